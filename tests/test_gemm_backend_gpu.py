"""A compiled bf16 nn.Linear + GELU, and a compiled ResNet-style CNN in inference, on a Hopper GPU
with CUTLASS's headers: the backend gives the partitions (the weight's transpose and the
activations' views outside it; each convolution with its batch norm and ReLU) to the built-in
writer's CUTLASS kernels, the judge checks and times them, and the model's output stays right
whatever is kept. A float32 convolution is declined where cuDNN computes it in TF32."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import kevin_backend
from kevin_backend.backend.report import Status

pytestmark = pytest.mark.gpu


def _searched(model: torch.nn.Module, x: torch.Tensor, kevin_dir: Path, tolerance: float, turns: int = 1):  # type: ignore[no-untyped-def]
    """The compile report of `model` compiled with the built-in writer (a search of `turns` turns
    per partition), its output on `x` checked against eager's."""
    torch._dynamo.reset()
    with torch.no_grad():
        got = torch.compile(model, backend="kevin", options={
            "mode": "generate", "cache_dir": str(kevin_dir), "policy": "builtin", "trajectories": 1, "turns": turns,
            "seed_cache": False})(x)
        want = model(x)
    report = kevin_backend.last_report()
    print(report)
    torch.testing.assert_close(got, want, rtol=tolerance, atol=tolerance)
    return report


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
                    reason="needs a Hopper GPU (sm_90a)")
def test_a_compiled_linear_is_searched_with_the_cutlass_gemm(kevin_dir: Path) -> None:
    from kevin_backend.toolchain.cutlass_headers import find_cutlass

    if find_cutlass() is None:
        pytest.skip("needs CUTLASS's headers (pip install 'kevin_backend[cutlass]')")
    model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.GELU(approximate="tanh")).cuda().to(torch.bfloat16)
    report = _searched(model, torch.randn(8, 512, 1024, device="cuda", dtype=torch.bfloat16), kevin_dir, 2e-2)
    (gemm,) = [r for r in report.records() if "aten.addmm.default" in r.ops]
    assert gemm.status in (Status.GENERATED, Status.INDUCTOR), (gemm.status, gemm.reason, gemm.detail)
    assert gemm.search is not None and (gemm.search.candidates or 0) >= 1, gemm.search
    # a kernel kept carries its speed against Inductor; an Inductor decision says why, and no
    # candidate of the search may have failed the judge's checks
    if gemm.status is Status.GENERATED:
        assert gemm.speedup_vs_inductor is not None
    for failure in ("MISMATCH", "COMPILE", "NAN_INF", "RUNTIME_ERROR", "ILLEGAL"):
        assert failure not in gemm.detail, gemm.detail


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
                    reason="needs a Hopper GPU (sm_90a)")
def test_a_kept_cutlass_gemm_runs_in_the_compiled_model(kevin_dir: Path) -> None:
    """A bf16 Linear + GELU whose CUTLASS kernel is kept (margin -0.5: whatever its speed, so this is a
    test of the kernel in the model, not of a race) runs in the compiled model, its output eager's."""
    from kevin_backend.runtime.registry import kernel_calls
    from kevin_backend.toolchain.cutlass_headers import find_cutlass

    if find_cutlass() is None:
        pytest.skip("needs CUTLASS's headers (pip install 'kevin_backend[cutlass]')")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.GELU(approximate="tanh")).cuda().to(torch.bfloat16)
    x = torch.randn(8, 512, 1024, device="cuda", dtype=torch.bfloat16)
    torch._dynamo.reset()
    with torch.no_grad():
        got = torch.compile(model, backend="kevin", options={
            "mode": "generate", "cache_dir": str(kevin_dir), "policy": "builtin", "trajectories": 1, "turns": 1,
            "margin": -0.5, "seed_cache": False})(x)
        want = model(x)
    report = kevin_backend.last_report()
    print(report)
    (gemm,) = [r for r in report.records() if "aten.addmm.default" in r.ops]
    assert gemm.status is Status.GENERATED, (gemm.status, gemm.reason, gemm.detail)
    assert "tile" in gemm.detail, gemm.detail  # (the report names the CUTLASS kernel's tile and cluster)
    assert kernel_calls().get(gemm.key or "", 0) >= 1, "the compiled model ran the partition's reference, not the kernel"
    torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2)


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
                    reason="needs a Hopper GPU (sm_90a)")
def test_a_compiled_cnns_convolutions_are_searched_with_their_batch_norm(kevin_dir: Path) -> None:
    from kevin_backend.example_models import make_example
    from kevin_backend.toolchain.cutlass_headers import find_cutlass

    if find_cutlass() is None:
        pytest.skip("needs CUTLASS's headers (pip install 'kevin_backend[cutlass]')")
    model, (x,) = make_example("cnn", device="cuda", dtype=torch.bfloat16, size="large")
    model = model.eval().to(memory_format=torch.channels_last)
    report = _searched(model, x.contiguous(memory_format=torch.channels_last), kevin_dir, 3e-2)
    convs = [r for r in report.records() if "aten.convolution.default" in r.ops]
    assert len(convs) == 2 and all("aten.relu.default" in r.ops for r in convs), [r.ops for r in convs]
    for conv in convs:
        assert conv.status in (Status.GENERATED, Status.INDUCTOR), (conv.status, conv.reason, conv.detail)
        assert conv.search is not None and (conv.search.candidates or 0) >= 1, conv.search
        for failure in ("MISMATCH", "COMPILE", "NAN_INF", "RUNTIME_ERROR", "ILLEGAL"):
            assert failure not in conv.detail, conv.detail


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
                    reason="needs a Hopper GPU (sm_90a)")
@pytest.mark.parametrize("tf32", [True, False])
def test_a_float32_convolution_is_searched_only_where_cudnn_computes_it_in_float32(kevin_dir: Path, tf32: bool) -> None:
    """A float32 3x3 convolution of 64 channels with its ReLU: under torch's default (cuDNN's float32
    convolutions in TF32, which the partition's cache key names) the writer is told so and declines
    it without building anything; with cudnn.allow_tf32 off it writes its 3xTF32 kernel."""
    from kevin_backend.toolchain.cutlass_headers import find_cutlass

    if find_cutlass() is None:
        pytest.skip("needs CUTLASS's headers (pip install 'kevin_backend[cutlass]')")
    model = torch.nn.Sequential(torch.nn.Conv2d(64, 64, 3, padding=1), torch.nn.ReLU()).cuda().eval()
    before = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = tf32
    try:
        report = _searched(model, torch.randn(32, 64, 28, 28, device="cuda"), kevin_dir, 2e-2 if tf32 else 1e-3)
    finally:
        torch.backends.cudnn.allow_tf32 = before
    (conv,) = [r for r in report.records() if "aten.convolution.default" in r.ops]
    assert conv.status in (Status.GENERATED, Status.INDUCTOR), (conv.status, conv.reason, conv.detail)
    candidates = (conv.search.candidates or 0) if conv.search is not None else 0
    if tf32:  # (the same partition without TF32, below, is searched: the writer is what declined here)
        assert candidates == 0 and conv.status is Status.INDUCTOR, (conv.search, conv.reason, conv.detail)
        assert "declined" in conv.detail and "cudnn.allow_tf32" in conv.detail, conv.detail
    else:
        assert candidates >= 1, (conv.search, conv.reason, conv.detail)
