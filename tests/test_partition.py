"""The partitioner: fusible groups, no cycles, size limits, and a reason for every node left out."""

from __future__ import annotations

import pytest
import torch
import torch.fx as fx
from torch.fx.experimental.proxy_tensor import make_fx

from kevin_backend.backend.partition import LeftOutReason, partition_graph
from kevin_backend.generate.op_support import GeneralOpSupport, op_name


def trace(fn, *inputs: torch.Tensor) -> fx.Graph:
    return make_fx(fn, tracing_mode="fake")(*inputs).graph


def names(part) -> list[str]:
    return [op_name(n).removeprefix("aten.").split(".")[0] for n in part.nodes]


def reasons(plan) -> dict[str, LeftOutReason]:
    return {lo.op.removeprefix("aten.").split(".")[0]: lo.reason for lo in plan.left_out if lo.op != "placeholder"}


def test_chain_of_pointwise_ops_is_one_partition() -> None:
    graph = trace(lambda x, y: torch.relu(x * y + 1.0).exp(), torch.randn(8, 8), torch.randn(8, 8))
    plan = partition_graph(graph, GeneralOpSupport())
    (part,) = plan.partitions
    assert names(part) == ["mul", "add", "relu", "exp"]
    assert [n.name for n in part.inputs] == ["x_1", "y_1"]
    assert len(part.outputs) == 1


def test_no_cycle_through_an_unsupported_node() -> None:
    # a -> cumsum (unsupported) -> c, and a -> c directly: a and c cannot share a partition,
    # since the kernel would need cumsum's result, which needs the kernel's own output.
    def fn(x):
        a = torch.sin(x) * 2
        b = torch.cumsum(a, 0)
        return torch.cos(a) + b * 3

    plan = partition_graph(trace(fn, torch.randn(16)), GeneralOpSupport(), min_nodes=1)
    part_of = {n.name: p.index for p in plan.partitions for n in p.nodes}
    assert part_of["sin"] == part_of["mul"]
    assert part_of["add"] != part_of["sin"]
    assert reasons(plan)["cumsum"] is LeftOutReason.UNSUPPORTED
    for part in plan.partitions:  # no partition reads a value that depends on itself
        inside = set(part.nodes)
        for i in part.inputs:
            stack, seen = [i], set()
            while stack:
                node = stack.pop()
                assert node not in inside
                stack.extend(a for a in node.all_input_nodes if a not in seen)
                seen.update(node.all_input_nodes)


def test_independent_branches_merge_at_their_join() -> None:
    plan = partition_graph(
        trace(lambda x, y: torch.sin(x).exp() + torch.cos(y).abs(), torch.randn(4), torch.randn(4)),
        GeneralOpSupport(),
    )
    (part,) = plan.partitions
    assert sorted(names(part)) == sorted(["sin", "exp", "cos", "abs", "add"])


def test_max_size_splits_and_min_size_dissolves() -> None:
    def fn(x):
        for _ in range(9):
            x = torch.sin(x)
        return x

    graph = trace(fn, torch.randn(4))
    plan = partition_graph(graph, GeneralOpSupport(), min_nodes=2, max_nodes=4)
    assert [len(p.nodes) for p in plan.partitions] == [4, 4]
    assert [lo.reason for lo in plan.left_out if lo.op.startswith("aten")] == [LeftOutReason.TOO_SMALL]


def test_a_lone_reduction_is_a_partition_and_a_lone_pointwise_op_is_not() -> None:
    """A KernelBench problem of one reduction (a sum or an argmax over a dimension) reaches the
    writer at the default size; one pointwise op alone stays with Inductor; a larger minimum
    still dissolves the reduction."""
    for fn in (lambda x: x.sum(1), lambda x: torch.argmax(x, 1), lambda x: torch.max(x, 0)[0]):
        plan = partition_graph(trace(fn, torch.randn(8, 16)), GeneralOpSupport())
        assert len(plan.partitions) == 1, plan.left_out
    plan = partition_graph(trace(lambda x: torch.relu(x), torch.randn(8, 16)), GeneralOpSupport())
    assert not plan.partitions and reasons(plan)["relu"] is LeftOutReason.TOO_SMALL
    plan = partition_graph(trace(lambda x: x.sum(1), torch.randn(8, 16)), GeneralOpSupport(), min_nodes=3)
    assert not plan.partitions and reasons(plan)["sum"] is LeftOutReason.TOO_SMALL


