"""What the built-in writer reads from a task: its aten graph, planned for one of two kernels.

    plan = plan_task(task_source)        # a Plan, or Declined(reason)

The task program is traced on meta tensors (its inputs' exact shapes, strides and dtypes), with
the composite ops it may call (softmax, log_softmax, logsumexp, layer norm, ...) decomposed into
the pointwise ops and reductions the writer knows. Every value then has a *kind*:

    FULL  varies along a reduced dimension of the iteration space S (its last one when nothing
          is reduced)
    ROW   constant along every reduced dimension: a reduction's result, or an input of size 1
          there

A plan without reductions is a **pointwise** kernel over prod(S) elements. A plan with
reductions is a **row** kernel. Every reduction of a plan reduces the same dimensions R of S
(any of them: the last, a middle one, several, all). A "row" is one position in the kept
dimensions, and its "columns" are the positions in R. The kernel reads each row one pass per
reduction, or once when the row fits in registers, then writes the FULL outputs. Index
reductions (`argmax`, `argmin`, `max.dim`, `min.dim`) carry each value's position in the
row. Cross-entropy's `nll_loss_forward` reads its int64 class targets as a row input: each
row's loss is a *pick*, the log-probability at the target's column, and a `final` reduction
over the rows (mean over the targets not ignored, or sum) makes the scalar. Anything else is
declined with the reason: reductions over different dimensions in one task, integer inputs read
as values, views that move data, and so on.
"""

from __future__ import annotations

import dataclasses
import enum
import operator
import re
import threading
import weakref
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.fx as fx

from kevin_backend.generate.builtin.ops import Unsupported, check as check_pointwise, float_literal, is_pointwise, pointwise_expr
from kevin_backend.types import load_program

__all__ = ["Kind", "Reduction", "PlanInput", "PlanNode", "PlanOutput", "Plan", "Declined", "plan_task", "REDUCTIONS", "DTYPES",
           "INDEXED", "CENTERED", "FinalReduce", "online_partner"]

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
    STD = "std"  # the square root of VAR
    ARGMAX = "argmax"  # the position of the first largest value (NaN counts as largest)
    ARGMIN = "argmin"
    MAX_DIM = "max_dim"  # (values, indices): AMAX and ARGMAX at once
    MIN_DIM = "min_dim"


REDUCTIONS = {
    aten.sum.dim_IntList: Reduction.SUM,
    aten.sum.default: Reduction.SUM,
    aten.mean.dim: Reduction.MEAN,
    aten.mean.default: Reduction.MEAN,
    aten.amax.default: Reduction.AMAX,
    aten.amin.default: Reduction.AMIN,
    aten.max.default: Reduction.AMAX,
    aten.min.default: Reduction.AMIN,
    aten.var.correction: Reduction.VAR,
    aten.var_mean.correction: Reduction.VAR_MEAN,
    aten.std.correction: Reduction.STD,
    aten.argmax.default: Reduction.ARGMAX,
    aten.argmin.default: Reduction.ARGMIN,
    aten.max.dim: Reduction.MAX_DIM,
    aten.min.dim: Reduction.MIN_DIM,
}
# Reductions whose result (or one of whose results) is a position: an int64 value.
INDEXED = (Reduction.ARGMAX, Reduction.ARGMIN, Reduction.MAX_DIM, Reduction.MIN_DIM)
# Reductions that need the row's mean first (two passes, or a mean and squares kept in registers).
CENTERED = (Reduction.VAR, Reduction.VAR_MEAN, Reduction.STD)

# Ops a task may call that the tracer decomposes into the ones above (and pointwise ops).
_DECOMPOSED = [
    aten._softmax, aten._log_softmax, aten.softmax, aten.log_softmax, aten.logsumexp, aten.native_layer_norm,
    aten.layer_norm, aten.silu, aten.mish, aten.hardswish, aten.hardsigmoid,
    aten.rms_norm, aten._fused_rms_norm, aten.linalg_vector_norm, aten.native_group_norm, aten.group_norm,
    aten.native_batch_norm, aten._native_batch_norm_legit_no_training, aten._native_batch_norm_legit_functional,
    aten.batch_norm, aten.instance_norm, aten.smooth_l1_loss, aten.huber_loss, aten.mse_loss, aten.kl_div,
]
# Views that keep a ROW value a ROW value, or a FULL value in place.
_VIEWS = {aten.view.default, aten._unsafe_view.default, aten.reshape.default, aten.unsqueeze.default,
          aten.squeeze.dim, aten.squeeze.default, aten.squeeze.dims, aten.expand.default, aten.alias.default}
# Views that move an input's dimensions: taken only straight from an input (`_fold_input_views`).
_MOVES = {aten.permute.default, aten.transpose.int, aten.t.default}
_FOLDABLE = {aten.view.default, aten.unsqueeze.default, aten.squeeze.dim, aten.squeeze.default, aten.squeeze.dims,
             aten.expand.default, aten.alias.default} | _MOVES


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
    pick: tuple[str, str] | None = None  # (FULL value, ROW index): the value at the index's column (ROW)


