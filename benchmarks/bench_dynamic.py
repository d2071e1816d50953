"""Dynamic shapes: kevin's kernels for the size they were made for, Inductor's code for the others.

A block of memory-bound work (layer norm, GELU, a residual add, RMS-style scaling) compiled with
`dynamic=True` twice: by kevin in generate mode with the built-in writer, and by Inductor. The
first size is compiled first (kevin's search makes its kernels for it); the two other sizes then
run through the same compiled graph, where kevin's partitions serve them with Inductor's code
compiled once (the graph check's dispatch, `backend/graph_check.py`). For each size: both compilers timed in
interleaved rounds (`kevin_backend.measure.interleave.interleaved`), kevin over Inductor, and the
runtime's counters (kernel calls, Inductor-served calls).

The sizes are large enough for the GPU's time to dominate a call (at 4096 x 2048 a call is mostly
host time, and rounds then scatter by 25%).

Usage: python benchmarks/bench_dynamic.py [--sizes 16384,8192,32768] [--dim 4096] [--rounds 15] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.scale = nn.Parameter(torch.randn(dim))

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        h = F.gelu(self.norm(x)) + y
        return h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6) * self.scale


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="16384,8192,32768", help="rows at each size; the first gets kevin's kernels")
    parser.add_argument("--dim", type=int, default=4096)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("bench_dynamic needs a CUDA GPU", file=sys.stderr)
        return 2
    import kevin_backend
    from kevin_backend.runtime.counters import counters
    from kevin_backend.runtime.registry import kernel_calls
    from kevin_backend.bench.results import paired_ratio
    from kevin_backend.measure.interleave import interleaved, timer

    sizes = [int(s) for s in args.sizes.split(",")]
    torch.manual_seed(0)
    model = Block(args.dim).cuda().eval()
    rows: list[dict[str, object]] = []
    with tempfile.TemporaryDirectory() as cache, torch.no_grad():
        kevin = torch.compile(model, backend="kevin", dynamic=True, options={
            "mode": "generate", "cache_dir": cache, "policy": "builtin", "trajectories": 1, "turns": 2, "seed_cache": False})
        inductor = torch.compile(model, dynamic=True)
        for n, size in enumerate(sizes):
            x, y = torch.randn(size, args.dim, device="cuda"), torch.randn(size, args.dim, device="cuda")
            began = time.perf_counter()
            got, want = kevin(x, y), inductor(x, y)
            first_s = time.perf_counter() - began
            error = (got - want).abs().max().item()
            report = str(kevin_backend.last_report()) if n == 0 else ""
            before = counters.snapshot()
            calls = sum(kernel_calls().values())
            samples = interleaved({"kevin": lambda: kevin(x, y), "inductor": lambda: inductor(x, y)}, torch.device("cuda"),
                                  args.rounds, measure=timer("cuda", 20, 3))
            after = counters.snapshot()
            k, i = statistics.median(samples["kevin"]), statistics.median(samples["inductor"])
            paired = paired_ratio(samples["kevin"], samples["inductor"])  # (geometric mean, 95% low, high)
            row = {"rows": size, "kevin_ms": k, "inductor_ms": i, "kevin_vs_inductor": i / k, "max_abs_error": error,
                   "kevin_vs_inductor_paired": list(paired) if paired else None,
                   "kernel_calls": sum(kernel_calls().values()) - calls,
                   "inductor_served_calls": after.get("runtime_inductor_calls", 0) - before.get("runtime_inductor_calls", 0),
                   "first_call_s": first_s, "rounds_ms": {"kevin": samples["kevin"], "inductor": samples["inductor"]}}
            rows.append(row)
            if report:
                print(report, file=sys.stderr)
            interval = f" [{paired[1]:.3f}-{paired[2]:.3f}]" if paired else ""
            print(f"rows {size}: kevin {k:.4f} ms, Inductor {i:.4f} ms, {i / k:.3f}x{interval}; kernel calls {row['kernel_calls']}, "
                  f"Inductor-served calls {row['inductor_served_calls']}, max |kevin - Inductor| {error:.2e}", flush=True)
    print("| rows | kevin ms | Inductor ms | kevin x Inductor [95% interval, rounds paired] | kevin kernel calls | Inductor-served calls |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        p = r["kevin_vs_inductor_paired"]
        interval = f" [{p[1]:.3f}-{p[2]:.3f}]" if p else ""
        print(f"| {r['rows']} | {r['kevin_ms']:.4f} | {r['inductor_ms']:.4f} | {r['kevin_vs_inductor']:.3f}x{interval} | "
              f"{r['kernel_calls']} | {r['inductor_served_calls']} |")
    if args.json:
        args.json.write_text(json.dumps({"meta": {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                                                  "date": time.strftime("%Y-%m-%d"), "dim": args.dim}, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