def test_one_matmul_per_partition() -> None:
    w1, w2 = torch.randn(8, 8), torch.randn(8, 8)
    plan = partition_graph(
        trace(lambda x, a, b: torch.relu(torch.relu(x @ a) @ b), torch.randn(4, 8), w1, w2),
        GeneralOpSupport(),
    )
    assert [names(p) for p in plan.partitions] == [["mm", "relu"], ["mm", "relu"]]


def test_structural_reasons() -> None:
    def fn(x, buf):
        y = torch.rand_like(x) + x  # random
        buf.add_(1)  # mutation
        z = torch.nonzero(x > 0)  # data-dependent shape
        return y * 2, z

    graph = trace(fn, torch.randn(4), torch.randn(4))
    plan = partition_graph(graph, GeneralOpSupport(), min_nodes=1)
    got = reasons(plan)
    assert got["rand_like"] is LeftOutReason.RANDOM
    assert got["add_"] is LeftOutReason.MUTATES
    assert got["nonzero"] is LeftOutReason.UNSUPPORTED
    assert got["output"] is LeftOutReason.GRAPH_IO
    # every node is accounted for, each left-out one with a reason
    placed = {n.name for p in plan.partitions for n in p.nodes}
    assert placed | {lo.node for lo in plan.left_out} == {n.name for n in graph.nodes}


def test_views_alone_are_not_a_partition() -> None:
    plan = partition_graph(trace(lambda x: x.t().reshape(-1).unsqueeze(0), torch.randn(3, 4)), GeneralOpSupport(), min_nodes=1)
    assert plan.partitions == ()
    assert {lo.reason for lo in plan.left_out if lo.op.startswith("aten")} <= {LeftOutReason.ALIAS_VIEW, LeftOutReason.NO_COMPUTE}


def test_multi_output_op_keeps_its_getitems() -> None:
    def fn(x):
        var, mean = torch.var_mean(x, dim=-1, keepdim=True)
        return (x - mean) * torch.rsqrt(var + 1e-5)

    plan = partition_graph(trace(fn, torch.randn(4, 16)), GeneralOpSupport())
    (part,) = plan.partitions
    assert names(part).count("getitem") == 2
    assert len(part.outputs) == 1


def test_symbolic_size_arguments_are_left_out() -> None:
    gm = make_fx(lambda x: (torch.sin(x) * 2).reshape(x.shape[0] * 2, -1), tracing_mode="symbolic")(torch.randn(4, 6))
    plan = partition_graph(gm.graph, GeneralOpSupport(), min_nodes=1)
    reshape = [lo for lo in plan.left_out if "view" in lo.op or "reshape" in lo.op]
    assert reshape and all(lo.reason is LeftOutReason.SYMBOLIC for lo in reshape)
    assert [names(p) for p in plan.partitions] == [["sin", "mul"]]


@pytest.mark.parametrize("bad", [0, -1])
def test_partitioner_sizes_validated_by_config(bad: int) -> None:
    from kevin_backend.config import Config, ConfigError

    with pytest.raises(ConfigError, match="min_partition"):
        Config.from_options({"min_partition": bad})


def test_edge_views_stay_outside_so_outputs_never_alias() -> None:
    # weight.t() feeds the matmul (a leading view); y.view(...) is only read outside (trailing)
    def fn(x, w):
        y = torch.relu(x @ w.t())
        return y.view(-1), y * 2

    plan = partition_graph(trace(fn, torch.randn(4, 8), torch.randn(8, 8)), GeneralOpSupport())
    (part,) = plan.partitions
    assert names(part) == ["mm", "relu", "mul"]
    left = {lo.op.removeprefix("aten.").split(".")[0]: lo.reason for lo in plan.left_out}
    assert left["t"] is LeftOutReason.ALIAS_VIEW and left["view"] is LeftOutReason.ALIAS_VIEW
