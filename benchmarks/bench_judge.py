"""The judge at RL speed: latency of one verdict through the warm worker pool, and candidates
judged per minute.

Eight tasks of the built-in writer's suite (four elementwise, four row reductions), candidates
written by the built-in writer (its variants: block sizes, vector widths, rows per block):

1. first candidate of each task (cold build, the references built, compiled and timed once)
2. a new kernel for a known task: cold build through the pool, references already timed
3. the same kernel again: warm evaluation (build cached, worker and references warm)
4. throughput: a fresh build folder and judge, 64 distinct candidates (8 per task) submitted at
   once through `Judge.evaluate_many`, one batch per task, all batches concurrently

Latencies are one candidate at a time (nothing else running), in the calling process's API
(`Judge.judge`), as the generator and the trainer use it.

Usage: python benchmarks/bench_judge.py [--workers 8] [--json judge_speed.json]
(stored results, with their metadata: benchmarks/results/, see benchmarks/tables.py wrap)
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
from kevin_backend.generate.builtin.variants import VARIANTS_POINTWISE, VARIANTS_ROWS, Variant
from kevin_backend.generate.builtin.suite import SUITE
from kevin_backend.judge.judge import Judge
from kevin_backend.judge.pool import describe
from kevin_backend.judge.sandbox import RunConfig

TASKS = ("relu-f32", "gelu-erf-f32", "gated-f32", "silu-mul-bf16", "sum-f32", "softmax-f32", "layernorm-f32", "rmsnorm-f32")


def candidates_for(source: str, count: int) -> list[str]:
    plan = plan_task(source)
    assert plan is not None
    variants = list(VARIANTS_ROWS if plan.is_rows else VARIANTS_POINTWISE)
    extra = [Variant(64), Variant(64, vector=True), Variant(1024, vector=True)]
    variants += [v for v in extra if v not in variants]
    return [write_program(plan, v) for v in variants[:count]]


def task_bytes(source: str) -> int:
    namespace: dict = {}
    exec(compile(source, "<task>", "exec"), namespace)  # noqa: S102 - the suite's own tasks
    return sum(t.numel() * t.element_size() for t in namespace["get_inputs"]() if isinstance(t, torch.Tensor))


def timed(judge: Judge, task: str, candidate: str) -> tuple[float, str]:
    began = time.perf_counter()
    result = judge.judge(task, candidate)
    return time.perf_counter() - began, result.reason.name


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--per-task", type=int, default=8)
    parser.add_argument("--trials", type=int, default=100)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("bench_judge needs a CUDA GPU", file=sys.stderr)
        return 2
    by_name = {t.name: t for t in SUITE}
    tasks = [(name, by_name[name].source) for name in TASKS]
    programs = {name: candidates_for(source, args.per_task) for name, source in tasks}
    out: dict = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "workers": args.workers,
                 "trials": args.trials, "task_bytes": {n: task_bytes(s) for n, s in tasks}}

    def save() -> None:
        if args.json:
            args.json.write_text(json.dumps(out, indent=1))

    config = RunConfig(trials=args.trials, warmup=10)
    with tempfile.TemporaryDirectory() as tmp:
        with Judge(Path(tmp) / "builds", config, workers=args.workers) as judge:
            for label, index in (("first", 0), ("cold", 1), ("warm", 1)):
                rows = []
                for name, source in tasks:
                    seconds, reason = timed(judge, source, programs[name][index])
                    rows.append({"task": name, "seconds": seconds, "reason": reason})
                    print(f"{label:6s} {name:16s} {seconds:6.2f} s {reason}", flush=True)
                out[label] = {"rows": rows, "median_s": statistics.median(r["seconds"] for r in rows)}
                save()
            out["latency_pool"] = describe(judge.pool) if judge.pool else None

        # throughput: everything cold, 64 distinct candidates at once
        with Judge(Path(tmp) / "builds-throughput", config, workers=args.workers) as judge:
            began = time.perf_counter()
            done_at: list[float] = []

            def batch(item: tuple[str, str]) -> list[str]:
                name, source = item
                results = judge.evaluate_many(source, programs[name], at_once=args.workers,
                                              done=lambda i, r: done_at.append(time.perf_counter() - began))
                return [r.reason.name for r in results]

            with concurrent.futures.ThreadPoolExecutor(len(tasks)) as threads:
                verdicts = dict(zip([n for n, _ in tasks], threads.map(batch, tasks)))
            seconds = time.perf_counter() - began
            total = sum(len(v) for v in verdicts.values())
            accepted = sum(v.count("ACCEPTED") for v in verdicts.values())
            out["throughput"] = {"candidates": total, "seconds": seconds, "per_minute": total / seconds * 60,
                                 "accepted": accepted, "verdicts": verdicts, "done_at_s": sorted(done_at),
                                 "pool": describe(judge.pool) if judge.pool else None}
            print(f"throughput: {total} candidates in {seconds:.1f} s = {total / seconds * 60:.1f} per minute; "
                  f"{accepted} accepted", flush=True)
            save()
    print(json.dumps({k: out[k]["median_s"] for k in ("first", "cold", "warm")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
