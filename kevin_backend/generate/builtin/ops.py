"""The built-in writer's op table: every pointwise aten op it knows, as a C++ `float` expression.

    expr = pointwise_expr(node, value)   # "kevin_gelu_erf(v3)", or raises Unsupported(why)
    reason = check(node)                 # None when pointwise_expr would succeed, else the reason
    is_pointwise(node)                   # the op is in the table (check() still decides the details)

`value(arg)` is the kernel template's name (or expression) for a tensor operand; it is called once
for every fx.Node argument of the op. The expressions keep these conventions:

* Every value is a `float`, whatever its graph dtype. float16/bfloat16 values are widened when
  loaded and rounded when stored. Eager PyTorch computes half ops in float ("opmath") and rounds
  each op's result; the kernels (`rounding.relax_rounding`) keep intermediate values in float, as
  Inductor's code does, except where a rounding can change a discrete outcome (a comparison, an
  index reduction). An explicit cast to float16/bfloat16 (`convert_element_type`, `_to_copy`)
  rounds here, with `kevin_round_half` / `kevin_round_bf16`, so that the value *after* the cast is
  the rounded one even when it is never stored.
* A bool value is 1.0f or 0.0f. Ops reading one as a condition test `!= 0.0f` (NaN is true, as in
  PyTorch); an arithmetic op with a bool result (True + True is True) is brought back to 0/1.
* Python scalars become float literals (`float_literal`), rounded to float32 as PyTorch's float
  opmath does. A comparison's scalar is rounded to the dtype of the tensor it is compared with,
  since PyTorch compares in that dtype: `half_tensor == 0.1` tests against half(0.1), and the
  float literal 0.1f would never be equal to any half value.
* Integer, float64 and complex tensors are declined: a float cannot carry their values exactly.
* Special values follow PyTorch: NaN propagates through maximum/minimum/clamp/relu/hardtanh (fmaxf
  and fminf would drop it), sign(NaN) is 0, pow(x, 0.5) is sqrt (so pow(-inf, 0.5) is NaN, as in
  PyTorch's fast path), and the math is the precise libm/CUDA functions (expf, erff, log1pf,
  expm1f, ...). The one exception: a kernel whose every output is float16 or bfloat16 defines
  KEVIN_FAST_MATH, and its exp and log, and its sigmoid, SiLU, tanh, softplus and mish
  (cuda/device_helpers.cuh), then take the device's __expf / __logf / __fdividef, whose few float32 ulps
  lie far below one rounding to the output's dtype (the math Inductor's generated code uses for
  these ops); tanh and sigmoid take the device's tanh.approx (a relative error near 2^-11, half a
  float16 rounding), and log(1 + e^x) an exp and a polynomial: chains of them are bound by the
  multi-function unit, and each takes one of its instructions instead of two.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.fx as fx

__all__ = [
    "Unsupported",
    "pointwise_expr",
    "is_pointwise",
    "check",
    "float_literal",
    "SUPPORTED_OPS",
    "VALUE_DTYPES",
]

aten = torch.ops.aten
prims = torch.ops.prims

VALUE_DTYPES = frozenset({torch.float32, torch.float16, torch.bfloat16, torch.bool})
_HALF_DTYPES = (torch.float16, torch.bfloat16)
_ROUND = {torch.float16: "kevin_round_half", torch.bfloat16: "kevin_round_bf16"}


class Unsupported(Exception):
    """An op, or one use of it, the built-in writer cannot express; the message names the op and
    says why ("aten.pow.Tensor_Tensor with integer dtype torch.int64 operand x")."""


# ----------------------------------------------------------------------------------------------
# Literals and operands


def float_literal(value: bool | int | float, dtype: torch.dtype = torch.float32) -> str:
    """A C++ float literal for a Python number, first rounded to `dtype` (float32, or the
    float16/bfloat16 a comparison runs in): `1.5f`, `3.0f`, `1e+10f`, `INFINITY`, `-INFINITY`,
    `NAN`. The digits are the shortest that read back as the same float32, so the compiler gets
    exactly the value PyTorch computes with."""
    if type(value) is bool:
        return "1.0f" if value else "0.0f"
    if type(value) not in (int, float):
        raise TypeError(f"not a Python number: {value!r}")
    try:
        x = float(value)
    except OverflowError:  # an int beyond any float
        x = math.inf if value > 0 else -math.inf
    if math.isnan(x):
        return "NAN"
    x = torch.tensor(x, dtype=dtype).item()  # overflow rounds to inf, as the cast in PyTorch does
    if math.isinf(x):
        return "INFINITY" if x > 0 else "-INFINITY"
    for digits in range(1, 10):  # 9 significant digits always identify a float32
        shortest = float(f"{x:.{digits}g}")
        if torch.tensor(shortest, dtype=torch.float32).item() == x:
            break
    text = repr(shortest)  # "20.0", not "2e+01"; "1e-45"; never "3" (`3f` is not C++)
    return text + "f"


_ATOM = re.compile(r"[A-Za-z_]\w*|\d+(\.\d*)?(e[+-]?\d+)?f")


def _atom(expr: str) -> str:
    """`expr` safe to use as an operand: names and unsigned literals as they are, anything else
    (a negative literal, a compound expression) in parentheses."""
    return expr if _ATOM.fullmatch(expr) else f"({expr})"


def _dtype_problem(dtype: torch.dtype) -> str | None:
    if dtype in VALUE_DTYPES:
        return None
    if dtype.is_complex:
        return f"complex dtype {dtype}"
    if not dtype.is_floating_point:
        return f"integer dtype {dtype}"
    return f"dtype {dtype} (only float32, float16, bfloat16 and bool values fit a float)"


def _tensor_val(node: fx.Node) -> torch.Tensor | None:
    val = node.meta.get("val")
    return val if isinstance(val, torch.Tensor) else None


@dataclass(frozen=True)
class _Call:
    """One node's arguments bound to its schema's names, and the ways a rule reads them."""

    op: str  # "aten.add.Tensor", for messages
    node: fx.Node
    args: dict[str, Any]
    values: dict[fx.Node, str]  # the template's expression for every tensor operand

    def has(self, name: str) -> bool:
        return self.args.get(name) is not None

    def x(self, name: str, dtype: torch.dtype = torch.float32) -> str:
        """The argument as a C++ float operand: the template's expression for a tensor, a literal
        for a Python number. With `dtype` float16/bfloat16 (the dtype a comparison runs in), a
        number, or a wider tensor value, is rounded to it first."""
        arg = self.args.get(name)
        if isinstance(arg, fx.Node):
            expr = self.values[arg]
            source = self.dtype(name)
            if dtype in _HALF_DTYPES and source not in (dtype, torch.bool):
                return f"{_ROUND[dtype]}({expr})"
            return _atom(expr)
        return _atom(float_literal(self.scalar(name), dtype if dtype in _HALF_DTYPES else torch.float32))

    def common_dtype(self, *names: str) -> torch.dtype:
        """The dtype PyTorch's type promotion computes the op in (`torch.result_type`): a 0-dim
        tensor or a number does not widen a dimensioned half tensor."""

        def stand_in(name: str) -> Any:
            arg = self.args.get(name)
            if isinstance(arg, fx.Node):
                val = _tensor_val(arg)
                return torch.empty([1] * min(val.ndim, 1), dtype=val.dtype)
            return self.scalar(name)

        a, b = (stand_in(n) for n in names)
        if not isinstance(a, torch.Tensor):
            a, b = b, a
        if not isinstance(a, torch.Tensor):
            return torch.float32
        return torch.result_type(a, b)

    def scalar(self, name: str) -> bool | int | float:
        """A Python number argument (a SymFloat or a tensor where a number belongs is declined)."""
        arg = self.args.get(name)
        if type(arg) in (bool, int, float):
            return arg
        if arg is None:
            raise Unsupported(f"{self.op} without its argument {name}")
        raise Unsupported(f"{self.op} with {name}={arg!r}: only tensors and Python numbers are operands")

    def dtype(self, name: str) -> torch.dtype | None:
        arg = self.args.get(name)
        val = _tensor_val(arg) if isinstance(arg, fx.Node) else None
        return val.dtype if val is not None else None

    @property
    def out_dtype(self) -> torch.dtype:
        return self.node.meta["val"].dtype


def _bind(node: fx.Node, op: str) -> dict[str, Any]:
    """The node's args and kwargs by schema name, defaults filled in."""
    schema = node.target._schema  # type: ignore[union-attr]
    positional = [a for a in schema.arguments if not a.kwarg_only]
    if len(node.args) > len(positional):
        raise Unsupported(f"{op} with {len(node.args)} positional arguments (the schema has {len(positional)})")
    names = {a.name for a in schema.arguments}
    extra = sorted(set(node.kwargs) - names)
    if extra:
        raise Unsupported(f"{op} with unknown keyword arguments {extra}")
    bound: dict[str, Any] = {}
    for i, a in enumerate(schema.arguments):
        if not a.kwarg_only and i < len(node.args):
            bound[a.name] = node.args[i]
        elif a.name in node.kwargs:
            bound[a.name] = node.kwargs[a.name]
        else:
            bound[a.name] = a.default_value if a.has_default_value() else None
    return bound


