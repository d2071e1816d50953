"""The planner's handlers, one per kind of graph node (`HANDLERS`, keyed by `node_kind`): each adds
the node's PlanNode to a `PlanBuilder` and records the value's name and kind, or raises
Unsupported with the reason.

    HANDLERS[node_kind(node)](builder, node, var)
"""

from __future__ import annotations

import dataclasses
import operator
import re
from typing import Callable

import torch
import torch.fx as fx

from kevin_backend.generate.builtin.graph_nodes import REDUCTIONS, VIEWS, node_value, op_name, reduced_dims, tensor_args
from kevin_backend.generate.builtin.ops import Unsupported, check as check_pointwise, float_literal, is_pointwise, pointwise_expr
from kevin_backend.generate.builtin.plan import CENTERED, DTYPES, FinalReduce, Kind, PlanNode, Reduction, numel
from kevin_backend.generate.builtin.plan_builder import PlanBuilder, Viewing, aligned, into_space, view_layout

__all__ = ["HANDLERS", "node_kind"]

aten = torch.ops.aten


def node_kind(node: fx.Node) -> str:
    """The key of `node`'s handler in `HANDLERS`."""
    if node.target is operator.getitem:
        return "item"
    if node.target in REDUCTIONS:
        return "reduction"
    if node.target in VIEWS:
        return "view"
    if node.target is aten.nll_loss_forward.default:
        return "nll"
    if node.target is aten.masked_fill.Scalar and isinstance(node.args[2], (int, float, bool)):
        return "masked_fill"
    return "pointwise"  # or an op the writer cannot take: its handler says why


def _plan_item(p: PlanBuilder, node: fx.Node, var: str) -> None:
    """An item of a tuple-valued node (var_mean's two results): a name for it, no plan node."""
    src = node.args[0]
    if src not in p.names or not isinstance(node.args[1], int):
        raise Unsupported("an item of a value the writer does not know")
    p.names[node], p.kinds[node] = f"{p.names[src]}_{node.args[1]}", p.kinds[src]
    if src.target in (aten.max.dim, aten.min.dim) and node.args[1] == 1:
        p.indices.add(node)


def _plan_reduction(p: PlanBuilder, node: fx.Node, var: str) -> None:
    """A reduction over the plan's dimensions R of the full iteration space: a ROW value (or
    two, for var_mean, max.dim and min.dim; an index reduction's positions are int64)."""
    op, val, shape = op_name(node), node.meta.get("val"), p.shape
    p.kinds[node] = Kind.ROW
    red = REDUCTIONS[node.target]
    source = node.args[0]
    src_val = node_value(source)
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


def _plan_nll(p: PlanBuilder, node: fx.Node, var: str) -> None:
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
    t_val = node_value(target)
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
    out_dtype = node_value(logp).dtype  # type: ignore[union-attr]
    p.nodes.append(PlanNode(f"{var}_pick", Kind.ROW, None, pick=(p.value(logp), t)))
    p.nodes.append(PlanNode(f"{var}_0", Kind.ROW, f"({t} == {float(ignore)!r}f ? 0.0f : -{var}_pick)", dtype=out_dtype))
    p.names[node], p.kinds[node] = var, Kind.ROW
    if _NLL_REDUCTIONS[reduction] != "none":
        items = [u for u in node.users if u.target is operator.getitem and u.args[1] == 0]
        weights = [u for u in node.users if u.target is operator.getitem and u.args[1] == 1]
        if len(items) != 1 or len(weights) > 1 or any(w.op != "output" for u in weights for w in u.users):
            raise Unsupported("nll_loss's total weight read by another op than the task's return")
        p.final = (items[0], FinalReduce(_NLL_REDUCTIONS[reduction], t, ignore, out_dtype))
        p.final_count = weights[0] if weights else None


def _squeezed(shape: tuple[int, ...]) -> tuple[int, ...]:
    """`shape` without its dimensions of size 1 (which order no element)."""
    return tuple(d for d in shape if d != 1)


def _plan_view(p: PlanBuilder, node: fx.Node, var: str) -> None:
    """A view that keeps every value where it is: the same value under another name (a row
    value with or without its size-1 dimensions, or expanded along the last one)."""
    if node.args[0] in p.viewing:
        return _plan_view_of_viewing(p, node, var)
    if p.viewed(node):
        return _plan_pointwise_in_view(p, node, var)
    op, val = op_name(node), node.meta.get("val")
    src = node.args[0]
    if src not in p.names:
        raise Unsupported(f"{op} of a value the writer does not know")
    out_shape = tuple(val.shape)
    src_shape = tuple(node_value(src).shape)  # type: ignore[union-attr]
    if p.kinds[src] is Kind.ROW and numel(out_shape) == numel(src_shape):
        pass  # a row value seen with or without its size-1 dimensions
    elif (node.target is aten.view.default and p.kinds[src] is Kind.FULL and numel(out_shape) == numel(p.shape)
          and (src_shape == p.shape or src in p.spaces or _squeezed(src_shape) == _squeezed(p.shape))):
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


