"""What the built-in writer reads from a task: its aten graph, planned for one of two kernels.

    plan = plan_task(task_source)        # a Plan, or Declined(reason)

The task program is traced on meta tensors (its inputs' exact shapes, strides and dtypes), with
the composite ops it may call (softmax, log_softmax, logsumexp, layer norm, ...) decomposed into
the pointwise ops and reductions the writer knows. Every value then has a *kind*:

    FULL  varies along the iteration space's last dimension (shape S = [..., L])
    ROW   constant along it: a reduction's result, or an input whose last dimension is 1

A plan without reductions is a **pointwise** kernel over prod(S) elements. A plan with
reductions over the last dimension is a **row** kernel: one row (or one warp's row) at a time,
one pass per reduction, then a pass that writes the FULL outputs. Anything else is declined with
the reason (reductions over other dimensions, integer tensors, views that move data, ...).
"""

from __future__ import annotations

import dataclasses
import enum
import operator
import threading
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx as fx

from kevin_backend.generate.builtin.ops import Unsupported, check as check_pointwise, float_literal, is_pointwise, pointwise_expr
from kevin_backend.types import load_program

__all__ = ["Kind", "Reduction", "PlanInput", "PlanNode", "PlanOutput", "Plan", "Declined", "plan_task", "REDUCTIONS", "DTYPES"]

aten = torch.ops.aten

DTYPES = {torch.float32: "float", torch.float16: "__half", torch.bfloat16: "__nv_bfloat16", torch.bool: "bool"}


class Kind(str, enum.Enum):
    FULL = "full"
    ROW = "row"


class Reduction(str, enum.Enum):
    SUM = "sum"
    MEAN = "mean"
    AMAX = "amax"
    AMIN = "amin"
    VAR = "var"  # needs the mean first: two passes
    VAR_MEAN = "var_mean"


REDUCTIONS = {
    aten.sum.dim_IntList: Reduction.SUM,
    aten.mean.dim: Reduction.MEAN,
    aten.amax.default: Reduction.AMAX,
    aten.amin.default: Reduction.AMIN,
    aten.var.correction: Reduction.VAR,
    aten.var_mean.correction: Reduction.VAR_MEAN,
}

# Ops a task may call that the tracer decomposes into the ones above (and pointwise ops).
_DECOMPOSED = [
    aten._softmax, aten._log_softmax, aten.softmax, aten.log_softmax, aten.logsumexp, aten.native_layer_norm,
    aten.layer_norm, aten.silu, aten.mish, aten.hardswish, aten.hardsigmoid,
    aten.rms_norm, aten._fused_rms_norm,
]
# Views that keep a ROW value a ROW value, or a FULL value in place.
_VIEWS = {aten.view.default, aten._unsafe_view.default, aten.reshape.default, aten.unsqueeze.default,
          aten.squeeze.dim, aten.squeeze.default, aten.squeeze.dims, aten.expand.default, aten.alias.default}


@dataclass(frozen=True)
class PlanInput:
    var: str  # C name of the pointer argument
    index: int  # position among the task's inputs
    dtype: torch.dtype
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    kind: Kind
    view: tuple[tuple[int, ...], tuple[int, ...]] | None = None  # read through a view: (shape, strides)

    @property
    def read_shape(self) -> tuple[int, ...]:
        """The shape the kernel reads the input as (its view's, when the task views it first)."""
        return self.view[0] if self.view else self.shape

    @property
    def read_stride(self) -> tuple[int, ...]:
        return self.view[1] if self.view else self.stride


@dataclass(frozen=True)
class PlanNode:
    var: str  # C name of the value
    kind: Kind
    expr: str | None  # the C float expression (pointwise); None for reductions and inputs' loads
    reduction: Reduction | None = None
    operand: str | None = None  # the reduced value's var (reductions)
    correction: float = 0.0  # var / var_mean
    dtype: torch.dtype = torch.float32  # the value's dtype in the graph (rounded to it when half)
    alias_of: str | None = None  # views and getitem: the same value under another node


@dataclass(frozen=True)
class PlanOutput:
    var: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    kind: Kind