# ----------------------------------------------------------------------------------------------
# The rules


@dataclass(frozen=True)
class _Rule:
    """How one overload becomes an expression."""

    emit: Callable[[_Call], str]
    # The expression maps 0/1 operands to a 0/1 result, so a bool result needs no normalizing.
    # Arithmetic does not (True + True is 2.0f in float, True in PyTorch).
    bool_result: bool = False


def _call(fn: str, *params: str) -> Callable[[_Call], str]:
    """`fn(param, ...)`: a C function of the op's arguments, scalars as literals."""
    return lambda c: f"{fn}({', '.join(c.x(p) for p in params)})"


def _add(sign: str, swap: bool = False) -> Callable[[_Call], str]:
    """add/sub/rsub: `self ± alpha * other` (rsub: `other - alpha * self`)."""

    def emit(c: _Call) -> str:
        a, b = c.x("self"), c.x("other")
        if swap:
            a, b = b, a
        alpha = c.scalar("alpha")
        if alpha != 1:
            b = f"{_atom(float_literal(alpha))} * {b}"
        return f"{a} {sign} {b}"

    return emit


def _div(c: _Call) -> str:
    """True division only: floor division rounds differently from floorf(a / b) (PyTorch
    computes it from fmod), so 'floor' and 'trunc' are declined rather than approximated."""
    mode = c.args.get("rounding_mode")
    if mode is not None:
        raise Unsupported(f"{c.op} with rounding_mode={mode!r} (only true division)")
    return f"{c.x('self')} / {c.x('other')}"


