"""`kevin bench`: eager, Inductor and kevin on benchmark models, or on a folder of KernelBench tasks.

    kevin bench                                   # mlp, cnn, gpt2, llama; infer and train; full and small
                                                  # batch; float32 and bfloat16; on CUDA
    kevin bench --models gpt2,llama --workloads train --json bench.json --chart bench.png
    kevin bench --kernelbench examples/kernelbench --json kb.json
    kevin bench --merge part1.json part2.json --json all.json --chart all.png   # a run made in parts

kevin runs in mode `cache` on the user's kernel cache (`--cache-dir`, `--no-seed` apply), so the
numbers show what the kernels already cached bring. Each model and each task runs in a fresh
process with an empty Inductor cache; times follow the judge's protocol, the three compilers
interleaved round by round and, inside a round, call by call (whole calls, the host's part included). The table goes to stdout, progress to stderr.

Exit codes: 0 everything ran (wrong kevin outputs are results, shown in the table), 1 a model or
task failed to run, 2 usage error.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import shlex
import sys
from pathlib import Path
from typing import Any

from kevin_backend.cli.main import EXIT_FAILED, EXIT_OK, EXIT_USAGE, CommandError
from kevin_backend.config import Config

__all__ = ["register"]


def register(subparsers: argparse._SubParsersAction, parents: list[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "bench", parents=parents, help="benchmark eager, Inductor and kevin on models or KernelBench tasks",
        description="Time eager, Inductor and the kevin backend (mode cache, your kernel cache) on benchmark models "
                    "(inference and a training step) or on a folder of KernelBench-format tasks.",
    )
    p.add_argument("--models", metavar="LIST", help="comma-separated: mlp, cnn, gpt2, llama (default: all; "
                   "none with --kernelbench unless given)")
    p.add_argument("--workloads", metavar="LIST", default="infer,train", help="comma-separated: infer, train (default: both)")
    p.add_argument("--repeats", type=int, default=5, metavar="N", help="rounds, the compilers alternating (default: 5)")
    p.add_argument("--trials", type=int, default=10, metavar="N", help="timed calls per round; its median counts (default: 10)")
    p.add_argument("--warmup", type=int, default=3, metavar="N", help="untimed calls before each round (default: 3)")
    p.add_argument("--warmup-rounds", type=int, default=1, metavar="N",
                   help="whole rounds run first and not counted (default: 1)")
    p.add_argument("--precision", type=float, default=0.01, metavar="F",
                   help="on a GPU, rounds go on after --repeats until kevin over Inductor's 95%% interval is within "
                        "+-F of its estimate (default: 0.01; 0: exactly --repeats rounds)")
    p.add_argument("--max-repeats", type=int, default=45, metavar="N", help="rounds at most, with --precision (default: 45)")
    p.add_argument("--round-ms", type=float, default=200.0, metavar="MS",
                   help="on a GPU, a round lasts at least this long: a short step gets more trials (default: 200; 0: "
                        "always --trials)")
    p.add_argument("--interleave", choices=("call", "round"), default="call",
                   help="inside a round, the compilers take turns call by call (call, the default) or each runs its "
                        "calls back to back (round)")
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"), help="default: cuda")
    p.add_argument("--dtype", default="float32,bfloat16", metavar="LIST",
                   help="comma-separated models' dtypes: float32, bfloat16, float16 (KernelBench tasks keep theirs; "
                        "default: float32,bfloat16)")
    p.add_argument("--size", default="full,small", metavar="LIST",
                   help="comma-separated model sizes: full (GPU-sized), small (the same layers at a small batch, where "
                        "launch overhead matters), tiny (smoke runs) (default: full,small)")
    p.add_argument("--kernelbench", type=Path, metavar="DIR", help="also (or only) run the KernelBench-format tasks in DIR")
    p.add_argument("--json", type=Path, metavar="FILE", help="write the results as JSON")
    p.add_argument("--chart", type=Path, metavar="FILE", help="write a PNG bar chart of the speedups (needs matplotlib)")
    p.add_argument("--markdown", type=Path, metavar="FILE", help="also write the table to FILE")
    p.add_argument("--timeout", type=float, default=1800.0, metavar="S", help="seconds per model or task (default: 1800)")
    p.add_argument("--inductor-cache", metavar="DIR",
                   help="share this Inductor cache between the runs (default: a fresh one per run, so every "
                        "partition reaches the kevin pass and is reported)")
    p.add_argument("--in-process", action="store_true", help="run everything in this process (debugging)")
    p.add_argument("--merge", nargs="+", type=Path, metavar="JSON",
                   help="run nothing: combine reports saved with --json (a bench run in parts) into one table, "
                        "and --json / --chart / --markdown")
    p.set_defaults(handler=_bench)


def _names(text: str | None, valid: tuple[str, ...], what: str) -> list[str]:
    names = [n.strip() for n in (text or "").split(",") if n.strip()]
    unknown = [n for n in names if n not in valid]
    if unknown:
        raise CommandError(f"unknown {what} {', '.join(map(repr, unknown))}; valid {what}s: {', '.join(valid)}", EXIT_USAGE)
    if not names:
        raise CommandError(f"--{what}s names none; valid {what}s: {', '.join(valid)}", EXIT_USAGE)
    return list(dict.fromkeys(names))


def _command(args: argparse.Namespace, models: list[str], workloads: list[str]) -> str:
    """The command line that repeats this run (for the report's header)."""
    parts = ["kevin", "bench"]
    if models:
        parts += ["--models", ",".join(models), "--workloads", ",".join(workloads)]
    if args.kernelbench is not None:
        parts += ["--kernelbench", str(args.kernelbench)]
    parts += ["--device", args.device, "--dtype", ",".join(args.dtypes), "--size", ",".join(args.sizes),
              "--repeats", str(args.repeats), "--trials", str(args.trials), "--warmup", str(args.warmup),
              "--warmup-rounds", str(args.warmup_rounds), "--precision", f"{args.precision:g}",
              "--max-repeats", str(args.max_repeats), "--round-ms", f"{args.round_ms:g}",
              "--interleave", args.interleave]
    return " ".join(shlex.quote(p) for p in parts)


def _merge(paths: list[Path]) -> Any:
    """One report from several saved ones: their models, and their KernelBench tasks, in order."""
    from kevin_backend.bench.results import BenchReport

    reports = []
    for path in paths:
        try:
            data = json.loads(path.read_text())
            if not isinstance(data, dict) or not {"environment", "models", "kernelbench"} <= set(data):
                raise ValueError("it lacks the environment, models and kernelbench keys")
            reports.append(BenchReport.from_dict(data))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise CommandError(f"--merge: {path} is not a report written by kevin bench --json: {exc}", EXIT_USAGE) from exc
    return _combined(reports)


def _combined(reports: list[Any]) -> Any:
    """One report of several: the first's environment (every command named), all their rows."""
    from kevin_backend.bench.results import BenchReport, KernelBenchResult

    environment = dict(reports[0].environment)
    settings = dict(environment.get("settings") or {})
    for name in ("size", "dtype"):  # every size and dtype the reports ran
        seen = [str((r.environment.get("settings") or {}).get(name)) for r in reports if (r.environment.get("settings") or {}).get(name)]
        if seen:
            settings[name] = ",".join(dict.fromkeys(seen))
    environment["settings"] = settings
    commands = [r.environment.get("command") for r in reports if r.environment.get("command")]
    if commands:
        environment["command"] = " ; ".join(dict.fromkeys(commands))
    tasks = [t for r in reports if r.kernelbench for t in r.kernelbench.tasks]
    folders = [r.kernelbench.directory for r in reports if r.kernelbench]
    kernelbench = KernelBenchResult(", ".join(dict.fromkeys(folders)), tuple(tasks)) if folders else None
    return BenchReport(environment, tuple(m for r in reports for m in r.models), kernelbench)


def _bench(args: argparse.Namespace, config: Config) -> int:
    import torch

    from kevin_backend.bench.kernelbench import task_files
    from kevin_backend.bench.models import MODELS, WORKLOADS, needs_transformers
    from kevin_backend.bench.render import MissingDependency, require_matplotlib
    from kevin_backend.bench.runs import BenchSettings, kevin_options, run_bench

    if args.merge:
        if args.chart is not None:
            try:
                require_matplotlib()
            except MissingDependency as exc:
                raise CommandError(str(exc), EXIT_USAGE) from exc
        return _report(_merge(args.merge), args)
    if args.models is not None:
        models = _names(args.models, MODELS, "model")
    else:  # all of them, unless this is a KernelBench run
        models = list(MODELS) if args.kernelbench is None else []
    workloads = _names(args.workloads, WORKLOADS, "workload")
    from kevin_backend.bench.common import DTYPES
    from kevin_backend.bench.models import SIZES

    args.sizes = _names(args.size, SIZES, "size")
    args.dtypes = _names(args.dtype, DTYPES, "dtype")
    for flag, value, least in (("--repeats", args.repeats, 1), ("--trials", args.trials, 1), ("--warmup", args.warmup, 0),
                                 ("--warmup-rounds", args.warmup_rounds, 0), ("--max-repeats", args.max_repeats, 1)):
        if value < least:
            raise CommandError(f"{flag} must be at least {least}, got {value}", EXIT_USAGE)
    if not args.timeout > 0:  # also refuses nan
        raise CommandError(f"--timeout must be more than 0 seconds, got {args.timeout}", EXIT_USAGE)
    if not 0 <= args.precision < 1:  # also refuses nan
        raise CommandError(f"--precision must be at least 0 and below 1, got {args.precision}", EXIT_USAGE)
    if not args.round_ms >= 0:  # also refuses nan
        raise CommandError(f"--round-ms must be at least 0, got {args.round_ms}", EXIT_USAGE)
    if args.kernelbench is not None:
        try:
            task_files(args.kernelbench)
        except (OSError, ValueError) as exc:
            raise CommandError(f"--kernelbench: {exc}", EXIT_USAGE) from exc
    if args.device == "cuda" and not torch.cuda.is_available():
        raise CommandError("no CUDA device here (torch.cuda.is_available() is False); "
                           "use --device cpu for a CPU run", EXIT_USAGE)
    if any(needs_transformers(m) for m in models) and importlib.util.find_spec("transformers") is None:
        wanted = ", ".join(m for m in models if needs_transformers(m))
        raise CommandError(f"{wanted} need transformers: pip install 'kevin_backend[bench]'", EXIT_USAGE)
    if args.chart is not None:
        try:
            require_matplotlib()
        except MissingDependency as exc:
            raise CommandError(str(exc), EXIT_USAGE) from exc

    # one run per size and dtype (the KernelBench tasks, which keep their own, with the first);
    # without models, the tasks alone: one run
    runs = [(size, dtype) for size in args.sizes for dtype in args.dtypes][: None if models else 1]
    reports = []
    for n, (size, dtype) in enumerate(runs):
        settings = BenchSettings(
            device=args.device, dtype=dtype, size=size, repeats=args.repeats, trials=args.trials,
            warmup=args.warmup, warmup_rounds=args.warmup_rounds, precision=args.precision,
            max_repeats=args.max_repeats, round_ms=args.round_ms, interleave=args.interleave, kevin_options=kevin_options(config), isolate=not args.in_process,
            timeout_s=args.timeout, inductor_cache=args.inductor_cache,
        )
        if len(runs) > 1:
            print(f"kevin bench: {', '.join(models)} at size {size}, {dtype}", file=sys.stderr, flush=True)
        reports.append(run_bench(models, workloads, args.kernelbench if n == 0 else None, settings, progress=True,
                                 command=_command(args, models, workloads)))
    return _report(reports[0] if len(reports) == 1 else _combined(reports), args)


def _report(report: Any, args: argparse.Namespace) -> int:
    from kevin_backend.bench.render import markdown, write_chart, write_json

    table = markdown(report)
    print(table, end="")
    if args.json is not None:
        write_json(report, args.json)
    if args.markdown is not None:
        args.markdown.write_text(table)
    if args.chart is not None:
        write_chart(report, args.chart)
    for error in report.errors:
        print(f"kevin bench: {error}", file=sys.stderr)
    return EXIT_FAILED if report.errors else EXIT_OK
