"""Per-call overhead of the runtime op `kevin::launch` over a bare launch of the same kernel.

The kernel is the hand-written `sigmoid(x) * y + 1` of the GPU tests, on a tiny input so that
each call costs its launch, not its memory traffic. Three ways to call it, timed with one
protocol (many calls back to back, wall clock per call, synchronized at both ends; median of
rounds):

  bare      the extension function itself
  module    ModelNew.forward (what the cache entry's program exposes)
  op        torch.ops.kevin.launch.default(key, [x, y], False) (what Inductor's code calls: the
            direct path of `runtime.op._DirectLaunch` when nothing intercepts the call)
  dispatch  the same op through the dispatcher (`op._op(...)`: the path of calls that a mode or
            a tensor subclass could intercept)

Usage: python benchmarks/bench_op_overhead.py [--calls 20000] [--rounds 7] [--json FILE]
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
from torch.fx.experimental.proxy_tensor import make_fx

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from gpu_kernels import GATED_KERNEL  # noqa: E402

from kevin_backend.runtime import registry as runtime  # noqa: E402
from kevin_backend.backend.partition import partition_graph  # noqa: E402
from kevin_backend.generate.op_support import GeneralOpSupport  # noqa: E402
from kevin_backend.backend.task import extract_task  # noqa: E402
from kevin_backend.cache.format import CacheEntry, EntryKind  # noqa: E402
from kevin_backend.cache.key import make_key  # noqa: E402
from kevin_backend.cache.store import KernelCache  # noqa: E402
from kevin_backend.config import Config  # noqa: E402


def per_call_us(fn, calls: int, rounds: int) -> float:
    for _ in range(200):
        fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        samples.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(samples)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--runs", type=int, default=4, help="interleaved runs of the four ways")
    parser.add_argument("--size", type=int, default=256, help="elements per input (tiny: launch-bound)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 2

    x = torch.randn(1, args.size, device="cuda")
    y = torch.randn(1, args.size, device="cuda")
    graph = make_fx(lambda a, b: torch.sigmoid(a) * b + 1.0, tracing_mode="fake")(x, y).graph
    (part,) = partition_graph(graph, GeneralOpSupport()).partitions
    task = extract_task(part)
    key = make_key(task)
    with tempfile.TemporaryDirectory() as tmp:
        cache = KernelCache(Path(tmp), None)
        cache.put(CacheEntry(key=key, kind=EntryKind.KERNEL, task=task, kernel_source=GATED_KERNEL, policy="hand-written"))
        runtime.use_cache(cache, Config(cache_dir=Path(tmp)))
        loaded = runtime.lookup(key.digest)
        ext = loaded.kernel.__func__.__globals__["gated_ext"]
        forward = loaded.kernel
        op = torch.ops.kevin.launch.default
        digest = key.digest
        inputs = [x, y]
        assert torch.allclose(op(digest, inputs, False)[0], ext.gated(x, y))
        results = {}
        for _ in range(args.runs):  # interleaved, so drift shows up as disagreement between runs
            results.setdefault("bare", []).append(per_call_us(lambda: ext.gated(x, y), args.calls, args.rounds))
            results.setdefault("module", []).append(per_call_us(lambda: forward(x, y), args.calls, args.rounds))
            results.setdefault("op", []).append(per_call_us(lambda: op(digest, inputs, False), args.calls, args.rounds))
            results.setdefault("dispatch", []).append(per_call_us(lambda: op._op(digest, inputs, False), args.calls, args.rounds))
    summary = {name: statistics.median(values) for name, values in results.items()}
    summary["op_overhead_us"] = summary["op"] - summary["bare"]
    summary["op_overhead_over_module_us"] = summary["op"] - summary["module"]
    summary["dispatch_overhead_us"] = summary["dispatch"] - summary["bare"]
    print(f"{'call':<9} {'us/call':>8}   (median of {args.runs} interleaved runs; each run's value)")
    for name in ("bare", "module", "op", "dispatch"):
        print(f"{name:<9} {summary[name]:8.2f}   {[round(v, 2) for v in results[name]]}")
    print(f"kevin::launch overhead over a bare launch: {summary['op_overhead_us']:.2f} us/call "
          f"(over the module's forward: {summary['op_overhead_over_module_us']:.2f}; through the dispatcher: "
          f"{summary['dispatch_overhead_us']:.2f})")
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}")
    if args.json:
        args.json.write_text(json.dumps({"results": results, "summary": summary}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