def _pow_tensor_scalar(c: _Call) -> str:
    """PyTorch's own fast paths, so the special values agree: exponent 0.5 is sqrt (pow(-inf,
    0.5) is NaN, not powf's +inf; pow(-0, 0.5) is -0), -0.5 is 1/sqrt, 2 and 3 are products."""
    x, e = c.x("self"), c.scalar("exponent")
    fast = {
        0: "1.0f",  # pow(NaN, 0) is 1
        1: x,
        2: f"kevin_square({x})",
        3: f"kevin_cube({x})",
        0.5: f"sqrtf({x})",
        -0.5: f"kevin_rsqrt({x})",
        -1: f"1.0f / {x}",
        -2: f"1.0f / kevin_square({x})",
    }
    return fast.get(e, f"powf({x}, {c.x('exponent')})")


def _compare(symbol: str) -> Callable[[_Call], str]:
    """Compared in the operands' common dtype, as PyTorch does: `half_tensor == 0.1` tests against
    half(0.1) (the float 0.1f equals no half value), and so does a float32 0-dim tensor."""

    def emit(c: _Call) -> str:
        dtype = c.common_dtype("self", "other")
        return f"({c.x('self', dtype)} {symbol} {c.x('other', dtype)} ? 1.0f : 0.0f)"

    return emit


def _logical(combine: str) -> Callable[[_Call], str]:
    """Truth of float values: nonzero is true, NaN included (NaN != 0)."""

    def emit(c: _Call) -> str:
        a, b = f"{c.x('self')} != 0.0f", f"{c.x('other')} != 0.0f"
        return f"(({a}) {combine} ({b}) ? 1.0f : 0.0f)"

    return emit


def _where(c: _Call) -> str:
    """The condition is a bool value, 1.0f or 0.0f."""
    return f"({c.x('condition')} != 0.0f ? {c.x('self')} : {c.x('other')})"