@dataclass(frozen=True)
class FinalReduce:
    """A reduction over the rows after the row kernel (cross-entropy's mean over the targets):
    the plan's one output is then the per-row value (float32, one per row), and a last launch
    reduces it to the scalar the task returns."""
    op: str  # "mean": the sum over the rows whose target is not `ignore`, over their count; "sum"
    target: str  # the int64 targets' input var
    ignore: int  # the ignored class index
    dtype: torch.dtype  # the scalar's dtype


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
    ops: tuple[str, ...]  # every aten op of the graph once, in graph order (views too; tuple items are none), for reports
    reduced: tuple[int, ...] = ()  # R: the dimensions of S every reduction reduces (sorted); () = the last one
    final: FinalReduce | None = None  # a reduction over the rows after the row kernel (cross-entropy)

    @property
    def picks(self) -> tuple[PlanNode, ...]:
        return tuple(n for n in self.nodes if n.pick is not None)

    @property
    def reductions(self) -> tuple[PlanNode, ...]:
        return tuple(n for n in self.nodes if n.reduction is not None)

    @property
    def is_rows(self) -> bool:
        return bool(self.reductions)

    @property
    def reduced_dims(self) -> tuple[int, ...]:
        return self.reduced or ((len(self.shape) - 1,) if self.shape else ())

    @property
    def kept_dims(self) -> tuple[int, ...]:
        return tuple(d for d in range(len(self.shape)) if d not in self.reduced_dims)

    @property
    def over_last(self) -> bool:
        """Whether the row is the last dimension of S (a row is contiguous in a contiguous S)."""
        return self.reduced_dims == ((len(self.shape) - 1,) if self.shape else ())

    @property
    def cols(self) -> int:
        return _numel(tuple(self.shape[d] for d in self.reduced_dims)) if self.shape else 1

    @property
    def rows(self) -> int:
        return _numel(tuple(self.shape[d] for d in self.kept_dims))

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
    # the forward too: a partition's task makes its scalars on the graph's device
    # (`aten.full.default(..., device=cuda:0)`), which must be meta beside meta inputs
    with _OnMeta():
        gm = make_fx(lambda *args: model(*args), decomposition_table=table)(*metas)
    fold_decomposed_nll(gm.graph)
    gm.graph.eliminate_dead_code()  # what decompositions make and nothing reads (a norm's unused saved statistics)
    gm.recompile()
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
    """The plan of a traced task: its inputs and iteration space checked, then each call_function
    node, in graph order, handed to the handler of its kind (`_Planner.visit`). Raises Unsupported."""
    graph = gm.graph
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    outs = _outputs_of(graph)
    _check_inputs(metas)
    reductions = [n for n in graph.nodes if n.op == "call_function" and n.target in REDUCTIONS]
    shape = _iteration_space(reductions, outs)
    planner = _Planner(shape, reducing=bool(reductions), reduced=reduced_dims(reductions[0], len(shape)) if reductions else ())
    for i, (ph, t) in enumerate(zip(placeholders, metas)):
        planner.add_input(ph, i, t)
    folded = _fold_input_views(placeholders, metas)
    for ph, (chain, layout) in folded.items():
        planner.read_through(ph, chain[-1], layout)
    in_chains = {n for chain, _ in folded.values() for n in chain}
    counter = 0
    for node in graph.nodes:
        if node.op == "get_attr":
            raise Unsupported("the task reads a constant tensor")
        if node.op != "call_function":
            continue
        if node in in_chains:  # the input read through these views: no code of their own
            planner.ops.append(_op_name(node))
            continue
        planner.visit(node, f"v{counter}")
        counter += 1
    return planner.finish(placeholders, metas, outs)


def _fold_input_views(placeholders: list[fx.Node], metas: list[Any]) -> dict[fx.Node, tuple[list[fx.Node], tuple[tuple[int, ...], tuple[int, ...]]]]:
    """Inputs read through views that move their dimensions (a transpose, a permute, a view that
    splits or merges dimensions), each view used by the next alone: per input, the chain of views
    and the layout (shape, strides) the kernel reads the input through. The layout is what torch
    gives when the views are applied to a meta tensor of the input's layout, so torch decides what
    is a view (a view it refuses leaves the input unfolded, and the plan says why)."""
    folded = {}
    for ph, t in zip(placeholders, metas):
        chain, node, moves = [], ph, False
        while len(node.users) == 1:
            (user,) = node.users
            if user.op != "call_function" or user.target not in _FOLDABLE or not user.args or user.args[0] is not node:
                break
            before, after = _val(node), _val(user)
            if before is None or after is None:
                break
            chain.append(user)
            moves = moves or user.target in _MOVES or (
                user.target is aten.view.default and [d for d in before.shape if d != 1] != [d for d in after.shape if d != 1])
            node = user
        if not chain or not moves:
            continue
        try:
            meta = torch.empty_strided(tuple(t.shape), tuple(t.stride()), dtype=t.dtype, device="meta")
            for n in chain:
                meta = n.target(meta, *n.args[1:], **n.kwargs)
        except RuntimeError:
            continue
        folded[ph] = (chain, (tuple(meta.shape), tuple(meta.stride())))
    return folded


def _outputs_of(graph: fx.Graph) -> list[fx.Node]:
    (output_node,) = [n for n in graph.nodes if n.op == "output"]
    outs = output_node.args[0]
    outs = list(outs) if isinstance(outs, (list, tuple)) else [outs]
    if not outs or not all(isinstance(o, fx.Node) for o in outs):
        raise Unsupported("the task returns something other than tensors")
    return outs


def _check_inputs(metas: list[Any]) -> None:
    for t in metas:
        if not isinstance(t, torch.Tensor):
            raise Unsupported("the task has non-tensor inputs")
        if t.dtype not in DTYPES and t.dtype is not torch.int64:
            raise Unsupported(f"input dtype {t.dtype} (supported: float32, float16, bfloat16, bool; int64 as class targets)")


def reduced_dims(node: fx.Node, ndim: int) -> tuple[int, ...]:
    """The dimensions a reduction node reduces, sorted and non-negative (all of them when its
    dimension argument is absent, None or empty, as torch reads it)."""
    target = node.target
    if target in (aten.sum.default, aten.mean.default, aten.max.default, aten.min.default):
        dims: Any = None
    elif target in (aten.var.correction, aten.var_mean.correction, aten.std.correction):
        dims = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
    elif target in (aten.argmax.default, aten.argmin.default, aten.max.dim, aten.min.dim):
        dims = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
    else:
        dims = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
    if dims is None or (isinstance(dims, (list, tuple)) and not dims):
        return tuple(range(ndim))
    dims = [dims] if isinstance(dims, int) else list(dims)
    return tuple(sorted({d % ndim for d in dims})) if ndim else ()


