"""The mutation check (`tools/mutation_check.py`), in the full tier (KEVIN_TESTS_FULL=1): every
defect it puts back into a copy of the project turns one of its tests red, and the unchanged copy
passes them. The mutations run in two parts, this file's and tests/test_mutation_check_part2.py's, so that pytest-xdist can run the
halves side by side (each file runs on one worker)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _tool():  # type: ignore[no-untyped-def]
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        import mutation_check
    finally:
        sys.path.remove(str(ROOT / "tools"))
    return mutation_check


def check_part(k: int, n: int = 2) -> None:
    """`mutation_check.py --part k/n`: its control passes, and each of its mutations is killed."""
    names = [m.name for m in _tool().MUTATIONS[k - 1::n]]
    done = subprocess.run([sys.executable, str(ROOT / "tools" / "mutation_check.py"), "--part", f"{k}/{n}"],
                          capture_output=True, text=True, timeout=1800, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "[control] no mutation: passed" in done.stdout
    killed = [line.split("] ", 1)[1].split(":", 1)[0] for line in done.stdout.splitlines() if ": killed (" in line]
    assert killed == names and len(names) >= 4, done.stdout


@pytest.mark.full  # (minutes of pytest runs on copies of the project: the full tier)
def test_every_mutation_is_killed_by_its_tests_first_half() -> None:
    assert len(_tool().MUTATIONS) >= 8
    check_part(1)


def test_a_mutation_that_no_longer_applies_is_an_error(tmp_path: Path) -> None:
    mutation_check = _tool()
    (tmp_path / "m.py").write_text("x = 1\n")
    stale = mutation_check.Mutation("stale", "m.py", "x = 2\n", "x = 3\n", (), "")
    try:
        mutation_check.apply(stale, tmp_path)
    except ValueError as exc:
        assert "occurs 0 times" in str(exc)
    else:
        raise AssertionError("a mutation whose text is gone applied")
