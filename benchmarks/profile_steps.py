"""Where a bench model's step spends its time: its GPU kernels by time, and the GPU's busy share.

One step under Inductor (or kevin, with its cache's kernels): the GPU kernels by total time, each
with its share; and how much of the step the GPU is busy (its kernels' time against the step's
with the GPU waited for; the rest is the host's: launches, Python, the wait).

    python benchmarks/profile_steps.py --models gpt2,llama --dtype bfloat16 --json out.json
    python benchmarks/profile_steps.py --compiler kevin --cache-dir DIR   # kevin's step, the cache's kernels in it

What it is for: which kernels a kevin kernel would have to replace to move a model's step (a
partition's share of the step bounds what a faster kernel for it can gain), and whether the host's
time, where a kevin kernel's longer host path would show, is the step's."""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections import defaultdict
from typing import Any

import torch

from kevin_backend.bench.models import make_model
from kevin_backend.bench.runs import model_step


def _times(step: Any, n: int = 30) -> tuple[float, float]:
    """(host ms to issue one step, ms of one step with the GPU waited for), medians."""
    host, full = [], []
    for _ in range(n):
        torch.cuda.synchronize()
        start = time.perf_counter()
        step()
        host.append((time.perf_counter() - start) * 1e3)
        torch.cuda.synchronize()
        full.append((time.perf_counter() - start) * 1e3)
    return statistics.median(host), statistics.median(full)


def profile(name: str, workload: str, dtype: torch.dtype, size: str, top: int, options: dict[str, Any] | None = None) -> dict[str, Any]:
    """One step of `name` compiled by Inductor, or by kevin with `options` (its cache's kernels)."""
    model, inputs = make_model(name, workload, "cuda", dtype, size)
    compiled = torch.compile(model) if options is None else torch.compile(model, backend="kevin", options=options)
    step = model_step(compiled, inputs, workload == "train")
    for _ in range(5):
        step()
    host_ms, step_ms = _times(step)
    steps = 5
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    by_kernel: dict[str, list[float]] = defaultdict(list)
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            by_kernel[event.name].append(event.device_time / 1e3)
    total = sum(sum(v) for v in by_kernel.values()) / steps
    kernels = sorted(({"kernel": k[:120], "ms_per_step": sum(v) / steps, "calls_per_step": len(v) / steps}
                      for k, v in by_kernel.items()), key=lambda r: -r["ms_per_step"])
    return {"model": name, "workload": workload, "dtype": str(dtype).removeprefix("torch."), "size": size,
            "host_ms": host_ms, "step_ms": step_ms, "kernels_ms": total, "kernels": kernels[:top]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="gpt2,llama")
    p.add_argument("--workloads", default="infer,train")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--size", default="full")
    p.add_argument("--top", type=int, default=15)
    p.add_argument("--compiler", choices=("inductor", "kevin"), default="inductor")
    p.add_argument("--cache-dir", help="kevin's cache (with --compiler kevin; default: KEVIN_CACHE_DIR's)")
    p.add_argument("--json")
    args = p.parse_args()
    dtype = getattr(torch, args.dtype)
    options = None if args.compiler == "inductor" else {"mode": "cache", **({"cache_dir": args.cache_dir} if args.cache_dir else {})}
    results = []
    for name in args.models.split(","):
        for workload in args.workloads.split(","):
            torch._dynamo.reset()
            r = profile(name, workload, dtype, args.size, args.top, options)
            results.append(r)
            busy = r["kernels_ms"] / r["step_ms"]
            print(f"\n{args.compiler}: {name} {workload} {r['dtype']} {r['size']}: step {r['step_ms']:.3f} ms, host {r['host_ms']:.3f} ms to issue it, "
                  f"GPU kernels {r['kernels_ms']:.3f} ms: the GPU busy {100 * busy:.0f}% of the step"
                  + (" (bound by the host: launches, Python, the wait)" if busy < 0.8 else ""))
            for k in r["kernels"]:
                print(f"  {k['ms_per_step']:8.4f} ms {100 * k['ms_per_step'] / r['kernels_ms']:5.1f}%  x{k['calls_per_step']:<4g} {k['kernel']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "compiler": args.compiler, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
