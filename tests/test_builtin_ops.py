"""The built-in writer's op table, checked numerically against PyTorch on the CPU.

Every supported overload is traced into a one-op FX graph, its expression emitted, and all of them
go into ONE C++ program (nvcc, host code: the helpers are `__host__ __device__`, and a kernel
calling every case makes nvcc compile them for the device too). The program evaluates each case
on a few hundred inputs, special values included (±0, ±inf, NaN, tiny, huge, values at the
thresholds of softplus/hardswish/the fp16 and bf16 rounding), read from a binary file; the results
are compared with PyTorch's own, NaN positions included.
"""

from __future__ import annotations

import math
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import pytest
import torch
import torch.fx as fx
from torch.fx.experimental.proxy_tensor import make_fx

from kevin_backend.generate.builtin.codegen import cuda_code
from kevin_backend.generate.builtin.ops import (
    SUPPORTED_OPS,
    Unsupported,
    check,
    float_literal,
    is_pointwise,
    pointwise_expr,
)

A = torch.ops.aten
P = torch.ops.prims
DEVICE_HELPERS = cuda_code("device_helpers.cuh")  # the functions the op table's expressions call
inf, nan = math.inf, math.nan
N = 320  # inputs per case

# ----------------------------------------------------------------------------------------------
# Inputs

SPECIALS = [
    0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 2.0, -2.0, 3.0, -3.0, 6.0, -6.0, 0.1, -0.1, 1 / 3, 0.25, 1.5, 2.5,
    -2.5, 1e-7, -1e-7, 1e-30, -1e-30, 1e-40, 5.0, 15.0, 20.0, 20.5, -20.0, 88.0, 89.0, -88.0, -104.0,
    100.0, 1e4, -1e4, 1e10, -1e10, 3e38, -3e38, inf, -inf, nan,
]
# Values where float16 / bfloat16 rounding decides: ties to even, overflow, subnormals.
ROUNDING = [
    65504.0, 65519.0, 65520.0, -65520.0, 6e-8, 2.98e-8, 2.99e-8, 1e-8, 6.1e-5, 1 + 2**-11, 1 + 3 * 2**-11,
    1 + 2**-8, 1 + 3 * 2**-8, 1 + 2**-9, 3.3895e38, 3.39e38, 1e-39, -1e-39, 2049.0, 2051.0, 257.0, 259.0,
]