def _plan_view_of_viewing(p: PlanBuilder, node: fx.Node, var: str) -> None:
    """A view of a value outside the iteration space: the inputs it reads get this view's
    layout; once the view is in the iteration space, its plan nodes get their kind."""
    val = node.meta.get("val")
    src_view = p.viewing[node.args[0]]
    out_shape = tuple(val.shape)
    expand = node.target is aten.expand.default
    layouts = {}
    for ph, (shape_, stride_) in src_view.layouts.items():
        layout = view_layout(*aligned(shape_, stride_, src_view.space), out_shape, expand)
        if layout is None and node.target is aten.view.default:  # one that splits or merges dimensions, as torch views it
            layout = into_space(stride_, shape_, src_view.space, out_shape)
        if layout is None:
            raise Unsupported(src_view.why)
        layouts[ph] = layout
    p.names[node] = p.names[node.args[0]]
    try:
        p.kinds[node] = p.kind_of_shape(out_shape)
    except Unsupported:  # still outside the iteration space: keep following
        p.viewing[node] = Viewing(out_shape, layouts, src_view.members, src_view.why)
        return
    for ph, layout in layouts.items():
        if p.views.setdefault(ph, layout) != layout:
            raise Unsupported(f"input {p.names[ph]} is read through two different views")
    for k in src_view.members:
        p.nodes[k] = dataclasses.replace(p.nodes[k], kind=p.kinds[node])
    p.nodes.append(PlanNode(var, p.kinds[node], None, alias_of=p.names[node], dtype=val.dtype))


def _plan_pointwise_in_view(p: PlanBuilder, node: fx.Node, var: str) -> None:
    """Pointwise work on values outside the iteration space, in their own space: computed per
    element once a view brings the result in. Anything else reading such a value is declined."""
    viewed, val = p.viewed(node), node.meta.get("val")
    if is_pointwise(node) and _rows_of_the_space(p, node):
        return _plan_pointwise(p, node, var)
    if not (is_pointwise(node) and all(a in p.viewing for a in tensor_args(node)) and isinstance(val, torch.Tensor)):
        raise Unsupported(p.viewing[viewed[0]].why)
    reason = check_pointwise(node)
    if reason:
        raise Unsupported(reason)
    space = tuple(val.shape)
    layouts = {}
    for a in viewed:
        for ph, layout in p.viewing[a].layouts.items():
            here = aligned(*aligned(*layout, p.viewing[a].space), space)
            if layouts.setdefault(ph, here) != here:
                raise Unsupported(f"input {p.names[ph]} is read in two different ways")
    members = [k for a in viewed for k in p.viewing[a].members]
    p.names[node] = var
    p.viewing[node] = Viewing(space, layouts, [*dict.fromkeys(members), len(p.nodes)], p.viewing[viewed[0]].why)
    p.nodes.append(PlanNode(var, Kind.FULL, pointwise_expr(node, lambda arg: p.names[arg]), dtype=val.dtype))


def _rows_of_the_space(p: PlanBuilder, node: fx.Node) -> bool:
    """Whether `node`'s operands outside the iteration space are per-row values: each shaped as
    the kept dimensions, met by a row value of that same shape (a reduction's result without its
    reduced dimensions). Training batch norm's running statistics, [C] beside the batch's mean over
    (N, H, W). If so, they are brought in as row values (their inputs read with stride 0 along the
    reduced dimensions) and True is returned."""
    if not p.reducing:
        return False
    kept = tuple(d for d in range(len(p.shape)) if d not in p.reduced)
    row_shape = tuple(p.shape[d] for d in kept)
    args = tensor_args(node)
    viewed = [a for a in args if a in p.viewing]
    rows = [a for a in args if a not in p.viewing]
    if not viewed or not rows or not row_shape:
        return False
    if any(p.kinds.get(a) is not Kind.ROW or node_value(a) is None or tuple(node_value(a).shape) != row_shape for a in rows):  # type: ignore[union-attr]
        return False
    if any(p.viewing[a].space != row_shape for a in viewed):
        return False
    for a in viewed:
        view = p.viewing.pop(a)
        for ph, layout in view.layouts.items():
            _, stride = aligned(*layout, row_shape)
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


def _plan_masked_fill(p: PlanBuilder, node: fx.Node, var: str) -> None:
    """where(mask, value, x): what logsumexp's decomposition guards infinite maxima with."""
    if p.viewed(node):
        return _plan_pointwise_in_view(p, node, var)
    val = node.meta.get("val")
    kind = p.kinds[node.args[0]] if p.kinds[node.args[1]] is Kind.ROW else Kind.FULL
    expr = f"(({p.value(node.args[1])}) != 0.0f ? {float_literal(node.args[2])} : ({p.value(node.args[0])}))"
    p.nodes.append(PlanNode(var, kind, expr, dtype=val.dtype))
    p.names[node], p.kinds[node] = var, kind


