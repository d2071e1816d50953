"""On a GPU: the graph-level check drops a kernel that splits a fusion. The gated model's
pointwise partition feeds a cumsum; Inductor alone fuses the two into one kernel, while the kevin
kernel makes the graph two launches, an extra round trip of the intermediate through memory and
the runtime op's host time. Timed as it runs, the graph is slower with the kernel: it is dropped,
the report says why, and a new compile reuses the stored outcome."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import kevin_backend
from gpu_kernels import GATED_OPS, compile_with_gated_kernel
from kevin_backend.runtime import registry as runtime
from kevin_backend.backend.report import Status
from kevin_backend.runtime.counters import counters

pytestmark = pytest.mark.gpu


def test_a_kernel_that_splits_a_fusion_is_dropped_with_its_reason(kevin_dir: Path) -> None:
    torch.manual_seed(0)
    x, y = torch.randn(512, 1024, device="cuda"), torch.randn(512, 1024, device="cuda")
    model, compiled, digest = compile_with_gated_kernel(kevin_dir, x, y, graph_check=True)
    got = compiled(x, y)  # the first call: the graph timed with and without the kernel
    torch.testing.assert_close(got, model(x, y), rtol=1e-5, atol=1e-5 * float(got.abs().max()))
    report = kevin_backend.last_report()
    print(report)
    (record,) = [r for r in report.records() if r.ops == GATED_OPS]
    assert record.status is Status.DROPPED, str(report)
    assert "lower bound" in record.detail and record.key == digest
    assert counters["graph_checks"] == 1 and counters["dropped"] == 1
    calls = runtime.kernel_calls()[digest]
    for _ in range(3):
        compiled(x, y)
    assert runtime.kernel_calls()[digest] == calls  # Inductor's fused code runs now
    assert list((kevin_dir / "graph_checks").glob("*.json"))

    torch._dynamo.reset()
    counters.reset()
    again = torch.compile(model, backend="kevin", options={"cache_dir": str(kevin_dir), "graph_check": True})
    torch.testing.assert_close(again(x, y), model(x, y), rtol=1e-5, atol=1e-5 * float(got.abs().max()))
    assert counters["graph_checks"] == 0 and counters["graph_checks_stored"] == 1
    (record,) = [r for r in kevin_backend.last_report().records() if r.ops == GATED_OPS]
    assert record.status is Status.DROPPED
