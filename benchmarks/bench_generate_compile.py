"""How long a one-partition model takes to compile in generate mode, as a user meets it.

Each problem is a KernelBench level-1 style model whose whole forward is one partition (LayerNorm,
RMSNorm, L2 and L1 norm over 65535 columns, softmax and log-softmax over 393216 columns),
compiled with

    torch.compile(model, backend="kevin", options={"mode": "generate", "policy": "builtin",
                                                   "trajectories": 1, "turns": 3, ...})

and called once: the first call compiles (Dynamo, Inductor with the kevin pass: the search, the
decision re-timed against Inductor, the kernel loaded) and runs the graph-level check. Its wall
clock is the model's compile time. The compile report says how long the partition's search took
and where (the writer, the judge, the re-timing), and how long the graph check took.

Every model is compiled in a Python process of its own (a user's script), one after another; all
share one kernel cache folder (as a user's machine does: the builds' precompiled header and
reference times are made by the first, each model's key is its own, so each is a miss) and one
Inductor cache. The first model pays what a machine pays once; the median is over all of them.

Usage: python benchmarks/bench_generate_compile.py [--small] [--problems layernorm,l2norm]
       [--trajectories 1] [--turns 3] [--cache DIR] [--json FILE] [--cpu]

`--small` makes every problem a sixteenth of its size or less (the same row lengths, fewer
rows). `--cpu` runs the plumbing on a machine without a GPU: the partitions are searched and the
judge answers NO_GPU, so each ends pending (a check of this script, not a measurement).
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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROW = "kevin-generate-compile-row "  # the prefix of a worker's last line: its row as JSON


@dataclass(frozen=True)
class Problem:
    name: str
    forward: str  # the body of `forward(self, x)`, one expression
    shape: tuple[int, ...]
    small: tuple[int, ...]


PROBLEMS = (
    # KernelBench level 1, 40_LayerNorm: normalised over the last three dims, no affine
    Problem("layernorm", "torch.nn.functional.layer_norm(x, x.shape[1:])", (16, 64, 256, 256), (4, 64, 64, 64)),
    # 36_RMSNorm_: over the features (dim 1)
    Problem("rmsnorm", "x / torch.sqrt(torch.mean(x ** 2, dim=1, keepdim=True) + 1e-5)", (16, 64, 256, 256),
            (4, 64, 64, 64)),
    # 39_L2Norm_ and 38_L1Norm_, over 65535 columns
    Problem("l2norm", "x / torch.norm(x, p=2, dim=1, keepdim=True)", (4096, 65535), (256, 65535)),
    Problem("l1norm", "x / torch.sum(torch.abs(x), dim=1, keepdim=True)", (4096, 65535), (256, 65535)),
    # 23_Softmax and 24_LogSoftmax, over 393216 columns
    Problem("softmax", "torch.softmax(x, dim=1)", (4096, 393216), (64, 393216)),
    Problem("logsoftmax", "torch.log_softmax(x, dim=1)", (4096, 393216), (64, 393216)),
)


def _model(problem: Problem) -> Any:
    """The problem's model, from a program of its own (a forward Dynamo traces as written)."""
    from kevin_backend.types import load_program

    source = ("import torch\n\n\nclass Model(torch.nn.Module):\n    def forward(self, x):\n"
              f"        return {problem.forward}\n")
    return load_program(source, f"kevin_bench_{problem.name}").Model().eval()


def compile_one(problem: Problem, cache: Path, small: bool, trajectories: int, turns: int, device: str) -> dict[str, Any]:
    """`problem` compiled in generate mode in this process and called once: its row."""
    import torch

    import kevin_backend

    torch.manual_seed(0)
    x = torch.randn(*(problem.small if small else problem.shape), device=device)
    model = _model(problem)
    options = {"mode": "generate", "cache_dir": str(cache), "policy": "builtin", "trajectories": trajectories,
               "turns": turns, "seed_cache": False, "cpu_kernels": device == "cpu"}
    torch._dynamo.reset()
    began = time.perf_counter()
    compiled = torch.compile(model, backend="kevin", options=options)
    with torch.no_grad():
        got = compiled(x)
        if device == "cuda":
            torch.cuda.synchronize()
        seconds = time.perf_counter() - began
        want = model(x)
    report = kevin_backend.last_report()
    data = report.as_dict() if report is not None else {}
    return {"problem": problem.name, "shape": list(x.shape), "compile_seconds": round(seconds, 3),
            "search_seconds": data.get("search_seconds"), "graph_check_seconds": data.get("graph_check_seconds"),
            "match": bool(torch.allclose(got.double(), want.double(), rtol=1e-3, atol=1e-4)),
            "partitions": [p for g in data.get("graphs", []) for p in g["partitions"]],
            "released": data.get("released", []), "report": str(report)}