def _pools() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)

    def wide(count: int) -> torch.Tensor:  # random signs and magnitudes from 1e-8 to 1e8
        signs = torch.where(torch.rand(count, generator=g) < 0.5, -1.0, 1.0)
        return signs * 10 ** (torch.rand(count, generator=g, dtype=torch.float64) * 16 - 8)

    def pool(first: list[float], seed_perm: bool) -> torch.Tensor:
        head = torch.tensor(first, dtype=torch.float64)
        if seed_perm:
            head = head[torch.randperm(len(first), generator=g)]
        rest = N - len(head)
        normal = torch.randn(rest // 2, generator=g, dtype=torch.float64) * 3
        return torch.cat([head, normal, wide(rest - rest // 2)]).float()

    x = pool(SPECIALS, False)
    y = pool(SPECIALS, True)
    same = torch.rand(N, generator=g) < 0.1  # some equal pairs, for the comparisons
    y = torch.where(same, x, y)
    z = pool(SPECIALS, True)
    tiny = wide(N).float() * 1e-5  # magnitudes 1e-13 .. 1e3: relative accuracy near zero
    moderate = torch.where(x.abs() > 1e30, torch.tensor(7.0), x)
    rounding = torch.cat([torch.tensor(ROUNDING), -torch.tensor(ROUNDING), x])[:N].float()
    return {
        "x": x,
        "y": y,
        "z": z,
        "moderate": moderate,
        "tiny": tiny,
        "rounding": rounding,
        "half": x.half(),
        "bf16": x.bfloat16(),
        "bool": torch.rand(N, generator=g) < 0.5,
        "bool2": torch.rand(N, generator=g) < 0.5,
    }


# ----------------------------------------------------------------------------------------------
# Cases


@dataclass(frozen=True)
class Case:
    name: str
    fn: Callable[..., torch.Tensor]  # calls the op under test on tensors from `inputs`
    target: Any  # the overload the traced graph must contain (None: `expr` is given)
    inputs: tuple[str, ...] = ("x",)
    expr: str | None = None  # a raw expression of a0.. (the helpers' own tests)
    exact: bool = False  # bit-exact (casts and rounding)
    tight: bool = False  # relative tolerance only, no absolute floor (accuracy near zero)


def _bound(fn: Callable[..., Any], extra: Any) -> Callable[[torch.Tensor], Any]:
    """`x -> fn(x, extra)` (make_fx traces every parameter, so no `lambda x, extra=extra`)."""
    return lambda x: fn(x, extra)


def _short(op: Any) -> str:
    return str(op).removeprefix("aten.").removesuffix(".default")


def unary(op: Any, inputs: str = "x", **kwargs: Any) -> Case:
    suffix = "" if inputs == "x" else f"({inputs})"
    return Case(f"{_short(op)}{suffix}{kwargs or ''}", lambda x: op(x, **kwargs), op, (inputs,))


def binary(op: Any, a: str = "x", b: str = "y", **kwargs: Any) -> Case:
    return Case(f"{_short(op)}({a},{b}){kwargs or ''}", lambda x, y: op(x, y, **kwargs), op, (a, b))


def with_scalar(op: Any, scalar: Any, inputs: str = "x", **kwargs: Any) -> Case:
    return Case(f"{_short(op)}({inputs},{scalar}){kwargs or ''}", lambda x: op(x, scalar, **kwargs), op, (inputs,))


CASES: list[Case] = [
    # arithmetic
    binary(A.add.Tensor),
    binary(A.add.Tensor, alpha=2.5),
    binary(A.add.Tensor, "half", "x"),
    binary(A.add.Tensor, "bool", "bool2"),  # True + True is True
    with_scalar(A.add.Tensor, 0.5),  # a number where the schema says Tensor, as in Inductor's graphs
    Case("sub.Tensor(1, x)", lambda x: A.sub.Tensor(1, x), A.sub.Tensor),
    with_scalar(A.add.Scalar, 1.5),
    with_scalar(A.add.Scalar, 1.5, alpha=-3),
    binary(A.sub.Tensor),
    binary(A.sub.Tensor, alpha=-0.5),
    with_scalar(A.sub.Scalar, 0.1),
    binary(A.rsub.Tensor),
    with_scalar(A.rsub.Scalar, 2.0),
    with_scalar(A.rsub.Scalar, 2.0, alpha=3),
    binary(A.mul.Tensor),
    binary(A.mul.Tensor, "x", "bool"),
    binary(A.mul.Tensor, "bool", "bool2"),
    Case("mul(add(x, y), neg(y))", lambda x, y: A.mul.Tensor(A.add.Tensor(x, y), A.neg.default(y)), A.mul.Tensor, ("x", "y")),
    with_scalar(A.mul.Scalar, -0.3),
    with_scalar(A.mul.Tensor, inf),
    binary(A.div.Tensor),
    with_scalar(A.div.Scalar, 3.0),
    binary(A.div.Tensor_mode, rounding_mode=None),
    with_scalar(A.div.Scalar_mode, 7.0, rounding_mode=None),
    unary(A.neg.default),
    unary(A.reciprocal.default),
    *[with_scalar(A.pow.Tensor_Scalar, e) for e in (2, 3, 0.5, -0.5, -1, -2, 0, 1, 2.5, -1.5, 1 / 3, 2.0)],
    binary(A.pow.Tensor_Tensor),
    binary(A.xlogy.Tensor),  # 0 where x is 0, NaN where y is NaN, log of negatives NaN
    *[Case(f"pow.Scalar({b}, x)", _bound(lambda x, b: A.pow.Scalar(b, x), b), A.pow.Scalar) for b in (2.0, 0.5, 1.0, -2.0, 0)],
    # math functions
    *[
        unary(op)
        for op in (
            A.abs.default, A.exp.default, A.exp2.default, A.expm1.default, A.log.default, A.log2.default,
            A.log10.default, A.log1p.default, A.sqrt.default, A.rsqrt.default, A.erf.default, A.sin.default,
            A.cos.default, A.tanh.default, A.sigmoid.default, A.floor.default, A.ceil.default, A.trunc.default,
            A.round.default, A.sign.default, A.sgn.default,
        )
    ],
    # near zero, where exp(x) - 1 for expm1 (or erf without care) would lose every digit
    *[
        Case(f"{_short(op)}(tiny)", _bound(lambda x, op: op(x), op), op, ("tiny",), tight=True)
        for op in (A.expm1.default, A.log1p.default, A.sin.default, A.tanh.default, A.erf.default, A.elu.default,
                   A.gelu.default, A.silu.default, A.mish.default, A.hardswish.default)
    ],
    # activations
    unary(A.relu.default),
    # PyTorch's CPU gelu gives NaN at +inf and inf at 3e38 (CUDA's, Inductor's and ours: inf, 3e38)
    unary(A.gelu.default, "moderate"),
    unary(A.gelu.default, "moderate", approximate="none"),
    unary(A.gelu.default, approximate="tanh"),
    unary(A.silu.default),
    unary(A.mish.default),
    unary(A.hardswish.default),
    unary(A.hardsigmoid.default),
    unary(A.hardtanh.default),
    Case("hardtanh(-2.5, 0.5)", lambda x: A.hardtanh.default(x, -2.5, 0.5), A.hardtanh.default),
    unary(A.leaky_relu.default),
    Case("leaky_relu(0.2)", lambda x: A.leaky_relu.default(x, 0.2), A.leaky_relu.default),
    unary(A.softplus.default),
    Case("softplus(2, 5)", lambda x: A.softplus.default(x, 2.0, 5.0), A.softplus.default),
    Case("softplus(0.5, 3)", lambda x: A.softplus.default(x, 0.5, 3), A.softplus.default),
    unary(A.elu.default),
    Case("elu(1.67, 1.05, 0.5)", lambda x: A.elu.default(x, 1.67, 1.05, 0.5), A.elu.default),
    # bounds: NaN from the value or a bound propagates
    Case("clamp(-1.5, 2)", lambda x: A.clamp.default(x, -1.5, 2.0), A.clamp.default),
    Case("clamp(min=-1)", lambda x: A.clamp.default(x, min=-1), A.clamp.default),
    Case("clamp(max=0.5)", lambda x: A.clamp.default(x, max=0.5), A.clamp.default),
    Case("clamp(2, -1)", lambda x: A.clamp.default(x, 2.0, -1.0), A.clamp.default),  # min > max: max
    Case("clamp(min=nan)", lambda x: A.clamp.default(x, nan), A.clamp.default),
    Case("clamp.Tensor(y, z)", lambda x, y, z: A.clamp.Tensor(x, y, z), A.clamp.Tensor, ("x", "y", "z")),
    Case("clamp.Tensor(min=y)", lambda x, y: A.clamp.Tensor(x, min=y), A.clamp.Tensor, ("x", "y")),
    Case("clamp.Tensor(max=y)", lambda x, y: A.clamp.Tensor(x, None, y), A.clamp.Tensor, ("x", "y")),
    with_scalar(A.clamp_min.default, 0.5),
    binary(A.clamp_min.Tensor),
    with_scalar(A.clamp_max.default, -0.25),
    binary(A.clamp_max.Tensor),
    binary(A.maximum.default),
    binary(A.minimum.default),
    binary(A.maximum.default, "bool", "bool2"),
    # selection and comparison
    Case("where.self", lambda c, x, y: A.where.self(c, x, y), A.where.self, ("bool", "x", "y")),
    Case("where.self(bool)", lambda c, x, y: A.where.self(c, x, y), A.where.self, ("bool", "bool2", "bool")),
    Case("where.ScalarSelf", lambda c, y: A.where.ScalarSelf(c, 1.5, y), A.where.ScalarSelf, ("bool", "y")),
    Case("where.ScalarOther", lambda c, x: A.where.ScalarOther(c, x, -inf), A.where.ScalarOther, ("bool", "x")),
    Case("where.Scalar", lambda c: A.where.Scalar(c, 1.5, -2.0), A.where.Scalar, ("bool",)),
    *[binary(getattr(A, name).Tensor) for name in ("gt", "lt", "ge", "le", "eq", "ne")],
    *[with_scalar(getattr(A, name).Scalar, 0.5) for name in ("gt", "lt", "ge", "le", "eq", "ne")],
    *[with_scalar(getattr(A, name).Scalar, 0.1, "half") for name in ("eq", "ne", "gt", "le")],  # vs half(0.1)
    with_scalar(A.eq.Scalar, 0.1, "bf16"),
    with_scalar(A.ge.Scalar, -0.1, "half"),
    with_scalar(A.eq.Scalar, 1, "bool"),
    binary(A.lt.Tensor, "half", "x"),
    Case("eq.Tensor(half, 0-dim f32 0.1)", lambda x: A.eq.Tensor(x, A.full.default([], 0.1, dtype=torch.float32)),
         A.eq.Tensor, ("half",)),  # compared in half, as the 0-dim tensor does not widen the comparison
    Case("ge.Tensor(0-dim f32 -0.1, bf16)", lambda x: A.ge.Tensor(A.scalar_tensor.default(-0.1), x),
         A.ge.Tensor, ("bf16",)),
    with_scalar(A.gt.Scalar, nan),
    unary(A.logical_not.default),  # NaN is true
    unary(A.logical_not.default, "bool"),
    binary(A.logical_and.default),
    binary(A.logical_and.default, "bool", "bool2"),
    binary(A.logical_or.default),
    binary(A.logical_xor.default, "bool", "x"),
    unary(A.bitwise_not.default, "bool"),
    binary(A.bitwise_and.Tensor, "bool", "bool2"),
    binary(A.bitwise_or.Tensor, "bool", "bool2"),
    binary(A.bitwise_xor.Tensor, "bool", "bool2"),
    unary(A.isnan.default),
    unary(A.isinf.default),
    # casts, copies, constants
    *[
        Case(f"convert_element_type({src}->{dt})", _bound(P.convert_element_type.default, dt),
             P.convert_element_type.default, (src,), exact=True)
        for src, dt in (
            ("rounding", torch.float16), ("rounding", torch.bfloat16), ("x", torch.float16), ("x", torch.bfloat16),
            ("half", torch.float32), ("bf16", torch.float32), ("half", torch.bfloat16), ("x", torch.bool),
            ("bool", torch.float16), ("bool", torch.float32), ("half", torch.float16),
        )
    ],
    Case("_to_copy(f16)", lambda x: A._to_copy.default(x, dtype=torch.float16), A._to_copy.default, ("rounding",), exact=True),
    Case("_to_copy(bf16)", lambda x: A._to_copy.default(x, dtype=torch.bfloat16), A._to_copy.default, ("rounding",), exact=True),
    Case("_to_copy(bool)", lambda x: A._to_copy.default(x, dtype=torch.bool), A._to_copy.default, exact=True),
    Case("_to_copy(half->f32, cpu)", lambda x: A._to_copy.default(x, dtype=torch.float32, layout=torch.strided, device="cpu"),
         A._to_copy.default, ("half",), exact=True),
    Case("_to_copy()", lambda x: A._to_copy.default(x), A._to_copy.default, exact=True),
    unary(A.clone.default),
    unary(A.alias.default),
    unary(A.lift_fresh_copy.default),
    Case("full(0.1)", lambda: A.full.default([], 0.1, dtype=torch.float32), A.full.default, (), exact=True),
    Case("full(0.1, f16)", lambda: A.full.default([], 0.1, dtype=torch.float16), A.full.default, (), exact=True),
    Case("full(True)", lambda: A.full.default([], True, dtype=torch.bool), A.full.default, (), exact=True),
    Case("full(-inf)", lambda: A.full.default([], -inf, dtype=torch.float32), A.full.default, (), exact=True),
    Case("scalar_tensor(2.5)", lambda: A.scalar_tensor.default(2.5), A.scalar_tensor.default, (), exact=True),
    Case("scalar_tensor(0.1, bf16)", lambda: A.scalar_tensor.default(0.1, dtype=torch.bfloat16), A.scalar_tensor.default, (), exact=True),
    # the rounding helpers themselves
    Case("kevin_round_half", lambda x: x.half().float(), None, ("rounding",), expr="kevin_round_half(a0)", exact=True),
    Case("kevin_round_bf16", lambda x: x.bfloat16().float(), None, ("rounding",), expr="kevin_round_bf16(a0)", exact=True),
    Case("kevin_round_half(x)", lambda x: x.half().float(), None, ("x",), expr="kevin_round_half(a0)", exact=True),
    Case("kevin_round_bf16(x)", lambda x: x.bfloat16().float(), None, ("x",), expr="kevin_round_bf16(a0)", exact=True),
]


def _example(pool: torch.Tensor) -> torch.Tensor:
    return pool[:4].clone()


_NODES: dict[str, fx.Node] = {}


def _one_op_node(case: Case) -> fx.Node:
    if case.name not in _NODES:
        _NODES[case.name] = _trace(case)
    return _NODES[case.name]


def _trace(case: Case) -> fx.Node:
    """The case's op as a node of a traced graph with meta["val"]: make_fx's graph when it keeps
    the op, else (a composite op make_fx decomposes, e.g. where.ScalarSelf) the op as written,
    with meta["val"] from running it."""
    pools = POOLS
    examples = [_example(pools[name]) for name in case.inputs]
    graph = make_fx(case.fn, tracing_mode="fake")(*examples).graph
    found = [n for n in graph.nodes if n.op == "call_function" and n.target == case.target]
    if not found:
        graph = fx.symbolic_trace(case.fn).graph
        env: dict[fx.Node, Any] = {}
        placeholders = iter(examples)
        for node in graph.nodes:
            if node.op == "placeholder":
                env[node] = next(placeholders)
            elif node.op == "call_function":
                args, kwargs = fx.node.map_arg((node.args, node.kwargs), lambda a: env[a])
                env[node] = node.target(*args, **kwargs)
            else:
                continue
            node.meta["val"] = env[node]
        found = [n for n in graph.nodes if n.op == "call_function" and n.target == case.target]
    (node,) = found
    return node


def _expression(case: Case) -> str:
    if case.expr is not None:
        return case.expr
    node = _one_op_node(case)
    placeholders = [n for n in node.graph.nodes if n.op == "placeholder"]

    def value(arg: object) -> str:
        assert isinstance(arg, fx.Node), f"{case.name}: operand {arg!r} is not a node"
        if arg.op == "placeholder":
            return f"a{placeholders.index(arg)}"
        return pointwise_expr(arg, value)  # an op feeding the one under test: inlined

    return pointwise_expr(node, value)


POOLS = _pools()

# ----------------------------------------------------------------------------------------------
# The program: every case's expression, compiled once

_HEADER = r"""
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

typedef float (*CaseFn)(float, float, float);
"""

_MAIN = r"""
// Makes nvcc compile every expression for the device as well.
__global__ void kevin_device_check(const float* in, float* out) {
    const int i = threadIdx.x;
    float r = 0.0f;
%(device_calls)s
    out[i] = r;
}

int main(int argc, char** argv) {
    if (argc != 4) return 2;
    const int n = atoi(argv[3]);
    FILE* in = fopen(argv[1], "rb");
    FILE* out = fopen(argv[2], "wb");
    if (!in || !out) return 3;
    std::vector<float> a(3 * (size_t)n), r(n);
    for (int c = 0; c < kNumCases; ++c) {
        std::fill(a.begin(), a.end(), 0.0f);
        const size_t count = (size_t)kArity[c] * n;
        if (fread(a.data(), sizeof(float), count, in) != count) return 4;
        for (int i = 0; i < n; ++i) r[i] = kCases[c](a[i], a[n + i], a[2 * n + i]);
        fwrite(r.data(), sizeof(float), n, out);
    }
    fclose(in);
    fclose(out);
    return 0;
}
"""

# The flags torch's extension builds pass: the helpers must not need half operators/conversions.
_TORCH_FLAGS = ["-D__CUDA_NO_HALF_OPERATORS__", "-D__CUDA_NO_HALF_CONVERSIONS__",
                "-D__CUDA_NO_BFLOAT16_CONVERSIONS__", "-D__CUDA_NO_HALF2_OPERATORS__"]


def _program(exprs: list[str], arities: list[int]) -> str:
    parts = [DEVICE_HELPERS, _HEADER]
    for i, expr in enumerate(exprs):
        parts.append(f"__host__ __device__ float kevin_case_{i}(float a0, float a1, float a2) {{ return {expr}; }}")
    parts.append(f"static const int kNumCases = {len(exprs)};")
    parts.append("static const CaseFn kCases[] = {" + ", ".join(f"kevin_case_{i}" for i in range(len(exprs))) + "};")
    parts.append("static const int kArity[] = {" + ", ".join(map(str, arities)) + "};")
    calls = "\n".join(f"    r += kevin_case_{i}(in[i], in[i + 1], in[i + 2]);" for i in range(len(exprs)))
    parts.append(_MAIN.replace("%(device_calls)s", calls))
    return "\n".join(parts)


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, torch.Tensor]:
    """Every case's N results from the compiled program, by case name."""
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc is not installed")
    folder = tmp_path_factory.mktemp("builtin_ops")
    exprs = [_expression(case) for case in CASES]
    arities = [len(case.inputs) for case in CASES]
    (folder / "prog.cu").write_text(_program(exprs, arities))
    with open(folder / "inputs.bin", "wb") as f:
        for case in CASES:
            for name in case.inputs:
                f.write(POOLS[name].float().numpy().tobytes())
    build = subprocess.run(
        [nvcc, "-x", "cu", "-std=c++17", "-O2", *_TORCH_FLAGS, "prog.cu", "-o", "prog"],
        cwd=folder, capture_output=True, text=True, timeout=300,
    )
    assert build.returncode == 0, build.stderr[-6000:]
    run = subprocess.run(["./prog", "inputs.bin", "outputs.bin", str(N)], cwd=folder, capture_output=True, timeout=60)
    assert run.returncode == 0, run.stderr
    out = torch.frombuffer(bytearray((folder / "outputs.bin").read_bytes()), dtype=torch.float32)
    assert out.numel() == len(CASES) * N
    return {case.name: out[i * N : (i + 1) * N] for i, case in enumerate(CASES)}


def test_case_names_are_unique() -> None:
    names = [case.name for case in CASES]
    assert len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)


def test_every_supported_op_has_a_numerical_case() -> None:
    covered = {case.target for case in CASES}
    missing = sorted(str(op) for op in SUPPORTED_OPS - covered)
    assert not missing, missing


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_matches_pytorch(case: Case, results: dict[str, torch.Tensor]) -> None:
    want = case.fn(*[POOLS[name] for name in case.inputs])
    exact = case.fn(*[POOLS[name].double() for name in case.inputs]) if case.tight and want.dtype == torch.float32 else None
    got = results[case.name]
    if want.dtype in (torch.float16, torch.bfloat16):
        got = got.to(want.dtype)  # what the kernel's store does
    want = want.float().expand(N)
    got = got.float()
    if case.exact:
        torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)
    elif case.tight and exact is not None:
        # near zero PyTorch's own float32 result can be ulps off (its vectorised erf differs by
        # CPU): relative accuracy against the float64 result, allowing what PyTorch itself misses
        exact = exact.expand(N)
        err, allowed = (got.double() - exact).abs(), 1e-5 * exact.abs() + 4 * (want.double() - exact).abs() + 1e-38
        same = (got.double() == exact) | (got.isnan() & exact.isnan())
        assert bool((same | (err <= allowed)).all()), f"max error {float(err.nan_to_num(0).max()):.3g}"
    elif case.tight:
        torch.testing.assert_close(got, want, rtol=1e-5, atol=0, equal_nan=True)
    else:
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6, equal_nan=True)
    if case.target is not None and _one_op_node(case).meta["val"].dtype == torch.bool:
        assert set(got.unique().tolist()) <= {0.0, 1.0}


