"""`kevin cache prune` and what each cache serves (`info`, `ls`): entries written under fake GPU
names and torch/CUDA versions, on the CPU."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest

from kevin_backend.cache import CacheEntry, DeviceInfo, KernelCache, VersionTarget
from kevin_backend.cache.store import default_seed_dir
from kevin_backend.cli.main import main
from kevin_backend.config import override
from test_cache import make_entry, make_task

H200 = ("NVIDIA H200", "9.0")
H100 = ("NVIDIA H100", "9.0")
B200 = ("NVIDIA B200", "10.0")


@pytest.fixture(autouse=True)
def _no_home_cache(tmp_path: Path):
    with override(KEVIN_CACHE_DIR=tmp_path / "default-cache"):
        yield


def made_for(n: int, gpu: tuple[str, str], torch_version: str, cuda: str) -> CacheEntry:
    entry = make_entry(n)
    key = dataclasses.replace(entry.key, gpu=gpu[0], capability=gpu[1], torch_version=torch_version, cuda_version=cuda)
    return dataclasses.replace(entry, key=key)


def schema1_folder(root: Path, entry: CacheEntry) -> str:
    """An entry folder as kevin_backend wrote it before the key had numerics (schema 1)."""
    build = KernelCache(root.parent / f"build-{entry.digest}", seed_dir=None)
    build.put(entry)
    source = build.cache_dir / "entries" / entry.digest
    meta = json.loads((source / "meta.json").read_text())
    del meta["key"]["numerics"]
    meta["key"]["schema"] = 1
    old = dataclasses.replace(entry.key, schema=1).digest
    root.mkdir(parents=True, exist_ok=True)
    shutil.copytree(source, root / old)
    (root / old / "meta.json").write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
    return old


@pytest.fixture
def mixed(tmp_path: Path) -> tuple[KernelCache, dict[str, str]]:
    """A user cache with entries for several GPUs and versions, pending misses, a schema-1
    entry, an unreadable one, and a seed with entries for one GPU and version."""
    seed = tmp_path / "seed"
    seed.mkdir()
    for n in (50, 51):
        seed_entry = made_for(n, H200, "2.11.0", "13.0")
        build = KernelCache(tmp_path / f"seed-build-{n}", seed_dir=None)
        build.put(seed_entry)
        shutil.copytree(build.cache_dir / "entries" / seed_entry.digest, seed / seed_entry.digest)
    cache = KernelCache(tmp_path / "cache", seed_dir=seed)
    digests = {
        "here": made_for(0, H200, "2.13.0", "12.8"),
        "other_gpu": made_for(1, H100, "2.13.0", "12.8"),
        "other_capability": made_for(2, ("NVIDIA H200", "10.0"), "2.13.0", "12.8"),
        "old_torch": made_for(3, H200, "2.11.0", "12.8"),
        "old_cuda": made_for(4, H200, "2.13.0", "12.6"),
        "cpu_tensors": made_for(5, ("cpu", ""), "2.13.0", "12.8"),
    }
    for entry in digests.values():
        assert cache.put(entry)
    names = {label: entry.digest for label, entry in digests.items()}
    names["schema1"] = schema1_folder(cache.cache_dir / "entries", made_for(6, H200, "2.13.0", "12.8"))
    unreadable = cache.cache_dir / "entries" / ("f" * 32)
    unreadable.mkdir()
    (unreadable / "meta.json").write_text("{not json")
    names["unreadable"] = unreadable.name
    pending_here, pending_old = made_for(7, H200, "2.13.0", "12.8"), made_for(8, B200, "2.10.0", "12.8")
    cache.record_pending(pending_here.key, make_task(7))
    cache.record_pending(pending_old.key, make_task(8))
    names["pending_here"], names["pending_old"] = pending_here.digest, pending_old.digest
    return cache, names


H200_HERE = VersionTarget(gpu="NVIDIA H200", capability="9.0", torch_version="2.13.0", cuda_version="12.8")


def test_dry_run_lists_and_removes_nothing(mixed) -> None:
    cache, names = mixed
    before = sorted(p.name for p in (cache.cache_dir / "entries").iterdir())
    report = cache.prune(H200_HERE, dry_run=True)
    assert report.dry_run
    removed = {digest: what for digest, what, _ in report.removed}
    assert removed == {
        names["other_gpu"]: "gpu",
        names["other_capability"]: "gpu",
        names["old_torch"]: "torch",
        names["old_cuda"]: "cuda",
        names["schema1"]: "schema",
    }
    assert set(report.kept) == {names["here"], names["cpu_tensors"]}
    assert [d for d, _ in report.left] == [names["unreadable"]]
    assert [d for d, _, _ in report.pending_removed] == [names["pending_old"]]
    assert list(report.pending_kept) == [names["pending_here"]]
    assert report.counts() == {"gpu": 2, "torch": 1, "cuda": 1, "schema": 1}
    assert sorted(p.name for p in (cache.cache_dir / "entries").iterdir()) == before


def test_prune_removes_what_cannot_be_used_and_keeps_the_rest(mixed) -> None:
    cache, names = mixed
    fingerprint = cache.fingerprint()
    report = cache.prune(H200_HERE)
    assert len(report.removed) == 5
    left = sorted(p.name for p in (cache.cache_dir / "entries").iterdir())
    assert left == sorted([names["here"], names["cpu_tensors"], names["unreadable"]])
    assert [p.digest for p in cache.pending()] == [names["pending_here"]]
    assert cache.get(made_for(0, H200, "2.13.0", "12.8").key) is not None
    assert cache.fingerprint() != fingerprint  # compiled code that named removed entries is not reused
    assert len(list(cache.seed_dir.iterdir())) == 2  # the seed is never pruned
    again = cache.prune(H200_HERE)
    assert again.removed == () and again.pending_removed == ()


def test_without_a_gpu_only_versions_are_compared(mixed) -> None:
    cache, names = mixed
    report = cache.prune(VersionTarget(torch_version="2.13.0", cuda_version=None), dry_run=True)
    assert {d: w for d, w, _ in report.removed} == {names["old_torch"]: "torch", names["schema1"]: "schema"}
    by_gpu = cache.prune(VersionTarget(gpu="NVIDIA H100", torch_version="2.13.0"), dry_run=True)
    assert names["other_gpu"] in by_gpu.kept and names["other_capability"] not in by_gpu.kept
    assert names["cpu_tensors"] in by_gpu.kept  # CPU-tensor entries are never pruned for their GPU


def test_a_newer_schema_is_left_alone(tmp_path: Path) -> None:
    cache = KernelCache(tmp_path / "c", seed_dir=None)
    entry = made_for(0, H200, "2.13.0", "12.8")
    cache.put(entry)
    meta_path = cache.cache_dir / "entries" / entry.digest / "meta.json"
    meta = json.loads(meta_path.read_text())
    meta["key"]["schema"] = 99
    meta_path.write_text(json.dumps(meta))
    report = cache.prune(H200_HERE)
    assert report.removed == () and report.left[0][0] == entry.digest and "newer kevin_backend" in report.left[0][1]


def test_versions_count_each_source(mixed) -> None:
    cache, _ = mixed
    groups = {(g.source, g.gpu, g.capability, g.torch_version, g.cuda_version, g.schema): g.entries for g in cache.versions()}
    assert groups[("seed", "NVIDIA H200", "9.0", "2.11.0", "13.0", 2)] == 2
    assert groups[("user", "NVIDIA H200", "9.0", "2.13.0", "12.8", 1)] == 1  # the schema-1 entry
    assert groups[("user", "NVIDIA H200", "9.0", "2.13.0", "12.8", 2)] == 1
    assert sum(n for (source, *_), n in groups.items() if source == "user") == 7  # the unreadable one is left out


# -- the CLI -------------------------------------------------------------------------------------


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.fixture
def machine(monkeypatch: pytest.MonkeyPatch):
    """Pretend this machine has `device` (a DeviceInfo); returns the setter."""

    def use(device: DeviceInfo) -> None:
        monkeypatch.setattr(DeviceInfo, "detect", staticmethod(lambda device_type="cuda", index=None: device))

    return use


def opts_of(cache: KernelCache) -> list[str]:
    return ["--cache-dir", str(cache.cache_dir), "--seed-dir", str(cache.seed_dir)]


def test_cli_prune_on_a_gpu_machine(mixed, capsys, machine) -> None:
    cache, names = mixed
    machine(DeviceInfo("NVIDIA H200", "9.0", "2.13.0", "12.8"))
    code, out, err = run(capsys, "cache", "prune", "--dry-run", *opts_of(cache))
    assert code == 0 and err == ""
    assert "keeping entries for: NVIDIA H200 (9.0), torch 2.13.0, CUDA 12.8" in out
    assert ("would remove 5 of 7 user entries (1 for another CUDA, 2 for another GPU, "
            "1 from an older kevin_backend, 1 for another torch):") in out
    assert f"{names['old_torch'][:12]}  torch 2.11.0, not 2.13.0" in out
    assert f"{names['other_gpu'][:12]}  GPU NVIDIA H100, not NVIDIA H200" in out
    assert "would forget 1 of 2 pending misses" in out and "left in place: 1" in out
    assert "seed cache (read-only, never pruned): 2 for NVIDIA H200 (9.0), torch 2.11.0, CUDA 13.0" in out
    assert len(list((cache.cache_dir / "entries").iterdir())) == 8  # dry run

    code, out, _ = run(capsys, "cache", "prune", *opts_of(cache))
    assert code == 0 and "removed 5 of 7 user entries" in out and "forgot 1 of 2 pending misses" in out
    assert "kept 2 user entries and 1 pending misses" in out
    code, out, _ = run(capsys, "cache", "prune", *opts_of(cache))
    assert code == 0 and "nothing to prune: 2 user entries, all usable here" in out


def test_cli_prune_on_a_cpu_only_machine(mixed, capsys, machine) -> None:
    cache, names = mixed
    machine(DeviceInfo("cuda", "", "2.13.0", ""))  # what DeviceInfo.detect says without a GPU and CUDA
    code, out, _ = run(capsys, "cache", "prune", "--dry-run", *opts_of(cache))
    assert code == 0
    assert "keeping entries for: any GPU, torch 2.13.0, any CUDA (no GPU visible" in out and "--gpu NAME" in out
    assert "would remove 2 of 7 user entries (1 from an older kevin_backend, 1 for another torch)" in out

    code, out, _ = run(capsys, "cache", "prune", "--dry-run", "--gpu", "NVIDIA H200", "--cuda", "12.8", *opts_of(cache))
    assert "keeping entries for: NVIDIA H200, torch 2.13.0, CUDA 12.8" in out
    assert "would remove 4 of 7 user entries" in out  # any capability of a GPU named by hand
    code, out, _ = run(capsys, "cache", "prune", "--dry-run", "--torch", "2.11.0+cu130", *opts_of(cache))
    assert "keeping entries for: any GPU, torch 2.11.0, any CUDA" in out


def test_cli_prune_help_says_what_happens_without_a_gpu(capsys) -> None:
    code, out, _ = run(capsys, "cache", "prune", "--help")
    assert code == 0 and "Without a visible GPU" in out and "--gpu NAME" in out and "never pruned" in out


def test_cli_info_and_ls_say_what_the_seed_serves(mixed, capsys, machine) -> None:
    cache, _ = mixed
    machine(DeviceInfo("cuda", "", "2.13.0", ""))
    code, out, _ = run(capsys, "cache", "info", *opts_of(cache))
    assert code == 0
    assert f"seed cache: {cache.seed_dir} (read-only, 2 entries)" in out
    assert "this machine: no GPU visible, torch 2.13.0, torch built without CUDA" in out
    seed_row = next(line for line in out.splitlines() if line.startswith("seed  "))
    assert seed_row.split()[:6] == ["seed", "2", "NVIDIA", "H200", "(9.0)", "2.11.0"]
    assert "no: torch 2.11.0, not 2.13.0" in seed_row
    assert "user entries cannot be used here: `kevin cache prune --dry-run`" in out

    code, out, _ = run(capsys, "cache", "info", "--json", *opts_of(cache))
    data = json.loads(out)
    assert data["machine"] == {"gpu": None, "capability": None, "torch": "2.13.0", "cuda": None}
    assert {"source": "seed", "gpu": "NVIDIA H200", "capability": "9.0", "torch": "2.11.0", "cuda": "13.0",
            "schema": 2, "entries": 2, "usable_here": "no: torch 2.11.0, not 2.13.0"} in data["versions"]

    machine(DeviceInfo("NVIDIA H200", "9.0", "2.11.0", "13.0"))
    code, out, _ = run(capsys, "cache", "ls", *opts_of(cache))
    assert code == 0
    assert "the seed cache serves:\n  NVIDIA H200 (9.0), torch 2.11.0, CUDA 13.0, key schema 2: 2 entries; usable here: yes" in out


def test_the_packaged_seed_says_which_versions_it_serves(tmp_path: Path, capsys) -> None:
    seed = default_seed_dir()
    assert seed is not None
    groups = KernelCache(tmp_path / "c", seed_dir=seed).versions()
    assert [(g.source, g.gpu, g.capability, g.torch_version, g.cuda_version, g.schema) for g in groups] == [
        ("seed", "NVIDIA H200", "9.0", "2.11.0", "13.0", 2)
    ]
    code, out, _ = run(capsys, "cache", "ls", "--cache-dir", str(tmp_path / "c"))
    assert code == 0 and "NVIDIA H200 (9.0), torch 2.11.0, CUDA 13.0, key schema 2: 94 entries" in out