def _in_process(problem: Problem, args: argparse.Namespace, cache: Path, env: dict[str, str]) -> dict[str, Any]:
    """`compile_one` in a fresh Python process: its row, or a row that says why there is none."""
    command = [sys.executable, __file__, "--worker", problem.name, "--cache", str(cache), "--trajectories",
               str(args.trajectories), "--turns", str(args.turns), *(["--small"] if args.small else []),
               *(["--cpu"] if args.cpu else [])]
    began = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    rows = [line[len(ROW):] for line in done.stdout.splitlines() if line.startswith(ROW)]
    if rows:
        return {**json.loads(rows[-1]), "process_seconds": round(time.perf_counter() - began, 3)}
    tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
    return {"problem": problem.name, "error": f"the worker ended with code {done.returncode}: {tail}"[:500]}


def _line(row: dict[str, Any]) -> str:
    if "error" in row:
        return f"{row['problem']:<11} error: {row['error']}"
    parts = row["partitions"]
    what = ", ".join(f"{p['status']}" + (f" {p['speedup_vs_inductor']:.2f}x" if p.get("speedup_vs_inductor") else "")
                     + (f" ({p['reason']})" if p.get("reason") else "") for p in parts) or "no partition"
    search = next((p["search"] for p in parts if p.get("search")), None)
    split = ""
    if search:
        split = " = ".join([f"search {search['seconds']:.1f} s", " + ".join(
            f"{name} {search[key]:.1f}" for name, key in (("writer", "writer_seconds"), ("judge", "judge_seconds"),
                                                          ("re-timing", "retime_seconds")) if search.get(key) is not None)])
    return (f"{row['problem']:<11} {row['compile_seconds']:7.1f} s  [{split}; graph check {row['graph_check_seconds'] or 0:.1f} s]"
            f"  {what}{'' if row['match'] else '  OUTPUTS DIFFER'}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--problems", help="comma-separated names: " + ",".join(p.name for p in PROBLEMS))
    parser.add_argument("--small", action="store_true", help="fewer rows (the same row lengths)")
    parser.add_argument("--trajectories", type=int, default=1)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--cache", type=Path, help="the kernel cache folder (default: a fresh one)")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--cpu", action="store_true", help="no GPU: check the script's plumbing only")
    parser.add_argument("--worker", help=argparse.SUPPRESS)  # one problem in this process; its row on the last line
    args = parser.parse_args()
    by_name = {p.name: p for p in PROBLEMS}
    import torch

    if not args.cpu and not torch.cuda.is_available():
        print("bench_generate_compile needs a CUDA GPU (--cpu checks the plumbing without one)", file=sys.stderr)
        return 2
    device = "cpu" if args.cpu else "cuda"
    if args.worker:
        row = compile_one(by_name[args.worker], args.cache, args.small, args.trajectories, args.turns, device)
        print(ROW + json.dumps(row), flush=True)
        return 0
    names = args.problems.split(",") if args.problems else [p.name for p in PROBLEMS]
    unknown = [n for n in names if n not in by_name]
    if unknown:
        parser.error(f"unknown problems {unknown}; known: {sorted(by_name)}")
    cache = args.cache or Path(tempfile.mkdtemp(prefix="kevin_generate_compile_"))
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": os.environ.get("TORCHINDUCTOR_CACHE_DIR", str(cache / "inductor"))}
    print(f"generate mode, built-in writer, {args.trajectories} trajectory x {args.turns} turns, "
          f"{'small' if args.small else 'full'} sizes, cache {cache}", flush=True)
    rows = []
    for name in names:
        row = _in_process(by_name[name], args, cache, env)
        rows.append(row)
        print(_line(row), flush=True)
    seconds = [r["compile_seconds"] for r in rows if "compile_seconds" in r]
    summary = {"models": len(rows), "compiled": len(seconds),
               "median_compile_seconds": round(statistics.median(seconds), 3) if seconds else None,
               "max_compile_seconds": max(seconds) if seconds else None,
               "median_search_seconds": round(statistics.median(r["search_seconds"] for r in rows if r.get("search_seconds")
                                                                ), 3) if any(r.get("search_seconds") for r in rows) else None}
    print(f"median compile {summary['median_compile_seconds']} s over {len(seconds)} models "
          f"(slowest {summary['max_compile_seconds']} s; median search {summary['median_search_seconds']} s)")
    if args.json:
        args.json.write_text(json.dumps({"device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
                                         "torch": torch.__version__, "small": args.small, "trajectories": args.trajectories,
                                         "turns": args.turns, "summary": summary, "rows": rows}, indent=2))
    return 0 if len(seconds) == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
