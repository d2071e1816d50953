"""tools/restamp_cache.py: the seed cache as a user on another torch sees it (the H200 check of
`kevin cache revalidate` uses it where a second torch cannot be installed)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from kevin_backend.cache.format import EntryKind
from kevin_backend.cache.store import KernelCache, default_seed_dir

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}


def test_every_seed_entry_is_copied_under_a_key_naming_the_other_torch_and_revalidate_would_judge_its_kernels(
        tmp_path: Path) -> None:
    cache = tmp_path / "user"
    made = subprocess.run([sys.executable, str(ROOT / "tools" / "restamp_cache.py"), str(cache), "0.0.1"],
                          capture_output=True, text=True, check=True, env=ENV)
    seed = KernelCache(tmp_path / "empty", default_seed_dir())
    originals = [seed.get_digest(f.name) for f in default_seed_dir().iterdir() if f.is_dir()]
    originals = [e for e in originals if e is not None]
    copies = KernelCache(cache, None)
    moved = [copies.get_digest(f.name) for f in (cache / "entries").iterdir()]
    assert len(moved) == len(originals) > 0
    assert all(e is not None and e.key.torch_version == "0.0.1" for e in moved)
    kernels = sum(e.kind is EntryKind.KERNEL for e in originals)
    assert len(made.stdout.splitlines()) == kernels > 0
    listed = subprocess.run([sys.executable, "-m", "kevin_backend.cli.main", "cache", "--cache-dir", str(cache),
                             "--no-seed", "revalidate", "--dry-run"], capture_output=True, text=True, env=ENV)
    assert listed.returncode == 0, listed.stderr
    assert f"{kernels} would judge" in listed.stdout and "torch 0.0.1 -> " in listed.stdout


def test_the_entries_of_another_user_cache_are_copied_with_from(tmp_path: Path) -> None:
    first, second = tmp_path / "first", tmp_path / "second"
    subprocess.run([sys.executable, str(ROOT / "tools" / "restamp_cache.py"), str(first), "0.0.1"],
                   capture_output=True, text=True, check=True, env=ENV)
    made = subprocess.run([sys.executable, str(ROOT / "tools" / "restamp_cache.py"), str(second), "0.0.2",
                           "--from", str(first)], capture_output=True, text=True, check=True, env=ENV)
    copies = KernelCache(second, None)
    moved = [copies.get_digest(f.name) for f in (second / "entries").iterdir()]
    assert len(moved) == len(list((first / "entries").iterdir())) > 0
    assert all(e is not None and e.key.torch_version == "0.0.2" for e in moved)
    assert made.stdout.splitlines() and all(len(line.split()) == 3 for line in made.stdout.splitlines())
    missing = subprocess.run([sys.executable, str(ROOT / "tools" / "restamp_cache.py"), str(tmp_path / "third"), "0.0.3",
                              "--from", str(tmp_path / "nowhere")], capture_output=True, text=True, env=ENV)
    assert missing.returncode != 0 and "no cache entries in" in missing.stderr