@dataclass(frozen=True)
class Plan:
    inputs: tuple[PlanInput, ...]
    nodes: tuple[PlanNode, ...]  # topological order
    outputs: tuple[PlanOutput, ...]
    shape: tuple[int, ...]  # the iteration space S
    ops: tuple[str, ...]  # the aten ops, for reports

    @property
    def reductions(self) -> tuple[PlanNode, ...]:
        return tuple(n for n in self.nodes if n.reduction is not None)

    @property
    def is_rows(self) -> bool:
        return bool(self.reductions)

    @property
    def cols(self) -> int:
        return self.shape[-1] if self.shape else 1

    @property
    def rows(self) -> int:
        n = 1
        for s in self.shape[:-1]:
            n *= s
        return n

    @property
    def numel(self) -> int:
        return self.rows * self.cols


@dataclass(frozen=True)
class Declined:
    reason: str

    def __bool__(self) -> bool:
        return False


class _OnMeta(torch.overrides.TorchFunctionMode):
    """Makes a task's `get_inputs()` build meta tensors wherever it asks for a device: the writer
    needs shapes, strides and dtypes, not data (and runs where no GPU is)."""

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = dict(kwargs or {})
        if func in (torch.Tensor.cuda, torch.Tensor.cpu):
            return args[0]
        if "device" in kwargs:
            kwargs["device"] = "meta"
        if func is torch.Tensor.to:
            args = tuple("meta" if isinstance(a, (str, torch.device)) else a for a in args)
        return func(*args, **kwargs)


def trace(task_source: str) -> tuple[fx.GraphModule, list[Any]]:
    """The task's aten graph on meta tensors shaped like its inputs, composites decomposed."""
    from torch._decomp import get_decompositions
    from torch.fx.experimental.proxy_tensor import make_fx

    module = load_program(task_source, "kevin_builtin_task")
    with torch.device("meta"), _OnMeta():
        model = module.Model(*module.get_init_inputs())
        metas = list(module.get_inputs())
    if any(True for _ in model.parameters()) or any(True for _ in model.buffers()):
        raise Unsupported("the task has parameters or buffers (the built-in writer takes tensor inputs only)")
    table = get_decompositions(_DECOMPOSED)
    gm = make_fx(lambda *args: model(*args), decomposition_table=table)(*metas)
    return gm, metas


# make_fx keeps its patching state in module globals: two traces at once in one process break
# each other (searches of several tasks run in threads), so tracing takes turns.
_TRACE_LOCK = threading.Lock()


def plan_task(task_source: str) -> Plan | Declined:
    try:
        with _TRACE_LOCK:
            gm, metas = trace(task_source)
    except Unsupported as exc:
        return Declined(str(exc))
    except Exception as exc:  # a task the tracer cannot take is declined, not an error
        return Declined(f"the task could not be traced on meta tensors: {type(exc).__name__}: {exc}")
    try:
        return _plan(gm, metas)
    except Unsupported as exc:
        return Declined(str(exc))


def _val(node: Any) -> torch.Tensor | None:
    v = node.meta.get("val") if isinstance(node, fx.Node) else None
    return v if isinstance(v, torch.Tensor) else None


