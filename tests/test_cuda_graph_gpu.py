"""On a GPU: a model compiled with a kevin kernel is captured into a CUDA graph and replayed
with new input values (the runtime op neither synchronizes nor launches outside torch's current
stream: either would fail the capture), and it runs on a user's stream."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import kevin_backend
from gpu_kernels import GATED_OPS, compile_with_gated_kernel
from kevin_backend.runtime import registry as runtime
from kevin_backend.backend.report import Status

pytestmark = pytest.mark.gpu


def _compiled_with_kernel(kevin_dir: Path, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.nn.Module, object, str]:
    model, compiled, digest = compile_with_gated_kernel(kevin_dir, x, y, graph_check=False)
    compiled(x, y)
    (record,) = [r for r in kevin_backend.last_report().records() if r.ops == GATED_OPS]
    assert record.status is Status.HIT
    return model, compiled, digest


def test_a_compiled_model_with_a_kevin_kernel_is_captured_and_replayed(kevin_dir: Path) -> None:
    torch.manual_seed(0)
    x, y = torch.randn(512, 1024, device="cuda"), torch.randn(512, 1024, device="cuda")
    model, compiled, digest = _compiled_with_kernel(kevin_dir, x, y)
    static_x, static_y = x.clone(), y.clone()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up on a side stream, as capture wants
        for _ in range(3):
            compiled(static_x, static_y)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    before = runtime.kernel_calls()[digest]
    with torch.cuda.graph(graph):
        static_out = compiled(static_x, static_y)
    assert runtime.kernel_calls()[digest] == before + 1  # the kernel itself was captured, not its fallback
    for seed in (1, 2, 3):
        torch.manual_seed(seed)
        new_x, new_y = torch.randn_like(x), torch.randn_like(y)
        static_x.copy_(new_x)
        static_y.copy_(new_y)
        graph.replay()
        torch.cuda.synchronize()
        want = model(new_x, new_y)
        torch.testing.assert_close(static_out, want, rtol=1e-5, atol=1e-5 * float(want.abs().max()))
    assert runtime.kernel_calls()[digest] == before + 1  # replays run the captured launch, no Python


def test_a_compiled_model_with_a_kevin_kernel_runs_on_a_users_stream(kevin_dir: Path) -> None:
    torch.manual_seed(0)
    x, y = torch.randn(512, 1024, device="cuda"), torch.randn(512, 1024, device="cuda")
    model, compiled, digest = _compiled_with_kernel(kevin_dir, x, y)
    stream = torch.cuda.Stream()
    before = runtime.kernel_calls()[digest]
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        # a long op first on the same stream: a kernel launched elsewhere would read x too early
        x.mul_(2.0).mul_(0.5)
        got = compiled(x, y)
    stream.synchronize()
    assert runtime.kernel_calls()[digest] == before + 1
    torch.testing.assert_close(got, model(x, y), rtol=1e-5, atol=1e-5 * float(got.abs().max()))
