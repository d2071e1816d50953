"""A task of several matmuls (an MLP: up, activation, down; a SiLU-gated MLP: two products of the
same input, one gating the other) as a chain of the GEMM writer's kernels, one a matmul, each
with its epilogue, run one after the other by one program.

    chain = plan_chain(graph, metas)          # a GemmChain, or Unsupported with the reason
    program = write_chain_program(chain, chain_tilings(chain)[0])

The graph is cut at its matmuls. Each node after the first matmul belongs to the latest matmul it
depends on: that matmul's region, its epilogue. A region hands on one value (its end): what a later
matmul reads as its left operand (the MLP's activations), what a later epilogue reads as an operand
(the gate, after its SiLU), or the task's output for the last. Each region is then planned as a
task of its own (`gemm_plan._read`) whose inputs are the task's, then the earlier regions' ends
(`y0`, `y1`, ...), which the program keeps between its kernels.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx as fx

from kevin_backend.generate.builtin.ops import Unsupported

__all__ = ["MATMULS", "ChainTiling", "GemmChain", "batched_operands", "chain_cut", "chain_tilings", "copy_placeholder",
           "decompose_baddbmm", "the_matmul", "value_placeholder"]

aten = torch.ops.aten
MATMULS = (aten.mm.default, aten.addmm.default, aten.bmm.default)
# ops that view their operand in place (an expand adding nothing shows as no zero stride after it)
_VIEWS = (aten.view.default, aten._unsafe_view.default, aten.reshape.default, aten.expand.default, aten.t.default,
          aten.permute.default, aten.transpose.int)


@dataclass(frozen=True)
class GemmChain:
    """The kernels of a task of several matmuls, in order: plan j reads the task's inputs (numbered
    as `GemmPlan` numbers them) and, after them, the ends of plans 0 .. j-1."""

    plans: tuple[Any, ...]  # GemmPlan each

    @property
    def inputs(self) -> int:
        return self.plans[0].inputs

    @property
    def state(self) -> tuple[str, ...]:
        return self.plans[0].state

    def describe(self) -> str:
        return " -> ".join(f"[{p.describe()}]" for p in self.plans)


@dataclass(frozen=True)
class ChainTiling:
    """A variant of a chain: one tiling for each of its kernels."""

    tilings: tuple[Any, ...]

    @property
    def name(self) -> str:
        return " + ".join(t.name for t in self.tilings)


def chain_tilings(chain: GemmChain) -> tuple[ChainTiling, ...]:
    """The chain's variants, in the order a search tries them: the i-th of each kernel's own
    (`gemm_kernel.tilings_for`), as many as the longest list has."""
    from kevin_backend.generate.builtin.gemm_kernel import tilings_for

    each = [tilings_for(p.spec, (p.batch * p.m, p.n, p.k)) for p in chain.plans]
    return tuple(ChainTiling(tuple(ts[i % len(ts)] for ts in each)) for i in range(max(len(ts) for ts in each)))


def chain_cut(graph: fx.Graph, metas: list[Any]) -> list[tuple[fx.Graph, list[Any]]]:
    """The task's graph cut into one graph per matmul (module docstring), each with the metas of
    its inputs: the task's, then the earlier regions' ends."""
    nodes = list(graph.nodes)
    placeholders = [n for n in nodes if n.op == "placeholder"]
    (output,) = [n for n in nodes if n.op == "output"]
    matmuls = [n for n in nodes if n.op == "call_function" and n.target in MATMULS]
    owner: dict[fx.Node, fx.Node | None] = {}
    for n in nodes:  # graph order: each node's inputs are placed before it
        if n.op == "placeholder":
            owner[n] = None
        elif n in matmuls:
            owner[n] = n
        elif n.op == "call_function":
            found = [owner[i] for i in n.all_input_nodes if owner[i] is not None]
            owner[n] = max(found, key=matmuls.index) if found else None
    ends: list[fx.Node] = []
    for mm in matmuls:
        region = [n for n in nodes if owner.get(n) is mm]
        leaving = [n for n in region if any(u.op == "output" or owner.get(u) is not mm for u in n.users)]
        if len(leaving) != 1:
            raise Unsupported(f"the matmul {mm.name} hands on {len(leaving)} values: a chain's kernel hands on one")
        if mm is not matmuls[-1] and output in leaving[0].users:
            raise Unsupported("an output of the chain before its last matmul (the GEMM writer's tasks have one output)")
        ends.append(leaving[0])
    if output not in ends[-1].users:
        raise Unsupported("the last matmul's epilogue does not end in the task's output")
    cut: list[tuple[fx.Graph, list[Any]]] = []
    for j, mm in enumerate(matmuls):
        sub = fx.Graph()
        env: dict[fx.Node, fx.Node] = {p: copy_placeholder(sub, p) for p in placeholders}
        sub_metas = list(metas)
        for i, end in enumerate(ends[:j]):
            env[end] = value_placeholder(sub, f"y{i}", end)
            sub_metas.append(env[end].meta["val"])
        for n in nodes:  # the region, and what it reads that no matmul computes (a weight's transpose)
            if n.op != "call_function" or n in env or not (owner.get(n) is mm or (owner.get(n) is None and _read_by(n, mm, owner))):
                continue
            if any(i not in env for i in n.all_input_nodes):
                raise Unsupported(f"{n.name} reads a value of another matmul's epilogue than its end")
            env[n] = sub.node_copy(n, lambda i: env[i])
        sub.output(env[ends[j]])
        cut.append((sub, sub_metas))
    return cut


def copy_placeholder(graph: fx.Graph, p: fx.Node) -> fx.Node:
    """`p` as an input of `graph`, its meta kept."""
    copy = graph.placeholder(p.name)
    copy.meta = dict(p.meta)
    return copy


def value_placeholder(graph: fx.Graph, name: str, node: fx.Node, dtype: torch.dtype | None = None) -> fx.Node:
    """An input of `graph` holding `node`'s value as an earlier kernel leaves it: its shape and
    dtype (or `dtype`, where that kernel stores it in another), contiguous."""
    value = node.meta["val"]
    made = graph.placeholder(name)
    made.meta = {"val": torch.empty(value.shape, dtype=dtype or value.dtype, device="meta")}
    return made


def the_matmul(graph: fx.Graph) -> fx.Node:
    """The graph's one matmul (mm, addmm or bmm), or else its one convolution."""
    found = [n for n in graph.nodes if n.op == "call_function" and n.target in MATMULS]
    (mm,) = found or [n for n in graph.nodes if n.op == "call_function" and n.target is aten.convolution.default]
    return mm


