"""The GEMM bench's peers: cuBLASLt's fused epilogue as a task of its own (computing what the task
computes, where cuBLASLt fuses that epilogue) and Inductor's max-autotune as judge numerics."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from test_gemm_plan import LINEAR_GELU, task

ROOT = Path(__file__).resolve().parents[1]


def _bench():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("bench_gemm", ROOT / "benchmarks" / "bench_gemm.py")
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    sys.modules["bench_gemm"] = module
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


@pytest.mark.parametrize("forward, gelu", [("F.relu(F.linear(v[0], v[1], v[2]))", False),
                                           ("F.gelu(v[0] @ v[1].t() + v[2], approximate='tanh')", True)])
def test_the_cublaslt_peer_computes_the_task(forward: str, gelu: bool) -> None:
    from kevin_backend.generate.builtin.gemm_plan import GemmPlan, plan_gemm
    from kevin_backend.types import load_program

    half = "dtype=torch.float16"
    plan = plan_gemm(task(forward, f"torch.randn(2, 64, 32, {half}), torch.randn(48, 32, {half}), torch.randn(48, {half})"))
    assert isinstance(plan, GemmPlan), plan
    # (run here in float32, the CPU's: the plan of its 16-bit twin names the same inputs)
    source = task(forward, "torch.randn(2, 64, 32), torch.randn(48, 32), torch.randn(48)")
    peer = _bench().cublaslt_task(source, plan)
    assert peer is not None and f"use_gelu={gelu})" in peer
    if gelu:
        return  # (torch's CPU form of it is erf's GELU; on a GPU, cuBLASLt's and its fallback are tanh's)
    module = load_program(peer, "kevin_test_cublaslt_peer")
    x, w, b = module.get_inputs()
    got = module.Model(*module.get_init_inputs())(x, w, b)
    torch.testing.assert_close(got, torch.relu(x @ w.t() + b), rtol=1e-4, atol=1e-4)


def test_a_1x1_convolutions_peer_multiplies_its_channels_last_rows() -> None:
    """A 1x1 convolution of a channels-last input is a GEMM of its rows of channels: cuBLASLt's peer
    multiplies those rows and gives the output back as N x C_out x H x W; a 3x3 one has no peer."""
    from kevin_backend.generate.builtin.gemm_plan import GemmPlan, plan_gemm
    from kevin_backend.types import load_program

    def conv(size: int, dtype: str) -> str:
        return task("F.relu(F.conv2d(v[0], v[1], v[2], padding=%d))" % (size // 2),
                    f"torch.randn(2, 32, 6, 5, {dtype}).to(memory_format=torch.channels_last), "
                    f"torch.randn(80, 32, {size}, {size}, {dtype}), torch.randn(80, {dtype})")  # (80 output channels: past the direct kernel's 64)

    bench = _bench()
    plan = plan_gemm(conv(1, "dtype=torch.float16"))
    assert isinstance(plan, GemmPlan) and plan.conv, plan
    peer = bench.cublaslt_task(conv(1, "dtype=torch.float32"), plan)  # (run on the CPU in float32)
    assert peer is not None
    module = load_program(peer, "kevin_test_cublaslt_conv_peer")
    x, w, b = module.get_inputs()
    got = module.Model(*module.get_init_inputs())(x, w, b)
    torch.testing.assert_close(got, torch.relu(F.conv2d(x, w, b)), rtol=1e-4, atol=1e-4)
    three = plan_gemm(conv(3, "dtype=torch.float16"))
    assert isinstance(three, GemmPlan) and three.spec.convolution is not None, three
    assert bench.cublaslt_task(conv(3, "dtype=torch.float32"), three) is None


def test_epilogues_cublaslt_does_not_fuse_have_no_peer() -> None:
    from kevin_backend.generate.builtin.gemm_plan import GemmPlan, plan_gemm

    bench = _bench()
    exact_gelu = plan_gemm(LINEAR_GELU)  # erf GELU: cuBLASLt's is tanh's
    no_bias = plan_gemm(task("F.relu(v[0] @ v[1].t())", "torch.randn(64, 32, dtype=torch.float16), "
                             "torch.randn(48, 32, dtype=torch.float16)"))
    assert isinstance(exact_gelu, GemmPlan) and isinstance(no_bias, GemmPlan)
    assert bench.cublaslt_task(LINEAR_GELU, exact_gelu) is None and bench.cublaslt_task("", no_bias) is None


def test_max_autotune_is_named_in_the_judges_numerics() -> None:
    import json

    numerics = _bench().max_autotune_numerics()
    config = json.loads(numerics["inductor_config"])
    assert config.get("max_autotune") is True and "triton.cudagraphs" not in config, config