# ----------------------------------------------------------------------------------------------
# Literals


@pytest.mark.parametrize(
    "value, text",
    [
        (1.5, "1.5f"), (3, "3.0f"), (-2, "-2.0f"), (0.1, "0.1f"), (20, "20.0f"), (-0.0, "-0.0f"), (True, "1.0f"),
        (False, "0.0f"), (inf, "INFINITY"), (-inf, "-INFINITY"), (nan, "NAN"), (1e39, "INFINITY"),
        (2**24 + 1, "16777216.0f"), (2**2000, "INFINITY"), (-(2**2000), "-INFINITY"), (1e-45, "1e-45f"),
        (3e38, "3e+38f"),
    ],
)
def test_float_literal(value: Any, text: str) -> None:
    assert float_literal(value) == text


def test_float_literal_reads_back_as_the_float32_value() -> None:
    g = torch.Generator().manual_seed(1)
    values = (torch.randn(200, generator=g, dtype=torch.float64) * 10 ** torch.randint(-30, 30, (200,), generator=g)).tolist()
    for v in values:
        text = float_literal(v)
        assert torch.tensor(float(text.removesuffix("f")), dtype=torch.float32).item() == torch.tensor(v, dtype=torch.float32).item()


def test_literals_rounded_to_half_types() -> None:
    for dtype in (torch.float16, torch.bfloat16):
        text = float_literal(0.1, dtype)
        assert torch.tensor(float(text.removesuffix("f"))).item() == torch.tensor(0.1, dtype=dtype).item()
    assert float_literal(70000.0, torch.float16) == "INFINITY"