def _iteration_space(reductions: list[fx.Node], outs: list[fx.Node]) -> tuple[int, ...]:
    """S: what the first reduction reduces, else the largest output's shape."""
    if reductions:
        shape = tuple(_val(reductions[0].args[0]).shape)  # type: ignore[union-attr]
    else:
        shape = tuple(max((tuple(_val(o).shape) for o in outs), key=lambda s: (len(s), _numel(s))))  # type: ignore[union-attr]
    if not shape:
        raise Unsupported("a 0-dimensional iteration space")
    return shape


class _Planner:
    """The walk over a traced graph that builds a Plan: each call_function node goes to the
    handler of its kind (`_HANDLERS`: an item of a tuple, a reduction, a view, masked_fill, a
    pointwise op), which adds its PlanNode and records the value's name and kind.

    An input whose own shape does not broadcast to the iteration space may still be read through
    views that only add, drop or expand size-1 dimensions (a per-channel vector seen as [C, 1, 1]
    against [N, C, H, W]), also after pointwise work in its own smaller space (a norm's
    1 / sqrt(var + eps) on [C], then viewed). Until such a view brings it into the iteration
    space, a value is "viewing" (`viewing`): its space, the layout there of every input it reads,
    and the plan nodes that compute it (their kind is known once the view is)."""

    def __init__(self, shape: tuple[int, ...], reducing: bool, reduced: tuple[int, ...] = ()) -> None:
        self.shape = shape
        self.reduced = reduced or (len(shape) - 1,)  # R
        self.reducing = reducing  # a row plan
        self.indices: set[fx.Node] = set()  # int64 positions (index reductions): outputs only
        self.targets: set[fx.Node] = set()  # int64 inputs: read only as class targets (nll_loss_forward)
        self.final: tuple[fx.Node, FinalReduce] | None = None
        self.spaces: dict[fx.Node, tuple[int, ...]] = {}  # FULL values seen in another shape of the same order
        self.kinds: dict[fx.Node, Kind] = {}
        self.names: dict[fx.Node, str] = {}
        self.nodes: list[PlanNode] = []
        self.ops: list[str] = []  # every aten op of the graph once, in graph order
        self.viewing: dict[fx.Node, _Viewing] = {}
        self.views: dict[fx.Node, tuple[tuple[int, ...], tuple[int, ...]]] = {}  # input placeholder: how the kernel reads it

    def kind_of_shape(self, s: tuple[int, ...]) -> Kind:
        shape = self.shape
        if len(s) > len(shape) or any(a not in (1, b) for a, b in zip(reversed(s), reversed(shape))):
            raise Unsupported(f"a value of shape {list(s)} does not broadcast to the iteration space {list(shape)}")
        aligned = (1,) * (len(shape) - len(s)) + tuple(s)
        return Kind.FULL if any(aligned[d] == shape[d] != 1 for d in self.reduced) else Kind.ROW

    def add_input(self, ph: fx.Node, index: int, t: torch.Tensor) -> None:
        self.names[ph] = f"in{index}"
        if t.dtype is torch.int64:
            self.targets.add(ph)
        try:
            self.kinds[ph] = self.kind_of_shape(tuple(t.shape))
        except Unsupported as exc:
            self.viewing[ph] = _Viewing(tuple(t.shape), {ph: (tuple(t.shape), tuple(t.stride()))}, [], str(exc))

    def read_through(self, ph: fx.Node, last: fx.Node, layout: tuple[tuple[int, ...], tuple[int, ...]]) -> None:
        """Input `ph` read through a chain of views ending at `last` (`_fold_input_views`): the
        chain's value is the input, laid out as `layout` in the iteration space."""
        self.viewing.pop(ph, None)
        kind = self.kind_of_shape(layout[0])
        self.views[ph] = layout
        self.kinds[ph] = self.kinds[last] = kind
        self.names[last] = self.names[ph]

    def cols_of(self, shape: tuple[int, ...]) -> int:
        return _numel(tuple(shape[d] for d in self.reduced))

    def value(self, arg: Any) -> str:
        """The C name of an operand in the iteration space."""
        if arg in self.viewing:
            raise Unsupported(self.viewing[arg].why)
        if arg in self.indices:
            raise Unsupported("an index reduction's positions are read by another op (the built-in writer only returns them)")
        if arg in self.targets:
            raise Unsupported("an int64 input read as a value (the built-in writer reads int64 inputs only as "
                              "cross-entropy's class targets)")
        if not isinstance(arg, fx.Node) or arg not in self.names:
            raise Unsupported(f"an operand the writer cannot read: {arg}")
        return self.names[arg]

    def viewed(self, node: fx.Node) -> list[fx.Node]:
        """The operands of `node` still outside the iteration space."""
        return [a for a in _tensor_args(node) if a in self.viewing]

    def visit(self, node: fx.Node, var: str) -> None:
        kind = _node_kind(node)
        if kind != "item":  # an item of a tuple is no op of its own
            self.ops.append(_op_name(node))
        _HANDLERS[kind](self, node, var)

    def finish(self, placeholders: list[fx.Node], metas: list[Any], outs: list[fx.Node]) -> Plan:
        shape = self.shape
        for node, view in self.viewing.items():
            if not view.members and node.op == "placeholder" and node not in self.views:
                raise Unsupported(view.why)
        inputs = []
        for i, (ph, t) in enumerate(zip(placeholders, metas)):
            view = self.views.get(ph)
            kind = self.kinds[ph] if view is None else self.kind_of_shape(view[0])
            inputs.append(PlanInput(f"in{i}", i, t.dtype, tuple(t.shape), tuple(t.stride()), kind, view))
        outputs = []
        rows = _numel(tuple(shape[d] for d in range(len(shape)) if d not in self.reduced))
        if self.final is not None:
            if len(outs) != 1 or outs[0] is not self.final[0]:
                raise Unsupported("a cross-entropy loss returned with other outputs")
            outputs.append(PlanOutput(self.names[outs[0]], torch.float32, (rows,), Kind.ROW))
            outs = []
        for o in outs:
            if o not in self.names or o.op == "placeholder":
                raise Unsupported("an output that is an input or unknown")
            v = _val(o)
            if o in self.viewing:
                raise Unsupported(f"an output of shape {list(v.shape)} in an iteration space of {list(shape)}")  # type: ignore[union-attr]
            kind = self.kinds[o]
            out_shape = tuple(v.shape)  # type: ignore[union-attr]
            if kind is Kind.FULL and out_shape != shape and self.spaces.get(o) != out_shape:
                raise Unsupported(f"an output of shape {list(out_shape)} in an iteration space of {list(shape)}")
            if kind is Kind.ROW and self.reducing and _numel(out_shape) != rows:
                raise Unsupported(f"a row output of shape {list(out_shape)}")
            if kind is Kind.ROW and not self.reducing and out_shape != shape:
                raise Unsupported(f"an output of shape {list(out_shape)} in an iteration space of {list(shape)}")
            index = o in self.indices and v.dtype is torch.int64  # type: ignore[union-attr]
            if v.dtype not in (torch.float32, torch.float16, torch.bfloat16) and not index:  # type: ignore[union-attr]
                raise Unsupported(f"an output of dtype {v.dtype}")  # type: ignore[union-attr]
            outputs.append(PlanOutput(self.names[o], v.dtype, out_shape, kind))  # type: ignore[union-attr]
        nodes = self.nodes
        if not self.reducing:  # a pointwise kernel computes every value per element
            nodes = [dataclasses.replace(n, kind=Kind.FULL) for n in nodes]
        reduced = self.reduced if self.reducing and self.reduced != (len(shape) - 1,) else ()
        final = self.final[1] if self.final is not None else None
        return Plan(tuple(inputs), tuple(nodes), tuple(outputs), shape, tuple(self.ops), reduced, final)


