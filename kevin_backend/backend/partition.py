"""The partitioner: an aten graph -> fusible subgraphs a kernel writer can handle.

Before (a post-grad aten graph, as Inductor hands it over):

    x, w, b = placeholders
    mm   = aten.mm(x, w)
    add  = aten.add(mm, b)
    relu = aten.relu(add)
    idx  = aten.index(relu, [i])        # not declared by the writer
    sum  = aten.sum(idx, [1])
    output(sum)

After `partition_graph`:

    Partition 0: nodes [mm, add, relu]  inputs [x, w, b]  outputs [relu]
    left out: x, w, b (graph input), idx (not declared by writer 'general'),
              sum (partition too small: 1 compute node < 2), output (graph output)

Rules, in order, for every node (each failure is recorded with its reason):
graph inputs, outputs and attributes are never partitioned; ops that mutate, draw random numbers,
take symbolic sizes or produce non-tensors are left to Inductor; then the writer's `OpSupport`
decides. A supported node joins the partition of one of its producers when that adds no cycle
through an outside node and the partition is not full (`max_nodes`); otherwise it starts a new
one. Partitions with fewer than `min_nodes` compute nodes (views and getitems do not count) are
dissolved; a reduction counts as two (one alone is a partition at the default). The graph is not
modified.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from enum import Enum

import torch
import torch.fx as fx

from kevin_backend.generate.op_support import MATMUL_OPS, VIEW_OPS, OpSupport, op_name

_PRODUCTS = MATMUL_OPS | {torch.ops.aten.convolution.default}  # (a writer that declares convolutions fuses them so)

__all__ = ["LeftOutReason", "LeftOut", "Partition", "PartitionPlan", "partition_graph"]


class LeftOutReason(str, Enum):
    GRAPH_IO = "graph input or output"
    ATTRIBUTE = "module attribute"
    NOT_AN_OP = "not an aten op"
    MUTATES = "mutates its inputs"
    RANDOM = "draws random numbers"
    SYMBOLIC = "takes or makes symbolic sizes"
    NON_TENSOR = "produces no tensor"
    UNSUPPORTED = "not declared by the writer"
    ORPHAN = "reads a left-out multi-output op"
    TOO_SMALL = "partition too small"
    NO_COMPUTE = "partition has no compute"
    ALIAS_VIEW = "view at a partition's edge (a kernel's outputs must not alias)"


@dataclass(frozen=True)
class LeftOut:
    node: str
    op: str
    reason: LeftOutReason
    detail: str = ""

    def __str__(self) -> str:
        extra = f": {self.detail}" if self.detail else ""
        return f"{self.node} ({self.op}) - {self.reason.value}{extra}"


@dataclass(frozen=True)
class Partition:
    """A fusible subgraph: its nodes in graph order, the values it reads and the values it exposes."""

    index: int
    nodes: tuple[fx.Node, ...]
    inputs: tuple[fx.Node, ...]
    outputs: tuple[fx.Node, ...]

    @property
    def ops(self) -> tuple[str, ...]:
        return tuple(op_name(n) for n in self.nodes)


@dataclass(frozen=True)
class PartitionPlan:
    partitions: tuple[Partition, ...]
    left_out: tuple[LeftOut, ...]


def _is_compute(node: fx.Node) -> bool:
    return node.target is not operator.getitem and node.target not in VIEW_OPS


_REDUCTION_TAG = getattr(torch.Tag, "reduction", None)


def _weight(node: fx.Node) -> int:
    """What a compute node counts towards `min_nodes`: a reduction two, so one alone is a
    partition at the default. A lone sum, max or argmax over a dimension is a kernel worth writing
    (on an H200 the built-in writer's max over dim 0 ran at 3.3x Inductor's), and each such
    KernelBench problem would otherwise never reach the writer; a lone pointwise op is not."""
    target = node.target
    return 2 if _REDUCTION_TAG is not None and isinstance(target, torch._ops.OpOverload) and _REDUCTION_TAG in target.tags else 1


def _val_is_tensor(node: fx.Node) -> bool:
    val = node.meta.get("val")
    if isinstance(val, torch.Tensor):
        return True
    return isinstance(val, (tuple, list)) and len(val) > 0 and all(
        isinstance(v, torch.Tensor) or v is None for v in val
    )


def _has_symbolic(node: fx.Node) -> bool:
    """True when the node takes a size-valued node or a SymInt, or its output has symbolic sizes
    in its arguments (dynamic-shape views): the task program would need the symbol's value."""
    for arg in node.all_input_nodes:
        if not isinstance(arg.meta.get("val"), (torch.Tensor, tuple, list)):
            return True

    def walk(value: object) -> bool:
        if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            return True
        if isinstance(value, (list, tuple)):
            return any(walk(v) for v in value)
        return False

    return walk(node.args) or walk(tuple(node.kwargs.values()))


