"""A GEMM task whose product is reduced after its epilogue (a sum, a max, a logsumexp, a softmax or
a norm over the output's rows: what level-2 problems do after a Linear): the GEMM kernel, then the
built-in writer's own kernel for the rest, one program of two extensions.

    tail = plan_tail(graph, metas, read)      # a GemmTail, or Unsupported with the reason

The graph is cut where the matmul's elementwise epilogue ends: from the matmul through each value
read once, by an elementwise op (a bias, an activation, a scale), up to the first value read twice
or by a reduction (its end). The GEMM kernel computes the matmul and that epilogue (`read`:
`gemm_plan._read` on the first part) and keeps its end (`y0`); the rest reads y0 and the task's
inputs it needs, a task of its own for the built-in writer's planner (`planner.plan_graph`: its
row kernels), written with its first variant.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.fx as fx

from kevin_backend.generate.builtin.gemm_function import ELEMENTWISE
from kevin_backend.generate.builtin.graph_nodes import REDUCTIONS
from kevin_backend.generate.builtin.ops import Unsupported
from kevin_backend.generate.builtin.plan import Plan

__all__ = ["GemmTail", "has_tail", "plan_tail"]

aten = torch.ops.aten
_MATMULS = (aten.mm.default, aten.addmm.default)


@dataclass(frozen=True)
class GemmTail:
    """The GEMM (`gemm`, a GemmPlan whose output is the end) and the built-in writer's plan of the
    rest (`tail`), whose inputs are, in order, the task's inputs numbered `reads` (the end: the
    number after the task's inputs and parameters)."""

    gemm: Any
    tail: Plan
    reads: tuple[int, ...]

    @property
    def inputs(self) -> int:
        return self.gemm.inputs

    @property
    def state(self) -> tuple[str, ...]:
        return self.gemm.state

    def describe(self) -> str:
        ops = ", ".join(dict.fromkeys(o.split(".")[1] if o.count(".") >= 2 else o for o in self.tail.ops))
        return f"[{self.gemm.describe()}] -> [the built-in writer's {'row' if self.tail.is_rows else 'pointwise'} kernel: {ops}]"


def has_tail(graph: fx.Graph) -> bool:
    """Whether a reduction follows the task's matmul (the tail's kind of task)."""
    return any(n.op == "call_function" and n.target in REDUCTIONS for n in graph.nodes)


def plan_tail(graph: fx.Graph, metas: list[Any], read: Callable[[fx.Graph, list[Any]], Any]) -> GemmTail:
    from kevin_backend.generate.builtin.planner import plan_graph

    nodes = list(graph.nodes)
    placeholders = [n for n in nodes if n.op == "placeholder"]
    (mm,) = [n for n in nodes if n.op == "call_function" and n.target in _MATMULS]
    end = mm
    dtype = mm.meta["val"].dtype
    while len(end.users) == 1:  # (the end in the product's dtype: what the GEMM kernel stores)
        (user,) = end.users
        if user.op != "call_function" or user.target in REDUCTIONS or user.target not in ELEMENTWISE or (
                not isinstance(user.meta.get("val"), torch.Tensor) or user.meta["val"].dtype != dtype):
            break
        end = user
    head = _ancestors(end)
    if any(n.target in REDUCTIONS for n in head):
        raise Unsupported("a reduction before the matmul's epilogue ends (the GEMM kernel takes none)")
    gemm_graph = fx.Graph()
    env = {p: _copy_placeholder(gemm_graph, p) for p in placeholders}
    for n in nodes:
        if n in head and n.op == "call_function":
            env[n] = gemm_graph.node_copy(n, lambda i: env[i])
    gemm_graph.output(env[end])
    gemm = read(gemm_graph, list(metas))

    rest = [n for n in nodes if n.op == "call_function" and n not in head]
    outside = [i for n in rest for i in n.all_input_nodes if i not in rest]
    if any(i in head and i is not end and i.op != "placeholder" for i in outside):
        raise Unsupported("the reduction reads a value of the matmul's epilogue before its end")
    used = [p for p in placeholders if p in outside]
    tail_graph = fx.Graph()
    env = {p: _copy_placeholder(tail_graph, p) for p in used}
    value = end.meta["val"]
    env[end] = tail_graph.placeholder("y0")
    env[end].meta = {"val": torch.empty(value.shape, dtype=value.dtype, device="meta")}  # (the GEMM's output: contiguous)
    for n in rest:
        env[n] = tail_graph.node_copy(n, lambda i: env[i])
    (output,) = [n for n in nodes if n.op == "output"]
    tail_graph.output(fx.map_arg(output.args[0], lambda i: env[i]))
    tail_metas = [metas[placeholders.index(p)] for p in used] + [env[end].meta["val"]]
    tail = plan_graph(fx.GraphModule(torch.nn.Module(), tail_graph), tail_metas)
    reads = tuple(placeholders.index(p) for p in used) + (len(placeholders),)
    return GemmTail(gemm, tail, reads)


def _ancestors(node: fx.Node) -> set[fx.Node]:
    seen: set[fx.Node] = set()
    todo = [node]
    while todo:
        n = todo.pop()
        if n not in seen:
            seen.add(n)
            todo.extend(n.all_input_nodes)
    return seen


def _copy_placeholder(graph: fx.Graph, p: fx.Node) -> fx.Node:
    copy = graph.placeholder(p.name)
    copy.meta = dict(p.meta)
    return copy
