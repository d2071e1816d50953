"""On a GPU: a hand-written kernel placed in the cache for one partition is swapped in, matches
eager, and is found again by a fresh process whose Inductor cache is warm."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import kevin_backend
from gpu_kernels import GATED_KERNEL, GATED_OPS, gated_model
from kevin_backend.backend.report import Status
from kevin_backend.runtime.counters import counters
from kevin_backend.cache.format import CacheEntry, EntryKind, Timings
from kevin_backend.runtime import registry as runtime
from kevin_backend.cache.store import KernelCache

pytestmark = pytest.mark.gpu

_FRESH = textwrap.dedent(
    """
    import json, sys, torch, kevin_backend
    sys.path.insert(0, sys.argv[2])
    from gpu_kernels import gated_model
    torch.manual_seed(1)
    x, y = torch.randn(512, 1024, device="cuda"), torch.randn(512, 1024, device="cuda")
    model = gated_model()
    want = model(x, y)
    got = torch.compile(model, backend="kevin", options={"cache_dir": sys.argv[1]})(x, y)
    report = kevin_backend.last_report()
    print(json.dumps({
        "error": ((got - want).abs().max() / want.abs().max()).item(),
        "statuses": [r.status.value for r in report.records()],
        "graphs": len(report.graphs),
        "counters": kevin_backend.counters.snapshot(),
        "kernel_calls": sum(__import__("kevin_backend.runtime.registry", fromlist=["x"]).kernel_calls().values()),
    }))
    """
)


def test_handwritten_kernel_is_hit_and_survives_a_fresh_process(kevin_dir: Path, tmp_path: Path) -> None:
    torch.manual_seed(0)
    x, y = torch.randn(512, 1024, device="cuda"), torch.randn(512, 1024, device="cuda")
    model = gated_model()
    want = model(x, y)
    options = {"cache_dir": str(kevin_dir)}

    # 1. empty cache: the partition is a miss, recorded as a pending task
    got = torch.compile(model, backend="kevin", options=options)(x, y)
    torch.testing.assert_close(got, want)
    report = kevin_backend.last_report()
    (record,) = [r for r in report.records() if r.ops == GATED_OPS]
    assert record.status is Status.PENDING
    cache = KernelCache(kevin_dir, None)
    (pending,) = [p for p in cache.pending() if p.task.ops == GATED_OPS]

    # 2. the hand-written kernel enters the cache for that key
    entry = CacheEntry(
        key=pending.key,
        kind=EntryKind.KERNEL,
        task=pending.task,
        kernel_source=GATED_KERNEL,
        timings=Timings(eager_ms=None, inductor_ms=None, kernel_ms=None),
        policy="hand-written (test)",
    )
    assert cache.put(entry)

    # 3. compiled again: the report shows the hit and the outputs match eager
    torch._dynamo.reset()
    counters.reset()
    got = torch.compile(model, backend="kevin", options=options)(x, y)
    torch.testing.assert_close(got, want)
    report = kevin_backend.last_report()
    print(report)
    (record,) = [r for r in report.records() if r.ops == GATED_OPS]
    assert record.status is Status.HIT and record.key == pending.key.digest
    counters.expect(hits=1, fallbacks=0, compile_fallbacks=0)
    ran = runtime.kernel_calls().get(pending.key.digest, 0)
    assert ran >= 1, "the compiled model ran the kernel's reference, not the kernel"  # the kernel itself ran

    # 4. a fresh process with the (now warm) Inductor cache: served by Inductor's cache, the
    #    cached code calls kevin::launch by name, which loads the kernel from the kevin cache
    env = {**os.environ}
    out = subprocess.run(
        [sys.executable, "-c", _FRESH, str(kevin_dir), str(Path(__file__).parent)],
        env=env, capture_output=True, text=True, timeout=900,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    fresh = json.loads(out.stdout.strip().splitlines()[-1])
    print("fresh process:", fresh)
    assert fresh["error"] < 1e-6  # relative to the largest output (a cumsum over 1024 values)
    assert fresh["graphs"] == 0  # Inductor's cache served the graph: the kevin pass did not run
    assert fresh["counters"]["runtime_loads"] == 1
    assert fresh["kernel_calls"] >= 1  # the hand-written kernel ran, not its reference
