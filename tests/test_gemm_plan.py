"""The built-in writer's reading of a GEMM task (`generate/builtin/gemm_plan.py`): which matmul and
which epilogue it fuses, each task it declines with the reason, and the program it writes (which
the static rules take)."""

from __future__ import annotations

import pytest

from kevin_backend.generate.builtin.gemm_kernel import GemmTiling
from kevin_backend.generate.builtin.gemm_plan import GemmPlan, plan_gemm, write_gemm_program
from kevin_backend.generate.builtin.plan import Declined
from kevin_backend.toolchain.static_rules import check_program


def task(forward: str, inputs: str) -> str:
    return f"""import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def forward(self, *v):
        return {forward}


def get_inputs():
    return [{inputs}]


def get_init_inputs():
    return []
"""


BF16 = "dtype=torch.bfloat16"
LINEAR_GELU = task("F.gelu(F.linear(v[0], v[1], v[2]))",
                   f"torch.randn(4, 512, 1024, {BF16}), torch.randn(2048, 1024, {BF16}), torch.randn(2048, {BF16})")


def _plan(source: str) -> GemmPlan:
    plan = plan_gemm(source)
    assert isinstance(plan, GemmPlan), plan
    return plan


def test_a_linear_with_its_bias_and_gelu_over_a_3d_input() -> None:
    plan = _plan(LINEAR_GELU)
    assert (plan.m, plan.n, plan.k, plan.x, plan.w, plan.bias, plan.residual) == (2048, 2048, 1024, 0, 1, 2, None)
    assert plan.spec.dtype == "bfloat16" and plan.spec.epilogue.bias and plan.spec.epilogue.activation == "gelu"
    assert plan.describe() == "2048x2048x1024 bfloat16, bias, gelu"


def test_a_scaled_product_with_a_residual_and_silu() -> None:
    f16 = "dtype=torch.float16"
    source = task("F.silu(torch.add((v[0] @ v[1].t()) * 0.25, v[2], alpha=2.0))",
                  f"torch.randn(1024, 768, {f16}), torch.randn(512, 768, {f16}), torch.randn(1024, 512, {f16})")
    plan = _plan(source)
    e = plan.spec.epilogue
    assert (e.alpha, e.residual, e.beta, e.activation, e.bias, plan.residual) == (0.25, True, 2.0, "silu", False, 2)
    tanh = _plan(task("F.gelu(v[0] @ v[1].t() + v[2], approximate='tanh')",
                      f"torch.randn(256, 512, {BF16}), torch.randn(1024, 512, {BF16}), torch.randn(1024, {BF16})"))
    assert tanh.spec.epilogue.activation == "gelu_tanh" and tanh.bias == 2
    assert _plan(task("torch.sigmoid(v[0] @ v[1].t())", f"torch.randn(256, 512, {BF16}), torch.randn(1024, 512, {BF16})")
                 ).spec.epilogue.activation == "sigmoid"


def test_a_k_by_n_weight_is_read_as_it_lies() -> None:
    plan = _plan(task("F.relu(v[0] @ v[1])", f"torch.randn(256, 512, {BF16}), torch.randn(512, 1024, {BF16})"))
    assert (plan.m, plan.n, plan.k, plan.spec.weight, plan.spec.epilogue.activation) == (256, 1024, 512, "kn", "relu")
    assert plan.describe() == "256x1024x512 bfloat16, K x N weight, relu"
    program = write_gemm_program(plan, GemmTiling())
    assert "Element, cutlass::layout::RowMajor, kAlign,\n    float, TileShape" in program  # B row-major: K x N
    assert "n = w.size(1)" in program and check_program(program) == ()


@pytest.mark.parametrize(("forward", "inputs", "reason"), [
    ("F.relu(v[0] @ v[1].t())", "torch.randn(256, 512), torch.randn(1024, 512)", "float32 would run as TF32"),
    ("v[0] @ v[1].exp()", f"torch.randn(256, 512, {BF16}), torch.randn(512, 1024, {BF16})", "right operand is not an input"),
    ("v[0] @ v[1].t()", f"torch.randn(256, 512, {BF16}), torch.randn(50257, 512, {BF16})", "N = 50257"),
    ("F.relu(v[0] @ v[1].t()) * 2.0", f"torch.randn(256, 512, {BF16}), torch.randn(1024, 512, {BF16})", "after the activation"),
    ("(v[0] @ v[1].t() + v[2]) * 0.5", f"torch.randn(256, 512, {BF16}), torch.randn(1024, 512, {BF16}), torch.randn(1024, {BF16})",
     "a scale after an add"),
    ("(v[0] @ v[1].t()) @ v[2].t()", f"torch.randn(256, 512, {BF16}), torch.randn(1024, 512, {BF16}), torch.randn(64, 1024, {BF16})",
     "2 matmuls"),
    ("torch.tanh(v[0] @ v[1].t())", f"torch.randn(256, 512, {BF16}), torch.randn(1024, 512, {BF16})", "not one the GEMM writer fuses"),
])
def test_what_it_cannot_fuse_is_declined_with_the_reason(forward: str, inputs: str, reason: str) -> None:
    declined = plan_gemm(task(forward, inputs))
    assert isinstance(declined, Declined) and reason in declined.reason, declined


def test_the_program_calls_the_kernel_with_the_tasks_inputs_and_passes_the_static_rules() -> None:
    program = write_gemm_program(_plan(LINEAR_GELU), GemmTiling((128, 256, 64), (1, 2, 1)))
    assert "return ext.gemm_epilogue(v0, v1, v2, torch.empty(0, device=v0.device, dtype=v0.dtype))" in program
    assert "cooperative tile 128x256x64 cluster 1x2" in program and "compute_90a" in program
    assert check_program(program) == ()