def _node(fn: Callable[..., Any], *inputs: torch.Tensor, target: Any) -> fx.Node:
    graph = make_fx(fn, tracing_mode="fake")(*inputs).graph
    (node,) = [n for n in graph.nodes if n.target == target]
    return node


def test_scalars_become_literals_and_every_operand_is_asked_for() -> None:
    x = torch.randn(4)
    asked: list[str] = []

    def value(arg: object) -> str:
        assert isinstance(arg, fx.Node)
        asked.append(arg.name)
        return "v"

    node = _node(lambda x: A.mul.Tensor(x, -inf), x, target=A.mul.Tensor)
    assert pointwise_expr(node, value) == "v * (-INFINITY)"
    node = _node(lambda x: A.pow.Tensor_Scalar(x, 0), x, target=A.pow.Tensor_Scalar)
    assert pointwise_expr(node, value) == "1.0f"  # does not read x, but x was still asked for
    assert asked == ["x_1", "x_1"]
    node = _node(lambda x: A.add.Tensor(x, 2, alpha=3), x, target=A.add.Tensor)
    assert pointwise_expr(node, lambda a: "a + b") == "(a + b) + 3.0f * 2.0f"  # compound operands in parentheses


# ----------------------------------------------------------------------------------------------
# Declined


def _manual(target: Any, val: torch.Tensor, *args: Any, **kwargs: Any) -> fx.Node:
    """A node built by hand (for arguments PyTorch itself would refuse to trace)."""
    graph = fx.Graph()
    x = graph.placeholder("x")
    x.meta["val"] = torch.empty(4)
    node = graph.call_function(target, (x, *args), kwargs)
    node.meta["val"] = val
    return node