def _plan_pointwise(p: PlanBuilder, node: fx.Node, var: str) -> None:
    """An op of the pointwise table: FULL if any operand is; ROW if its operands are rows (a
    reduction's result in any of its shapes); a node of scalars alone takes its kind from its
    shape. Any other op is declined here."""
    if any(a in p.spaces for a in tensor_args(node)):
        return _plan_pointwise_in_space(p, node, var)
    if p.viewed(node):
        return _plan_pointwise_in_view(p, node, var)
    op, val = op_name(node), node.meta.get("val")
    if not is_pointwise(node):
        raise Unsupported(f"{op} is neither pointwise nor a reduction the built-in writer knows")
    reason = check_pointwise(node)
    if reason:
        raise Unsupported(reason)
    if not isinstance(val, torch.Tensor) or val.dtype not in DTYPES:
        raise Unsupported(f"{op} makes a {getattr(val, 'dtype', type(val))} value")
    operand_kinds = [p.kinds[a] for a in tensor_args(node) if a in p.kinds]
    kind = Kind.FULL if Kind.FULL in operand_kinds else Kind.ROW if operand_kinds else p.kind_of_shape(tuple(val.shape))
    if kind is Kind.FULL and tuple(val.shape) != p.shape and p.reducing:
        raise Unsupported(f"{op} makes shape {list(val.shape)}, not the iteration space {list(p.shape)}")
    p.nodes.append(PlanNode(var, kind, _log1p_of_exp(p, node) or pointwise_expr(node, p.value), dtype=val.dtype))
    p.names[node], p.kinds[node] = var, kind


def _log1p_of_exp(p: PlanBuilder, node: fx.Node) -> str | None:
    """log1p(exp(x)) over float32, where nothing else reads the exp: softplus as Inductor
    decomposes it (`where(x > 20, x, log1p(exp(x)))`), as the helper the writer's own softplus
    calls. Under fast math that is __logf(1 + __expf(x)), not the precise log1pf; on an H200 the
    backend's softplus partitions ran at 33-52% of copy bandwidth where the suite's tasks, calling
    softplus itself, reached 49-62%. None for anything else."""
    inner = node.args[0] if node.target is aten.log1p.default and node.args else None
    if not isinstance(inner, fx.Node) or inner.target is not aten.exp.default or len(inner.users) != 1:
        return None
    inner_val, val = node_value(inner), node_value(node)
    if inner_val is None or val is None or inner_val.dtype is not torch.float32 or val.dtype is not torch.float32:
        return None
    var = p.names.get(inner)
    made = next((n for n in reversed(p.nodes) if n.var == var), None)
    found = re.fullmatch(r"expf\((\w+)\)", made.expr or "") if made is not None and made.alias_of is None else None
    return f"kevin_log1p_exp({found.group(1)})" if found else None


def _plan_pointwise_in_space(p: PlanBuilder, node: fx.Node, var: str) -> None:
    """A pointwise op on a full value seen in another shape T (`PlanBuilder.spaces`): its other
    operands are values of the same T, or inputs (through their views) that broadcast to T;
    each such input is read through the layout that T's elements have in the iteration space
    (torch views the broadcast layout as the iteration space's shape, on a meta tensor; one it
    refuses is declined). The result is a full value seen in T."""
    op, val = op_name(node), node.meta.get("val")
    if not is_pointwise(node) or not isinstance(val, torch.Tensor) or val.dtype not in DTYPES:
        raise Unsupported(f"{op} on a value viewed in another shape")
    reason = check_pointwise(node)
    if reason:
        raise Unsupported(reason)
    spaces = {p.spaces[a] for a in tensor_args(node) if a in p.spaces}
    space = tuple(val.shape)
    if spaces != {space}:
        raise Unsupported(f"{op} on values viewed in different shapes {sorted(spaces)}")
    for a in tensor_args(node):
        if a in p.spaces:
            continue
        a_val = node_value(a)
        if a in p.viewing:
            view = p.viewing.pop(a)
            kind = Kind.ROW
            for ph, (shape_, stride_) in view.layouts.items():
                layout = into_space(aligned(shape_, stride_, view.space)[1], view.space, space, p.shape)
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


HANDLERS: dict[str, Callable[[PlanBuilder, fx.Node, str], None]] = {
    "item": _plan_item,
    "reduction": _plan_reduction,
    "view": _plan_view,
    "masked_fill": _plan_masked_fill,
    "nll": _plan_nll,
    "pointwise": _plan_pointwise,
}
