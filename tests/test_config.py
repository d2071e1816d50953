"""Config: options over environment over defaults, clear errors, one env registry, entry point."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kevin_backend.config import ENV, Config, ConfigError, Mode, override

PACKAGE = Path(__file__).resolve().parents[1] / "kevin_backend"


def test_defaults_and_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    config = Config.from_env()
    assert config.mode is Mode.CACHE and config.cache_dir == tmp_path / "kevin_backend"
    monkeypatch.setenv("KEVIN_MODE", "off")
    monkeypatch.setenv("KEVIN_CACHE_DIR", str(tmp_path / "c"))
    monkeypatch.setenv("KEVIN_MAX_PARTITION", "9")
    config = Config.from_env()
    assert (config.mode, config.cache_dir, config.max_partition) == (Mode.OFF, tmp_path / "c", 9)


def test_options_win_over_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KEVIN_MODE", "off")
    assert Config.from_options({"mode": "generate"}).mode is Mode.GENERATE
    with override(KEVIN_MODE=Mode.CACHE):
        assert Config.from_env().mode is Mode.CACHE
    assert Config.from_env().mode is Mode.OFF


@pytest.mark.parametrize(
    "options, message",
    [
        ({"mdoe": "cache"}, "unknown kevin option"),
        ({"mode": "fast"}, "mode"),
        ({"max_partition": "many"}, "max_partition"),
        ({"min_partition": 5, "max_partition": 4}, "max_partition"),
        ({"generator": object()}, "generate"),
    ],
)
def test_bad_options_name_the_problem(options: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        Config.from_options(options)


def test_bad_environment_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KEVIN_MIN_PARTITION", "two")
    with pytest.raises(ConfigError, match="KEVIN_MIN_PARTITION"):
        Config.from_env()


def test_compile_with_a_bad_option_fails_clearly() -> None:
    torch._dynamo.reset()
    fn = torch.compile(lambda x: x.sin() + 1, backend="kevin", options={"bogus": 1})
    with pytest.raises(Exception, match="unknown kevin option"):
        fn(torch.randn(4))
    torch._dynamo.reset()


def test_a_bad_mode_names_the_valid_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    """`options={"mode": "fast"}` (and KEVIN_MODE=fast) say which modes there are."""
    torch._dynamo.reset()
    fn = torch.compile(lambda x: x.sin() + 1, backend="kevin", options={"mode": "fast"})
    with pytest.raises(Exception, match=r"mode='fast' is invalid: 'fast' is not a valid mode; valid modes: cache, generate, off"):
        fn(torch.randn(4))
    torch._dynamo.reset()
    monkeypatch.setenv("KEVIN_MODE", "fast")
    with pytest.raises(ConfigError, match="KEVIN_MODE='fast'.*valid modes: cache, generate, off"):
        Config.from_env()


def test_no_environment_reads_outside_config() -> None:
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        if path.name == "config.py":
            continue
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr in ("environ", "getenv"):
                offenders.append(f"{path.name}:{node.lineno}")
    assert offenders == []


def test_entry_point_works_without_importing_the_package() -> None:
    script = (
        "import torch, sys\n"
        "assert 'kevin_backend' not in sys.modules\n"
        "from torch._dynamo import list_backends\n"
        "assert 'kevin' in list_backends(exclude_tags=())\n"
        "f = torch.compile(lambda x: torch.relu(x) * 2 + 1, backend='kevin', options={'mode': 'off'})\n"
        "x = torch.randn(8)\n"
        "assert torch.allclose(f(x), torch.relu(x) * 2 + 1)\n"
        "from torch._dynamo.backends.registry import lookup_backend\n"
        "import kevin_backend.backend.entry as e\n"
        "assert lookup_backend('kevin') is e.kevin\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().endswith("ok")


def test_import_changes_no_torch_setting() -> None:
    script = (
        "import torch, torch._inductor.config as c\n"
        "before = c.save_config_portable() if hasattr(c, 'save_config_portable') else dict(c.get_config_copy())\n"
        "import kevin_backend\n"
        "after = c.save_config_portable() if hasattr(c, 'save_config_portable') else dict(c.get_config_copy())\n"
        "assert before == after\n"
        "assert hasattr(torch.ops.kevin, 'launch')\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