def _structural_reason(node: fx.Node) -> tuple[LeftOutReason, str] | None:
    """Why `node` can never be partitioned, whatever the writer supports; None if it can be."""
    if node.op in ("placeholder", "output"):
        return LeftOutReason.GRAPH_IO, ""
    if node.op == "get_attr":
        return LeftOutReason.ATTRIBUTE, ""
    if node.op != "call_function":
        return LeftOutReason.NOT_AN_OP, node.op
    target = node.target
    if target is operator.getitem:
        return None
    if not isinstance(target, torch._ops.OpOverload):
        return LeftOutReason.NOT_AN_OP, op_name(node)
    if target._schema.is_mutable:
        return LeftOutReason.MUTATES, ""
    if torch.Tag.nondeterministic_seeded in target.tags:
        return LeftOutReason.RANDOM, ""
    if not _val_is_tensor(node):
        return LeftOutReason.NON_TENSOR, ""
    if _has_symbolic(node):
        return LeftOutReason.SYMBOLIC, ""
    return None


def partition_graph(
    graph: fx.Graph, support: OpSupport, min_nodes: int = 2, max_nodes: int = 64
) -> PartitionPlan:
    """Split `graph` into fusible partitions of ops `support` declares (see the module docstring)."""
    order = {n: i for i, n in enumerate(graph.nodes)}
    builder = _Builder(max_nodes, order, support)
    left_out: dict[fx.Node, LeftOut] = {}

    def leave(node: fx.Node, reason: LeftOutReason, detail: str = "") -> None:
        left_out[node] = LeftOut(node.name, op_name(node) if node.op == "call_function" else node.op, reason, detail)

    for node in graph.nodes:
        structural = _structural_reason(node)
        if structural is not None:
            leave(node, *structural)
            builder.skip(node)
        elif node.target is operator.getitem:
            # A getitem always travels with the multi-output op it reads.
            producer = node.all_input_nodes[0]
            if builder.part_of(producer) is not None:
                builder.place(node, builder.part_of(producer))
            else:
                leave(node, LeftOutReason.ORPHAN, producer.name)
                builder.skip(node)
        else:
            ok, why = support.supports(node)
            if ok:
                builder.add(node)
            else:
                leave(node, LeftOutReason.UNSUPPORTED, why)
                builder.skip(node)

    # Dissolve partitions too small to be worth a kernel, then number the rest in graph order.
    partitions: list[Partition] = []
    for nodes in builder.groups():
        for n in _alias_views(nodes):
            nodes.remove(n)
            leave(n, LeftOutReason.ALIAS_VIEW)
        compute = sum(_weight(n) for n in nodes if _is_compute(n))
        if compute == 0:
            for n in nodes:
                leave(n, LeftOutReason.NO_COMPUTE, "only views")
        elif compute < min_nodes:
            for n in nodes:
                leave(n, LeftOutReason.TOO_SMALL, f"{compute} compute node(s) < {min_nodes} (a reduction counts two)")
        else:
            partitions.append(_make_partition(len(partitions), nodes))
    ordered_left_out = tuple(left_out[n] for n in sorted(left_out, key=order.__getitem__))
    return PartitionPlan(tuple(partitions), ordered_left_out)