@pytest.mark.parametrize(
    "make, words",
    [
        (lambda: _node(lambda a, b: A.pow.Tensor_Tensor(a, b), torch.arange(4), torch.arange(4) + 7, target=A.pow.Tensor_Tensor),
         ["aten.pow.Tensor_Tensor", "integer dtype"]),
        (lambda: _node(lambda a: A.add.Tensor(a, 1.0), torch.randn(4, dtype=torch.float64), target=A.add.Tensor),
         ["aten.add.Tensor", "torch.float64"]),
        (lambda: _node(lambda a: A.lt.Scalar(a, 2), torch.arange(4, dtype=torch.int32), target=A.lt.Scalar),
         ["aten.lt.Scalar", "integer dtype torch.int32 operand"]),
        (lambda: _node(lambda a, b: A.div.Tensor_mode(a, b, rounding_mode="floor"), torch.randn(4), torch.randn(4),
                       target=A.div.Tensor_mode),
         ["aten.div.Tensor_mode", "rounding_mode='floor'"]),
        (lambda: _node(lambda a: A.div.Scalar_mode(a, 2.0, rounding_mode="trunc"), torch.randn(4), target=A.div.Scalar_mode),
         ["aten.div.Scalar_mode", "rounding_mode='trunc'"]),
        (lambda: _manual(A.gelu.default, torch.empty(4), approximate="foo"), ["aten.gelu", "approximate='foo'"]),
        (lambda: _manual(A._to_copy.default, torch.empty(4), device=torch.device("meta")), ["aten._to_copy", "device"]),
        (lambda: _manual(A._to_copy.default, torch.empty(4), layout=torch.sparse_coo), ["aten._to_copy", "layout"]),
        (lambda: _manual(A._to_copy.default, torch.empty(4), memory_format=torch.channels_last),
         ["aten._to_copy", "memory_format"]),
        (lambda: _node(lambda a: P.convert_element_type.default(a, torch.int32), torch.randn(4), target=P.convert_element_type.default),
         ["prims.convert_element_type", "integer dtype torch.int32 result"]),
        (lambda: _manual(A.clamp.default, torch.empty(4)), ["aten.clamp.default", "neither min nor max"]),
        (lambda: _node(lambda a: A.sum.default(a), torch.randn(4), target=A.sum.default), ["aten.sum.default", "not a pointwise"]),
        (lambda: _manual(A.neg.default, None), ["aten.neg.default", "meta['val']"]),
        (lambda: _manual(A.mul.Tensor, torch.empty(4), object()), ["aten.mul.Tensor", "only tensors and Python numbers"]),
    ],
)
def test_declined_with_the_op_and_the_reason(make: Callable[[], fx.Node], words: list[str]) -> None:
    node = make()
    with pytest.raises(Unsupported) as info:
        pointwise_expr(node, lambda arg: "v")
    for word in words:
        assert word in str(info.value)
    assert check(node) == str(info.value)