def _node_kind(node: fx.Node) -> str:
    """The key of `node`'s handler in `_HANDLERS`."""
    if node.target is operator.getitem:
        return "item"
    if node.target in REDUCTIONS:
        return "reduction"
    if node.target in _VIEWS:
        return "view"
    if node.target is aten.nll_loss_forward.default:
        return "nll"
    if node.target is aten.masked_fill.Scalar and isinstance(node.args[2], (int, float, bool)):
        return "masked_fill"
    return "pointwise"  # or an op the writer cannot take: its handler says why


def _plan_item(p: _Planner, node: fx.Node, var: str) -> None:
    """An item of a tuple-valued node (var_mean's two results): a name for it, no plan node."""
    src = node.args[0]
    if src not in p.names or not isinstance(node.args[1], int):
        raise Unsupported("an item of a value the writer does not know")
    p.names[node], p.kinds[node] = f"{p.names[src]}_{node.args[1]}", p.kinds[src]
    if src.target in (aten.max.dim, aten.min.dim) and node.args[1] == 1:
        p.indices.add(node)


def _plan_reduction(p: _Planner, node: fx.Node, var: str) -> None:
    """A reduction over the plan's dimensions R of the full iteration space: a ROW value (or
    two, for var_mean, max.dim and min.dim; an index reduction's positions are int64)."""
    op, val, shape = _op_name(node), node.meta.get("val"), p.shape
    p.kinds[node] = Kind.ROW
    red = REDUCTIONS[node.target]
    source = node.args[0]
    src_val = _val(source)
    if src_val is None or tuple(src_val.shape) != shape or p.kinds.get(source) is not Kind.FULL:
        if src_val is not None and tuple(src_val.shape) == shape and p.kinds.get(source) is Kind.ROW and p.cols_of(shape) == 1:
            pass  # a reduction over size-1 dimensions (its value is its operand's)
        else:
            raise Unsupported(f"{op} reduces a value that is not the full iteration space {list(shape)}")
    dims = reduced_dims(node, len(shape))
    if dims != p.reduced:
        raise Unsupported(f"{op} over dims {list(dims)} where the task's first reduction is over {list(p.reduced)}: "
                          "the built-in writer reduces one set of dimensions per kernel")
    if red in (Reduction.ARGMAX, Reduction.ARGMIN, Reduction.MAX_DIM, Reduction.MIN_DIM) and len(dims) > 1 and len(dims) != len(shape):
        raise Unsupported(f"{op} over several dimensions")
    correction = 0.0
    if red in CENTERED:
        c = node.kwargs.get("correction", 1)
        correction = 1.0 if c is None else float(c)
    values = val[0] if isinstance(val, (tuple, list)) else val
    dtype = values.dtype
    if red in (Reduction.ARGMAX, Reduction.ARGMIN):
        dtype = src_val.dtype  # type: ignore[union-attr] # (the positions are int64; the values compared are the operand's)
        p.indices.add(node)
    if dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise Unsupported(f"{op} with result dtype {dtype}")
    p.nodes.append(PlanNode(var, Kind.ROW, None, red, p.names[source], correction, dtype))
    p.names[node] = var


# nll_loss_forward's reduction argument
_NLL_REDUCTIONS = {0: "none", 1: "mean", 2: "sum"}


