"""The seed cache shipped in kernels_cache/: every entry loads, and its metadata agrees with
itself (key and folder, timings and judge record, a kernel that passes the judge's rules); the
README's `kevin cache show` example names one of its entries."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from kevin_backend.cache.format import EntryKind
from kevin_backend.cache.store import KernelCache, default_seed_dir
from kevin_backend.judge.result import Reason
from kevin_backend.judge.static_judge import judge_static
from kevin_backend.types import load_program

SEED = default_seed_dir()
ENTRIES = [p for p in sorted(SEED.iterdir()) if p.is_dir() and not p.name.startswith("_")] if SEED else []


def test_the_seed_cache_is_found() -> None:
    assert SEED is not None and (SEED / "README.md").exists()


def test_the_readme_cache_show_example_shows_a_seed_entry(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The README's `kevin cache show PREFIX` runs as written on a fresh install: the prefix names
    one entry of the shipped seed cache."""
    from kevin_backend.cli.main import main

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    prefixes = re.findall(r"^kevin cache show (\S+)", readme, re.M)
    assert prefixes
    for prefix in prefixes:
        code = main(["--cache-dir", str(tmp_path / "user"), "cache", "show", prefix, "--seed-dir", str(SEED)])
        out, err = capsys.readouterr()
        assert code == 0, err
        assert out.startswith("entry " + prefix) and "(seed cache: " in out.splitlines()[0]


@pytest.mark.parametrize("folder", ENTRIES, ids=lambda p: p.name[:12])
def test_every_seed_entry_loads_and_is_consistent(folder: Path, tmp_path: Path) -> None:
    cache = KernelCache(tmp_path / "user", seed_dir=SEED)
    infos = {i.digest: i for i in cache.entries()}
    info = infos[folder.name]
    assert info.ok, info.error
    entry = cache.get_digest(folder.name)
    assert entry is not None and entry.key.digest == folder.name and info.source == "seed"
    task = load_program(entry.task.source, "seed_task")
    assert all(hasattr(task, name) for name in ("Model", "get_inputs", "get_init_inputs"))
    if entry.kind is EntryKind.KERNEL:
        record = entry.judge_record
        assert record is not None and record["reason"] == Reason.ACCEPTED.name
        assert record["timings"]["kernel_ms"] == pytest.approx(entry.timings.kernel_ms)
        assert entry.timings.speedup_vs_inductor is not None and entry.timings.speedup_vs_inductor > 1.0
        assert judge_static(entry.kernel_source).reason is Reason.STATIC_OK
    else:
        assert entry.reason
