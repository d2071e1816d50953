"""Where a judge call's time goes, and how many candidates a GPU machine judges per minute.

Judges the built-in writer's first kernel for N suite tasks at once (warm build cache on the
second pass, so the run phase is what is left), with Inductor's compile worker pool at the
machine's size, with one compile thread per worker process, and with Inductor's time reused from
an earlier candidate of the same task. Prints seconds per pass.

Usage: python benchmarks/bench_judge_throughput.py [--at-once 8] [--json FILE]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from kevin_backend.generate.builtin.planner import plan_task
from kevin_backend.generate.builtin.program import write_program
from kevin_backend.generate.builtin.variants import VARIANTS_POINTWISE, VARIANTS_ROWS
from kevin_backend.generate.builtin.suite import SUITE
from kevin_backend.judge.judge import Judge
from kevin_backend.judge.sandbox import RunConfig


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--at-once", type=int, default=8)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import torch; torch.zeros(1, device='cuda')"], check=True)
    rows: dict[str, float] = {"process start + torch import + CUDA init": time.perf_counter() - start}
    tasks = [t for t in SUITE if plan_task(t.source)][: args.at_once]
    programs = []
    for t in tasks:
        plan = plan_task(t.source)
        programs.append((t, write_program(plan, (VARIANTS_ROWS if plan.is_rows else VARIANTS_POINTWISE)[0])))
    with tempfile.TemporaryDirectory() as tmp:
        judge = Judge(Path(tmp) / "builds", RunConfig(trials=50, warmup=5))
        passes = (("cold builds, a compile pool per worker", None, False), ("warm builds, a compile pool per worker", None, False),
                  ("warm builds, 1 compile thread", "1", False), ("warm builds, Inductor baseline reused", "1", True))
        for label, threads, reuse in passes:
            # the judge's workers take this from the environment (they default to 1 when it is unset)
            os.environ["TORCHINDUCTOR_COMPILE_THREADS"] = threads or str(os.cpu_count() or 1)
            judge.reuse_references = reuse
            t0 = time.perf_counter()
            with concurrent.futures.ThreadPoolExecutor(len(programs)) as pool:
                results = list(pool.map(lambda p: judge.judge(p[0].source, p[1]), programs))
            rows[f"{len(programs)} candidates at once: {label}"] = time.perf_counter() - t0
            t0 = time.perf_counter()
            judge.judge(programs[0][0].source, programs[0][1])
            rows[f"one candidate alone: {label}"] = time.perf_counter() - t0
            print(label, [r.reason.name for r in results], flush=True)
            for k in list(rows)[-2:]:
                print(f"{rows[k]:8.2f} s  {k}", flush=True)
            if args.json:  # as it goes: a run stopped at its time limit keeps what it measured
                args.json.write_text(json.dumps(rows, indent=1))
    print(f"{rows['process start + torch import + CUDA init']:8.2f} s  process start + torch import + CUDA init")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
