"""What the built-in writer reads from a task: its aten graph, planned for one of two kernels.

    plan = plan_task(task_source)        # a Plan (plan.py), or Declined(reason)

The task program is traced on meta tensors (tracing.py), then each node of its graph is handed to
the handler of its kind (plan_handlers.py), which adds it to the plan. Anything the writer cannot
take is declined with the reason: reductions over different dimensions in one task, integer
inputs read as values, views that move data, and so on.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.fx as fx

from kevin_backend.generate.builtin.graph_nodes import FOLDABLE, MOVES, REDUCTIONS, node_value, op_name, reduced_dims
from kevin_backend.generate.builtin.ops import Unsupported
from kevin_backend.generate.builtin.plan import DTYPES, Declined, Plan, numel
from kevin_backend.generate.builtin.plan_builder import PlanBuilder
from kevin_backend.generate.builtin.plan_handlers import HANDLERS, node_kind
from kevin_backend.generate.builtin.tracing import TRACE_LOCK, trace

__all__ = ["plan_task", "plan_graph", "fold_input_views"]

aten = torch.ops.aten


def plan_task(task_source: str) -> Plan | Declined:
    """The task's plan, or why the built-in writer declines it."""
    try:
        with TRACE_LOCK:
            gm, metas = trace(task_source)
    except Unsupported as exc:
        return Declined(str(exc))
    except Exception as exc:  # a task the tracer cannot take is declined, not an error
        return Declined(f"the task could not be traced on meta tensors: {type(exc).__name__}: {exc}")
    try:
        return plan_graph(gm, metas)
    except Unsupported as exc:
        return Declined(str(exc))


def plan_graph(gm: fx.GraphModule, metas: list[Any]) -> Plan:
    """The plan of a traced task: its inputs and iteration space checked, then each call_function
    node, in graph order, handed to the handler of its kind (`plan_handlers.HANDLERS`). Raises
    Unsupported."""
    graph = gm.graph
    _drop_unit_reductions(graph)
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    outs = _outputs_of(graph)
    _check_inputs(metas)
    reductions = [n for n in graph.nodes if n.op == "call_function" and n.target in REDUCTIONS]
    shape = _iteration_space(reductions, outs)
    planner = PlanBuilder(shape, reducing=bool(reductions), reduced=reduced_dims(reductions[0], len(shape)) if reductions else ())
    for i, (ph, t) in enumerate(zip(placeholders, metas)):
        planner.add_input(ph, i, t)
    folded = fold_input_views(placeholders, metas)
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
            planner.ops.append(op_name(node))
            continue
        kind = node_kind(node)
        if kind != "item":  # an item of a tuple is no op of its own
            planner.ops.append(op_name(node))
        HANDLERS[kind](planner, node, f"v{counter}")
        counter += 1
    return planner.finish(placeholders, metas, outs)


# the reductions a sum, mean, amax or amin over dimensions of one element leaves as they were
_UNIT_REDUCIBLE = (aten.sum.dim_IntList, aten.mean.dim, aten.amax.default, aten.amin.default)


def _drop_unit_reductions(graph: fx.Graph) -> None:
    """Each float reduction over dimensions of size 1 only, its result the shape and dtype of its
    operand (keepdim), replaced by the operand: it reduces nothing (a level-2 task's mean over the
    one column a max left), and a plan reduces one iteration space."""
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target not in _UNIT_REDUCIBLE or not isinstance(node.args[0], fx.Node):
            continue
        source, value = node.args[0].meta.get("val"), node.meta.get("val")
        dims = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
        if not isinstance(source, torch.Tensor) or not isinstance(value, torch.Tensor) or not dims or not source.is_floating_point():
            continue
        if value.shape == source.shape and value.dtype == source.dtype and all(source.shape[d] == 1 for d in dims):
            node.replace_all_uses_with(node.args[0])
            graph.erase_node(node)


def fold_input_views(placeholders: list[fx.Node], metas: list[Any]) -> dict[fx.Node, tuple[list[fx.Node], tuple[tuple[int, ...], tuple[int, ...]]]]:
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
            if user.op != "call_function" or user.target not in FOLDABLE or not user.args or user.args[0] is not node:
                break
            before, after = node_value(node), node_value(user)
            if before is None or after is None:
                break
            chain.append(user)
            moves = moves or user.target in MOVES or (
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


def _iteration_space(reductions: list[fx.Node], outs: list[fx.Node]) -> tuple[int, ...]:
    """S: what the first reduction reduces, else the largest output's shape."""
    if reductions:
        shape = tuple(node_value(reductions[0].args[0]).shape)  # type: ignore[union-attr]
    else:
        shape = tuple(max((tuple(node_value(o).shape) for o in outs), key=lambda s: (len(s), numel(s))))  # type: ignore[union-attr]
    if not shape:
        raise Unsupported("a 0-dimensional iteration space")
    return shape
