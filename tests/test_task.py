"""Task extraction: every partition's program reproduces its subgraph exactly."""

from __future__ import annotations

import operator
from typing import Any

import pytest
import torch
import torch.fx as fx

from conftest import capture_aot_graphs
from kevin_backend.backend.partition import partition_graph
from kevin_backend.generate.op_support import GeneralOpSupport
from kevin_backend.backend.task import extract_task
from kevin_backend.example_models import EXAMPLES, make_example
from kevin_backend.types import TensorSpec


def _all_values(gm: fx.GraphModule, args: list[Any]) -> dict[fx.Node, Any]:
    """Run the graph once, keeping every node's value."""
    values: dict[fx.Node, Any] = {}

    class Keep(fx.Interpreter):
        def run_node(self, n: fx.Node) -> Any:
            values[n] = super().run_node(n)
            return values[n]

    Keep(gm).run(*args)
    return values


@pytest.mark.parametrize("train", [False, True], ids=["inference", "training"])
@pytest.mark.parametrize("name", EXAMPLES)
def test_every_partition_program_is_exact(name: str, train: bool) -> None:
    model, inputs = make_example(name)
    graphs = capture_aot_graphs(model, inputs, train)
    assert graphs and all(args for _, args in graphs)
    checked = 0
    for gm, args in graphs:
        values = _all_values(gm, args)
        plan = partition_graph(gm.graph, GeneralOpSupport())
        # every node is in exactly one partition or left out with a reason
        placed = [n.name for p in plan.partitions for n in p.nodes]
        left = [lo.node for lo in plan.left_out]
        assert sorted(placed + left) == sorted(n.name for n in gm.graph.nodes)
        assert all(lo.reason for lo in plan.left_out)
        for part in plan.partitions:
            task = extract_task(part)
            module = task.load()
            got = module.Model(*module.get_init_inputs())(*[values[n] for n in part.inputs])
            got = [got] if isinstance(got, torch.Tensor) else list(got)
            want = [values[n] for n in part.outputs]
            assert len(got) == len(want)
            for g, w in zip(got, want):
                assert g.dtype == w.dtype and g.shape == w.shape
                assert torch.equal(g, w), f"{task.name}: program differs from the subgraph"
            # the program's own inputs have the recorded specs
            made = module.get_inputs()
            assert [TensorSpec.of(t) for t in made] == list(task.inputs)
            checked += 1
    assert checked >= 1


def test_program_renders_constants_exactly() -> None:
    g = fx.Graph()
    x = g.placeholder("x")
    x.meta["val"] = torch.empty(4, 3)
    nodes = [
        g.call_function(torch.ops.aten.add.Tensor, (x, 0.1 + 0.2)),
    ]
    nodes.append(g.call_function(torch.ops.aten.clamp.default, (nodes[0], float("-inf"), 1e-30)))
    nodes.append(g.call_function(torch.ops.aten._to_copy.default, (nodes[1],), {"dtype": torch.float16}))
    g.output(nodes[-1])
    gm = fx.GraphModule(torch.nn.Module(), g)
    values = _all_values(gm, [torch.randn(4, 3)])
    for n in nodes:
        n.meta["val"] = values[n]
    plan = partition_graph(g, GeneralOpSupport(), min_nodes=2)
    (part,) = plan.partitions
    task = extract_task(part)
    assert "0.30000000000000004" in task.source and "float('-inf')" in task.source
    assert "dtype=torch.float16" in task.source
    out = task.load().Model()(values[x])
    assert torch.equal(out, values[nodes[-1]])
    assert operator.eq(task.outputs[0].dtype, "float16")


def test_a_program_task_runs_its_model_where_its_inputs_are() -> None:
    """KernelBench programs make CUDA inputs and a model whose parameters start on the CPU (the
    judge moves the model); reading such a task's specs moves it too. `meta` stands in for CUDA."""
    from kevin_backend.types import KernelTask

    source = '''import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.norm = nn.LayerNorm(dim)

    def forward(self, x):
        return self.norm(x)


def get_inputs():
    return [torch.randn(8, 64, device="meta")]


def get_init_inputs():
    return [64]
'''
    task = KernelTask.from_program("norm", source)
    assert [s.shape for s in task.inputs] == [(8, 64)] and [s.shape for s in task.outputs] == [(8, 64)]
