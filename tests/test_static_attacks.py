"""Programs that reach into the process that loads them (tests/static_attacks): each is refused by
the static rules with the rule its docstring's `Expect:` line names, and by that rule alone: with
the rule taken out of the list, the rest let the program through (the rule is what catches it).
A cached or imported program that breaks the rules is never loaded; without a preprocessor the
C++ rules fail closed; every honest program the project holds still passes."""

from __future__ import annotations

import dataclasses
import io
import json
import re
import sys
import tarfile
from pathlib import Path

import pytest

from kevin_backend.toolchain import cpp_preprocess
from kevin_backend.toolchain.candidate import Candidate
from kevin_backend.toolchain.static_rules import RULES, check, check_program

ATTACKS = Path(__file__).resolve().parent / "static_attacks"
CASES = sorted(ATTACKS.glob("*.py"))


def _expect(path: Path) -> str:
    return re.search(r"^Expect: (\S+)$", path.read_text(), re.MULTILINE).group(1)  # type: ignore[union-attr]


def test_the_corpus_covers_python_and_cpp() -> None:
    assert len(CASES) >= 14
    kinds = {p.name.split("_")[0] for p in CASES}
    assert kinds == {"py", "cpp"}
    assert len({_expect(p) for p in CASES}) >= 10


@pytest.mark.parametrize("path", CASES, ids=lambda p: p.stem)
def test_each_attack_is_refused_by_its_rule(path: Path) -> None:
    violations = check_program(path.read_text())
    assert {v.rule for v in violations} == {_expect(path)}, [str(v) for v in violations]
    assert all(v.where for v in violations), "a violation names its place"


@pytest.mark.parametrize("path", CASES, ids=lambda p: p.stem)
def test_without_its_rule_the_attack_passes(path: Path) -> None:
    """The rule is load-bearing: the functions that report it, taken out, leave nothing caught."""
    candidate = Candidate.parse(path.read_text())
    catching = [rule for rule in RULES if any(v.rule == _expect(path) for v in rule(candidate))]
    assert catching
    assert check(candidate, [rule for rule in RULES if rule not in catching]) == ()


def test_cpp_violations_name_the_candidates_own_line() -> None:
    source = (ATTACKS / "cpp_pyrun_token_paste.py").read_text()
    (v,) = check_program(source)
    kind, line = v.where.split(":")
    cuda = Candidate.parse(source).extensions[0].cuda_sources
    assert kind == "cuda" and "CAT(PyRun_, SimpleString)" in cuda.splitlines()[int(line) - 1]
    assert "PyRun_SimpleString" in v.message


def test_without_a_preprocessor_the_cpp_rules_fail_closed(monkeypatch: pytest.MonkeyPatch) -> None:
    honest = (Path(__file__).resolve().parent / "build_styles" / "relu_block_literal.py").read_text()
    assert check_program(honest) == ()
    monkeypatch.setattr(cpp_preprocess, "_compiler", lambda: None)
    cpp_preprocess.preprocess.cache_clear()
    try:
        violations = check_program(honest)
    finally:
        cpp_preprocess.preprocess.cache_clear()
    assert violations and {v.rule for v in violations} == {"cpp-preprocessed"}
    assert "no C++ preprocessor" in violations[0].message


@pytest.mark.parametrize("depth", ["B(B(x))", "B(B(B(x)))"], ids=["too-big", "too-long"])
def test_a_macro_bomb_fails_closed(monkeypatch: pytest.MonkeyPatch, depth: str) -> None:
    """8^8 copies of a token pass the 4 MB limit; 8^12 would take hours: both are stopped."""
    monkeypatch.setattr(cpp_preprocess, "_TIMEOUT_S", 3)
    bomb = f"#define A(x) x x x x x x x x\n#define B(x) A(A(A(A(x))))\n#define C(x) {depth}\nint v = 0; C(+v)\n"
    result = cpp_preprocess.preprocess("cuda", bomb, "bomb")
    assert result.error is not None and ("4 MB" in result.error or "took over 3 s" in result.error), result.error
    assert check_program((ATTACKS / "cpp_system_true.py").read_text().replace('system("true");', f"{bomb}")) != ()


