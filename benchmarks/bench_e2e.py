"""End to end: eager, Inductor and kevin on the example models, compile time and run time.

For each model, every compiler is measured in its own fresh process (cold: empty Inductor and
kevin caches; then warm: a second process on the same caches): the time of the first call of an
inference step and of a training step (forward + backward), which is compile time plus one run.
Run time is then measured in one process for all three, interleaved round by round, with CUDA
events: the median per-step time over rounds of `--iters` steps.

kevin runs in mode `cache` on the cache named by --kevin-cache (default: a fresh empty one), so
with an empty cache it shows what the backend costs when it has no kernel to offer.

Usage: python benchmarks/bench_e2e.py [--models mlp cnn transformer] [--json FILE] [--markdown FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from kevin_backend.example_models import EXAMPLES, make_example

COMPILERS = ("inductor", "kevin")


def _step(model: Any, inputs: tuple, train: bool) -> None:
    if train:
        out = model(*inputs)
        out.float().pow(2).mean().backward()
    else:
        with torch.no_grad():
            model(*inputs)


def _compiled(name: str, compiler: str, kevin_cache: str | None) -> tuple[Any, tuple, Any]:
    model, inputs = make_example(name, device="cuda", size="large")
    if compiler == "eager":
        return model, inputs, model
    if compiler == "inductor":
        return model, inputs, torch.compile(model)
    options = {"cache_dir": kevin_cache} if kevin_cache else None
    return model, inputs, torch.compile(model, backend="kevin", options=options)


def worker(name: str, compiler: str, kevin_cache: str | None, profile: Path | None = None) -> dict[str, Any]:
    """In a fresh process: first-call time of an inference step, then of a training step."""
    _, inputs, compiled = _compiled(name, compiler, kevin_cache)
    result: dict[str, Any] = {}
    for train in (False, True):
        torch.cuda.synchronize()
        profiler = None
        if profile is not None:
            import cProfile

            profiler = cProfile.Profile()
            profiler.enable()
        start = time.perf_counter()
        _step(compiled, inputs, train)
        torch.cuda.synchronize()
        result["train" if train else "infer"] = time.perf_counter() - start
        if profiler is not None:
            import io
            import pstats

            profiler.disable()
            text = io.StringIO()
            pstats.Stats(profiler, stream=text).sort_stats("cumulative").print_stats(60)
            step = "train" if train else "infer"
            with (profile / "profiles.txt").open("a") as fh:
                fh.write(f"==== {name} {compiler} {step} {result[step]:.2f}s\n{text.getvalue()}")
    if compiler == "kevin":
        import kevin_backend

        report = kevin_backend.last_report()
        result["partitions"] = report.summary() if report else {}
    return result


def run_worker(
    name: str, compiler: str, inductor_dir: Path, kevin_cache: str | None, profile: Path | None = None
) -> dict[str, Any]:
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(inductor_dir)}
    cmd = [sys.executable, __file__, "--worker", name, compiler]
    if kevin_cache:
        cmd += ["--kevin-cache", kevin_cache]
    if profile:
        cmd += ["--profile-dir", str(profile)]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1200)
    if out.returncode != 0:
        raise RuntimeError(f"worker {name}/{compiler} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def time_steps(fn: Any, iters: int) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters


def run_times(name: str, kevin_cache: str | None, iters: int, rounds: int) -> dict[str, dict[str, float]]:
    """Median ms per step for eager, inductor and kevin, interleaved round by round."""
    models = {c: _compiled(name, c, kevin_cache) for c in ("eager", *COMPILERS)}
    times: dict[str, dict[str, list[float]]] = {c: {"infer": [], "train": []} for c in models}
    for train in (False, True):
        mode = "train" if train else "infer"
        for c, (_, inputs, fn) in models.items():
            for _ in range(3):  # compile (warm caches) and warm up
                _step(fn, inputs, train)
        for _ in range(rounds):
            for c, (_, inputs, fn) in models.items():
                times[c][mode].append(time_steps(lambda: _step(fn, inputs, train), iters))
    return {c: {m: statistics.median(v) for m, v in per.items()} for c, per in times.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=list(EXAMPLES), choices=EXAMPLES)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--kevin-cache", help="kevin cache dir (default: a fresh empty one)")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--markdown", type=Path, help="append the table to this file")
    parser.add_argument("--warm-repeats", type=int, default=3, help="warm first-call runs per compiler (median)")
    parser.add_argument("--compile-only", action="store_true", help="measure compile times only")
    parser.add_argument("--profile-dir", type=Path, help="write a cProfile of each warm first call here")
    parser.add_argument("--worker", nargs=2, metavar=("MODEL", "COMPILER"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(*args.worker, args.kevin_cache, args.profile_dir)))
        return 0
    if not torch.cuda.is_available():
        print("bench_e2e needs a CUDA GPU", file=sys.stderr)
        return 2

    rows = []
    total = len(args.models) * (len(COMPILERS) * (1 + args.warm_repeats) + (0 if args.compile_only else 1))
    done, began = 0, time.perf_counter()

    def progress(what: str) -> None:
        nonlocal done
        done += 1
        elapsed = time.perf_counter() - began
        eta = elapsed / done * (total - done)
        print(f"[{done:>2}/{total}] {what:<40} {elapsed:6.0f}s elapsed, ~{eta:4.0f}s left", file=sys.stderr, flush=True)

    with tempfile.TemporaryDirectory() as tmp:
        kevin_cache = args.kevin_cache or str(Path(tmp) / "kevin")
        for index, name in enumerate(args.models):
            compile_times: dict[str, dict[str, Any]] = {}
            inductor_dir = Path(tmp) / f"inductor-{name}"
            # Alternate which compiler goes first, model by model: whatever one process leaves
            # behind for the next (file-system caches, compiled bytecode) then favours neither.
            order = COMPILERS if index % 2 == 0 else tuple(reversed(COMPILERS))
            for compiler in order:
                own = inductor_dir.with_name(f"{inductor_dir.name}-{compiler}")
                cold = run_worker(name, compiler, own, kevin_cache)
                progress(f"{name} {compiler} cold compile")
                warms = []
                for _ in range(args.warm_repeats):
                    warms.append(run_worker(name, compiler, own, kevin_cache, args.profile_dir))
                    progress(f"{name} {compiler} warm compile")
                warm = {step: statistics.median(w[step] for w in warms) for step in ("infer", "train")}
                compile_times[compiler] = {"cold": cold, "warm": warm, "first": order[0]}
            runs = None
            if not args.compile_only:
                os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(inductor_dir.with_name(f"{inductor_dir.name}-kevin"))
                runs = run_times(name, kevin_cache, args.iters, args.rounds)
                progress(f"{name} run times")
            rows.append({"model": name, "compile": compile_times, "run_ms": runs})

    lines = [
        f"GPU: {torch.cuda.get_device_name()}, torch {torch.__version__}, "
        f"date {time.strftime('%Y-%m-%d')}, command: python benchmarks/bench_e2e.py {' '.join(sys.argv[1:])}",
        "",
    ]
    if not args.compile_only:
        lines += [
            "Run time, ms per step (median over rounds, interleaved in one process):",
            "",
            "| model | step | eager ms | inductor ms | kevin ms | kevin / inductor |",
            "|---|---|---|---|---|---|",
        ]
        for row in rows:
            for step in ("infer", "train"):
                run = {c: row["run_ms"][c][step] for c in ("eager", *COMPILERS)}
                lines.append(
                    f"| {row['model']} | {step} | {run['eager']:.3f} | {run['inductor']:.3f} | {run['kevin']:.3f} | "
                    f"{run['kevin'] / run['inductor']:.3f} |"
                )
        lines.append("")
    lines += [
        f"Compile time: first call of a step, s (cold: fresh caches; warm: median of {args.warm_repeats} fresh processes on warm caches):",
        "",
        "| model | step | first | inductor cold | kevin cold | kevin / inductor cold | inductor warm | kevin warm | kevin / inductor warm |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        ci, ck = row["compile"]["inductor"], row["compile"]["kevin"]
        for step in ("infer", "train"):
            lines.append(
                f"| {row['model']} | {step} | {ci['first']} | {ci['cold'][step]:.2f} | {ck['cold'][step]:.2f} | "
                f"{ck['cold'][step] / ci['cold'][step]:.2f} | {ci['warm'][step]:.2f} | {ck['warm'][step]:.2f} | "
                f"{ck['warm'][step] / ci['warm'][step]:.2f} |"
            )
    partitions = {row["model"]: row["compile"]["kevin"]["cold"].get("partitions") for row in rows}
    lines += ["", f"kevin partitions per model (last graph compiled, cold): {json.dumps(partitions)}"]
    table = "\n".join(lines)
    print(table)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    if args.markdown:
        with args.markdown.open("a") as fh:
            fh.write(table + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
