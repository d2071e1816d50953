"""A new CUTLASS variant judged cold, step by step: the issue's goal of at most 60 s for a new
variant cold and at most 10 s when only its tile parameters change.

For one task of the GEMM suite, in a fresh build folder and a fresh kernel cache:

  first        the first variant of a fresh kernel cache, whose build also makes the fast build's
               precompiled header of torch's headers (once per toolchain and cache), beside its
               device part: the build's seconds, the whole judgement's, and when the header was done
  cold         each next variant (--tilings in all, with the first) built and judged, one after
               the other, none built before: the build's seconds and the whole judgement's
  ahead        one more tiling built ahead of its turn (as the search does while a turn is
               judged), then judged: the judgement of a change of tile parameters
  nvcc         nvcc's own phases for the first variant's device part (`nvcc --time`), alone on
               this host: where a cold build's time goes
  host         the CPUs and the load they carried

Usage: python benchmarks/bench_cold_variant.py [--task NAME] [--tilings 2] [--phases-only] [--json FILE]
(--phases-only: nvcc's phases alone, on a machine without a GPU)
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch


def nvcc_phases(program: str) -> dict[str, float]:
    """nvcc's phases (ms) for `program`'s device part, compiled again alone with `--time`."""
    from kevin_backend.toolchain.fast_build import Toolchain, device_command, fast_sources

    spec = _specs(program)[0]
    sources = fast_sources(spec.cpp_sources, spec.cuda_sources, spec.functions, spec.digest)
    out = Path(tempfile.mkdtemp())
    (out / "device.cu").write_text(sources.device)
    command = device_command(Toolchain.detect(), out / "device.cu", out / "device.o", "9.0", spec.extra_cuda_cflags,
                             spec.include_dirs)
    subprocess.run([*command, "--time", str(out / "time.csv")], capture_output=True, timeout=600)
    phases: dict[str, float] = {}
    with open(out / "time.csv") as f:
        for row in list(csv.reader(f))[1:]:
            if len(row) >= 8 and row[7].strip() == "ms":
                phases[row[1].strip()] = phases.get(row[1].strip(), 0.0) + float(row[6])
    return phases


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--task", default="mlp-up-gelu-f16-8192x768x3072")
    parser.add_argument("--tilings", type=int, default=2, help="variants judged cold, one after the other")
    parser.add_argument("--phases-only", action="store_true", help="nvcc's phases alone (no GPU needed)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    cache = Path(tempfile.mkdtemp(prefix="kevin_cold_"))
    os.environ["KEVIN_CACHE_DIR"] = str(cache)  # (a fresh cache: its own precompiled header)

    from kevin_backend.generate.builtin.gemm_plan import plan_gemm, plan_tilings, write_gemm_program
    from kevin_backend.generate.builtin.gemm_suite import GEMM_SUITE
    from kevin_backend.judge.judge import Judge
    from kevin_backend.judge.sandbox import RunConfig
    from kevin_backend.toolchain.fast_build import Toolchain, pch_header

    task = next(t for t in GEMM_SUITE if t.name == args.task)
    plan = plan_gemm(task.source, "sm90")
    tilings = plan_tilings(plan)
    programs = [(t.name, write_gemm_program(plan, t, task_source=task.source)) for t in tilings[:args.tilings + 1]]
    report: dict[str, object] = {"task": task.name, "torch": torch.__version__, "cpus": os.cpu_count(), "date": time.strftime("%Y-%m-%d")}
    if args.phases_only:
        report["nvcc_ms"] = nvcc_phases(programs[0][1])
        print("nvcc phases (ms):", report["nvcc_ms"], flush=True)
        if args.json:
            args.json.write_text(json.dumps(report, indent=1))
        return
    report["gpu"] = torch.cuda.get_device_name()
    with Judge(cache / "builds", RunConfig(trials=20)) as judge:
        judge.prepare()  # (as a search does: the judge's workers start beside the first build)
        done = pch_header(judge.builder.pch_root, Toolchain.detect()).parent / "done"
        rows = []
        for i, (name, program) in enumerate(programs[:-1]):
            began = time.time()
            rows.append(_judged(judge, task.source, name, program, "first of a fresh cache" if i == 0 else "cold"))
            if i == 0 and done.exists():
                report["pch_done_after_s"] = round(done.stat().st_mtime - began, 1)
            print(rows[-1], flush=True)
        name, program = programs[-1]
        start = time.perf_counter()
        judge.build_ahead([program])
        while not any(judge.builder.cached(s) for s in _specs(program)):  # (the build ahead, in the background)
            time.sleep(0.2)
        rows.append(_judged(judge, task.source, name, program, f"built ahead in {time.perf_counter() - start:.1f} s"))
        print(rows[-1], flush=True)
        report["variants"] = rows
    report["nvcc_ms"] = nvcc_phases(programs[0][1])
    print("nvcc phases (ms):", report["nvcc_ms"], flush=True)
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))


def _judged(judge, task: str, name: str, program: str, how: str) -> dict[str, object]:  # type: ignore[no-untyped-def]
    """`program` judged: its row (the build's seconds, the whole judgement's, the verdict, the load)."""
    start = time.perf_counter()
    result = judge.judge(task, program)
    return {"variant": name, "how": how, "build_s": round(result.build_seconds or 0, 1),
            "judged_s": round(time.perf_counter() - start, 1), "verdict": result.reason.name, "load": os.getloadavg()[0]}


def _specs(program: str) -> list:  # type: ignore[type-arg]
    from kevin_backend.toolchain.build import BuildSpec
    from kevin_backend.toolchain.candidate import Candidate

    return [BuildSpec.of(ext, "9.0") for ext in Candidate.parse(program).extensions]


if __name__ == "__main__":
    sys.exit(main())
