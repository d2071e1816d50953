"""Tests of the on-disk kernel cache (kevin_backend.cache.store) and `kevin cache` (CPU only)."""

from __future__ import annotations

import io
import json
import logging
import math
import multiprocessing
import shutil
import tarfile
from pathlib import Path

import diskcache
import pytest

from kevin_backend.cache import (
    CacheEntry,
    CacheKey,
    EntryKind,
    KernelCache,
    KernelCacheError,
    ReadOnlyEntryError,
    Timings,
    UnsafeArchiveError,
)
from kevin_backend.cli.main import main
from kevin_backend.config import Config, override
from kevin_backend.types import KernelTask, TensorSpec

TASK_SOURCE = '''import torch


class Model(torch.nn.Module):
    def forward(self, x, y):
        return torch.relu(x + y)


def get_inputs():
    return [torch.randn(4, 8), torch.randn(4, 8)]


def get_init_inputs():
    return []
'''

# A kernel program that passes the static rules (`kevin cache import` and the runtime check them);
# `{variant}` makes programs that differ.
KERNEL_SOURCE = '''import torch
from torch.utils.cpp_extension import load_inline

cuda_source = """
#include <torch/extension.h>

__global__ void add_relu_kernel(const float* x, const float* y, float* out, int n) {{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = fmaxf(x[i] + y[i], 0.0f);
}}

torch::Tensor add_relu(torch::Tensor x, torch::Tensor y) {{
    auto out = torch::empty_like(x);
    int n = x.numel();
    add_relu_kernel<<<(n + 255) / 256, 256>>>(x.data_ptr<float>(), y.data_ptr<float>(), out.data_ptr<float>(), n);
    return out;
}}
"""

ext = load_inline(name="add_relu", cpp_sources="torch::Tensor add_relu(torch::Tensor x, torch::Tensor y);",
                  cuda_sources=cuda_source, functions=["add_relu"])


class ModelNew(torch.nn.Module):
    def forward(self, x, y):
        return ext.add_relu(x, y)  # variant {variant}
'''


# -- builders ------------------------------------------------------------------------------------


def make_task(n: int = 0) -> KernelTask:
    """A task whose graph hash (and so key) depends on `n`."""
    spec = TensorSpec(shape=(4, 8 + n), stride=(8 + n, 1), dtype="float32", device="cuda")
    return KernelTask(
        name=f"add_relu_{n}",
        source=TASK_SOURCE,
        inputs=(spec, spec),
        outputs=(spec,),
        ops=("aten.add.Tensor", "aten.relu.default"),
        graph_hash=f"graph-{n:04d}",
    )


def make_key(task: KernelTask) -> CacheKey:
    return CacheKey(
        graph=task.graph_hash,
        inputs=task.inputs,
        gpu="NVIDIA H200",
        capability="9.0",
        torch_version="2.13.0",
        cuda_version="12.8",
    )


def make_entry(n: int = 0, variant: int = 0, kind: EntryKind = EntryKind.KERNEL) -> CacheEntry:
    task = make_task(n)
    kernel = kind is EntryKind.KERNEL
    return CacheEntry(
        key=make_key(task),
        kind=kind,
        task=task,
        kernel_source=KERNEL_SOURCE.format(variant=variant) if kernel else None,
        timings=Timings(eager_ms=2.0, inductor_ms=1.5, kernel_ms=0.75 if kernel else None),
        policy=f"kevin-32b/best-of-4/v{variant}",
        judge_record={"stage": "timed", "seeds": [0, 1, 2], "max_abs_err": 1e-6, "nested": {"ok": True}},
        created="2025-06-01T12:00:00+00:00",
        reason="" if kernel else "no candidate beat Inductor",
    )


def copy_to_seed(entry: CacheEntry, seed_dir: Path, tmp_path: Path) -> None:
    """Write `entry` into a seed folder the way a prewarm run would: the user-cache folder as is."""
    build = KernelCache(tmp_path / f"build-{entry.digest}", seed_dir=None)
    assert build.put(entry)
    shutil.copytree(build.cache_dir / "entries" / entry.digest, seed_dir / entry.digest)


@pytest.fixture(autouse=True)
def _no_home_cache(tmp_path: Path):
    """Point the default cache dir into tmp_path so that nothing can touch the real home cache."""
    with override(KEVIN_CACHE_DIR=tmp_path / "default-cache"):
        yield


