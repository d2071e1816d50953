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
  --revisit            the "Inductor wins" decisions for this machine's GPU, made again (with
                       --revisit-before DATE: those made before it); the new decision replaces
                       the old one, and a search the judge could not finish leaves it in place

The generator runs on every task, `--per-gpu` workers per local GPU (or `--workers` without
GPUs; builds overlap, timings take turns on each GPU), or on a Ray cluster (`--ray ADDRESS`). Each decision is stored as its task finishes; a task with an
entry is skipped, so a killed run resumes where it stopped.

With `--budget 30m` the run is profile-guided (`prewarm/profile.py`): each partition's Inductor
code is timed once, the partitions are searched in order of expected gain (the share of the
model's time times the distance from the roofline) until the budget is spent, the rest stay
pending, and a table gives each partition's expected and measured gain and the model's totals.
With the built-in writer, its searches' first programs are built in the background meanwhile.

Every argument is checked first (the policy's name, the generator's module and factory, the
files and folders, the counts), so a usage error is one line and nothing has been compiled yet.
The search judges on a GPU: without `--ray` or `--generator`, a machine without CUDA is refused
the same way. On a machine without GPUs, `--workers` run a `--generator` that needs none.

Exit codes: 0 every task decided, 1 some failed, 2 usage error.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

from kevin_backend.cli.main import EXIT_FAILED, EXIT_OK, EXIT_USAGE, CommandError, require_cuda
from kevin_backend.config import Config

__all__ = ["register"]


def register(subparsers: argparse._SubParsersAction, parents: list[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "prewarm", parents=parents, help="fill the kernel cache offline (all local GPUs or a Ray cluster)",
        description="Fill the kernel cache offline, so no training job waits for kernels: search for a kernel for "
                    "each task the sources give (the misses cache-mode runs recorded, the partitions of a model or a "
                    "bench model, KernelBench folders, decisions to revisit) on this machine's GPUs or a Ray cluster, each decision stored "
                    "as its task finishes (a killed run resumes where it stopped). On local GPUs, a kernel the cache "
                    "holds for the same task under another torch, CUDA or GPU is judged again first; kept, no search runs.",
    )
    p.add_argument("--pending", action="store_true", help="the pending tasks recorded by cache-mode runs (default when no source)")
    p.add_argument("--model", action="append", default=[], metavar="FILE.py:FACTORY", help="a model factory (repeatable)")
    p.add_argument("--bench-model", action="append", default=[], metavar="NAME",
                   help="a model of kevin bench: mlp, cnn, gpt2, llama or all (repeatable; inference and training step)")
    p.add_argument("--bench-size", choices=("full", "small", "tiny"), default="full",
                   help="size of the bench models: full, small (the same layers at a small batch) or tiny (default: full)")
    p.add_argument("--bench-dtype", default="float32,bfloat16", metavar="LIST",
                   help="comma-separated dtypes of the bench models: float32, bfloat16, float16 (default: float32,bfloat16, "
                        "as kevin bench runs them; each dtype's partitions are tasks of their own)")
    p.add_argument("--kernelbench", action="append", default=[], type=Path, metavar="DIR",
                   help="a folder of KernelBench tasks, each Model compiled as kevin bench --kernelbench runs it (repeatable)")
    p.add_argument("--tasks", action="append", default=[], type=Path, metavar="DIR", help="a folder of KernelBench tasks, each task whole (repeatable)")
    p.add_argument("--no-train", action="store_true", help="with --model: inference graphs only, no training step")
    p.add_argument("--policy", help="the kernel writer (default: KEVIN_POLICY, auto)")
    p.add_argument("--generator", metavar="MODULE:FACTORY", help="your own KernelGenerator factory instead of the search")
    p.add_argument("--trajectories", type=int, metavar="N", help="parallel trajectories per task (default: KEVIN_TRAJECTORIES, 16)")
    p.add_argument("--turns", type=int, metavar="N", help="refinement turns per trajectory (default: KEVIN_TURNS, 8)")
    p.add_argument("--beam", type=int, metavar="K", help="keep the best K trajectories after each turn (default: KEVIN_BEAM; 0: none)")
    p.add_argument("--gpus", default="all", help="GPU indices to use, e.g. 0,1 (default: all)")
    p.add_argument("--per-gpu", type=int, default=4, metavar="N",
                   help="tasks in flight per GPU: their builds overlap, their timings take turns (default 4)")
    p.add_argument("--workers", type=int, default=1, help="workers on a machine without GPUs, for a --generator that needs none (default 1)")
    p.add_argument("--ray", metavar="ADDRESS", help="run on a Ray cluster (e.g. auto, or ray://host:10001)")
    p.add_argument("--force", action="store_true", help="generate again for tasks that already have an entry")
    p.add_argument("--revisit", action="store_true",
                   help="decide again every \"Inductor wins\" entry (user cache and seed) for this machine's GPU")
    p.add_argument("--revisit-before", metavar="YYYY-MM-DD",
                   help="with --revisit: only decisions made before this date")
    p.add_argument("--budget", metavar="DURATION",
                   help="profile-guided: time each partition's Inductor code once, search the partitions in order of "
                        "expected gain (share of the model's time x distance from the roofline) until DURATION "
                        "(e.g. 30m, 90s, 1.5h) is spent, and end with a table of expected and measured gains")
    p.add_argument("--json", type=Path, help="also write the summary here")
    p.set_defaults(handler=_prewarm)


def _gpus(spec: str) -> list[int | None]:
    import torch

    wanted = _gpu_indices(spec)
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if wanted is None:
        return list(range(count))
    missing = [g for g in wanted if g >= count]
    if missing:
        raise CommandError(f"--gpus names GPU(s) {missing}, but this machine has {count}", EXIT_USAGE)
    return list(wanted)


def _gpu_indices(spec: str) -> list[int] | None:
    """`--gpus` read without looking at the GPUs: None for all, else the indices."""
    if spec == "all":
        return None
    try:
        wanted = [int(x) for x in spec.split(",") if x.strip()]
    except ValueError:
        wanted = []
    if not wanted or any(g < 0 for g in wanted):
        raise CommandError(f"--gpus expects indices like 0,1 or 'all', got {spec!r}", EXIT_USAGE)
    return wanted


def _check_numbers(args: argparse.Namespace, config: Config) -> None:
    """Counts that must be >= 1 (a 0 is refused, not taken for the default)."""
    for flag, value, least in (("--per-gpu", args.per_gpu, 1), ("--workers", args.workers, 1),
                               ("--trajectories", args.trajectories, 1), ("--turns", args.turns, 1),
                               ("--beam", args.beam, 0)):
        if value is not None and value < least:
            raise CommandError(f"{flag} must be at least {least}, got {value}", EXIT_USAGE)
    trajectories = args.trajectories if args.trajectories is not None else config.trajectories
    if args.beam and args.beam > trajectories:
        raise CommandError(f"--beam ({args.beam}) must not exceed the trajectories ({trajectories})", EXIT_USAGE)


def _top_level_names(path: Path) -> set[str] | None:
    """The names a Python file binds at its top level (read, not run); None when that cannot be
    told from the text (a star import, a module __getattr__, a file that does not parse)."""
    import ast

    try:
        tree = ast.parse(path.read_text(encoding="utf-8", errors="replace"))
    except (OSError, SyntaxError, ValueError):
        return None
    names: set[str] = set()
    statements = list(tree.body)
    while statements:
        node = statements.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                if alias.name == "*":
                    return None
                names.add(alias.asname or alias.name.split(".")[0])
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
        elif isinstance(node, (ast.If, ast.Try, ast.With, ast.For, ast.While)):
            for field in ("body", "orelse", "finalbody"):
                statements.extend(getattr(node, field, []) or [])
            statements.extend(s for h in getattr(node, "handlers", []) for s in h.body)
    return None if "__getattr__" in names else names


def _check_model_spec(spec: str) -> None:
    path_text, _, name = spec.rpartition(":")
    path = Path(path_text)
    if not path_text or not name or not path.is_file():
        raise CommandError(f"--model expects FILE.py:FACTORY with an existing file, got {spec!r}", EXIT_USAGE)
    names = _top_level_names(path)
    if names is not None and name not in names:
        raise CommandError(f"--model {spec}: {path} defines no {name!r}", EXIT_USAGE)


def _check_generator(spec: str, local: bool) -> None:
    """`--generator MODULE:FACTORY`, found where the local workers will import it (they run in this
    folder with this environment: the current folder, PYTHONPATH, the installed packages), without
    importing it. On a Ray cluster only its form is checked: the workers' import path is theirs."""
    import importlib.machinery
    import importlib.util
    import os

    module_name, _, factory = spec.partition(":")
    if not module_name or not factory or not all(part.isidentifier() for part in module_name.split(".")) \
            or not factory.isidentifier():
        raise CommandError(f"--generator expects MODULE:FACTORY (e.g. my_generators:make), got {spec!r}", EXIT_USAGE)
    if not local:
        return
    from kevin_backend.config import child_env

    worker_path = child_env().get("PYTHONPATH", "")  # the workers' environment is this one
    search = [os.getcwd(), *[p for p in worker_path.split(os.pathsep) if p], *sys.path]
    found = None
    parts = module_name.split(".")
    locations: list[str] | None = search
    for i in range(len(parts)):
        found = importlib.machinery.PathFinder.find_spec(".".join(parts[: i + 1]), locations)
        if found is None:
            break
        locations = list(found.submodule_search_locations or [])
    if found is None:
        try:  # a module other finders provide (already imported, frozen, a zip)
            found = importlib.util.find_spec(module_name)
        except (ImportError, ValueError):
            found = None
    if found is None:
        raise CommandError(f"--generator {spec}: no module {module_name!r} where the workers import from "
                           f"(this folder, PYTHONPATH, the installed packages)", EXIT_USAGE)
    origin = found.origin
    if origin and origin.endswith(".py"):
        names = _top_level_names(Path(origin))
        if names is not None and factory not in names:
            raise CommandError(f"--generator {spec}: module {module_name} ({origin}) defines no {factory!r}", EXIT_USAGE)


def _measure_models(names: list[str], args: argparse.Namespace, config: Config, gpus: list[int | None]) -> tuple[Any, ...]:
    """The bench models' steps timed as `kevin bench` times them (eager, Inductor, kevin in mode
    cache on this cache; a fresh process each), on the first worker's device."""
    from kevin_backend.bench.runs import BenchSettings, kevin_options, run_models

    device = "cuda" if gpus and gpus[0] is not None else "cpu"
    workloads = ["infer"] if args.no_train else ["infer", "train"]
    # on a GPU, enough paired rounds for an interval that tells a tie from a change
    rows: list[Any] = []
    for dtype in args.bench_dtypes:
        settings = BenchSettings(device=device, size=args.bench_size, dtype=dtype, repeats=7 if device == "cuda" else 3,
                                 trials=10 if device == "cuda" else 5, warmup=2,
                                 kevin_options={**kevin_options(config), "record_pending": False})
        print(f"kevin prewarm: timing {', '.join(names)} end to end ({device}, {dtype}, {', '.join(workloads)})", file=sys.stderr, flush=True)
        rows += run_models(names, workloads, settings)
    return tuple(rows)


def _end_to_end(before: tuple[Any, ...], after: tuple[Any, ...]) -> str:
    """Markdown: each bench model's step before and after the searches (kevin against Inductor)."""
    from kevin_backend.bench.render import interval

    def ms(value: float | None) -> str:
        return "-" if value is None else f"{value:.4f}"

    def x(value: float | None) -> str:
        return "-" if value is None else f"{value:.3f}x"

    later = {(r.model, r.workload, r.dtype): r for r in after}
    lines = ["| model | workload | dtype | Inductor ms | kevin ms before | kevin ms after | kevin x Inductor before | after "
             "| kernels run after |", "|---|---|---|---|---|---|---|---|---|"]
    for b in before:
        a = later.get((b.model, b.workload, b.dtype))
        lines.append(f"| {b.model} | {b.workload} | {b.dtype} | {ms(b.ms('inductor'))} | {ms(b.ms('kevin'))} | {ms(a.ms('kevin') if a else None)} | "
                     f"{x(b.speedup('kevin', 'inductor'))}{interval(b)} | {x(a.speedup('kevin', 'inductor') if a else None)}{interval(a)} | "
                     f"{len(a.kernels) if a else '-'} |")
    return "\n".join(lines)


def _build_first_turns(todo: list[Any], setup: dict[str, Any]) -> None:
    """With the built-in writer: the programs its searches' first turns will bring (a CUTLASS
    GEMM's, a minute or more to build), built from now on in the background, below the searches'
    own builds in priority, while the models are timed and the partitions profiled. The searches
    then find them built or building (`Judge.build_ahead`). A user's generator and a model's
    policy are left alone: their programs cannot be foreseen."""
    from kevin_backend.generate.writers import resolve_policy_name

    config = Config(cache_dir=Path(setup["cache_dir"]), policy=setup.get("policy") or "auto")
    if not todo or setup.get("generator") or resolve_policy_name(str(config.policy), config) != "builtin":
        return
    try:
        from kevin_backend.generate.kernel_generator import ForeseeingGenerator
        from kevin_backend.prewarm.gpu_worker import make_generator

        generator = make_generator(setup)  # (the workers' own: the same programs, the same build folder)
        if isinstance(generator, ForeseeingGenerator):
            generator.foresee([item.task for item in todo], [item.key for item in todo])
    except Exception as exc:  # noqa: BLE001 - each search builds its own programs anyway
        print(f"kevin prewarm: building the first turns' programs ahead failed ({type(exc).__name__}: {exc}); "
              "each search builds its own", file=sys.stderr)


def _profile_and_rank(todo: list[Any], gpus: list[int | None], budget_s: float) -> tuple[list[Any], list[Any], float]:
    """(the items in order of expected gain, their ranked profiles, the searches' deadline): each
    partition's Inductor code timed once on the first worker's device, within the budget."""
    import time

    from kevin_backend.prewarm.profile import profile_items, rank

    start = time.perf_counter()
    device = f"cuda:{gpus[0]}" if gpus and gpus[0] is not None else "cpu"

    def shown(profile: Any, done: int, total: int) -> None:
        ms = "-" if profile.inductor_ms is None else f"{profile.inductor_ms:.4f} ms"
        print(f"profile {done}/{total} {time.perf_counter() - start:.0f}s  {profile.name}: Inductor {ms}"
              f"{' x' + str(profile.occurrences) if profile.occurrences > 1 else ''}{'  ' + profile.error if profile.error else ''}",
              file=sys.stderr, flush=True)

    print(f"kevin prewarm: profiling {len(todo)} partition(s) on {device}, budget {budget_s:.0f} s", file=sys.stderr)
    ranked = rank(profile_items(todo, device, progress=shown))
    order = {p.digest: i for i, p in enumerate(ranked)}
    todo = sorted(todo, key=lambda item: order.get(item.digest, len(order)))
    print(f"kevin prewarm: profiled in {time.perf_counter() - start:.0f} s; searching in order of expected gain: "
          + ", ".join(p.name for p in ranked[:8]) + (" ..." if len(ranked) > 8 else ""), file=sys.stderr)
    return todo, ranked, start + budget_s


def _check_usage(args: argparse.Namespace, config: Config) -> Config:
    """Every argument checked before anything slow starts (a compile, a GPU check, a worker);
    the config with --policy applied."""
    from kevin_backend.bench.models import MODELS
    from kevin_backend.config import ConfigError, check_policy_name
    from kevin_backend.generate.writers import argument_problem

    _check_numbers(args, config)
    if args.budget is not None:
        from kevin_backend.prewarm.profile import parse_budget

        try:
            args.budget_seconds = parse_budget(args.budget)
        except ValueError as exc:
            raise CommandError(f"--budget: {exc}", EXIT_USAGE) from None
        if args.ray:
            raise CommandError("--budget runs on this machine's GPUs; it does not take --ray", EXIT_USAGE)
    if args.policy is not None:
        try:
            check_policy_name(args.policy)
        except ConfigError as exc:
            raise CommandError(f"--policy: {exc}", EXIT_USAGE) from None
        problem = argument_problem(args.policy)
        if problem:
            raise CommandError(f"--policy {args.policy}: {problem}", EXIT_USAGE)
        config = dataclasses.replace(config, policy=args.policy)
    if args.generator is not None:
        _check_generator(args.generator, local=not args.ray)
    for spec in args.model:
        _check_model_spec(spec)
    for spec in args.bench_model:
        unknown = [n for n in spec.split(",") if n != "all" and n not in MODELS]
        if unknown or not spec:
            raise CommandError(f"unknown bench model {', '.join(map(repr, unknown or [spec]))}; valid models: "
                               f"{', '.join(MODELS)} or all", EXIT_USAGE)
    from kevin_backend.bench.common import DTYPES

    args.bench_dtypes = list(dict.fromkeys(n.strip() for n in args.bench_dtype.split(",") if n.strip()))
    unknown = [n for n in args.bench_dtypes if n not in DTYPES]
    if unknown or not args.bench_dtypes:
        raise CommandError(f"--bench-dtype: unknown dtype {', '.join(map(repr, unknown or [args.bench_dtype]))}; "
                           f"valid dtypes: {', '.join(DTYPES)}", EXIT_USAGE)
    if args.revisit_before is not None:
        import datetime

        if not args.revisit:
            raise CommandError("--revisit-before needs --revisit", EXIT_USAGE)
        try:
            datetime.date.fromisoformat(args.revisit_before)
        except ValueError:
            raise CommandError(f"--revisit-before: not a date (YYYY-MM-DD): {args.revisit_before!r}", EXIT_USAGE) from None
    for flag, folders in (("--kernelbench", args.kernelbench), ("--tasks", args.tasks)):
        for folder in folders:
            if not folder.is_dir():
                raise CommandError(f"{flag}: no such folder: {folder}", EXIT_USAGE)
    if not args.ray:
        _gpu_indices(args.gpus)
        if args.generator is None:  # the search judges every kernel it writes on a GPU
            require_cuda("prewarming with the kernel search needs a CUDA GPU to judge kernels on "
                         "(--ray ADDRESS for a cluster's GPUs, or --generator for your own generator)")
    return config


def _prewarm(args: argparse.Namespace, config: Config) -> int:
    config = _check_usage(args, config)

    from kevin_backend.cache.store import KernelCache
    from kevin_backend.prewarm.local import format_summary, prewarm_local, print_progress
    from kevin_backend.bench.models import MODELS
    from kevin_backend.prewarm.sources import (SourceError, from_bench, from_folder, from_kernelbench, from_model, from_pending,
                                               from_revisit, machine_devices)

    gpus: list[int | None] = [] if args.ray else _gpus(args.gpus)
    cache = KernelCache.from_config(config)
    items = []
    try:
        for spec in args.model:
            items += from_model(spec, config, cache, train=not args.no_train)
        names = [n for spec in args.bench_model for n in (MODELS if spec == "all" else spec.split(","))]
        for name in dict.fromkeys(names):
            for dtype in args.bench_dtypes:
                items += from_bench(name, config, cache, train=not args.no_train, size=args.bench_size, dtype=dtype)
        for folder in args.kernelbench:
            items += from_kernelbench(folder, config, cache)
        for folder in args.tasks:
            items += from_folder(folder, cache)
        revisit = from_revisit(cache, machine_devices(), args.revisit_before) if args.revisit else []
        items += revisit
        if args.pending or not (args.model or args.bench_model or args.kernelbench or args.tasks or args.revisit):
            items += from_pending(cache)
    except SourceError as exc:
        raise CommandError(str(exc), EXIT_USAGE) from exc
    unique: dict[str, Any] = {}
    for item in items:  # a partition several sources meet: its runs per step add up
        known = unique.get(item.digest)
        unique[item.digest] = item if known is None else dataclasses.replace(
            known, occurrences=known.occurrences + item.occurrences,
            origin="revisit" if "revisit" in (known.origin, item.origin) else known.origin)
    todo = []
    finished = 0
    for item in unique.values():
        if cache.get(item.key) is not None and not args.force and item.origin != "revisit":
            finished += 1
            cache.remove_pending(item.digest)
            continue
        cache.record_pending(item.key, item.task)
        todo.append(item)
    search: dict[str, Any] | None = None
    if args.trajectories is not None or args.turns is not None or args.beam is not None:
        search = {"trajectories": args.trajectories if args.trajectories is not None else config.trajectories,
                  "turns": args.turns if args.turns is not None else config.turns,
                  "beam": (args.beam if args.beam is not None else config.beam) or None}
    setup = {"cache_dir": str(config.cache_dir), "policy": config.policy if isinstance(config.policy, str) else "auto",
             "generator": args.generator, "search": search}
    where = f"Ray cluster {args.ray}" if args.ray else None
    if not args.ray and not gpus:
        gpus = [None] * args.workers
        where = f"{len(gpus)} worker(s) without a GPU"
    if gpus and gpus[0] is not None:
        where = f"GPU(s) {', '.join(str(g) for g in gpus)}, {args.per_gpu} task(s) in flight on each"
        gpus = [g for g in gpus for _ in range(args.per_gpu)]
    print(f"kevin prewarm: {len(unique)} task(s), {finished} finished before, {len(todo)} to do on {where}; "
          f"cache {config.cache_dir}", file=sys.stderr)
    ranked = None
    if args.ray:
        from kevin_backend.prewarm.ray_cluster import prewarm_ray

        summary = prewarm_ray(todo, setup, args.ray, cache, workers=args.workers, progress=print_progress)
    elif args.budget is not None:
        bench = [n for spec in args.bench_model for n in (MODELS if spec == "all" else spec.split(","))]
        _build_first_turns(todo, setup)
        before = _measure_models(list(dict.fromkeys(bench)), args, config, gpus) if bench else ()
        todo, ranked, deadline = _profile_and_rank(todo, gpus, args.budget_seconds)
        summary = prewarm_local(todo, setup, gpus, progress=print_progress, deadline=deadline)
    else:
        summary = prewarm_local(todo, setup, gpus, progress=print_progress)
    summary.skipped += finished
    print(format_summary(summary))
    data = summary.as_dict()
    if ranked is not None:
        from kevin_backend.prewarm.profile import gain_table

        print("")
        print(gain_table(ranked, {o["digest"]: o for o in summary.outcomes if o.get("digest")}))
        data["profile"] = [dict(dataclasses.asdict(p), expected_gain_ms=p.expected_gain_ms) for p in ranked]
        if before:  # the bench models end to end, as `kevin bench` times them, with the cache as it is now
            after = _measure_models(list(dict.fromkeys(r.model for r in before)), args, config, gpus)
            print("")
            print(_end_to_end(before, after))
            data["end_to_end"] = {"before": [r.as_dict() for r in before], "after": [r.as_dict() for r in after]}
    if args.json:
        args.json.write_text(json.dumps(data, indent=1, default=str))
    return EXIT_FAILED if summary.failures else EXIT_OK