def _plan_nll(p: _Planner, node: fx.Node, var: str) -> None:
    """Cross-entropy's last step, nll_loss_forward(log_probs [N, C], targets [N] int64, weight,
    reduction, ignore_index): each row's loss is minus the log-probability at its target's column
    (0 where the target is `ignore_index`), a ROW value; reduction "none" returns it per row,
    "mean" and "sum" reduce it over the rows after the row kernel (`FinalReduce`)."""
    logp, target, weight, reduction, ignore = (list(node.args) + [None, 1, -100])[:5]
    shape = p.shape
    if weight is not None:
        raise Unsupported("nll_loss with class weights")
    if len(shape) != 2 or p.reduced != (1,) or p.kinds.get(logp) is not Kind.FULL:
        raise Unsupported("nll_loss over anything but the rows of a 2-D row plan")
    if target not in p.targets or not isinstance(target, fx.Node) or target.op != "placeholder":
        raise Unsupported("nll_loss whose targets are not an int64 input of the task")
    t_val = _val(target)
    if t_val is None or tuple(t_val.shape) != (shape[0],):
        raise Unsupported("nll_loss targets of another shape than [rows]")
    if shape[1] >= 1 << 24:
        raise Unsupported("nll_loss over 2^24 classes or more (the targets are compared as floats)")
    if reduction not in _NLL_REDUCTIONS or not isinstance(ignore, int) or abs(ignore) >= 1 << 24:
        raise Unsupported(f"nll_loss with reduction {reduction} and ignore_index {ignore}")
    # the targets: one value per row, read through a [N, 1] view of their storage
    p.viewing.pop(target, None)
    p.views[target] = ((shape[0], 1), (t_val.stride()[0], 0))
    p.kinds[target] = Kind.ROW
    t = p.names[target]
    out_dtype = _val(logp).dtype  # type: ignore[union-attr]
    p.nodes.append(PlanNode(f"{var}_pick", Kind.ROW, None, pick=(p.value(logp), t)))
    p.nodes.append(PlanNode(f"{var}_0", Kind.ROW, f"({t} == {float(ignore)!r}f ? 0.0f : -{var}_pick)", dtype=out_dtype))
    p.names[node], p.kinds[node] = var, Kind.ROW
    if _NLL_REDUCTIONS[reduction] != "none":
        items = [u for u in node.users if u.target is operator.getitem and u.args[1] == 0]
        if len(items) != 1 or any(u.target is operator.getitem and u.args[1] == 1 for u in node.users):
            raise Unsupported("nll_loss's total weight read")
        p.final = (items[0], FinalReduce(_NLL_REDUCTIONS[reduction], t, ignore, out_dtype))


@dataclass(frozen=True)
class DecomposedNll:
    """Cross-entropy's last step as Inductor's decompositions hand it to the backend, instead of
    one `nll_loss_forward`:

        safe  = where(ne(targets, ignore), targets, 0)              # int64, [N]
        pick  = squeeze(gather(log_probs, 1, unsqueeze(safe, 1)), 1)
        loss  = where(ne(targets, ignore), -pick, 0)                # reduction "none"
        total = sum(loss)                                           # "sum"
        mean  = total / sum(ne(targets, ignore)).to(dtype)          # "mean"

    (the zeros are `scalar_tensor(0)` or, after Inductor's own passes, `full([], 0)`)."""

    log_probs: fx.Node
    targets: fx.Node
    ignore: int
    reduction: int  # nll_loss_forward's: 0 none, 1 mean, 2 sum
    result: fx.Node  # the loss: `loss`, `total` or `mean` above
    nodes: frozenset[fx.Node]  # every node of the pattern (the log-probabilities' not)


def _is_zero_scalar(node: Any) -> bool:
    """A 0-d zero made in the graph: scalar_tensor(0) or full([], 0)."""
    if not isinstance(node, fx.Node):
        return False
    if node.target is aten.scalar_tensor.default:
        return node.args[0] == 0
    if node.target is aten.full.default:
        return list(node.args[0]) == [] and node.args[1] == 0
    return False


def _ignore_mask(node: Any, targets: fx.Node | None = None) -> tuple[fx.Node, int] | None:
    """ne(targets, ignore_index) as (targets, ignore_index); None for anything else."""
    if not (isinstance(node, fx.Node) and node.target is aten.ne.Scalar and isinstance(node.args[0], fx.Node)
            and isinstance(node.args[1], int) and not isinstance(node.args[1], bool)):
        return None
    return None if targets is not None and node.args[0] is not targets else (node.args[0], node.args[1])


def _sole_user(node: fx.Node, target: Any) -> fx.Node | None:
    users = list(node.users)
    return users[0] if len(users) == 1 and users[0].target is target else None


def match_decomposed_nll(gather: fx.Node) -> DecomposedNll | None:
    """The pattern of `DecomposedNll` around `gather`, or None when any part differs."""
    if gather.target is not aten.gather.default or len(gather.args) != 3 or gather.kwargs.get("sparse_grad"):
        return None
    log_probs, dim, index = gather.args
    lp = _val(log_probs)
    if lp is None or lp.dim() != 2 or dim not in (1, -1) or lp.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        return None
    if not isinstance(index, fx.Node) or index.target is not aten.unsqueeze.default or index.args[1] not in (1, -1):
        return None
    safe = index.args[0]
    if not isinstance(safe, fx.Node) or safe.target is not aten.where.self or not _is_zero_scalar(safe.args[2]):
        return None
    mask, targets = safe.args[0], safe.args[1]
    found = _ignore_mask(mask)
    t = _val(targets)
    if found is None or found[0] is not targets or t is None or t.dtype is not torch.int64 or tuple(t.shape) != (lp.shape[0],):
        return None
    ignore = found[1]
    squeeze = _sole_user(gather, aten.squeeze.dim)
    neg = _sole_user(squeeze, aten.neg.default) if squeeze is not None and squeeze.args[1] in (1, -1) else None
    loss = _sole_user(neg, aten.where.self) if neg is not None else None
    if loss is None or loss.args[1] is not neg or _ignore_mask(loss.args[0], targets) != (targets, ignore) \
            or not _is_zero_scalar(loss.args[2]):
        return None
    nodes = {mask, safe.args[2], safe, index, gather, squeeze, neg, loss.args[0], loss.args[2], loss}
    reduction, result = 0, loss
    total = _sole_user(loss, aten.sum.default)
    if total is not None and len(total.args) == 1:
        reduction, result = 2, total
        nodes.add(total)
        mean = _sole_user(total, aten.div.Tensor)
        count = mean.args[1] if mean is not None and mean.args[0] is total else None
        if isinstance(count, fx.Node) and count.target is torch.ops.prims.convert_element_type.default \
                and isinstance(count.args[0], fx.Node) and count.args[0].target is aten.sum.default \
                and len(count.args[0].args) == 1 and _ignore_mask(count.args[0].args[0], targets) == (targets, ignore):
            reduction, result = 1, mean
            nodes |= {mean, count, count.args[0], count.args[0].args[0]}
    return DecomposedNll(log_probs, targets, ignore, reduction, result, frozenset(nodes))  # type: ignore[arg-type]