@pytest.fixture
def cache(tmp_path: Path) -> KernelCache:
    with KernelCache(tmp_path / "cache", seed_dir=None) as kernel_cache:
        yield kernel_cache


def entry_dir(cache: KernelCache, entry: CacheEntry) -> Path:
    return cache.cache_dir / "entries" / entry.digest


# -- put / get -----------------------------------------------------------------------------------


def test_put_get_roundtrip_every_field(cache: KernelCache) -> None:
    kernel = make_entry(0)
    inductor = make_entry(1, kind=EntryKind.INDUCTOR)
    assert cache.put(kernel) and cache.put(inductor)

    assert cache.get(kernel.key) == kernel
    assert cache.get_digest(kernel.digest) == kernel
    assert cache.get(inductor.key) == inductor
    loaded = cache.get(kernel.key)
    assert loaded is not None
    assert (loaded.task.source, loaded.kernel_source, loaded.judge_record) == (
        kernel.task.source,
        kernel.kernel_source,
        kernel.judge_record,
    )

    folder = entry_dir(cache, kernel)
    assert sorted(p.name for p in folder.iterdir()) == ["kernel.py", "meta.json", "task.py"]
    assert (folder / "task.py").read_text() == TASK_SOURCE
    meta = json.loads((folder / "meta.json").read_text())
    assert meta["key"] == kernel.key.as_dict()
    assert meta["kind"] == "kernel"
    assert meta["task"] == kernel.task.as_dict()
    assert meta["timings"]["speedup_vs_eager"] == pytest.approx(2.0 / 0.75)
    assert meta["timings"]["speedup_vs_inductor"] == pytest.approx(2.0)
    assert set(meta["files"]) == {"task.py", "kernel.py"}
    assert sorted(p.name for p in entry_dir(cache, inductor).iterdir()) == ["meta.json", "task.py"]

    infos = {info.digest: info for info in cache.entries()}
    assert infos[kernel.digest].source == "user" and infos[kernel.digest].kind is EntryKind.KERNEL
    assert infos[kernel.digest].ops == kernel.task.ops and infos[kernel.digest].error is None
    assert infos[inductor.digest].kind is EntryKind.INDUCTOR


def test_miss_returns_none_and_creates_nothing(tmp_path: Path) -> None:
    cache = KernelCache(tmp_path / "absent", seed_dir=None)
    assert cache.get(make_key(make_task())) is None
    assert cache.entries() == [] and cache.pending() == []
    cache.fingerprint()
    assert not (tmp_path / "absent").exists()


def test_put_keeps_existing_unless_replace(cache: KernelCache) -> None:
    first, second = make_entry(variant=1), make_entry(variant=2)
    assert cache.put(first)
    assert not cache.put(second)
    assert cache.get(first.key) == first
    assert cache.put(second, replace=True)
    assert cache.get(first.key) == second
    assert [p.name for p in (cache.cache_dir / "entries").iterdir()] == [first.digest]


def test_put_rejects_unserializable_judge_record(cache: KernelCache) -> None:
    entry = make_entry()
    bad = CacheEntry(entry.key, entry.kind, entry.task, entry.kernel_source, judge_record={"x": object()})
    with pytest.raises(ValueError, match="cannot be serialized"):
        cache.put(bad)
    assert cache.get(entry.key) is None


def test_put_accepts_nan_in_judge_record(cache: KernelCache) -> None:
    entry = make_entry()
    odd = CacheEntry(entry.key, entry.kind, entry.task, entry.kernel_source, judge_record={"err": float("nan")})
    assert cache.put(odd)
    loaded = cache.get(entry.key)
    assert loaded is not None and loaded.judge_record is not None and math.isnan(loaded.judge_record["err"])


def _concurrent_put(cache_dir: str, variant: int, replace: bool, barrier, results) -> None:
    """Worker (spawned): write the same key as the other workers, a few times when replacing."""
    kernel_cache = KernelCache(Path(cache_dir), seed_dir=None)
    entry = make_entry(variant=variant)
    barrier.wait(timeout=120)
    outcomes = [kernel_cache.put(entry, replace=replace) for _ in range(5 if replace else 1)]
    kernel_cache.close()
    results.put((variant, outcomes))


