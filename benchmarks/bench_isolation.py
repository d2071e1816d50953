"""The judge with every candidate in a process of its own: warm evaluation latency and candidates
per minute on one GPU, after the references of each task are timed once.

Judges the built-in writer's programs (every variant) for suite tasks through one `Judge` with a
warm build cache and a pool of workers, first one at a time (latency: median and worst seconds
per candidate), then all at once, twice (candidates per minute): the first pass meets workers that
have not yet seen the tasks (each builds its references), the second is the steady state of a
long prewarm. Prints and stores (--json) the numbers.

Usage: python benchmarks/bench_isolation.py [--tasks 6] [--workers 4] [--json FILE]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from kevin_backend.generate.builtin.planner import plan_task
from kevin_backend.generate.builtin.program import write_program
from kevin_backend.generate.builtin.suite import SUITE
from kevin_backend.generate.builtin.variants import VARIANTS_POINTWISE, VARIANTS_ROWS
from kevin_backend.judge.judge import Judge
from kevin_backend.judge.sandbox import RunConfig
from kevin_backend.toolchain.build import BuildSpec
from kevin_backend.toolchain.candidate import Candidate


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", type=int, default=6)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    tasks = [t for t in SUITE if plan_task(t.source)][: args.tasks]
    programs = []
    for t in tasks:
        plan = plan_task(t.source)
        for variant in (VARIANTS_ROWS if plan.is_rows else VARIANTS_POINTWISE)[:4]:
            programs.append((t, write_program(plan, variant)))
    rows: dict[str, object] = {"tasks": len(tasks), "candidates": len(programs), "workers": args.workers}
    with tempfile.TemporaryDirectory() as tmp:
        judge = Judge(Path(tmp) / "builds", RunConfig(trials=100, warmup=5), workers=args.workers)
        t0 = time.perf_counter()
        major, minor = torch.cuda.get_device_capability()
        specs = [BuildSpec.of(ext, f"{major}.{minor}") for _, p in programs for ext in Candidate.parse(p).extensions]
        built = judge.builder.build_many(specs)  # every program built first: a warm evaluation builds nothing
        rows["builds"] = {"count": len(specs), "failed": sum(not b.ok for b in built), "s": time.perf_counter() - t0}
        first = [judge.judge(t.source, p) for t, p in programs[:: 4]]  # the references timed once per task
        rows["first pass (builds, references) s"] = time.perf_counter() - t0
        print("first pass", [r.reason.name for r in first], f"{rows['first pass (builds, references) s']:.1f} s", flush=True)
        latencies, reasons, phases = [], [], []
        for t, p in programs:
            t0 = time.perf_counter()
            result = judge.judge(t.source, p)
            latencies.append(time.perf_counter() - t0)
            reasons.append(result.reason.name)
            phases.append({**(result.phase_seconds or {}),
                           "outside the worker's phases": latencies[-1] - sum(
                               v for k, v in (result.phase_seconds or {}).items() if ": " not in k)})  # ("load: task": a part)
        names = sorted({name for p in phases for name in p}, key=lambda n: -statistics.median(p.get(n, 0.0) for p in phases))
        rows["one at a time: median s per phase"] = {n: statistics.median(p.get(n, 0.0) for p in phases) for n in names}
        print("median s per phase: " + ", ".join(f"{n} {v:.3f}" for n, v in rows["one at a time: median s per phase"].items()),
              flush=True)
        rows["one at a time: median s"] = statistics.median(latencies)
        rows["one at a time: worst s"] = max(latencies)
        rows["one at a time: reasons"] = {r: reasons.count(r) for r in set(reasons)}
        print(f"warm, one at a time: median {statistics.median(latencies):.3f} s, worst {max(latencies):.3f} s", reasons, flush=True)
        for label in ("all at once", "all at once, again"):  # the first: workers new to the tasks; then warm
            _all_at_once(judge, programs, args.workers, label, rows)
        judge.close()
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


def _all_at_once(judge: Judge, programs: list, workers: int, label: str, rows: dict[str, object]) -> None:
    """Every program judged by `workers` threads at once: candidates per minute, and where the time
    goes with workers side by side (phase "lock": waiting for the GPU alone)."""
    t0 = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        results = list(pool.map(lambda tp: judge.judge(tp[0].source, tp[1]), programs))
    seconds = time.perf_counter() - t0
    rows[f"{label}: s"] = seconds
    rows[f"{label}: candidates per minute"] = 60 * len(programs) / seconds
    rows[f"{label}: reasons"] = {r.reason.name: sum(x.reason == r.reason for x in results) for r in results}
    together = [r.phase_seconds or {} for r in results]
    names = sorted({n for p in together for n in p})
    rows[f"{label}: median s per phase"] = {n: statistics.median(p.get(n, 0.0) for p in together) for n in names}
    rows[f"{label}: worst s per phase"] = {n: max(p.get(n, 0.0) for p in together) for n in names}
    print(f"{label}, median s per phase: " + ", ".join(
        f"{n} {v:.3f}" for n, v in sorted(rows[f"{label}: median s per phase"].items(), key=lambda kv: -kv[1])[:8]), flush=True)
    print(f"{label}, worst s per phase: " + ", ".join(
        f"{n} {v:.3f}" for n, v in sorted(rows[f"{label}: worst s per phase"].items(), key=lambda kv: -kv[1])[:8]), flush=True)
    print(f"warm, {label} ({workers} workers): {len(programs)} in {seconds:.1f} s = {60 * len(programs) / seconds:.0f} per minute",
          flush=True)


if __name__ == "__main__":
    sys.exit(main())