def test_is_pointwise_and_check() -> None:
    x = torch.randn(4)
    exp = _node(lambda a: A.exp.default(a), x, target=A.exp.default)
    assert is_pointwise(exp) and check(exp) is None
    total = _node(lambda a: A.sum.default(a), x, target=A.sum.default)
    assert not is_pointwise(total) and "not a pointwise" in check(total)
    # in the table, declined for this use: the partitioner tells "unsupported here" from "unknown op"
    ints = _node(lambda a: A.exp.default(a), torch.arange(4), target=A.exp.default)
    assert is_pointwise(ints) and "integer dtype" in check(ints)
    placeholder = next(iter(exp.graph.nodes))
    assert not is_pointwise(placeholder)


def test_device_helpers_are_host_and_device_and_prefixed() -> None:
    import re

    defined = re.findall(r"^(.*?)\bfloat (\w+)\(", DEVICE_HELPERS, flags=re.M)
    assert len(defined) >= 15
    for qualifiers, name in defined:
        assert name.startswith("kevin_"), name
        assert "__host__ __device__ __forceinline__" in qualifiers, name
    # fast-math intrinsics only where a kernel asks for them (every output 16-bit: KEVIN_FAST_MATH)
    guarded = re.search(r"#if defined\(KEVIN_FAST_MATH\)\n(.*?)\n#else\n(?=__host__ __device__ __forceinline__ float kevin_sigmoid)",
                        DEVICE_HELPERS, flags=re.S)
    assert guarded is not None
    outside = DEVICE_HELPERS.replace(guarded.group(0), "")
    for fast in ("__expf", "__logf", "__fdividef", "__tanhf", "__sinf", "rsqrtf(", "tanh.approx", "kevin_log1p_unit"):
        assert fast not in outside, fast
    assert "__expf" in guarded.group(1) and "__fdividef" in guarded.group(1) and "tanh.approx.f32" in guarded.group(1)