class _Builder:
    """Grows partitions node by node in graph order, never closing a cycle.

    `upstream[n]` holds the ids of every partition that holds n or one of n's ancestors; ids are
    resolved through `_merged` (a union-find) since partitions merge. Joining or merging
    partitions closes a cycle exactly when a value outside them depends on one of them and feeds
    the other (or the new node).
    """

    def __init__(self, max_nodes: int, order: dict[fx.Node, int], support: OpSupport) -> None:
        self.max_nodes = max_nodes
        self._order = order
        self._support = support
        self._part: dict[fx.Node, int] = {}
        self._members: dict[int, list[fx.Node]] = {}
        self._merged: dict[int, int] = {}
        self._upstream: dict[fx.Node, frozenset[int]] = {}
        self._next_id = 0

    def _find(self, pid: int) -> int:
        while pid in self._merged:
            pid = self._merged[pid]
        return pid

    def part_of(self, node: fx.Node) -> int | None:
        pid = self._part.get(node)
        return None if pid is None else self._find(pid)

    def _depends_on(self, node: fx.Node, pid: int) -> bool:
        return any(self._find(q) == pid for q in self._upstream.get(node, ()))

    def _above(self, node: fx.Node) -> frozenset[int]:
        return frozenset().union(*(self._upstream.get(i, frozenset()) for i in node.all_input_nodes))

    def skip(self, node: fx.Node) -> None:
        self._upstream[node] = self._above(node)

    def place(self, node: fx.Node, pid: int) -> None:
        self._part[node] = pid
        self._members[pid].append(node)
        self._upstream[node] = self._above(node) | {pid}

    def add(self, node: fx.Node) -> None:
        candidates: list[int] = []
        for i in node.all_input_nodes:
            pid = self.part_of(i)
            if pid is not None and pid not in candidates:
                candidates.append(pid)
        group: list[int] = []
        for pid in candidates:
            if self._can_merge([*group, pid], node):
                group.append(pid)
        if not group:
            pid = self._next_id
            self._next_id += 1
            self._members[pid] = []
            self.place(node, pid)
            return
        target = group[0]
        for other in group[1:]:
            self._members[target].extend(self._members.pop(other))
            self._merged[other] = target
        self._members[target].sort(key=self._order.__getitem__)
        self.place(node, target)

    def _can_merge(self, pids: list[int], node: fx.Node) -> bool:
        nodes = [n for pid in pids for n in self._members[pid]] + [node]
        size = sum(1 for n in nodes if n.target is not operator.getitem)
        if size > self.max_nodes:
            return False
        # One matrix product (or convolution) per kernel: a GEMM with its prologue and epilogue is
        # the unit a writer can beat cuBLAS + Inductor on; two GEMMs in one kernel rarely are.
        if sum(1 for n in nodes if n.target in _PRODUCTS) > 1:
            return False
        # A writer whose matmul kernels take only an epilogue (`epilogue_only`): a matmul starts a
        # partition of its own, and one that holds a matmul merges with no other.
        if getattr(self._support, "epilogue_only", False) and any(n.target in _PRODUCTS for n in nodes) and (
                node.target in _PRODUCTS or len(pids) > 1):
            return False
        # A writer that reduces one set of dimensions per kernel (`reduction_key`: the same key for
        # reductions it can write together) keeps apart the reductions it cannot: a norm's
        # backward reduces rows for the input's gradient and columns for the weight's.
        keys = {k for n in nodes if (k := self._support.reduction_key(n)) is not None}
        if len(keys) > 1:
            return False
        group = set(pids)
        for n in nodes:
            for i in n.all_input_nodes:
                owner = self.part_of(i)
                if owner in group:
                    continue
                if any(self._depends_on(i, pid) for pid in group):
                    return False
        return True

    def groups(self) -> list[list[fx.Node]]:
        return [nodes for _, nodes in sorted(self._members.items(), key=lambda kv: self._order[kv[1][0]])]


def _alias_views(nodes: list[fx.Node]) -> list[fx.Node]:
    """View nodes a kernel must not own, since its outputs would alias its inputs or each other.

    Leading views (views of the partition's inputs, through views only) and trailing views (views
    none of the partition's nodes read) are free outside a kernel: Inductor keeps them as views.
    """
    inside = set(nodes)
    views = {n for n in nodes if n.target in VIEW_OPS and n.target is not torch.ops.aten.clone.default}
    leading: set[fx.Node] = set()
    for n in nodes:  # graph order: a view's producer is decided before the view
        if n in views and all(i not in inside or i in leading for i in n.all_input_nodes):
            leading.add(n)
    trailing: set[fx.Node] = set()
    for n in reversed(nodes):
        if n in views and n not in leading and all(u not in inside or u in trailing for u in n.users):
            trailing.add(n)
    return [n for n in nodes if n in leading or n in trailing]


def _make_partition(index: int, nodes: list[fx.Node]) -> Partition:
    inside = set(nodes)
    inputs: list[fx.Node] = []
    outputs: list[fx.Node] = []
    for n in nodes:
        for i in n.all_input_nodes:
            if i not in inside and i not in inputs:
                inputs.append(i)
        is_tuple = isinstance(n.meta.get("val"), (tuple, list))
        if not is_tuple and any(u not in inside for u in n.users):
            outputs.append(n)
    return Partition(index, tuple(nodes), tuple(inputs), tuple(outputs))