def _plan(gm: fx.GraphModule, metas: list[Any]) -> Plan:
    graph = gm.graph
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    (output_node,) = [n for n in graph.nodes if n.op == "output"]
    outs = output_node.args[0]
    outs = list(outs) if isinstance(outs, (list, tuple)) else [outs]
    if not outs or not all(isinstance(o, fx.Node) for o in outs):
        raise Unsupported("the task returns something other than tensors")
    for t in metas:
        if not isinstance(t, torch.Tensor):
            raise Unsupported("the task has non-tensor inputs")
        if t.dtype not in DTYPES:
            raise Unsupported(f"input dtype {t.dtype} (supported: float32, float16, bfloat16, bool)")

    reductions = [n for n in graph.nodes if n.op == "call_function" and n.target in REDUCTIONS]
    if reductions:
        shape = tuple(_val(reductions[0].args[0]).shape)  # type: ignore[union-attr]
    else:
        shape = tuple(max((tuple(_val(o).shape) for o in outs), key=lambda s: (len(s), _numel(s))))  # type: ignore[union-attr]
    if not shape:
        raise Unsupported("a 0-dimensional iteration space")
    cols = shape[-1]

    kinds: dict[fx.Node, Kind] = {}
    names: dict[fx.Node, str] = {}
    inputs: list[PlanInput] = []
    nodes: list[PlanNode] = []
    ops: list[str] = []

    def kind_of_shape(s: tuple[int, ...]) -> Kind:
        if len(s) > len(shape) or any(a not in (1, b) for a, b in zip(reversed(s), reversed(shape))):
            raise Unsupported(f"a value of shape {list(s)} does not broadcast to the iteration space {list(shape)}")
        return Kind.FULL if s and s[-1] == cols and cols != 1 else Kind.ROW

    # An input whose own shape does not broadcast to the iteration space may still be read
    # through views that only add, drop or expand size-1 dimensions (a per-channel vector seen as
    # [C, 1, 1] against [N, C, H, W]), also after pointwise work in its own smaller space (a
    # norm's 1 / sqrt(var + eps) on [C], then viewed). Until such a view brings it into the
    # iteration space, a value is "viewing": its space, the layout there of every input it reads,
    # and the plan nodes that compute it (their kind is known once the view is).
    viewing: dict[fx.Node, _Viewing] = {}
    views: dict[fx.Node, tuple[tuple[int, ...], tuple[int, ...]]] = {}  # input placeholder: how the kernel reads it
    for i, (ph, t) in enumerate(zip(placeholders, metas)):
        names[ph] = f"in{i}"
        try:
            kinds[ph] = kind_of_shape(tuple(t.shape))
        except Unsupported as exc:
            viewing[ph] = _Viewing(tuple(t.shape), {ph: (tuple(t.shape), tuple(t.stride()))}, [], str(exc))

    def value(arg: Any) -> str:
        if arg in viewing:
            raise Unsupported(viewing[arg].why)
        if not isinstance(arg, fx.Node) or arg not in names:
            raise Unsupported(f"an operand the writer cannot read: {arg}")
        return names[arg]

    counter = 0
    for node in graph.nodes:
        if node.op != "call_function":
            if node.op == "get_attr":
                raise Unsupported("the task reads a constant tensor")
            continue
        val = node.meta.get("val")
        var = f"v{counter}"
        counter += 1
        op = _op_name(node)
        if node.target is operator.getitem:
            src = node.args[0]
            if src not in names or not isinstance(node.args[1], int):
                raise Unsupported("an item of a value the writer does not know")
            names[node], kinds[node] = f"{names[src]}_{node.args[1]}", kinds[src]
            continue
        ops.append(op)
        if node.target in REDUCTIONS:
            kinds[node] = Kind.ROW
            red = REDUCTIONS[node.target]
            source = node.args[0]
            dims = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
            src_val = _val(source)
            if src_val is None or tuple(src_val.shape) != shape or kinds.get(source) is not Kind.FULL:
                raise Unsupported(f"{op} reduces a value that is not the full iteration space {list(shape)}")
            ndim = len(shape)
            dims = [dims] if isinstance(dims, int) else list(dims or [])
            if [d % ndim for d in dims] != [ndim - 1]:
                raise Unsupported(f"{op} over dims {dims}: the built-in writer reduces over the last dimension only")
            correction = 0.0
            if red in (Reduction.VAR, Reduction.VAR_MEAN):
                c = node.kwargs.get("correction", 1)
                correction = 1.0 if c is None else float(c)
            dtype = (val[0] if isinstance(val, (tuple, list)) else val).dtype
            if dtype not in (torch.float32, torch.float16, torch.bfloat16):
                raise Unsupported(f"{op} with result dtype {dtype}")
            nodes.append(PlanNode(var, Kind.ROW, None, red, names[source], correction, dtype))
            names[node] = var
            continue
        if node.target in _VIEWS and node.args[0] in viewing:
            src_view = viewing[node.args[0]]
            out_shape = tuple(val.shape)
            expand = node.target is aten.expand.default
            layouts = {}
            for ph, (shape_, stride_) in src_view.layouts.items():
                layout = _view_layout(*_aligned(shape_, stride_, src_view.space), out_shape, expand)
                if layout is None:
                    raise Unsupported(src_view.why)
                layouts[ph] = layout
            names[node] = names[node.args[0]]
            try:
                kinds[node] = kind_of_shape(out_shape)
            except Unsupported:  # still outside the iteration space: keep following
                viewing[node] = _Viewing(out_shape, layouts, src_view.members, src_view.why)
                continue
            for ph, layout in layouts.items():
                if views.setdefault(ph, layout) != layout:
                    raise Unsupported(f"input {names[ph]} is read through two different views")
            for k in src_view.members:
                nodes[k] = dataclasses.replace(nodes[k], kind=kinds[node])
            nodes.append(PlanNode(var, kinds[node], None, alias_of=names[node], dtype=val.dtype))
            continue
        viewed = [a for a in _tensor_args(node) if a in viewing]
        if viewed and is_pointwise(node) and all(a in viewing for a in _tensor_args(node)) and isinstance(val, torch.Tensor):
            # pointwise work in a viewing value's own space: computed per element once in view
            reason = check_pointwise(node)
            if reason:
                raise Unsupported(reason)
            space = tuple(val.shape)
            layouts = {}
            for a in viewed:
                for ph, layout in viewing[a].layouts.items():
                    aligned = _aligned(*_aligned(*layout, viewing[a].space), space)
                    if layouts.setdefault(ph, aligned) != aligned:
                        raise Unsupported(f"input {names[ph]} is read in two different ways")
            members = [k for a in viewed for k in viewing[a].members]
            names[node] = var
            viewing[node] = _Viewing(space, layouts, [*dict.fromkeys(members), len(nodes)], viewing[viewed[0]].why)
            ops.append(op)
            nodes.append(PlanNode(var, Kind.FULL, pointwise_expr(node, lambda arg: names[arg]), dtype=val.dtype))
            continue
        if viewed:  # anything else that reads a value outside the iteration space
            raise Unsupported(viewing[viewed[0]].why)
        if node.target in _VIEWS:
            src = node.args[0]
            if src not in names:
                raise Unsupported(f"{op} of a value the writer does not know")
            out_shape = tuple(val.shape)
            src_shape = tuple(_val(src).shape)  # type: ignore[union-attr]
            if kinds[src] is Kind.ROW and _numel(out_shape) == _numel(src_shape):
                pass  # a row value seen with or without its size-1 dimensions
            elif out_shape == src_shape or (node.target is aten.expand.default and (kind_of_shape(out_shape) is kinds[src] or kinds[src] is Kind.ROW)):
                # (a row value expanded along the last dimension is still one value per row)
                pass
            else:
                raise Unsupported(f"{op} from {list(src_shape)} to {list(out_shape)} moves data between rows")
            names[node], kinds[node] = names[src], kinds[src]
            nodes.append(PlanNode(var, kinds[src], None, alias_of=names[src], dtype=val.dtype))
            continue
        if node.target is aten.masked_fill.Scalar and isinstance(node.args[2], (int, float, bool)):
            # where(mask, value, x): what logsumexp's decomposition guards infinite maxima with
            kind = kinds[node.args[0]] if kinds[node.args[1]] is Kind.ROW else Kind.FULL
            expr = f"(({value(node.args[1])}) != 0.0f ? {float_literal(node.args[2])} : ({value(node.args[0])}))"
            nodes.append(PlanNode(var, kind, expr, dtype=val.dtype))
            names[node], kinds[node] = var, kind
            continue
        if not is_pointwise(node):
            raise Unsupported(f"{op} is neither pointwise nor a last-dimension reduction")
        reason = check_pointwise(node)
        if reason:
            raise Unsupported(reason)
        if not isinstance(val, torch.Tensor) or val.dtype not in DTYPES:
            raise Unsupported(f"{op} makes a {getattr(val, 'dtype', type(val))} value")
        operand_kinds = [kinds[a] for a in _tensor_args(node) if a in kinds]
        # FULL if any operand is; ROW if its operands are rows (a reduction's result in any of its
        # shapes); a node of scalars alone takes its kind from its shape
        kind = Kind.FULL if Kind.FULL in operand_kinds else Kind.ROW if operand_kinds else kind_of_shape(tuple(val.shape))
        if kind is Kind.FULL and tuple(val.shape) != shape and reductions:
            raise Unsupported(f"{op} makes shape {list(val.shape)}, not the iteration space {list(shape)}")
        nodes.append(PlanNode(var, kind, pointwise_expr(node, value), dtype=val.dtype))
        names[node], kinds[node] = var, kind

    for node, view in viewing.items():
        if not view.members and node.op == "placeholder" and node not in views:
            raise Unsupported(view.why)
    for i, (ph, t) in enumerate(zip(placeholders, metas)):
        view = views.get(ph)
        kind = kinds[ph] if view is None else kind_of_shape(view[0])
        inputs.append(PlanInput(f"in{i}", i, t.dtype, tuple(t.shape), tuple(t.stride()), kind, view))

    outputs = []
    for o in outs:
        if o not in names or o.op == "placeholder":
            raise Unsupported("an output that is an input or unknown")
        v = _val(o)
        if o in viewing:
            raise Unsupported(f"an output of shape {list(v.shape)} in an iteration space of {list(shape)}")  # type: ignore[union-attr]
        kind = kinds[o]
        out_shape = tuple(v.shape)  # type: ignore[union-attr]
        if kind is Kind.FULL and out_shape != shape:
            raise Unsupported(f"an output of shape {list(out_shape)} in an iteration space of {list(shape)}")
        if kind is Kind.ROW and reductions and _numel(out_shape) != _numel(shape[:-1]):
            raise Unsupported(f"a row output of shape {list(out_shape)}")
        if kind is Kind.ROW and not reductions and out_shape != shape:
            raise Unsupported(f"an output of shape {list(out_shape)} in an iteration space of {list(shape)}")
        if v.dtype not in (torch.float32, torch.float16, torch.bfloat16):  # type: ignore[union-attr]
            raise Unsupported(f"an output of dtype {v.dtype}")  # type: ignore[union-attr]
        outputs.append(PlanOutput(names[o], v.dtype, out_shape, kind))  # type: ignore[union-attr]
    if not reductions:  # a pointwise kernel computes every value per element
        nodes = [PlanNode(n.var, Kind.FULL, n.expr, n.reduction, n.operand, n.correction, n.dtype, n.alias_of) for n in nodes]
    return Plan(tuple(inputs), tuple(nodes), tuple(outputs), shape, tuple(ops))