def _clamp(c: _Call) -> str:
    """clamp, clamp_min, clamp_max (scalar or tensor bounds): NaN propagates from the value and
    from a bound, as torch.clamp does; with min > max the result is max."""
    if not c.has("min") and not c.has("max"):
        raise Unsupported(f"{c.op} with neither min nor max")
    x = c.x("self")
    if c.has("min"):
        x = f"kevin_maximum({x}, {c.x('min')})"
    if c.has("max"):
        x = f"kevin_minimum({x}, {c.x('max')})"
    return x


def _hardtanh(c: _Call) -> str:
    return f"kevin_minimum(kevin_maximum({c.x('self')}, {c.x('min_val')}), {c.x('max_val')})"


def _gelu(c: _Call) -> str:
    approximate = c.args.get("approximate")
    if approximate == "none":
        return f"kevin_gelu_erf({c.x('self')})"
    if approximate == "tanh":
        return f"kevin_gelu_tanh({c.x('self')})"
    raise Unsupported(f"{c.op} with approximate={approximate!r} (only 'none' and 'tanh')")


def _cast(c: _Call, name: str, dtype: torch.dtype | None) -> str:
    """A value converted to `dtype`: rounded to a half type, tested for truth to bool."""
    x = c.x(name)
    source = c.dtype(name)
    if dtype is None or dtype == source or dtype == torch.float32:
        return x
    if dtype in _HALF_DTYPES:
        if source == torch.bool:
            return x  # 0 and 1 are exact in every dtype
        return f"{_ROUND[dtype]}({x})"
    if dtype == torch.bool:
        return f"({x} != 0.0f ? 1.0f : 0.0f)"
    raise Unsupported(f"{c.op} to {dtype} (only float32, float16, bfloat16 and bool)")


def _convert_element_type(c: _Call) -> str:
    return _cast(c, "a", c.args.get("dtype"))


def _same_device(a: Any, b: torch.device) -> bool:
    a = torch.device(a)
    return a.type == b.type and (a.index is None or b.index is None or a.index == b.index)


def _to_copy(c: _Call) -> str:
    """A dtype change only: a move to another device or layout, or a copy into a new memory
    format, is not a value computation the kernel can do."""
    source = _tensor_val(c.args["self"]) if isinstance(c.args.get("self"), fx.Node) else None
    layout, device, memory_format = c.args.get("layout"), c.args.get("device"), c.args.get("memory_format")
    if layout is not None and (source is None or layout != source.layout):
        raise Unsupported(f"{c.op} with layout={layout} (a dtype change only)")
    if device is not None and (source is None or not _same_device(device, source.device)):
        raise Unsupported(f"{c.op} with device={device} (a dtype change only)")
    if memory_format not in (None, torch.preserve_format):
        raise Unsupported(f"{c.op} with memory_format={memory_format} (a dtype change only)")
    if c.args.get("pin_memory"):
        raise Unsupported(f"{c.op} with pin_memory=True (a dtype change only)")
    return _cast(c, "self", c.args.get("dtype"))


def _constant(name: str) -> Callable[[_Call], str]:
    """full / scalar_tensor: the fill value in the result's dtype (Inductor's graphs use them for
    the constants of decomposed ops, e.g. `where(x > 0, x, scalar_tensor(0.0))`)."""

    def emit(c: _Call) -> str:
        fill = c.scalar(name)
        if c.out_dtype == torch.bool:
            return "1.0f" if fill else "0.0f"
        return float_literal(fill, c.out_dtype)

    return emit


def _identity(c: _Call) -> str:
    return c.x("self")


def _unary(fn: str) -> _Rule:
    return _Rule(_call(fn, "self"))


