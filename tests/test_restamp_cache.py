"""tools/restamp_seed.py: the seed cache as a user on another torch sees it (the H200 check of
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
    made = subprocess.run([sys.executable, str(ROOT / "tools" / "restamp_seed.py"), str(cache), "0.0.1"],
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