# -- cached and imported programs ----------------------------------------------------------------

_LOADS_AND_RUNS = (ATTACKS / "py_top_level_runs.py").read_text().replace(
    "torch.cuda.synchronize()\n", 'torch.os.environ.setdefault("KEVIN_ATTACK_RAN", "1")\n')


def _malicious_entry():  # type: ignore[no-untyped-def]
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from test_cache import make_entry

    return dataclasses.replace(make_entry(3), kernel_source=_LOADS_AND_RUNS, policy="imported")


def test_load_entry_refuses_a_program_that_runs_at_load(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from kevin_backend.config import Config
    from kevin_backend.runtime import registry

    ran: list[str] = []
    monkeypatch.setattr(registry, "load_program", lambda source, name: ran.append(name))
    monkeypatch.delenv("KEVIN_ATTACK_RAN", raising=False)
    entry = _malicious_entry()
    with pytest.raises(registry.RejectedProgram, match="inert-top-level") as caught:
        registry.load_entry(entry, Config(cache_dir=tmp_path))
    assert entry.digest in str(caught.value) and "no-runtime-reach" in str(caught.value)
    assert ran == [] and registry.prebuild([entry], Config(cache_dir=tmp_path)) == 0


def test_a_task_program_that_reaches_out_is_refused_too(tmp_path: Path) -> None:
    from kevin_backend.config import Config
    from kevin_backend.runtime import registry

    entry = _malicious_entry()
    honest = (Path(__file__).resolve().parent / "static_attacks" / "py_item_in_forward.py").read_text()
    entry = dataclasses.replace(entry, kernel_source=honest.replace("scale = x.view(-1)[0].item()\n        ", ""))
    task = dataclasses.replace(entry.task, source=entry.task.source + "\ntorch.os.system('true')\n")
    with pytest.raises(registry.RejectedProgram, match="task program"):
        registry.load_entry(dataclasses.replace(entry, task=task), Config(cache_dir=tmp_path))


def test_kevin_cache_import_refuses_the_entry_by_name(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from kevin_backend.cache.disk_format import serialize_entry
    from kevin_backend.cli.main import main

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from test_cache import make_entry

    bad, good = _malicious_entry(), make_entry(4)
    archive = tmp_path / "shared.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        for entry in (bad, good):
            for name, data in serialize_entry(entry).items():
                blob = data if isinstance(data, bytes) else data.encode()
                info = tarfile.TarInfo(f"{entry.digest}/{name}")
                info.size = len(blob)
                tar.addfile(info, io.BytesIO(blob))
    code = main(["cache", "import", str(archive), "--cache-dir", str(tmp_path / "user"), "--no-seed"])
    out, err = capsys.readouterr()
    assert code == 1
    assert f"rejected {bad.digest}" in err and "inert-top-level" in err
    assert "imported 1 entries" in out and good.digest in out and bad.digest not in out
    assert not (tmp_path / "user" / "entries" / bad.digest).exists()


# -- honest programs -----------------------------------------------------------------------------


def test_every_honest_program_passes(capsys: pytest.CaptureFixture[str]) -> None:
    """tools/static_honest.py over every honest corpus, the built-in writer's first variant of each
    task (the tool's default checks every variant)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))
    import static_honest

    code = static_honest.main(["--sample", "1"])
    out = capsys.readouterr().out
    assert code == 0, out
    counts = {m.group(1): int(m.group(2)) for m in re.finditer(r"^(.+?): (\d+) programs, \2 pass", out, re.MULTILINE)}
    assert counts["judge cases"] >= 10 and counts["kb corpus"] >= 30 and counts["build styles"] >= 40
    assert counts["seed kernels"] >= 1 and counts["seed tasks"] >= 1 and counts["built-in programs"] >= 200
    json.dumps(counts)
