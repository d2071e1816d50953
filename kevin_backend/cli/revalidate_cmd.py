"""`kevin cache revalidate [--all | DIGEST_PREFIX...] [--dry-run] [--jobs N] [--json FILE]`: make kernels
verified under another torch, CUDA or GPU usable here by judging them again here.

A key names the environment its kernel was verified under, so after a torch upgrade every entry
(the seed cache's too) is a miss. Each kernel entry made for another environment is judged here
as a known candidate (`generate/revalidation.py`: the normal judge, then the generator's decision
against this Inductor) and, when kept, stored under this environment's key in the user cache; the
old entry stays. Rows: kept, dropped (wrong here, or not faster than this Inductor: nothing
stored), failed (the judge's own failure, RESOURCE or INFRA: no verdict, nothing stored), skipped
(nothing to judge, or already revalidated). `--jobs N` entries are judged side by side (one judge
with N workers): their builds, correctness runs and Inductor compiles overlap, while their timings
and re-timings hold the GPU alone in turn (the judge's GPU lock); entries that would get the same
key here go one after another, so the first kept wins.

Exit codes: 0 it ran (whatever was dropped), 2 usage error, and without a CUDA GPU a usage error
before anything starts, unless --dry-run, which lists what would be judged and why (the version
differences) on any machine.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kevin_backend.cli.cache_access import cache_errors, resolve_prefix, table
from kevin_backend.cli.main import EXIT_OK, EXIT_USAGE, CommandError, require_cuda
from kevin_backend.config import Config

if TYPE_CHECKING:  # torch, the cache and the judge are imported when the action runs
    from kevin_backend.cache.format import CacheEntry
    from kevin_backend.cache.key import CacheKey, DeviceInfo
    from kevin_backend.cache.store import KernelCache
    from kevin_backend.generate.judging import Judging, Retimer

__all__ = ["add_parser", "Revalidator", "gpu_revalidator"]

_HELP = """\
Judge again, on this machine, the kernels the cache holds for another torch version, CUDA
version or GPU (the seed cache's too), so that they can be used here: each is built against this
torch, checked for correctness on this GPU and re-timed against this Inductor by the rule the
generator uses (kept only when correct and faster beyond the noise). A kept kernel is stored in
the user cache under this machine's key; the old entry stays. Dropped kernels (wrong here, or not
faster) and failed ones (the judge's own failure: no verdict) store nothing.

Without arguments: every kernel entry made for another environment that has no entry here yet.
--all: every kernel entry, this environment's too (a kept one replaces the entry here). DIGEST
PREFIX: those entries (prefixes as `kevin cache ls` lists them). Needs a CUDA GPU, except
--dry-run, which lists what would be judged and why.
"""


def add_parser(actions: argparse._SubParsersAction, common: list[argparse.ArgumentParser]) -> None:
    """Add `revalidate` to the `kevin cache` actions."""
    p = actions.add_parser(
        "revalidate", parents=common, formatter_class=argparse.RawDescriptionHelpFormatter, description=_HELP,
        help="judge kernels made for another torch/CUDA/GPU again here and keep those still correct and faster")
    p.add_argument("prefixes", metavar="DIGEST_PREFIX", nargs="*", help="entries to judge again (default: see above)")
    p.add_argument("--all", action="store_true", help="every kernel entry, this environment's too")
    p.add_argument("--dry-run", action="store_true", help="list what would be judged and why; judge nothing (no GPU needed)")
    p.add_argument("--jobs", type=int, default=4, metavar="N",
                   help="entries judged side by side: builds and compiles overlap, timings take turns (default 4)")
    p.add_argument("--json", type=Path, metavar="FILE", help="also write the rows as JSON to FILE")
    p.set_defaults(handler=_revalidate)


@dataclass(frozen=True)
class Revalidator:
    """What judges here: the judge, its re-timer, the environment keys are made for, the margin."""

    judge: Judging
    retime: Retimer | None
    device: DeviceInfo
    margin: float

    def close(self) -> None:
        close = getattr(self.judge, "close", None)
        if close is not None:
            close()


_NEEDS_GPU = "revalidating kernels judges them on a CUDA GPU (--dry-run lists what would be judged without one)"


def gpu_revalidator(config: Config, jobs: int = 1) -> Revalidator:
    """The judge on this machine's current GPU (`jobs` sandboxed workers, the cache's build folder),
    its sandboxed re-timer, and the configured margin. Without a CUDA GPU: a usage error, before
    anything is read or started."""
    require_cuda(_NEEDS_GPU)
    from kevin_backend.cache.key import DeviceInfo
    from kevin_backend.config import build_root
    from kevin_backend.judge.decide import SandboxRetimer
    from kevin_backend.judge.judge import Judge

    judge = Judge(build_root(config.cache_dir), workers=jobs)
    return Revalidator(judge, SandboxRetimer.for_judge(judge), DeviceInfo.detect("cuda"), config.margin)


@dataclass(frozen=True)
class _Planned:
    """An entry considered: the key it would get here, how the environments differ, and why it is
    skipped ("" when it is to be judged)."""

    entry: CacheEntry
    source: str
    key: CacheKey
    changes: tuple[str, ...]
    skip: str = ""
    key_known: bool = True  # False on a dry run without a GPU: the key here depends on the GPU


def _revalidate(args: argparse.Namespace, config: Config) -> int:
    if args.all and args.prefixes:
        raise CommandError("give --all or DIGEST_PREFIX..., not both", EXIT_USAGE)
    if args.jobs < 1:
        raise CommandError(f"--jobs must be at least 1, not {args.jobs}", EXIT_USAGE)
    if args.json is not None and not args.json.parent.is_dir():
        raise CommandError(f"--json: no such folder {args.json.parent}", EXIT_USAGE)
    if not args.dry_run:  # in the first second, before the cache (and torch) is opened
        require_cuda(_NEEDS_GPU)
    return cache_errors(lambda a, cache: _run(a, cache, config))(args, config)


def _here(dry_run: bool, config: Config, jobs: int) -> tuple[Revalidator | None, DeviceInfo, bool]:
    """(the revalidator or None for a dry run, this environment, whether its GPU is known)."""
    if not dry_run:
        revalidator = gpu_revalidator(config, jobs)
        return revalidator, revalidator.device, True
    from kevin_backend.cache.key import DeviceInfo

    device = DeviceInfo.detect("cuda")
    return None, device, device.capability != ""


def _plan(cache: KernelCache, args: argparse.Namespace, device: DeviceInfo, gpu_known: bool) -> list[_Planned]:
    """The entries to judge, and those skipped with their reason, user entries first."""
    from kevin_backend.cache.format import EntryKind
    from kevin_backend.cache.key import SCHEMA_VERSION, DeviceInfo, environment_changes

    infos = cache.entries()
    named = {resolve_prefix(infos, prefix) for prefix in args.prefixes}
    seen: set[str] = set()
    planned = []
    for info in infos:
        entry = info.entry
        if entry is None or info.digest in seen or (named and info.digest not in named):
            continue
        seen.add(info.digest)
        here = device
        if not gpu_known:  # no GPU visible (a dry run): the GPU is not compared, nor a CUDA this torch lacks
            here = DeviceInfo(entry.key.gpu, entry.key.capability, device.torch_version,
                              device.cuda_version or entry.key.cuda_version)
        key = entry.key.on_device(here)
        changes = environment_changes(entry.key, key)
        skip = ""
        if entry.kind is not EntryKind.KERNEL:
            if not named:
                continue
            skip = "an Inductor decision: no kernel to judge"
        elif entry.key.schema != SCHEMA_VERSION:
            skip = f"key schema {entry.key.schema}: this kevin_backend reads {SCHEMA_VERSION}"
        elif not named and not args.all:
            if not changes:
                continue
            if cache.get(key) is not None:
                skip = f"already here as {key.digest[:12]}"
        planned.append(_Planned(entry, info.source, key, changes, skip, gpu_known))
    return planned


def _run(args: argparse.Namespace, cache: KernelCache, config: Config) -> int:
    revalidator, device, gpu_known = _here(args.dry_run, config, args.jobs)
    try:
        planned = _plan(cache, args, device, gpu_known)
        print(f"this machine: {_describe(device, gpu_known)}")
        if args.dry_run:
            rows = [_dry_row(item) for item in planned]
        else:
            assert revalidator is not None
            rows = _judge_all(cache, planned, revalidator, args.jobs)
    finally:
        if revalidator is not None:
            revalidator.close()
    _print_rows(rows, args.dry_run)
    if args.json is not None:
        args.json.write_text(json.dumps({"machine": _describe(device, gpu_known), "dry_run": args.dry_run,
                                         "rows": rows}, indent=2) + "\n")
    return EXIT_OK


def _describe(device: DeviceInfo, gpu_known: bool) -> str:
    gpu = f"{device.name} ({device.capability})" if gpu_known else "no GPU visible (GPUs not compared)"
    cuda = f"CUDA {device.cuda_version}" if device.cuda_version else "torch built without CUDA"
    return f"{gpu}, torch {device.torch_version}, {cuda}"


def _row(item: _Planned, result: str, reason: str, **more: Any) -> dict[str, Any]:
    return {"digest": item.entry.digest, "source": item.source, "key": item.key.digest if item.key_known else None,
            "result": result,
            "reason": reason, "changes": list(item.changes), "speedup_vs_inductor": None, **more}


def _dry_row(item: _Planned) -> dict[str, Any]:
    if item.skip:
        return _row(item, "skipped", item.skip)
    return _row(item, "would judge", ", ".join(item.changes) or "the same environment")


def _judge_all(cache: KernelCache, planned: list[_Planned], revalidator: Revalidator, jobs: int = 1) -> list[dict[str, Any]]:
    """Judge the planned entries, `jobs` at a time (a progress line as each starts and ends on
    stderr), and store the kept ones; the rows, in the plan's order. Entries that get the same key
    here are judged in turn by one job: once one is kept, the rest are skipped."""
    import concurrent.futures
    import threading

    from kevin_backend.bench.progress import Progress

    progress = Progress(sum(1 for item in planned if not item.skip), stream=sys.stderr,
                        enabled=any(not item.skip for item in planned))
    shared = threading.Lock()  # the progress lines and the cache's writes
    rows: dict[int, dict[str, Any]] = {}
    groups: dict[str, list[int]] = {}
    for index, item in enumerate(planned):
        if item.skip:
            rows[index] = _row(item, "skipped", item.skip)
        else:
            groups.setdefault(item.key.digest, []).append(index)

    def judge_group(indices: list[int]) -> None:
        kept = False
        for index in indices:
            rows[index] = _judge_one(cache, planned[index], revalidator, progress, shared, kept)
            kept = kept or rows[index]["result"] == "kept"

    with concurrent.futures.ThreadPoolExecutor(max(1, min(jobs, len(groups)))) as threads:
        for done in [threads.submit(judge_group, indices) for indices in groups.values()]:
            done.result()
    return [rows[index] for index in range(len(planned))]


def _judge_one(cache: KernelCache, item: _Planned, revalidator: Revalidator, progress: Any, shared: Any,
               kept_already: bool) -> dict[str, Any]:
    from kevin_backend.generate.revalidation import KEPT, revalidate

    label = f"{item.entry.digest[:12]} ({item.entry.task.name})"
    if kept_already:  # another environment's kernel for the same task was kept already
        with shared:
            progress.finish(label, "skipped")
        return _row(item, "skipped", f"already kept here as {item.key.digest[:12]}")
    with shared:
        progress.start(label)
    outcome = revalidate(item.entry, item.key, revalidator.judge, revalidator.retime, revalidator.margin)
    with shared:
        if outcome.outcome == KEPT and outcome.entry is not None:
            cache.put(outcome.entry, replace=True)
        progress.finish(label, outcome.outcome)
    return _row(item, outcome.outcome, outcome.reason, judge_reason=outcome.judge_reason or None,
                speedup_vs_inductor=outcome.speedup_vs_inductor, seconds=round(outcome.seconds, 3))


def _print_rows(rows: list[dict[str, Any]], dry_run: bool) -> None:
    if not rows:
        print("nothing to revalidate: every kernel entry was made for this environment or has an entry here")
        return
    header = ["DIGEST", "SOURCE", "NEW KEY", "RESULT", "VS INDUCTOR", "REASON"]
    lines = [header]
    for row in rows:
        speedup = row["speedup_vs_inductor"]
        lines.append([row["digest"][:12], row["source"], (row["key"] or "?")[:12], row["result"],
                      "-" if speedup is None else f"{speedup:.2f}x", row["reason"]])
    print(table(lines))
    counts: dict[str, int] = {}
    for row in rows:
        counts[row["result"]] = counts.get(row["result"], 0) + 1
    order = ("would judge", "skipped") if dry_run else ("kept", "dropped", "failed", "skipped")
    print(", ".join(f"{counts.get(name, 0)} {name}" for name in order))