@dataclass
class _Viewing:
    space: tuple[int, ...]  # the value's shape
    layouts: dict[fx.Node, tuple[tuple[int, ...], tuple[int, ...]]]  # each input it reads: (shape, strides) in that space
    members: list[int]  # indices of the plan nodes computing it
    why: str  # the reason to give if no view brings it into the iteration space


def _aligned(shape: tuple[int, ...], stride: tuple[int, ...], space: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """A layout broadcast to `space` (trailing dimensions aligned; broadcast ones get stride 0)."""
    lead = len(space) - len(shape)
    shape, stride = (1,) * lead + tuple(shape), (0,) * lead + tuple(stride)
    return tuple(space), tuple(0 if size == 1 and full != 1 else st for size, st, full in zip(shape, stride, space))


def _view_layout(shape: tuple[int, ...], stride: tuple[int, ...], out: tuple[int, ...],
                 expand: bool) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """(shape, strides) of a view of a (shape, strides) layout as `out`, when the view keeps every
    element where it is: only size-1 dimensions added, dropped or expanded (stride 0); else None."""
    if expand:
        lead = len(out) - len(shape)
        if lead < 0:
            return None
        strides = []
        for d, size in enumerate(out):
            if d < lead:
                strides.append(0)
                continue
            src = shape[d - lead]
            if src not in (1, size):
                return None
            strides.append(0 if src == 1 else stride[d - lead])
        return out, tuple(strides)
    kept = [(size, st) for size, st in zip(shape, stride) if size != 1]
    if [size for size, _ in kept] != [size for size in out if size != 1]:
        return None
    it = iter(kept)
    return out, tuple(0 if size == 1 else next(it)[1] for size in out)


def _tensor_args(node: fx.Node) -> list[fx.Node]:
    return [a for a in (*node.args, *node.kwargs.values()) if isinstance(a, fx.Node)]


def _op_name(node: fx.Node) -> str:
    target = node.target
    return f"aten.{target._opname}.{target._overloadname}" if hasattr(target, "_opname") else str(target)


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


class BuiltinSupport:
    """What the built-in writer declares to the partitioner: the pointwise ops of its op table,
    the last-dimension reductions above and the views that keep rows in place. Whether a whole
    partition fits one of its two kernels is decided per task (`plan_task`), with the reason."""

    name = "builtin"

    def supports(self, node: fx.Node) -> tuple[bool, str]:
        target = node.target
        if target in REDUCTIONS:
            val = node.args[0].meta.get("val") if isinstance(node.args[0], fx.Node) else None
            dims = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
            dims = [dims] if isinstance(dims, int) else list(dims or [])
            if isinstance(val, torch.Tensor) and val.dim() and [d % val.dim() for d in dims] == [val.dim() - 1]:
                return True, ""
            return False, f"{_op_name(node)} not over the last dimension (the built-in writer reduces rows only)"
        if target in _VIEWS or target is aten.masked_fill.Scalar:
            return True, ""
        if is_pointwise(node):
            reason = check_pointwise(node)
            return (True, "") if reason is None else (False, reason)
        return False, f"{_op_name(node)} not declared by writer 'builtin'"