def fold_decomposed_nll(graph: fx.Graph) -> int:
    """Each `DecomposedNll` in `graph` replaced by the `nll_loss_forward` it came from (a partition's
    task, traced, reads like the backend's graph); the pattern's nodes are left for dead-code
    elimination. Returns how many were folded."""
    folded = 0
    for node in list(graph.nodes):
        found = match_decomposed_nll(node) if node.target is aten.gather.default else None
        if found is None:
            continue
        args = (found.log_probs, found.targets, None, found.reduction, found.ignore)
        with graph.inserting_before(found.result):
            nll = graph.call_function(aten.nll_loss_forward.default, args)
            item = graph.call_function(operator.getitem, (nll, 0))
        lp = _val(found.log_probs)
        assert lp is not None
        loss = torch.empty((lp.shape[0],) if found.reduction == 0 else (), dtype=lp.dtype, device="meta")
        nll.meta["val"], item.meta["val"] = (loss, torch.empty((), dtype=lp.dtype, device="meta")), loss  # (loss, total weight)
        found.result.replace_all_uses_with(item)
        folded += 1
    return folded


def _plan_view(p: _Planner, node: fx.Node, var: str) -> None:
    """A view that keeps every value where it is: the same value under another name (a row
    value with or without its size-1 dimensions, or expanded along the last one)."""
    if node.args[0] in p.viewing:
        return _plan_view_of_viewing(p, node, var)
    if p.viewed(node):
        return _plan_pointwise_in_view(p, node, var)
    op, val = _op_name(node), node.meta.get("val")
    src = node.args[0]
    if src not in p.names:
        raise Unsupported(f"{op} of a value the writer does not know")
    out_shape = tuple(val.shape)
    src_shape = tuple(_val(src).shape)  # type: ignore[union-attr]
    if p.kinds[src] is Kind.ROW and _numel(out_shape) == _numel(src_shape):
        pass  # a row value seen with or without its size-1 dimensions
    elif (node.target is aten.view.default and p.kinds[src] is Kind.FULL and _numel(out_shape) == _numel(p.shape)
          and (src_shape == p.shape or src in p.spaces)):
        # a full value seen in another shape, element for element in the iteration space's order
        # (a group norm's statistics over [N, G, C/G, HW], then its affine over [N, C, H, W]):
        # ops there read their other operands through that shape (`_plan_pointwise_in_space`)
        if out_shape != p.shape:
            p.spaces[node] = out_shape
    elif out_shape == src_shape or (node.target is aten.expand.default and (p.kind_of_shape(out_shape) is p.kinds[src] or p.kinds[src] is Kind.ROW)):
        # (a row value expanded along the last dimension is still one value per row)
        pass
    else:
        raise Unsupported(f"{op} from {list(src_shape)} to {list(out_shape)} moves data between rows")
    p.names[node], p.kinds[node] = p.names[src], p.kinds[src]
    if src in p.indices:
        p.indices.add(node)
    p.nodes.append(PlanNode(var, p.kinds[src], None, alias_of=p.names[src], dtype=val.dtype))


def _plan_view_of_viewing(p: _Planner, node: fx.Node, var: str) -> None:
    """A view of a value outside the iteration space: the inputs it reads get this view's
    layout; once the view is in the iteration space, its plan nodes get their kind."""
    val = node.meta.get("val")
    src_view = p.viewing[node.args[0]]
    out_shape = tuple(val.shape)
    expand = node.target is aten.expand.default
    layouts = {}
    for ph, (shape_, stride_) in src_view.layouts.items():
        layout = _view_layout(*_aligned(shape_, stride_, src_view.space), out_shape, expand)
        if layout is None and node.target is aten.view.default:  # one that splits or merges dimensions, as torch views it
            layout = _into_space(stride_, shape_, src_view.space, out_shape)
        if layout is None:
            raise Unsupported(src_view.why)
        layouts[ph] = layout
    p.names[node] = p.names[node.args[0]]
    try:
        p.kinds[node] = p.kind_of_shape(out_shape)
    except Unsupported:  # still outside the iteration space: keep following
        p.viewing[node] = _Viewing(out_shape, layouts, src_view.members, src_view.why)
        return
    for ph, layout in layouts.items():
        if p.views.setdefault(ph, layout) != layout:
            raise Unsupported(f"input {p.names[ph]} is read through two different views")
    for k in src_view.members:
        p.nodes[k] = dataclasses.replace(p.nodes[k], kind=p.kinds[node])
    p.nodes.append(PlanNode(var, p.kinds[node], None, alias_of=p.names[node], dtype=val.dtype))


def _plan_pointwise_in_view(p: _Planner, node: fx.Node, var: str) -> None:
    """Pointwise work on values outside the iteration space, in their own space: computed per
    element once a view brings the result in. Anything else reading such a value is declined."""
    viewed, val = p.viewed(node), node.meta.get("val")
    if is_pointwise(node) and _rows_of_the_space(p, node):
        return _plan_pointwise(p, node, var)
    if not (is_pointwise(node) and all(a in p.viewing for a in _tensor_args(node)) and isinstance(val, torch.Tensor)):
        raise Unsupported(p.viewing[viewed[0]].why)
    reason = check_pointwise(node)
    if reason:
        raise Unsupported(reason)
    space = tuple(val.shape)
    layouts = {}
    for a in viewed:
        for ph, layout in p.viewing[a].layouts.items():
            aligned = _aligned(*_aligned(*layout, p.viewing[a].space), space)
            if layouts.setdefault(ph, aligned) != aligned:
                raise Unsupported(f"input {p.names[ph]} is read in two different ways")
    members = [k for a in viewed for k in p.viewing[a].members]
    p.names[node] = var
    p.viewing[node] = _Viewing(space, layouts, [*dict.fromkeys(members), len(p.nodes)], p.viewing[viewed[0]].why)
    p.nodes.append(PlanNode(var, Kind.FULL, pointwise_expr(node, lambda arg: p.names[arg]), dtype=val.dtype))