def test_only_kernels_with_sixteen_bit_outputs_take_fast_math() -> None:
    from kevin_backend.generate.builtin.planner import plan_task
    from kevin_backend.generate.builtin.program import fast_math, write_program
    from kevin_backend.generate.builtin.variants import VARIANTS_POINTWISE
    from kevin_backend.generate.builtin.suite import _task

    for dt, fast in (("bf16", True), ("f16", True), ("f32", False)):
        task = _task(f"tanh-{dt}", "chain1", "torch.tanh(x) * torch.sigmoid(x)", [(8, 64)], dt)
        plan = plan_task(task.source)
        program = write_program(plan, VARIANTS_POINTWISE[0])
        assert fast_math(plan) is fast
        assert ("#define KEVIN_FAST_MATH 1" in program) is fast
        assert "kevin_tanh(" in program and "tanhf(" not in program.split("#include <math.h>")[0]
    mixed = plan_task(_task("max-f16", "reduction", "torch.max(x, -1)", [(8, 64)], "f16").source)  # values and int64 indices
    assert not fast_math(mixed)


def test_fast_math_softplus_sigmoid_and_tanh_stay_within_a_float16_rounding(tmp_path: Path) -> None:
    """Under KEVIN_FAST_MATH (every output 16-bit) log(1 + e^x) is an exp and a polynomial and
    sigmoid goes through tanh: on the host (the formulas; the device's tanh.approx aside) they
    match float64 within a tenth of a float16 rounding, at the extremes and NaN included."""
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc is not installed")
    xs = torch.cat([torch.linspace(-40, 40, 20001), torch.tensor([0.0, -0.0, 1e-8, -1e-8, 88.0, -88.0, 1e30, -1e30])])
    (tmp_path / "xs.bin").write_bytes(xs.numpy().tobytes())
    main = """
#include <cstdio>
#include <vector>
int main() {
    std::vector<float> x(%d), r(3 * %d);
    FILE* f = fopen("xs.bin", "rb"); if (fread(x.data(), 4, x.size(), f) != x.size()) return 2; fclose(f);
    for (size_t i = 0; i < x.size(); ++i) {
        r[i] = kevin_log1p_exp(x[i]); r[x.size() + i] = kevin_sigmoid(x[i]); r[2 * x.size() + i] = kevin_tanh(x[i]);
    }
    f = fopen("out.bin", "wb"); fwrite(r.data(), 4, r.size(), f); fclose(f);
    return 0;
}
""" % (xs.numel(), xs.numel())
    (tmp_path / "fast.cu").write_text("#define KEVIN_FAST_MATH 1\n" + DEVICE_HELPERS + main)
    build = subprocess.run([nvcc, "-x", "cu", "-std=c++17", "-O2", *_TORCH_FLAGS, "fast.cu", "-o", "fast"], cwd=tmp_path,
                           capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stderr[-4000:]
    assert subprocess.run(["./fast"], cwd=tmp_path, timeout=60).returncode == 0
    got = torch.frombuffer(bytearray((tmp_path / "out.bin").read_bytes()), dtype=torch.float32).double().reshape(3, -1)
    x = xs.double()
    want = torch.stack([torch.nn.functional.softplus(x), torch.sigmoid(x), torch.tanh(x)])
    bound = 2.0 ** -14 * (want.abs() + 2.0 ** -10)  # a tenth of float16's rounding, relative; absolute near 0
    assert ((got - want).abs() <= bound).all(), [((got[k] - want[k]).abs() - bound[k]).max().item() for k in range(3)]
    nan = subprocess.run  # NaN in, NaN out: checked through the same program on one value
    (tmp_path / "xs.bin").write_bytes(torch.full((xs.numel(),), float("nan")).numpy().tobytes())
    assert nan(["./fast"], cwd=tmp_path, timeout=60).returncode == 0
    assert torch.frombuffer(bytearray((tmp_path / "out.bin").read_bytes()), dtype=torch.float32).isnan().all()


@pytest.mark.parametrize("fast", [True, False])
def test_silu_keeps_its_tiny_values_far_below_zero(tmp_path: Path, fast: bool) -> None:
    """silu(x) = x e^x far below zero is a normal float32 (and bfloat16) down to x = -91: the helper
    matches float64 there, where x / (1 + e^-x) gave -0 once e^-x overflowed (x < -88.7), and
    everywhere else; NaN and the infinities as PyTorch's (silu(-inf) is NaN)."""
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc is not installed")
    xs = torch.cat([torch.linspace(-110, 30, 14001), torch.tensor([-88.72, -89.0, -91.0, 0.0, -0.0, 1e-30, -1e-30, 3e38, -3e38])])
    (tmp_path / "xs.bin").write_bytes(xs.numpy().tobytes())
    main = """
#include <cstdio>
#include <vector>
int main() {
    std::vector<float> x(%d), r(%d);
    FILE* f = fopen("xs.bin", "rb"); if (fread(x.data(), 4, x.size(), f) != x.size()) return 2; fclose(f);
    for (size_t i = 0; i < x.size(); ++i) r[i] = kevin_silu(x[i]);
    f = fopen("out.bin", "wb"); fwrite(r.data(), 4, r.size(), f); fclose(f);
    return 0;
}
""" % (xs.numel(), xs.numel())
    (tmp_path / "silu.cu").write_text(("#define KEVIN_FAST_MATH 1\n" if fast else "") + DEVICE_HELPERS + main)
    build = subprocess.run([nvcc, "-x", "cu", "-std=c++17", "-O2", *_TORCH_FLAGS, "silu.cu", "-o", "silu"], cwd=tmp_path,
                           capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stderr[-4000:]
    assert subprocess.run(["./silu"], cwd=tmp_path, timeout=60).returncode == 0
    got = torch.frombuffer(bytearray((tmp_path / "out.bin").read_bytes()), dtype=torch.float32).double()
    want = torch.nn.functional.silu(xs.double()).float().double()  # (float64's, rounded to float32: subnormals included)
    err = (got - want).abs()
    bad = err > 1e-6 * want.abs() + 2.0 ** -133  # (bfloat16's smallest subnormal: from x = -97 down, e^-|x| underflows)
    assert not bool(bad.any()), list(zip(xs[bad][:5].tolist(), got[bad][:5].tolist(), want[bad][:5].tolist()))
    specials = torch.tensor([float("nan"), float("inf"), -float("inf")])
    (tmp_path / "xs.bin").write_bytes(torch.cat([specials, xs[3:]]).numpy().tobytes())
    assert subprocess.run(["./silu"], cwd=tmp_path, timeout=60).returncode == 0
    head = torch.frombuffer(bytearray((tmp_path / "out.bin").read_bytes()), dtype=torch.float32)[:3]
    torch.testing.assert_close(head, torch.nn.functional.silu(specials), equal_nan=True)


def test_fast_math_activation_chains_take_one_multi_function_instruction_a_transcendental(tmp_path: Path) -> None:
    """The suite's 16-bit activation chains are bound by the multi-function unit (on the H200 the
    GELU-softplus-sigmoid-tanh chain took 1.09 ms at 7 of its instructions an element, the
    tanh-softplus-sigmoid one 0.42 ms at 6): compiled for sm_90, their PTX has 4 and 3 an element
    (exp2, log2, reciprocal, tanh and approximate divisions counted)."""
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc is not installed")
    from kevin_backend.generate.builtin.planner import plan_task
    from kevin_backend.generate.builtin.program import write_program
    from kevin_backend.generate.builtin.variants import VARIANTS_POINTWISE
    from kevin_backend.generate.builtin.roofline_suite import ROOFLINE_SUITE
    from kevin_backend.toolchain.candidate import Candidate
    from kevin_backend.toolchain.fast_build import fast_sources

    most = {"gelu-softplus-sigmoid-tanh-bf16-32768x16384": 4, "tanh-softplus-sigmoid-f16-65536x4096": 3}
    for task in (t for t in ROOFLINE_SUITE if t.name in most):
        (ext,) = Candidate.parse(write_program(plan_task(task.source), VARIANTS_POINTWISE[1])).extensions
        (tmp_path / "k.cu").write_text(fast_sources(ext.cpp_sources, ext.cuda_sources, ext.functions, "k").device)
        build = subprocess.run([nvcc, "-ptx", "k.cu", "-o", "k.ptx", "-arch=sm_90", "-O3", "-std=c++17"], cwd=tmp_path,
                               capture_output=True, text=True, timeout=300)
        assert build.returncode == 0, build.stderr[-4000:]
        ptx = (tmp_path / "k.ptx").read_text()
        vec = ptx[ptx.index(".entry _Z19kevin_pointwise_vec"):]
        vec = vec[:vec.index(".entry", 10)] if ".entry" in vec[10:] else vec
        units = len(re.findall(r"\b(?:ex2|lg2|rcp|tanh|div)\.approx", vec))
        assert units <= most[task.name] * 8, (task.name, units)  # the vector kernel: 8 elements an iteration
        assert "tanh.approx.f32" in vec
