"""The `kevin` command parses without importing torch: `kevin --help`, every subcommand's and
action's `--help`, and every usage error argparse finds (an unknown option, a missing argument)
exit in a fresh interpreter with torch not in sys.modules. Importing torch is most of the CLI's
start-up time (about 2 s of 3 s on two cores; benchmarks/bench_cli.py times it); only a command
that runs needs it.

Every command line runs in its own interpreter, as a user's does. The parsers are walked from
`build_parser()`, so a new subcommand, action or required argument is covered without an edit
here. No time is asserted: whether torch was imported is what decides the time.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

from kevin_backend.cli.main import EXIT_OK, EXIT_USAGE, build_parser

ROOT = Path(__file__).resolve().parent.parent

# Runs `kevin ARGV` through main() and reports its exit code and whether torch got imported.
_PROBE = (
    "import json, sys\n"
    "from kevin_backend.cli.main import main\n"
    "code = main(sys.argv[1:])\n"
    "print(json.dumps({'code': code, 'torch': 'torch' in sys.modules}))\n"
)


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """The subcommands (or actions) `parser` has, by name."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _required_positionals(parser: argparse.ArgumentParser) -> list[str]:
    return [a.dest for a in parser._actions if not a.option_strings and a.required
            and not isinstance(a, argparse._SubParsersAction)]


def _command_lines() -> tuple[list[tuple[str, ...]], list[tuple[str, ...]]]:
    """(every help command line, every argparse usage error) over the whole parser tree."""
    helps: list[tuple[str, ...]] = [("--help",)]
    errors: list[tuple[str, ...]] = [("--no-such-option",), ("no-such-command",)]
    todo = [((), build_parser())]
    while todo:
        path, parser = todo.pop(0)
        for name, sub in _subparsers(parser).items():
            words = (*path, name)
            helps.append((*words, "--help"))
            errors.append((*words, "--no-such-option"))
            if _required_positionals(sub):
                errors.append(words)  # the required argument left out
            todo.append((words, sub))
    return helps, errors


HELPS, USAGE_ERRORS = _command_lines()


def _probe(argv: tuple[str, ...]) -> dict[str, object]:
    done = subprocess.run([sys.executable, "-c", _PROBE, *argv], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1]) | {"stderr": done.stderr}


def test_the_walk_finds_every_command() -> None:
    assert {("generate", "--help"), ("cache", "ls", "--help"), ("train", "plot", "--help"), ("bench", "--help"),
            ("prewarm", "--help"), ("eval", "--help")} <= set(HELPS)
    assert {("generate",), ("eval",), ("cache", "show"), ("train", "plot")} <= set(USAGE_ERRORS)


@pytest.mark.parametrize("argv", HELPS, ids=" ".join)
def test_help_does_not_import_torch(argv: tuple[str, ...]) -> None:
    result = _probe(argv)
    assert result["code"] == EXIT_OK, result
    assert result["torch"] is False, f"kevin {' '.join(argv)} imported torch"


@pytest.mark.parametrize("argv", USAGE_ERRORS, ids=" ".join)
def test_usage_error_does_not_import_torch(argv: tuple[str, ...]) -> None:
    result = _probe(argv)
    assert result["code"] == EXIT_USAGE, result
    assert str(result["stderr"]).startswith("kevin: error: "), result
    assert result["torch"] is False, f"kevin {' '.join(argv)} imported torch"


@pytest.mark.parametrize("argv", [(), ("cache",)], ids=["kevin", "kevin cache"])
def test_a_group_without_its_command_does_not_import_torch(argv: tuple[str, ...]) -> None:
    """`kevin` alone prints its help, `kevin cache` alone names the actions: both exit 2, and
    neither needs torch."""
    result = _probe(argv)
    assert result["code"] == EXIT_USAGE and result["torch"] is False, result


def _module_imported(importtime: str, module: str) -> bool:
    """Whether `-X importtime` output (stderr) lists `module`."""
    return any(line.rsplit("|", 1)[-1].strip() == module for line in importtime.splitlines()
               if line.startswith("import time:"))


@pytest.mark.parametrize("entry", ["kevin_backend.cli.main", "kevin_backend"])
def test_python_m_help_does_not_import_torch(entry: str) -> None:
    """The ways to start the CLI as a module, through the package's __init__: no torch."""
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", entry, "--help"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == EXIT_OK, done.stderr[-2000:]
    assert "usage: kevin" in done.stdout
    assert _module_imported(done.stderr, "kevin_backend.cli.main")  # the check reads the lines
    assert not _module_imported(done.stderr, "torch")


def test_python_m_cli_main_reports_a_command_error_as_one_line() -> None:
    """Run as `python -m kevin_backend.cli.main`, a handler's CommandError is the one error line
    and its exit code, as under `kevin` (not a traceback: the script's module and the handlers'
    `kevin_backend.cli.main` must be one module)."""
    done = subprocess.run([sys.executable, "-m", "kevin_backend.cli.main", "cache"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == EXIT_USAGE, done.stderr[-2000:]
    assert done.stderr.startswith("kevin: error: `kevin cache` needs an action") and "Traceback" not in done.stderr


def test_the_package_import_stays_usable_without_torch_first() -> None:
    """`import kevin_backend` before torch imports no torch; the backend then compiles through the
    entry point, which defines `kevin::launch` before any compiled code can call it, and the names
    that need torch resolve on first use."""
    script = (
        "import sys\n"
        "import kevin_backend\n"
        "from kevin_backend import Config, Mode, __version__, counters\n"
        "assert 'torch' not in sys.modules\n"
        "import torch\n"
        "assert 'kevin_backend.runtime.op' not in sys.modules\n"
        "f = torch.compile(lambda x: torch.relu(x) * 2 + 1, backend='kevin', options={'mode': 'off'})\n"
        "x = torch.randn(8)\n"
        "assert torch.allclose(f(x), torch.relu(x) * 2 + 1)\n"
        "assert hasattr(torch.ops.kevin, 'launch')\n"
        "from kevin_backend import CompileReport, KernelTask, TensorSpec, last_report\n"
        "assert KernelTask.__module__ == TensorSpec.__module__ == 'kevin_backend.types'\n"
        "assert isinstance(last_report(), CompileReport) and counters is kevin_backend.counters\n"
        "print('ok')\n"
    )
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().endswith("ok")
