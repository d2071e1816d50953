"""`kevin prewarm`: fill the kernel cache offline, so no training job waits for kernels.

Sources (any together; the recorded pending tasks when none is given):
  --pending            the misses `cache`-mode runs recorded
  --model FILE:FACTORY the factory returns (model, example_inputs); compiled for inference and a
                       training step in `cache` mode, its misses are the work
  --bench-model NAME   a model of `kevin bench` (mlp, cnn, gpt2, llama, or all), its inference
                       and training step exactly as the bench runs them
  --kernelbench DIR    a folder of KernelBench-format tasks as `kevin bench --kernelbench` runs
                       them: each task's Model compiled, its partitions the work
  --tasks DIR          a folder of KernelBench-format tasks, each task whole

The generator runs on every task, `--per-gpu` workers per local GPU (or `--workers` without
GPUs; builds overlap, timings take turns on each GPU), or on a Ray cluster (`--ray ADDRESS`). Each decision is stored as its task finishes; a task with an
entry is skipped, so a killed run resumes where it stopped.

Exit codes: 0 every task decided, 1 some failed, 2 usage error.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from kevin_backend.cli.main import EXIT_FAILED, EXIT_OK, EXIT_USAGE, CommandError
from kevin_backend.config import Config

__all__ = ["register"]


def register(subparsers: argparse._SubParsersAction, parents: list[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser("prewarm", parents=parents, help="fill the kernel cache offline (all local GPUs or a Ray cluster)")
    p.add_argument("--pending", action="store_true", help="the pending tasks recorded by cache-mode runs (default when no source)")
    p.add_argument("--model", action="append", default=[], metavar="FILE.py:FACTORY", help="a model factory (repeatable)")
    p.add_argument("--bench-model", action="append", default=[], metavar="NAME",
                   help="a model of kevin bench: mlp, cnn, gpt2, llama or all (repeatable; inference and training step)")
    p.add_argument("--bench-size", choices=("full", "tiny"), default="full", help="size of the bench models (default: full)")
    p.add_argument("--kernelbench", action="append", default=[], type=Path, metavar="DIR",
                   help="a folder of KernelBench tasks, each Model compiled as kevin bench --kernelbench runs it (repeatable)")
    p.add_argument("--tasks", action="append", default=[], type=Path, metavar="DIR", help="a folder of KernelBench tasks, each task whole (repeatable)")
    p.add_argument("--no-train", action="store_true", help="with --model: inference graphs only, no training step")
    p.add_argument("--policy", help="the kernel writer (default: KEVIN_POLICY, auto)")
    p.add_argument("--generator", metavar="MODULE:FACTORY", help="your own KernelGenerator factory instead of the search")
    p.add_argument("--trajectories", type=int)
    p.add_argument("--turns", type=int)
    p.add_argument("--beam", type=int)
    p.add_argument("--gpus", default="all", help="GPU indices to use, e.g. 0,1 (default: all)")
    p.add_argument("--per-gpu", type=int, default=4, metavar="N",
                   help="tasks in flight per GPU: their builds overlap, their timings take turns (default 4)")
    p.add_argument("--workers", type=int, default=1, help="workers on a machine without GPUs (default 1)")
    p.add_argument("--ray", metavar="ADDRESS", help="run on a Ray cluster (e.g. auto, or ray://host:10001)")
    p.add_argument("--force", action="store_true", help="generate again for tasks that already have an entry")
    p.add_argument("--json", type=Path, help="also write the summary here")
    p.set_defaults(handler=_prewarm)


def _gpus(spec: str) -> list[int | None]:
    import torch

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if spec == "all":
        return list(range(count))
    try:
        wanted = [int(x) for x in spec.split(",") if x.strip()]
    except ValueError:
        raise CommandError(f"--gpus expects indices like 0,1 or 'all', got {spec!r}", EXIT_USAGE) from None
    missing = [g for g in wanted if g >= count]
    if missing:
        raise CommandError(f"--gpus names GPU(s) {missing}, but this machine has {count}", EXIT_USAGE)
    return list(wanted)


def _prewarm(args: argparse.Namespace, config: Config) -> int:
    from kevin_backend.cache.store import KernelCache
    from kevin_backend.prewarm.runner import format_summary, prewarm_local, print_progress
    from kevin_backend.bench.models import MODELS
    from kevin_backend.prewarm.sources import SourceError, from_bench, from_folder, from_kernelbench, from_model, from_pending

    if args.policy:
        config = Config(**{**config.__dict__, "policy": args.policy})
    cache = KernelCache.from_config(config)
    items = []
    try:
        for spec in args.model:
            items += from_model(spec, config, cache, train=not args.no_train)
        names = [n for spec in args.bench_model for n in (MODELS if spec == "all" else spec.split(","))]
        for name in dict.fromkeys(names):
            items += from_bench(name, config, cache, train=not args.no_train, size=args.bench_size)
        for folder in args.kernelbench:
            items += from_kernelbench(folder, config, cache)
        for folder in args.tasks:
            items += from_folder(folder, cache)
        if args.pending or not (args.model or args.bench_model or args.kernelbench or args.tasks):
            items += from_pending(cache)
    except SourceError as exc:
        raise CommandError(str(exc), EXIT_USAGE) from exc
    unique = {item.digest: item for item in items}
    todo = []
    finished = 0
    for item in unique.values():
        if cache.get(item.key) is not None and not args.force:
            finished += 1
            cache.remove_pending(item.digest)
            continue
        cache.record_pending(item.key, item.task)
        todo.append(item)
    search: dict[str, Any] | None = None
    if args.trajectories or args.turns or args.beam:
        search = {"trajectories": args.trajectories or config.trajectories, "turns": args.turns or config.turns,
                  "beam": args.beam or None}
    setup = {"cache_dir": str(config.cache_dir), "policy": config.policy if isinstance(config.policy, str) else "auto",
             "generator": args.generator, "search": search}
    where = f"Ray cluster {args.ray}" if args.ray else None
    gpus: list[int | None] = [] if args.ray else _gpus(args.gpus)
    if not args.ray and not gpus:
        gpus = [None] * max(1, args.workers)
        where = f"{len(gpus)} worker(s) without a GPU"
    if args.per_gpu < 1:
        raise CommandError(f"--per-gpu must be at least 1, got {args.per_gpu}", EXIT_USAGE)
    if gpus and gpus[0] is not None:
        where = f"GPU(s) {', '.join(str(g) for g in gpus)}, {args.per_gpu} task(s) in flight on each"
        gpus = [g for g in gpus for _ in range(args.per_gpu)]
    print(f"kevin prewarm: {len(unique)} task(s), {finished} finished before, {len(todo)} to do on {where}; "
          f"cache {config.cache_dir}", file=sys.stderr)
    if args.ray:
        from kevin_backend.prewarm.ray_runner import prewarm_ray

        summary = prewarm_ray(todo, setup, args.ray, cache, workers=args.workers, progress=print_progress)
    else:
        summary = prewarm_local(todo, setup, gpus, progress=print_progress)
    summary.skipped += finished
    print(format_summary(summary))
    if args.json:
        args.json.write_text(json.dumps(summary.as_dict(), indent=1, default=str))
    return EXIT_FAILED if summary.failures else EXIT_OK
