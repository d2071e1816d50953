"""The GEMM writer's epilogue function: an elementwise chain after the product that none of
CUTLASS's activations is (a compiled model's decomposed tanh-GELU, a scale or clamp after an
activation), written as C++ statements on the value. The statements are run here as written (a
line-for-line reading into torch) against PyTorch's own function on the same values."""

from __future__ import annotations

import math
import re

import pytest
import torch
import torch.nn.functional as F

from test_gemm_plan import BF16, compiled_graph, task

F16 = "dtype=torch.float16"


def run_statements(body: str, v: torch.Tensor, *operands: torch.Tensor) -> torch.Tensor:
    """The function's C++ statements evaluated on float32 `v` (and a tree's operands `a0`, `a1`, ...,
    broadcast against it), element by element as the kernel does."""
    def rounded(dtype: torch.dtype):  # type: ignore[no-untyped-def]
        return lambda x: torch.as_tensor(x).to(dtype).float()

    def pair(op):  # type: ignore[no-untyped-def]
        return lambda a, b: op(torch.as_tensor(a, dtype=torch.float32), torch.as_tensor(b, dtype=torch.float32))

    env = {"v": v, "tanhf": torch.tanh, "expf": torch.exp, "erff": torch.erf, "logf": torch.log, "log1pf": torch.log1p,
           "expm1f": torch.expm1, "sqrtf": torch.sqrt, "rsqrtf": torch.rsqrt, "fabsf": torch.abs, "sinf": torch.sin,
           "cosf": torch.cos, "fminf": pair(torch.minimum), "fmaxf": pair(torch.maximum), "powf": pair(torch.pow),
           "round_bf16": rounded(torch.bfloat16), "round_f16": rounded(torch.float16), "INFINITY": math.inf,
           # the built-in writer's helpers (cuda/device_helpers.cuh), as their precise forms compute them
           "KEVIN_EXPF": torch.exp, "KEVIN_LOGF": torch.log, "kevin_tanh": torch.tanh, "kevin_sigmoid": torch.sigmoid,
           "kevin_silu": F.silu, "kevin_gelu_erf": F.gelu, "kevin_gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
           **{f"a{j}": a.float() for j, a in enumerate(operands)}}
    text = body.replace("static_cast<float>(cutlass::bfloat16_t(", "round_bf16((").replace(
        "static_cast<float>(cutlass::half_t(", "round_f16((")
    text = re.sub(r"(\d(?:\.\d*)?(?:e[-+]?\d+)?)f\b", r"\1", text)
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("float "):
            name, expr = line[len("float "):].rstrip(";").split(" = ", 1)
            env[name] = eval(expr, env)  # noqa: S307 - the writer's own statements, in this test
        elif line.startswith("return static_cast<T>("):
            return torch.as_tensor(eval(line[len("return static_cast<T>("):-2], env))  # noqa: S307
    raise AssertionError(f"no return in {body!r}")


def _plan(forward: str, inputs: str):  # type: ignore[no-untyped-def]
    from kevin_backend.generate.builtin.gemm_plan import plan_gemm

    return plan_gemm(task(forward, inputs))


LINEAR_BF16 = f"torch.randn(256, 128, {BF16}), torch.randn(256, 128, {BF16}), torch.randn(256, {BF16})"


@pytest.mark.parametrize("forward, function", [
    ("torch.clamp(F.gelu(v[0] @ v[1].t() + v[2], approximate='tanh') * 2.0, -1.0, 1.0)",
     lambda y: torch.clamp(F.gelu(y, approximate="tanh") * 2.0, -1.0, 1.0)),
    # (the tracer decomposes hardswish with casts: its result is rounded to bfloat16 before the subtraction, as eager's)
    ("F.hardswish(F.linear(v[0], v[1], v[2])) - 0.5", lambda y: F.hardswish(y).bfloat16().float() - 0.5),
    ("torch.tanh(F.relu(F.linear(v[0], v[1], v[2])) / 3.0)", lambda y: torch.tanh(F.relu(y) / 3.0)),
    ("F.mish(F.linear(v[0], v[1], v[2]))", F.mish),
])
def test_a_chain_none_of_cutlass_activations_is_written_as_a_function(forward, function) -> None:  # type: ignore[no-untyped-def]
    from kevin_backend.generate.builtin.gemm_kernel import GemmTiling, gemm_device_source
    from kevin_backend.generate.builtin.gemm_plan import GemmPlan

    plan = _plan(forward, LINEAR_BF16)
    assert isinstance(plan, GemmPlan), plan
    e = plan.spec.epilogue
    assert e.activation == "function" and e.bias and plan.bias == 2, e
    assert "an elementwise function" in plan.describe()
    v = torch.linspace(-6, 6, 4001)
    want = function(v)  # the product in float32 (the exact run's, not rounded as eager's), the chain after it
    torch.testing.assert_close(run_statements(e.function, v), want, rtol=1e-5, atol=1e-5)
    source = gemm_device_source(plan.spec, GemmTiling())
    assert "template <class T> struct KevinEpilogueFn" in source and "KevinEpilogueFn<cutlass::Array<T, N>>" in source
    assert "LinCombPerColBiasEltAct<KevinEpilogueFn, Element" in source