_RULES: dict[Any, _Rule] = {
    # arithmetic
    aten.add.Tensor: _Rule(_add("+")),
    aten.add.Scalar: _Rule(_add("+")),
    aten.sub.Tensor: _Rule(_add("-")),
    aten.sub.Scalar: _Rule(_add("-")),
    aten.rsub.Tensor: _Rule(_add("-", swap=True)),
    aten.rsub.Scalar: _Rule(_add("-", swap=True)),
    aten.mul.Tensor: _Rule(lambda c: f"{c.x('self')} * {c.x('other')}", bool_result=True),  # and
    aten.mul.Scalar: _Rule(lambda c: f"{c.x('self')} * {c.x('other')}"),
    aten.div.Tensor: _Rule(_div),
    aten.div.Scalar: _Rule(_div),
    aten.div.Tensor_mode: _Rule(_div),
    aten.div.Scalar_mode: _Rule(_div),
    aten.neg.default: _Rule(lambda c: f"-{c.x('self')}"),
    aten.reciprocal.default: _Rule(lambda c: f"1.0f / {c.x('self')}"),
    aten.pow.Tensor_Scalar: _Rule(_pow_tensor_scalar),
    aten.pow.Tensor_Tensor: _Rule(_call("powf", "self", "exponent")),
    aten.pow.Scalar: _Rule(_call("powf", "self", "exponent")),
    # math functions (precise: expf, not __expf)
    aten.abs.default: _Rule(_call("fabsf", "self"), bool_result=True),
    aten.exp.default: _unary("expf"),
    aten.exp2.default: _unary("exp2f"),
    aten.expm1.default: _unary("expm1f"),
    aten.log.default: _unary("logf"),
    aten.log2.default: _unary("log2f"),
    aten.log10.default: _unary("log10f"),
    aten.log1p.default: _unary("log1pf"),
    aten.xlogy.Tensor: _Rule(_call("kevin_xlogy", "self", "other")),
    aten.sqrt.default: _unary("sqrtf"),
    aten.rsqrt.default: _unary("kevin_rsqrt"),
    aten.erf.default: _unary("erff"),
    aten.sin.default: _unary("sinf"),
    aten.cos.default: _unary("cosf"),
    aten.tanh.default: _unary("kevin_tanh"),
    aten.sigmoid.default: _unary("kevin_sigmoid"),
    aten.floor.default: _Rule(_call("floorf", "self"), bool_result=True),
    aten.ceil.default: _Rule(_call("ceilf", "self"), bool_result=True),
    aten.trunc.default: _Rule(_call("truncf", "self"), bool_result=True),
    aten.round.default: _Rule(_call("rintf", "self"), bool_result=True),  # halves to even, as torch.round
    aten.sign.default: _Rule(_call("kevin_sign", "self"), bool_result=True),
    aten.sgn.default: _Rule(_call("kevin_sign", "self"), bool_result=True),
    # activations
    aten.relu.default: _Rule(lambda c: f"kevin_maximum({c.x('self')}, 0.0f)"),  # relu(NaN) is NaN
    aten.gelu.default: _Rule(_gelu),
    aten.silu.default: _unary("kevin_silu"),
    aten.mish.default: _unary("kevin_mish"),
    aten.hardswish.default: _unary("kevin_hardswish"),
    aten.hardsigmoid.default: _unary("kevin_hardsigmoid"),
    aten.hardtanh.default: _Rule(_hardtanh),
    aten.leaky_relu.default: _Rule(_call("kevin_leaky_relu", "self", "negative_slope")),
    aten.softplus.default: _Rule(_call("kevin_softplus", "self", "beta", "threshold")),
    aten.elu.default: _Rule(_call("kevin_elu", "self", "alpha", "scale", "input_scale")),
    # bounds
    aten.clamp.default: _Rule(_clamp, bool_result=True),
    aten.clamp.Tensor: _Rule(_clamp, bool_result=True),
    aten.clamp_min.default: _Rule(_clamp, bool_result=True),
    aten.clamp_min.Tensor: _Rule(_clamp, bool_result=True),
    aten.clamp_max.default: _Rule(_clamp, bool_result=True),
    aten.clamp_max.Tensor: _Rule(_clamp, bool_result=True),
    aten.maximum.default: _Rule(_call("kevin_maximum", "self", "other"), bool_result=True),
    aten.minimum.default: _Rule(_call("kevin_minimum", "self", "other"), bool_result=True),
    # selection and comparison (results are 1.0f / 0.0f)
    aten.where.self: _Rule(_where, bool_result=True),
    aten.where.ScalarSelf: _Rule(_where, bool_result=True),
    aten.where.ScalarOther: _Rule(_where, bool_result=True),
    aten.where.Scalar: _Rule(_where, bool_result=True),
    **{
        getattr(getattr(aten, name), overload): _Rule(_compare(symbol), bool_result=True)
        for name, symbol in (("gt", ">"), ("lt", "<"), ("ge", ">="), ("le", "<="), ("eq", "=="), ("ne", "!="))
        for overload in ("Tensor", "Scalar")
    },
    aten.logical_not.default: _Rule(lambda c: f"({c.x('self')} == 0.0f ? 1.0f : 0.0f)", bool_result=True),
    aten.logical_and.default: _Rule(_logical("&&"), bool_result=True),
    aten.logical_or.default: _Rule(_logical("||"), bool_result=True),
    aten.logical_xor.default: _Rule(_logical("!="), bool_result=True),
    # bitwise ops reach here on bool tensors only (integer tensors are declined): logical ops
    aten.bitwise_not.default: _Rule(lambda c: f"({c.x('self')} == 0.0f ? 1.0f : 0.0f)", bool_result=True),
    aten.bitwise_and.Tensor: _Rule(_logical("&&"), bool_result=True),
    aten.bitwise_or.Tensor: _Rule(_logical("||"), bool_result=True),
    aten.bitwise_xor.Tensor: _Rule(_logical("!="), bool_result=True),
    aten.isnan.default: _Rule(_call("kevin_isnan", "self"), bool_result=True),
    aten.isinf.default: _Rule(_call("kevin_isinf", "self"), bool_result=True),
    # casts, copies, constants
    prims.convert_element_type.default: _Rule(_convert_element_type, bool_result=True),
    aten._to_copy.default: _Rule(_to_copy, bool_result=True),
    aten.clone.default: _Rule(_identity, bool_result=True),  # the memory format is the store's business
    aten.alias.default: _Rule(_identity, bool_result=True),
    aten.lift_fresh_copy.default: _Rule(_identity, bool_result=True),
    aten.full.default: _Rule(_constant("fill_value"), bool_result=True),
    aten.scalar_tensor.default: _Rule(_constant("s"), bool_result=True),
}