def _read_by(node: fx.Node, mm: fx.Node, owner: dict[fx.Node, fx.Node | None]) -> bool:
    """Whether `mm`'s region reads `node` (a value no matmul computes), directly or through others such."""
    seen: set[fx.Node] = set()
    todo = list(node.users)
    while todo:
        u = todo.pop()
        if u in seen:
            continue
        seen.add(u)
        if owner.get(u) is mm:
            return True
        if owner.get(u) is None and u.op == "call_function":
            todo.extend(u.users)
    return False


def with_parameters(chain: GemmChain, inputs: int, state: tuple[str, ...]) -> GemmChain:
    """The chain with its task's parameters named (`GemmPlan.state`) in every kernel's plan."""
    return GemmChain(tuple(dataclasses.replace(p, inputs=inputs, state=state) for p in chain.plans))


def decompose_baddbmm(graph: fx.Graph) -> None:
    """Each `baddbmm(c, a, b, beta=, alpha=)` of `graph` as what the GEMM writer reads: bmm(a, b),
    scaled by alpha, with beta x c added (the epilogue's scale and residual, or a tree's operand)."""
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target is not aten.baddbmm.default:
            continue
        c, a, b = node.args[:3]
        beta, alpha = node.kwargs.get("beta", 1), node.kwargs.get("alpha", 1)
        with graph.inserting_before(node):
            value = graph.call_function(aten.bmm.default, (a, b))
            if alpha != 1:
                value.meta = dict(node.meta)
                value = graph.call_function(aten.mul.Tensor, (value, alpha))
            if beta != 0:  # (beta 0: c is not read, as eager ignores it)
                value.meta = dict(node.meta)
                value = graph.call_function(aten.add.Tensor, (value, c), {"alpha": beta} if beta != 1 else {})
        value.meta = dict(node.meta)
        node.replace_all_uses_with(value)
        graph.erase_node(node)


def batched_operands(mm: fx.Node, index: dict[fx.Node, int], metas: list[Any]) -> tuple[fx.Node, fx.Node, str, bool, tuple[int, ...]]:
    """A bmm's operands as the task's inputs they view in place (`_VIEWS`: the 4-D q @ k.transpose
    of attention, flattened to 3-D): (x, w, the weight's layout, whether w is given transposed,
    (L, M, N, K)). x holds L packed M x K matrices; w L packed N x K ("nk", read transposed) or
    K x N ("kn") ones, or is given as their transpose (a compiled model's partition gets attention's
    keys as the (L, K, N) view of packed (L, N, K) ones): the program passes `w.transpose(-2, -1)`."""
    a, b = mm.args[:2]
    av, bv = a.meta["val"], b.meta["val"]
    batch, m, k = av.shape
    n = bv.shape[2]
    (x, x_turned), (w, w_turned) = _viewed(a, index, metas, batch * m * k), _viewed(b, index, metas, batch * k * n)
    if x is None or x_turned or not _strided(av, (m * k, k, 1)):
        raise Unsupported("bmm's left operand is not an input's packed (L, M, K) values, viewed in place")
    if w is not None and _strided(bv, (k * n, n, 1)):
        return x, w, "kn", w_turned, (batch, m, n, k)
    if w is not None and _strided(bv, (n * k, 1, k)):
        return x, w, "nk", w_turned, (batch, m, n, k)
    raise Unsupported("bmm's right operand is not an input's packed (L, K, N) or (L, N, K) values, viewed in place")


def _viewed(node: Any, index: dict[fx.Node, int], metas: list[Any], numel: int) -> tuple[fx.Node | None, bool]:
    """The input of `numel` values `node` views in place, and whether that input is the transpose
    of its last two dimensions of a contiguous tensor (rather than contiguous); (None, False) if none."""
    while isinstance(node, fx.Node) and node.target in _VIEWS:
        node = node.args[0]
    if node not in index or metas[index[node]].numel() != numel:
        return None, False
    value = metas[index[node]]
    if value.is_contiguous():
        return node, False
    if value.dim() >= 2 and value.transpose(-2, -1).is_contiguous():
        return node, True
    return None, False


def _strided(value: Any, strides: tuple[int, ...]) -> bool:
    """Whether `value` has these strides in every dimension of more than one element."""
    return all(size == 1 or int(got) == want for size, got, want in zip(value.shape, value.stride(), strides))