def test_a_compiled_linears_decomposed_tanh_gelu_is_its_function() -> None:
    # On an H200 a compiled bf16 nn.Linear + GELU(tanh) reached the writer with the GELU decomposed
    # (casts to float32 and back, the cube, tanh): "convert_element_type is read 4 times: the
    # epilogue is a chain", and the partition stayed Inductor's.
    from torch._inductor.decomposition import select_decomp_table

    from kevin_backend.generate.builtin.gemm_plan import GemmPlan, _read_gemm

    def model(x, w, b):  # type: ignore[no-untyped-def]
        return F.gelu(F.linear(x, w, b), approximate="tanh")

    x, w, b = torch.randn(32, 64), torch.randn(128, 64), torch.randn(128)
    graph = compiled_graph(model, *(t.to(torch.float16) for t in (x, w, b)), decompositions=select_decomp_table())
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    metas = [p.meta["val"] for p in placeholders]
    assert any(n.target is torch.ops.aten.tanh.default for n in graph.nodes)  # decomposed, as the backend sees it
    plan = _read_gemm(graph, metas, "sm90")
    assert isinstance(plan, GemmPlan) and plan.spec.epilogue.activation == "function", plan
    v = torch.linspace(-8, 8, 4001)
    torch.testing.assert_close(run_statements(plan.spec.epilogue.function, v),
                               F.gelu(v, approximate="tanh"), rtol=1e-5, atol=1e-5)


def test_a_chain_reading_other_tensors_is_one_function_of_the_accumulator_and_its_operands() -> None:
    # a tensor of the output's size after the activation, a column of M values, a second bias over
    # N: a visitor tree whose function starts from the accumulator and reads each as an operand
    x, w = torch.randn(64, 32, dtype=torch.float16), torch.randn(48, 32, dtype=torch.float16)
    r, rows, b1, b2 = (torch.randn(64, 48, dtype=torch.float16), torch.randn(64, dtype=torch.float16),
                       torch.randn(48, dtype=torch.float16), torch.randn(48, dtype=torch.float16))
    plan = _plan("(torch.relu(F.linear(v[0], v[1], v[4]) + v[5]) * v[2] + v[3].view(64, 1)) * 0.5",
                 f"torch.randn(64, 32, {F16}), torch.randn(48, 32, {F16}), torch.randn(64, 48, {F16}), "
                 f"torch.randn(64, {F16}), torch.randn(48, {F16}), torch.randn(48, {F16})")
    e = plan.spec.epilogue
    assert e.tree and e.operands == ("n", "n", "mn", "m") and plan.operands == (4, 5, 2, 3), plan
    assert (plan.bias, plan.residual, e.bias, e.residual, e.alpha) == (None, None, False, False, 1.0)
    assert "a visitor tree" in plan.describe() and "a vector over M" in plan.describe()
    acc = x.float() @ w.float().t()
    got = run_statements(e.function, acc, b1, b2, r, rows.view(64, 1))
    want = (torch.relu(F.linear(x, w, b1) + b2) * r + rows.view(64, 1)) * 0.5
    torch.testing.assert_close(got.half(), want, rtol=2e-3, atol=2e-3)


def test_an_epilogue_function_needs_its_activation_name() -> None:
    from kevin_backend.generate.builtin.gemm_kernel import Epilogue

    with pytest.raises(ValueError, match="activation 'function'"):
        Epilogue(function="    return static_cast<T>(v);")
    with pytest.raises(ValueError, match="activation 'function'"):
        Epilogue(activation="function")


def test_an_input_read_twice_is_one_operand_per_shape_it_is_read_in() -> None:
    # v[2] scales the columns and is added again: one operand; then read as a column too (M = N):
    # a second operand, the same input broadcast over the rows
    x, w, s = torch.randn(64, 32), torch.randn(64, 32), torch.randn(64)
    inputs = f"torch.randn(64, 32, {F16}), torch.randn(64, 32, {F16}), torch.randn(64, {F16})"
    once = _plan("(v[0] @ v[1].t()) * v[2] + v[2]", inputs)
    assert once.operands == (2,) and once.spec.epilogue.operands == ("n",), once
    both = _plan("(v[0] @ v[1].t()) * v[2] + v[2].view(64, 1)", inputs)
    assert both.operands == (2, 2) and both.spec.epilogue.operands == ("n", "m"), both
    acc = x @ w.t()
    got = run_statements(both.spec.epilogue.function, acc, s.view(1, 64), s.view(64, 1))
    torch.testing.assert_close(got, acc * s + s.view(64, 1), rtol=1e-5, atol=1e-5)  # (the product unrounded)


def test_the_functions_math_is_the_built_in_writers_helpers() -> None:
    # exp, sigmoid, SiLU, tanh and GELU are the helpers a 16-bit program computes with the device's fast
    # forms (cuda/device_helpers.cuh): never the precise expf and IEEE division written out in the function
    plan = _plan("(lambda y: (F.silu(y) * 2.0 + torch.exp(y * 0.01)) * torch.tanh(F.gelu(y)))(F.linear(v[0], v[1], v[2]))",
                 LINEAR_BF16)
    body = plan.spec.epilogue.function
    assert all(helper in body for helper in ("KEVIN_EXPF(", "kevin_tanh(", "kevin_gelu_erf(")), body
    assert "kevin_silu(" in body or "kevin_sigmoid(" in body, body
    assert not re.search(r"(?<![_A-Z])(expf|tanhf|erff)\(", body), body
    v = torch.linspace(-6, 6, 4001)
    want = (F.silu(v) * 2.0 + torch.exp(v * 0.01)) * torch.tanh(F.gelu(v))  # (the chain rounds to bfloat16 between ops)
    torch.testing.assert_close(run_statements(body, v), want, rtol=1e-2, atol=1e-2)