def _rows_of_the_space(p: _Planner, node: fx.Node) -> bool:
    """Whether `node`'s operands outside the iteration space are per-row values: each shaped as
    the kept dimensions, met by a row value of that same shape (a reduction's result without its
    reduced dimensions). Training batch norm's running statistics, [C] beside the batch's mean over
    (N, H, W). If so, they are brought in as row values (their inputs read with stride 0 along the
    reduced dimensions) and True is returned."""
    if not p.reducing:
        return False
    kept = tuple(d for d in range(len(p.shape)) if d not in p.reduced)
    row_shape = tuple(p.shape[d] for d in kept)
    args = _tensor_args(node)
    viewed = [a for a in args if a in p.viewing]
    rows = [a for a in args if a not in p.viewing]
    if not viewed or not rows or not row_shape:
        return False
    if any(p.kinds.get(a) is not Kind.ROW or _val(a) is None or tuple(_val(a).shape) != row_shape for a in rows):  # type: ignore[union-attr]
        return False
    if any(p.viewing[a].space != row_shape for a in viewed):
        return False
    for a in viewed:
        view = p.viewing.pop(a)
        for ph, layout in view.layouts.items():
            _, stride = _aligned(*layout, row_shape)
            full = [0] * len(p.shape)
            for d, st in zip(kept, stride):
                full[d] = st
            per_row = (tuple(1 if d in p.reduced else n for d, n in enumerate(p.shape)), tuple(full))
            if p.views.setdefault(ph, per_row) != per_row:
                raise Unsupported(f"input {p.names[ph]} is read through two different views")
            p.viewing.pop(ph, None)
            p.kinds[ph] = Kind.ROW
        for k in view.members:
            p.nodes[k] = dataclasses.replace(p.nodes[k], kind=Kind.ROW)
        p.kinds[a] = Kind.ROW
    return True


def _plan_masked_fill(p: _Planner, node: fx.Node, var: str) -> None:
    """where(mask, value, x): what logsumexp's decomposition guards infinite maxima with."""
    if p.viewed(node):
        return _plan_pointwise_in_view(p, node, var)
    val = node.meta.get("val")
    kind = p.kinds[node.args[0]] if p.kinds[node.args[1]] is Kind.ROW else Kind.FULL
    expr = f"(({p.value(node.args[1])}) != 0.0f ? {float_literal(node.args[2])} : ({p.value(node.args[0])}))"
    p.nodes.append(PlanNode(var, kind, expr, dtype=val.dtype))
    p.names[node], p.kinds[node] = var, kind


def _plan_pointwise(p: _Planner, node: fx.Node, var: str) -> None:
    """An op of the pointwise table: FULL if any operand is; ROW if its operands are rows (a
    reduction's result in any of its shapes); a node of scalars alone takes its kind from its
    shape. Any other op is declined here."""
    if any(a in p.spaces for a in _tensor_args(node)):
        return _plan_pointwise_in_space(p, node, var)
    if p.viewed(node):
        return _plan_pointwise_in_view(p, node, var)
    op, val = _op_name(node), node.meta.get("val")
    if not is_pointwise(node):
        raise Unsupported(f"{op} is neither pointwise nor a reduction the built-in writer knows")
    reason = check_pointwise(node)
    if reason:
        raise Unsupported(reason)
    if not isinstance(val, torch.Tensor) or val.dtype not in DTYPES:
        raise Unsupported(f"{op} makes a {getattr(val, 'dtype', type(val))} value")
    operand_kinds = [p.kinds[a] for a in _tensor_args(node) if a in p.kinds]
    kind = Kind.FULL if Kind.FULL in operand_kinds else Kind.ROW if operand_kinds else p.kind_of_shape(tuple(val.shape))
    if kind is Kind.FULL and tuple(val.shape) != p.shape and p.reducing:
        raise Unsupported(f"{op} makes shape {list(val.shape)}, not the iteration space {list(p.shape)}")
    p.nodes.append(PlanNode(var, kind, _log1p_of_exp(p, node) or pointwise_expr(node, p.value), dtype=val.dtype))
    p.names[node], p.kinds[node] = var, kind


def _log1p_of_exp(p: _Planner, node: fx.Node) -> str | None:
    """log1p(exp(x)) over float32, where nothing else reads the exp: softplus as Inductor
    decomposes it (`where(x > 20, x, log1p(exp(x)))`), as the helper the writer's own softplus
    calls. Under fast math that is __logf(1 + __expf(x)), not the precise log1pf; on an H200 the
    backend's softplus partitions ran at 33-52% of copy bandwidth where the suite's tasks, calling
    softplus itself, reached 49-62%. None for anything else."""
    inner = node.args[0] if node.target is aten.log1p.default and node.args else None
    if not isinstance(inner, fx.Node) or inner.target is not aten.exp.default or len(inner.users) != 1:
        return None
    inner_val, val = _val(inner), _val(node)
    if inner_val is None or val is None or inner_val.dtype is not torch.float32 or val.dtype is not torch.float32:
        return None
    var = p.names.get(inner)
    made = next((n for n in reversed(p.nodes) if n.var == var), None)
    found = re.fullmatch(r"expf\((\w+)\)", made.expr or "") if made is not None and made.alias_of is None else None
    return f"kevin_log1p_exp({found.group(1)})" if found else None