SUPPORTED_OPS = frozenset(_RULES)


# ----------------------------------------------------------------------------------------------
# The interface


def _name(node: fx.Node) -> str:
    target = node.target
    return str(target) if isinstance(target, torch._ops.OpOverload) else getattr(target, "__name__", str(target))


def is_pointwise(node: fx.Node) -> bool:
    """The node calls an op of the table. Whether this use of it can be written (dtypes,
    arguments) is `check`'s answer."""
    return node.op == "call_function" and node.target in _RULES


def pointwise_expr(node: fx.Node, value: Callable[[object], str]) -> str:
    """The C++ float expression computing `node` from its operands; `value(arg)` is the
    expression of a tensor operand, called once for every fx.Node argument. Raises Unsupported."""
    op = _name(node)
    if not is_pointwise(node):
        raise Unsupported(f"{op} is not a pointwise op the built-in writer knows")
    val = _tensor_val(node)
    if val is None:
        raise Unsupported(f"{op} without a tensor in meta['val'] (its dtype is unknown)")
    problem = _dtype_problem(val.dtype)
    if problem:
        raise Unsupported(f"{op} with {problem} result")
    for arg in node.all_input_nodes:
        arg_val = _tensor_val(arg)
        if arg_val is None:
            raise Unsupported(f"{op} with operand {arg.name}, which is not a tensor with a known dtype")
        problem = _dtype_problem(arg_val.dtype)
        if problem:
            raise Unsupported(f"{op} with {problem} operand {arg.name}")
    values = {arg: value(arg) for arg in node.all_input_nodes}
    rule = _RULES[node.target]
    call = _Call(op, node, _bind(node, op), values)
    expr = rule.emit(call)
    if val.dtype == torch.bool and not rule.bool_result:
        expr = f"({_atom(expr)} != 0.0f ? 1.0f : 0.0f)"
    return expr


def check(node: fx.Node) -> str | None:
    """None when `pointwise_expr(node, ...)` succeeds; otherwise the reason it would not."""
    try:
        pointwise_expr(node, lambda arg: "v")
    except Unsupported as exc:
        return str(exc)
    return None
