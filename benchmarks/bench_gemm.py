"""The built-in writer's CUTLASS GEMMs on the GEMM-epilogue suite, through the real judge.

Each suite task (`generate/builtin/gemm_suite.py`) the GEMM writer plans (`gemm_plan.plan_gemm`;
the others are listed with the reason they are declined) is written once per tiling below, the
programs built side by side (the build times kept: cold, and a tiling change of a built task),
then judged one at a time on a Hopper GPU: correctness on fresh inputs, the kernel timed beside
Inductor's default compile of the same task. The table has each task's best tiling.

Usage: python benchmarks/bench_gemm.py [--tasks NAME,...] [--trials 20] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from kevin_backend.generate.builtin.gemm_kernel import GEMM_TILINGS
from kevin_backend.generate.builtin.gemm_plan import GemmPlan, plan_gemm, write_gemm_program
from kevin_backend.generate.builtin.gemm_suite import GEMM_SUITE

TILINGS = GEMM_TILINGS  # the search's variants


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", default="", help="suite task names, comma-separated (default: all)")
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--builds", default="", help="the judge's build folder (default: a fresh temporary one)")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        print("bench_gemm: needs a Hopper GPU (sm_90a)", file=sys.stderr)
        return 2
    from kevin_backend.judge.judge import Judge
    from kevin_backend.judge.sandbox import RunConfig
    from kevin_backend.toolchain.build import BuildSpec
    from kevin_backend.toolchain.candidate import Candidate
    from kevin_backend.toolchain.cutlass_headers import find_cutlass

    if find_cutlass() is None:
        print("bench_gemm: CUTLASS's headers are not installed (pip install 'kevin_backend[cutlass]')", file=sys.stderr)
        return 2
    wanted = set(filter(None, args.tasks.split(",")))
    tasks = [t for t in GEMM_SUITE if not wanted or t.name in wanted]
    plans: dict[str, GemmPlan] = {}
    declined: dict[str, str] = {}
    for t in tasks:
        plan = plan_gemm(t.source)
        if isinstance(plan, GemmPlan):
            plans[t.name] = plan
        else:
            declined[t.name] = plan.reason
    programs = {(name, tiling.name): write_gemm_program(plan, tiling) for name, plan in plans.items() for tiling in TILINGS}
    builds = Path(args.builds) if args.builds else Path(__import__("tempfile").mkdtemp(prefix="kevin-gemm-"))
    judge = Judge(builds, RunConfig(trials=args.trials))
    specs = [BuildSpec.of(ext, "9.0") for p in programs.values() for ext in Candidate.parse(p).extensions]
    start = time.perf_counter()
    built = judge.builder.build_many(specs)
    build_wall = time.perf_counter() - start
    print(f"built {len(specs)} programs in {build_wall:.0f} s ({judge.builder.jobs} at a time): "
          f"median {statistics.median(r.seconds for r in built):.1f} s each, "
          f"{sum(r.ok for r in built)} ok, how: {sorted({getattr(r, 'how', '?') for r in built})}", flush=True)
    rows: list[dict] = []

    def save() -> None:  # after every row: a run cut short keeps what it judged
        if args.json:
            args.json.write_text(json.dumps({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                                             "build_seconds": [r.seconds for r in built], "build_wall_s": build_wall,
                                             "rows": rows, "declined": declined}, indent=1))

    for i, ((name, tiling), program) in enumerate(programs.items(), 1):
        began = time.perf_counter()
        result = judge.judge(next(t.source for t in tasks if t.name == name), program)
        t = result.timings
        row = {"task": name, "plan": plans[name].describe(), "tiling": tiling, "verdict": result.reason.name,
               "kernel_ms": t.kernel_ms, "inductor_ms": t.inductor_ms, "eager_ms": t.eager_ms,
               "x_inductor": (t.inductor_ms / t.kernel_ms) if t.kernel_ms and t.inductor_ms else None,
               "exact": result.exact, "seconds": round(time.perf_counter() - began, 1), "feedback": result.feedback[:300]}
        rows.append(row)
        x = f"{row['x_inductor']:.3f}x Inductor" if row["x_inductor"] else "-"
        print(f"[{i}/{len(programs)}] {name} {tiling}: {row['verdict']} {x} ({row['seconds']} s)", flush=True)
        save()
    best = {}
    for row in rows:
        if row["verdict"] == "ACCEPTED" and (row["task"] not in best or row["kernel_ms"] < best[row["task"]]["kernel_ms"]):
            best[row["task"]] = row
    print("\n| task | plan | best tiling | kernel ms | Inductor ms | x Inductor |\n|---|---|---|---|---|---|")
    for name in plans:
        r = best.get(name)
        print(f"| {name} | {plans[name].describe()} | " + (f"{r['tiling']} | {r['kernel_ms']:.4f} | {r['inductor_ms']:.4f} | "
                                                            f"{r['x_inductor']:.3f}x |" if r else "none accepted | - | - | - |"))
    for name, reason in declined.items():
        print(f"declined {name}: {reason}")
    save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