def _plan_pointwise_in_space(p: _Planner, node: fx.Node, var: str) -> None:
    """A pointwise op on a full value seen in another shape T (`_Planner.spaces`): its other
    operands are values of the same T, or inputs (through their views) that broadcast to T;
    each such input is read through the layout that T's elements have in the iteration space
    (torch views the broadcast layout as the iteration space's shape, on a meta tensor; one it
    refuses is declined). The result is a full value seen in T."""
    op, val = _op_name(node), node.meta.get("val")
    if not is_pointwise(node) or not isinstance(val, torch.Tensor) or val.dtype not in DTYPES:
        raise Unsupported(f"{op} on a value viewed in another shape")
    reason = check_pointwise(node)
    if reason:
        raise Unsupported(reason)
    spaces = {p.spaces[a] for a in _tensor_args(node) if a in p.spaces}
    space = tuple(val.shape)
    if spaces != {space}:
        raise Unsupported(f"{op} on values viewed in different shapes {sorted(spaces)}")
    for a in _tensor_args(node):
        if a in p.spaces:
            continue
        a_val = _val(a)
        if a in p.viewing:
            view = p.viewing.pop(a)
            kind = Kind.ROW
            for ph, (shape_, stride_) in view.layouts.items():
                layout = _into_space(_aligned(shape_, stride_, view.space)[1], view.space, space, p.shape)
                if layout is None:
                    raise Unsupported(f"input {p.names[ph]} cannot be read through the shape {list(space)}")
                if p.views.setdefault(ph, layout) != layout:
                    raise Unsupported(f"input {p.names[ph]} is read through two different views")
                if p.kind_of_shape(layout[0]) is Kind.FULL and any(layout[1][d] for d in p.reduced if p.shape[d] > 1):
                    kind = Kind.FULL
            for k in view.members:
                p.nodes[k] = dataclasses.replace(p.nodes[k], kind=kind)
            p.kinds[a] = kind
        elif a_val is None or a_val.numel() != 1:
            raise Unsupported(f"{op} mixes a value viewed as {list(space)} with one of shape {list(getattr(a_val, 'shape', []))}")
    p.nodes.append(PlanNode(var, Kind.FULL, pointwise_expr(node, p.value), dtype=val.dtype))
    p.names[node], p.kinds[node], p.spaces[node] = var, Kind.FULL, space


def _into_space(strides: tuple[int, ...], shape: tuple[int, ...], space: tuple[int, ...],
                iteration: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """The layout in the iteration space of a tensor laid out as (`shape`, `strides`) broadcast
    to `space`, where `space` enumerates the iteration space's elements in order; None when torch
    cannot view it so."""
    full_shape, full_strides = _aligned(shape, strides, space)
    try:
        meta = torch.empty_strided(full_shape, full_strides, device="meta").view(iteration)
    except RuntimeError:
        return None
    return tuple(iteration), tuple(meta.stride())


_HANDLERS: dict[str, Callable[[_Planner, fx.Node, str], None]] = {
    "item": _plan_item,
    "reduction": _plan_reduction,
    "view": _plan_view,
    "masked_fill": _plan_masked_fill,
    "nll": _plan_nll,
    "pointwise": _plan_pointwise,
}


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


def online_partner(plan: Plan, red: PlanNode) -> PlanNode | None:
    """The sum a max reduction can share one read of the row with (online softmax): the next
    reduction, a SUM of exp(a - m) where m is this max of a. None otherwise."""
    if red.reduction is not Reduction.AMAX or red.operand is None:
        return None
    reductions = list(plan.reductions)
    at = reductions.index(red)
    if at + 1 >= len(reductions) or reductions[at + 1].reduction is not Reduction.SUM:
        return None
    partner = reductions[at + 1]
    by_var = {n.var: n for n in plan.nodes}
    exp = by_var.get(partner.operand or "")
    found = re.fullmatch(r"expf\((v\d+)\)", exp.expr or "") if exp is not None and exp.alias_of is None else None
    diff = by_var.get(found.group(1)) if found else None
    if diff is None or diff.alias_of is not None or diff.expr != f"{red.operand} - {red.var}":
        return None
    return partner


class BuiltinSupport:
    """What the built-in writer declares to the partitioner: the pointwise ops of its op table,
    the reductions above (over any dimensions; a task whose reductions differ in them is
    declined by its plan) and the views that keep rows in place. Whether a whole
    partition fits one of its two kernels is decided per task (`plan_task`), with the reason.
    Cross-entropy's last step as Inductor decomposes it (`DecomposedNll`: int64 targets, a gather,
    sums over the rows) is declared as a whole: its task folds back to `nll_loss_forward`."""

    name = "builtin"

    def __init__(self) -> None:
        self._nll: tuple[weakref.ref[fx.Graph], int, frozenset[fx.Node]] | None = None

    def _nll_nodes(self, graph: fx.Graph) -> frozenset[fx.Node]:
        """The nodes of every `DecomposedNll` in `graph` (found once per graph and size)."""
        if self._nll is None or self._nll[0]() is not graph or self._nll[1] != len(graph.nodes):
            found = (match_decomposed_nll(n) for n in graph.nodes if n.target is aten.gather.default)
            self._nll = (weakref.ref(graph), len(graph.nodes), frozenset().union(*(m.nodes for m in found if m is not None)))
        return self._nll[2]

    def supports(self, node: fx.Node) -> tuple[bool, str]:
        target = node.target
        if node in self._nll_nodes(node.graph):
            return True, ""
        if target in REDUCTIONS:
            val = node.args[0].meta.get("val") if isinstance(node.args[0], fx.Node) else None
            if not isinstance(val, torch.Tensor) or not val.dim():
                return False, f"{_op_name(node)} of a 0-dimensional value"
            if val.dtype not in (torch.float32, torch.float16, torch.bfloat16):
                return False, f"{_op_name(node)} of {val.dtype} values"
            return True, ""
        if target in _VIEWS or target is aten.masked_fill.Scalar:
            return True, ""
        if is_pointwise(node):
            reason = check_pointwise(node)
            return (True, "") if reason is None else (False, reason)
        return False, f"{_op_name(node)} not declared by writer 'builtin'"

    def reduction_key(self, node: fx.Node) -> tuple[tuple[int | str, ...], tuple[int, ...]] | None:
        """What a reduction node must share with every other reduction of its kernel (a plan
        reduces one set of dimensions of one iteration space): the reduced value's shape and the
        dimensions; None for other nodes. The partitioner keeps reductions of different keys apart."""
        if node.op != "call_function" or node.target not in REDUCTIONS or node in self._nll_nodes(node.graph):
            return None  # (a cross-entropy's sums over its rows fold into its nll_loss_forward)
        val = _val(node.args[0]) if node.args else None
        if val is None:
            return None
        # (a symbolic size, under dynamic shapes, by its expression: SymInts do not hash)
        return tuple(d if isinstance(d, int) else str(d) for d in val.shape), reduced_dims(node, val.dim())