@pytest.mark.slow
@pytest.mark.parametrize("replace", [False, True])
def test_concurrent_writers_leave_one_valid_entry(tmp_path: Path, replace: bool) -> None:
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(4), ctx.Queue()
    cache_dir = tmp_path / "cache"
    workers = [
        ctx.Process(target=_concurrent_put, args=(str(cache_dir), variant, replace, barrier, results))
        for variant in range(4)
    ]
    for worker in workers:
        worker.start()
    outcomes = dict(results.get(timeout=300) for _ in workers)
    for worker in workers:
        worker.join(timeout=60)
        assert worker.exitcode == 0

    if replace:
        assert all(all(written) for written in outcomes.values())
    else:
        assert sorted(written[0] for written in outcomes.values()) == [False, False, False, True]
    digest = make_entry().digest
    assert [p.name for p in (cache_dir / "entries").iterdir()] == [digest]  # no temporaries left
    loaded = KernelCache(cache_dir, seed_dir=None).get_digest(digest)
    assert loaded in [make_entry(variant=variant) for variant in range(4)]
    if not replace:
        winner = next(variant for variant, written in outcomes.items() if written[0])
        assert loaded == make_entry(variant=winner)


# -- corruption ----------------------------------------------------------------------------------


def _truncate_kernel(folder: Path) -> None:
    data = (folder / "kernel.py").read_bytes()
    (folder / "kernel.py").write_bytes(data[: len(data) // 2])


def _garbage_meta(folder: Path) -> None:
    (folder / "meta.json").write_text("{ this is not json")


def _delete_task(folder: Path) -> None:
    (folder / "task.py").unlink()


def _wrong_format(folder: Path) -> None:
    meta = json.loads((folder / "meta.json").read_text())
    meta["format"] = 99
    (folder / "meta.json").write_text(json.dumps(meta))


def _schema_mismatch(folder: Path) -> None:
    meta = json.loads((folder / "meta.json").read_text())
    del meta["timings"]
    (folder / "meta.json").write_text(json.dumps(meta))


def _foreign_key(folder: Path) -> None:
    """meta.json of another entry (its key's digest is not this folder's name)."""
    other = make_entry(7)
    meta = json.loads((folder / "meta.json").read_text())
    meta["key"] = other.key.as_dict()
    (folder / "meta.json").write_text(json.dumps(meta))


CORRUPTIONS = {
    "truncated kernel.py": (_truncate_kernel, "kernel.py does not match"),
    "garbage meta.json": (_garbage_meta, "not valid JSON"),
    "deleted task.py": (_delete_task, "task.py is missing"),
    "unknown format": (_wrong_format, "entry format 99"),
    "schema mismatch": (_schema_mismatch, "does not match the entry schema"),
    "key of another entry": (_foreign_key, "not the folder's"),
}


@pytest.mark.parametrize("corruption", list(CORRUPTIONS))
def test_corrupt_entry_is_skipped_with_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, corruption: str
) -> None:
    corrupt, problem = CORRUPTIONS[corruption]
    cache = KernelCache(tmp_path / "cache", seed_dir=None)
    entry = make_entry()
    cache.put(entry)
    folder = entry_dir(cache, entry)
    corrupt(folder)

    caplog.set_level(logging.WARNING, logger="kevin_backend")
    assert cache.get(entry.key) is None
    warnings = [r.getMessage() for r in caplog.records if r.name == "kevin_backend"]
    assert any(str(folder) in message and problem in message for message in warnings), warnings

    [info] = cache.entries()
    assert info.digest == entry.digest and not info.ok and problem in (info.error or "")

    # A sound write over a corrupt entry repairs it even without replace.
    assert cache.put(entry)
    assert cache.get(entry.key) == entry


def test_corrupt_user_entry_falls_back_to_seed(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    seed_dir = tmp_path / "seed"
    seed_dir.mkdir()
    seed_entry, user_entry = make_entry(variant=1), make_entry(variant=2)
    copy_to_seed(seed_entry, seed_dir, tmp_path)
    cache = KernelCache(tmp_path / "cache", seed_dir=seed_dir)
    cache.put(user_entry)
    _truncate_kernel(entry_dir(cache, user_entry))

    caplog.set_level(logging.WARNING, logger="kevin_backend")
    assert cache.get(user_entry.key) == seed_entry
    assert any("kernel.py does not match" in r.getMessage() for r in caplog.records)


def test_index_summarizes_user_entries(cache: KernelCache) -> None:
    entry, other = make_entry(0), make_entry(1)
    cache.put(entry)
    cache.put(other)
    with diskcache.Cache(str(cache.cache_dir / "index")) as index:
        assert index.get(f"entry/{entry.digest}")["speedup_vs_inductor"] == pytest.approx(2.0)
        generation = index.get("generation")
        cache.remove(other.digest)
        assert index.get(f"entry/{other.digest}") is None and index.get("generation") == generation + 1
        cache.clear()
        assert index.get(f"entry/{entry.digest}") is None and index.get("generation") == generation + 2


def test_entry_without_index_is_found(cache: KernelCache) -> None:
    entry = make_entry()
    cache.put(entry)
    cache.close()
    shutil.rmtree(cache.cache_dir / "index")
    assert cache.get(entry.key) == entry
    assert [info.digest for info in cache.entries()] == [entry.digest]


# -- seed cache ----------------------------------------------------------------------------------


def test_seed_is_consulted_after_user(tmp_path: Path) -> None:
    seed_dir = tmp_path / "seed"
    seed_dir.mkdir()
    (seed_dir / "README.md").write_text("ignored")
    shared_seed, shared_user, seed_only = make_entry(0, variant=1), make_entry(0, variant=2), make_entry(1)
    copy_to_seed(shared_seed, seed_dir, tmp_path)
    copy_to_seed(seed_only, seed_dir, tmp_path)
    cache = KernelCache(tmp_path / "cache", seed_dir=seed_dir)
    cache.put(shared_user)

    assert cache.get(shared_user.key) == shared_user  # user wins
    assert cache.get(seed_only.key) == seed_only  # only in seed: found
    assert sorted((info.digest, info.source) for info in cache.entries()) == sorted(
        [(shared_user.digest, "user"), (shared_user.digest, "seed"), (seed_only.digest, "seed")]
    )
    assert cache.remove(shared_user.digest)
    assert cache.get(shared_user.key) == shared_seed  # falls back to the seed

    no_seed = KernelCache(tmp_path / "cache", seed_dir=None)
    assert no_seed.get(seed_only.key) is None


def test_remove_seed_entry_is_refused(tmp_path: Path) -> None:
    seed_dir = tmp_path / "seed"
    seed_dir.mkdir()
    entry = make_entry()
    copy_to_seed(entry, seed_dir, tmp_path)
    cache = KernelCache(tmp_path / "cache", seed_dir=seed_dir)
    with pytest.raises(ReadOnlyEntryError, match="read-only seed cache"):
        cache.remove(entry.digest)
    assert (seed_dir / entry.digest / "meta.json").exists()
    assert cache.clear() == 0
    assert cache.get(entry.key) == entry
    assert not cache.remove(make_entry(5).digest)  # in neither: just False


def test_from_config(tmp_path: Path) -> None:
    cache = KernelCache.from_config(Config(cache_dir=tmp_path / "c", seed_cache=False))
    assert cache.cache_dir == tmp_path / "c" and cache.seed_dir is None
    assert KernelCache.from_config(Config(cache_dir=tmp_path / "c")).cache_dir == tmp_path / "c"


# -- fingerprint and pending ---------------------------------------------------------------------


def test_fingerprint_tracks_user_entries(tmp_path: Path, cache: KernelCache) -> None:
    seen = [cache.fingerprint()]

    def changed() -> None:
        value = cache.fingerprint()
        assert value not in seen
        seen.append(value)

    entry, other = make_entry(0), make_entry(1)
    cache.put(entry)
    changed()
    cache.put(make_entry(0, variant=3), replace=True)
    changed()
    cache.put(other)
    changed()
    cache.remove(other.digest)
    changed()

    before = cache.fingerprint()
    cache.get(entry.key)
    cache.entries()
    assert cache.record_pending(other.key, other.task)
    assert cache.fingerprint() == before  # pending tasks do not change what compiles

    archive = tmp_path / "one.tar.gz"
    cache.export(archive)
    assert cache.clear() == 1
    changed()
    cache.import_(archive)
    changed()


def test_fingerprint_differs_between_seed_contents(tmp_path: Path) -> None:
    seeds = []
    for n in range(2):
        seed_dir = tmp_path / f"seed{n}"
        seed_dir.mkdir()
        copy_to_seed(make_entry(n), seed_dir, tmp_path)
        seeds.append(KernelCache(tmp_path / "cache", seed_dir=seed_dir).fingerprint())
    seeds.append(KernelCache(tmp_path / "cache", seed_dir=None).fingerprint())
    assert len(set(seeds)) == 3


def test_pending_record_list_remove(cache: KernelCache, caplog: pytest.LogCaptureFixture) -> None:
    first, second = make_entry(0), make_entry(1)
    assert cache.record_pending(first.key, first.task)
    assert not cache.record_pending(first.key, first.task)  # idempotent
    assert cache.record_pending(second.key, second.task)

    pending = {task.digest: task for task in cache.pending()}
    assert set(pending) == {first.digest, second.digest}
    assert pending[first.digest].key == first.key and pending[first.digest].task == first.task
    assert (cache.cache_dir / "pending" / first.digest / "task.py").read_text() == TASK_SOURCE
    assert cache.entries() == []  # pending tasks are not entries

    (cache.cache_dir / "pending" / second.digest / "task.py").write_text("truncated")
    caplog.set_level(logging.WARNING, logger="kevin_backend")
    assert [task.digest for task in cache.pending()] == [first.digest]
    assert any("pending" in r.getMessage() and second.digest in r.getMessage() for r in caplog.records)

    assert cache.remove_pending(first.digest)
    assert not cache.remove_pending(first.digest)
    assert cache.pending() == []


# -- export / import -----------------------------------------------------------------------------


def test_export_import_roundtrip(tmp_path: Path, cache: KernelCache) -> None:
    entries = [make_entry(0), make_entry(1, kind=EntryKind.INDUCTOR), make_entry(2)]
    for entry in entries:
        cache.put(entry)
    archive = tmp_path / "all.tar.gz"
    assert cache.export(archive) == 3

    fresh = KernelCache(tmp_path / "fresh", seed_dir=None)
    report = fresh.import_(archive)
    assert sorted(report.imported) == sorted(e.digest for e in entries)
    assert report.skipped == () and report.ok
    for entry in entries:
        assert fresh.get(entry.key) == entry

    again = fresh.import_(archive)
    assert again.imported == () and sorted(again.skipped) == sorted(e.digest for e in entries)
    assert sorted(fresh.import_(archive, replace=True).imported) == sorted(e.digest for e in entries)

    subset = tmp_path / "one.tar.gz"
    assert cache.export(subset, [entries[1].digest]) == 1
    with tarfile.open(subset) as tar:
        assert sorted(tar.getnames()) == [entries[1].digest, f"{entries[1].digest}/meta.json", f"{entries[1].digest}/task.py"]
    with pytest.raises(KernelCacheError, match="no valid cache entry"):
        cache.export(subset, [make_entry(9).digest])


def _tar_with(path: Path, members: dict[str, bytes]) -> None:
    with tarfile.open(path, "w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def _entry_members(cache: KernelCache, entry: CacheEntry) -> dict[str, bytes]:
    folder = entry_dir(cache, entry)
    return {f"{entry.digest}/{p.name}": p.read_bytes() for p in folder.iterdir()}


@pytest.mark.parametrize("evil_name", ["../evil.py", "{digest}/../../evil.py", "/tmp/evil.py"])
def test_import_refuses_path_traversal(tmp_path: Path, cache: KernelCache, evil_name: str) -> None:
    entry = make_entry()
    cache.put(entry)
    members = _entry_members(cache, entry)
    members[evil_name.format(digest=entry.digest)] = b"print('pwned')\n"
    archive = tmp_path / "evil.tar.gz"
    _tar_with(archive, members)

    fresh = KernelCache(tmp_path / "fresh", seed_dir=None)
    with pytest.raises(UnsafeArchiveError):
        fresh.import_(archive)
    assert fresh.entries() == []  # nothing imported, not even the sound entry
    assert not (tmp_path / "evil.py").exists()


def test_import_refuses_links(tmp_path: Path) -> None:
    archive = tmp_path / "link.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        info = tarfile.TarInfo(f"{make_entry().digest}/task.py")
        info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
        tar.addfile(info)
    with pytest.raises(UnsafeArchiveError, match="link"):
        KernelCache(tmp_path / "fresh", seed_dir=None).import_(archive)


def test_import_rejects_bad_entries_and_keeps_good_ones(tmp_path: Path, cache: KernelCache) -> None:
    good, tampered = make_entry(0), make_entry(1)
    cache.put(good)
    cache.put(tampered)
    members = {**_entry_members(cache, good), **_entry_members(cache, tampered)}
    members[f"{tampered.digest}/kernel.py"] = b"import os  # not what was verified\n"
    members["notes.txt"] = b"stray"
    archive = tmp_path / "mixed.tar.gz"
    _tar_with(archive, members)

    fresh = KernelCache(tmp_path / "fresh", seed_dir=None)
    report = fresh.import_(archive)
    assert report.imported == (good.digest,)
    rejected = dict(report.rejected)
    assert "kernel.py does not match" in rejected[tampered.digest]
    assert "notes.txt" in rejected and not report.ok
    assert fresh.get(tampered.key) is None and fresh.get(good.key) == good


# -- CLI -----------------------------------------------------------------------------------------


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.fixture
def cli_cache(tmp_path: Path) -> tuple[KernelCache, list[str]]:
    """A user cache with two entries and a seed with one, plus the CLI options that select them."""
    seed_dir = tmp_path / "seed"
    seed_dir.mkdir()
    copy_to_seed(make_entry(10, kind=EntryKind.INDUCTOR), seed_dir, tmp_path)
    cache = KernelCache(tmp_path / "cache", seed_dir=seed_dir)
    cache.put(make_entry(0))
    cache.put(make_entry(1, kind=EntryKind.INDUCTOR))
    return cache, ["--cache-dir", str(cache.cache_dir), "--seed-dir", str(seed_dir)]


def test_cli_ls(capsys: pytest.CaptureFixture[str], cli_cache: tuple[KernelCache, list[str]]) -> None:
    cache, opts = cli_cache
    code, out, _ = run_cli(capsys, "cache", "ls", *opts)
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split()[:3] == ["DIGEST", "KIND", "SOURCE"]
    kernel = make_entry(0)
    row = next(line for line in lines if line.startswith(kernel.digest[:12]))
    assert row.split()[1:4] == ["kernel", "user", "2.00x"] and "add.Tensor, relu" in row
    assert any(line.startswith(make_entry(10).digest[:12]) and " seed " in line for line in lines)

    # global options before the command, the cache group's --seed-dir before the action
    code, out, _ = run_cli(capsys, *opts[:2], "cache", *opts[2:], "ls", "--json")
    assert code == 0
    listed = json.loads(out)
    assert {(item["digest"], item["source"]) for item in listed} == {
        (make_entry(0).digest, "user"),
        (make_entry(1).digest, "user"),
        (make_entry(10).digest, "seed"),
    }

    code, out, _ = run_cli(capsys, "cache", "ls", "--cache-dir", str(cache.cache_dir), "--no-seed")
    assert code == 0 and make_entry(10).digest[:12] not in out


def test_cli_show(capsys: pytest.CaptureFixture[str], cli_cache: tuple[KernelCache, list[str]]) -> None:
    _, opts = cli_cache
    entry = make_entry(0)
    code, out, _ = run_cli(capsys, "cache", "show", entry.digest[:10], *opts)
    assert code == 0
    assert f"entry {entry.digest}" in out and '"graph": "graph-0000"' in out
    assert "kevin-32b/best-of-4/v0" in out
    assert "--- task.py ---" in out and "def get_inputs" in out
    assert "--- kernel.py ---" in out and "class ModelNew" in out

    code, out, _ = run_cli(capsys, "cache", "show", make_entry(10).digest, *opts)
    assert code == 0 and "seed cache" in out and "--- kernel.py ---" not in out


def _shared_prefix_digests(count: int = 17) -> tuple[str, list[CacheEntry]]:
    """Entries of which at least two share a first hex digit (pigeonhole: 17 > 16)."""
    entries = [make_entry(n) for n in range(100, 100 + count)]
    firsts = [e.digest[0] for e in entries]
    return next(ch for ch in firsts if firsts.count(ch) > 1), entries


def test_cli_prefix_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    prefix, entries = _shared_prefix_digests()
    cache = KernelCache(tmp_path / "cache", seed_dir=None)
    for entry in entries:
        cache.put(entry)
    opts = ["--cache-dir", str(cache.cache_dir), "--no-seed"]

    code, _, err = run_cli(capsys, "cache", "show", prefix, *opts)
    assert code == 2 and "ambiguous" in err
    code, _, err = run_cli(capsys, "cache", "rm", prefix, *opts)
    assert code == 2 and "ambiguous" in err
    assert len(cache.entries()) == len(entries)  # nothing removed

    hex_pairs = (f"{a}{b}" for a in "0123456789abcdef" for b in "0123456789abcdef")
    unknown_prefix = next(p for p in hex_pairs if not any(e.digest.startswith(p) for e in entries))
    code, _, err = run_cli(capsys, "cache", "show", unknown_prefix, *opts)
    assert code == 2 and "no cache entry matches" in err
    code, _, err = run_cli(capsys, "cache", "show", "xyz", *opts)
    assert code == 2 and "not a digest prefix" in err


def test_cli_rm(capsys: pytest.CaptureFixture[str], cli_cache: tuple[KernelCache, list[str]]) -> None:
    cache, opts = cli_cache
    kernel, inductor, seed = make_entry(0), make_entry(1), make_entry(10, kind=EntryKind.INDUCTOR)
    code, out, _ = run_cli(capsys, "cache", "rm", kernel.digest[:8], inductor.digest[:8], *opts)
    assert code == 0 and f"removed {kernel.digest}" in out and f"removed {inductor.digest}" in out
    assert cache.get(kernel.key) is None and cache.get(inductor.key) is None

    # a seed entry cannot be removed: a usage error (exit 2, as the README says of `kevin: error:`
    # lines), said before anything is removed
    remaining = make_entry(2)
    cache.put(remaining)
    code, _, err = run_cli(capsys, "cache", "rm", remaining.digest[:8], seed.digest[:8], *opts)
    assert code == 2 and err.count("\n") == 1 and "read-only seed cache" in err and "--no-seed" in err
    assert cache.get(seed.key) == seed and cache.get(remaining.key) == remaining


def test_cli_clear(capsys: pytest.CaptureFixture[str], cli_cache: tuple[KernelCache, list[str]]) -> None:
    cache, opts = cli_cache
    code, _, err = run_cli(capsys, "cache", "clear", *opts)
    assert code == 2 and "--yes" in err
    assert len([i for i in cache.entries() if i.source == "user"]) == 2
    code, out, _ = run_cli(capsys, "cache", "clear", "--yes", *opts)
    assert code == 0 and "removed 2 entries" in out
    assert [info.source for info in cache.entries()] == ["seed"]


def test_cli_export_import(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], cli_cache: tuple[KernelCache, list[str]]
) -> None:
    cache, opts = cli_cache
    archive = tmp_path / "out.tar.gz"
    code, out, _ = run_cli(capsys, "cache", "export", str(archive), *opts)
    assert code == 0 and "exported 2 entries" in out

    fresh = ["--cache-dir", str(tmp_path / "fresh"), "--no-seed"]
    code, out, _ = run_cli(capsys, "cache", "import", str(archive), *fresh)
    assert code == 0 and "imported 2 entries" in out
    fresh_cache = KernelCache(tmp_path / "fresh", seed_dir=None)
    assert fresh_cache.get(make_entry(0).key) == make_entry(0)

    code, out, _ = run_cli(capsys, "cache", "import", str(archive), *fresh)
    assert code == 0 and "skipped 2 entries" in out
    code, out, _ = run_cli(capsys, "cache", "import", str(archive), "--replace", *fresh)
    assert code == 0 and "imported 2 entries" in out

    one = tmp_path / "seed-one.tar.gz"
    code, out, _ = run_cli(capsys, "cache", "export", str(one), make_entry(10).digest[:6], *opts)
    assert code == 0 and "exported 1 entries" in out

    evil = tmp_path / "evil.tar.gz"
    _tar_with(evil, {"../evil.py": b"x"})
    code, _, err = run_cli(capsys, "cache", "import", str(evil), *fresh)
    assert code == 1 and "outside the archive" in err
    code, _, err = run_cli(capsys, "cache", "import", str(tmp_path / "missing.tar.gz"), *fresh)
    assert code == 2 and "no such file" in err  # a path that is not there: a usage error


def test_cli_usage_errors(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    opts = ["--cache-dir", str(tmp_path / "cache"), "--no-seed"]
    assert run_cli(capsys, "cache", "frobnicate", *opts)[0] == 2
    assert run_cli(capsys, "cache", *opts)[0] == 2
    assert run_cli(capsys)[0] == 2
    assert run_cli(capsys, "--help")[0] == 0
    code, out, _ = run_cli(capsys, "cache", "ls", *opts)
    assert code == 0 and "no cache entries" in out
