"""The built-in writer's plan counts what it fuses: every aten op of the task's graph once, in
graph order (views too; the items of a tuple such as var_mean's are none), and the writer's reply
says that count. Pointwise work on a per-channel value before its view was once counted twice."""

from __future__ import annotations

import operator

import pytest

from kevin_backend.generate.builtin.graph_nodes import op_name
from kevin_backend.generate.builtin.plan import Declined, Plan
from kevin_backend.generate.builtin.planner import plan_task
from kevin_backend.generate.builtin.tracing import trace
from kevin_backend.generate.builtin.builtin_policy import BuiltinPolicy
from kevin_backend.generate.builtin.suite import SUITE
from kevin_backend.generate.policy import Sampling


def _task(forward: str, inputs: str, args: str = "x, y") -> str:
    return ("import torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n\n"
            f"class Model(nn.Module):\n    def forward(self, {args}):\n        return {forward}\n\n"
            f"def get_inputs():\n    return [{inputs}]\n\ndef get_init_inputs():\n    return []\n")


def _randn(*shape: int) -> str:
    return f"torch.randn({', '.join(map(str, shape))}, device='cuda')"


def _plan(source: str) -> Plan:
    plan = plan_task(source)
    assert not isinstance(plan, Declined), plan
    return plan


A = "aten."
CASES = {
    # N distinct elementwise ops: N
    "five-elementwise": (_task("torch.tanh(torch.exp(x) - y).abs() * 2.0", f"{_randn(64, 128)}, {_randn(64, 128)}"),
                         ["exp.default", "sub.Tensor", "tanh.default", "abs.default", "mul.Tensor"]),
    # a chain with a repeated op: each call counts
    "chain-repeats": (_task("torch.relu(x + y) + y", f"{_randn(64, 128)}, {_randn(128)}"),
                      ["add.Tensor", "relu.default", "add.Tensor"]),
    "softmax": (_task("torch.softmax(x, dim=-1)", _randn(64, 128), args="x"),
                ["amax.default", "sub.Tensor", "exp.default", "sum.dim_IntList", "div.Tensor"]),
    # var_mean's two results are read through getitem: not ops of their own
    "layernorm": (_task("F.layer_norm(x, (128,))", _randn(64, 128), args="x"),
                  ["var_mean.correction", "add.Tensor", "rsqrt.default", "sub.Tensor", "mul.Tensor"]),
    # add and rsqrt run on the [64] vector before its view brings it into [2, 64, 4, 4]
    "per-channel-chain": (_task("x * torch.rsqrt(y + 1e-5)[:, None, None]", f"{_randn(2, 64, 4, 4)}, {_randn(64)}"),
                          ["add.Tensor", "rsqrt.default", "unsqueeze.default", "unsqueeze.default", "mul.Tensor"]),
    "per-channel-view": (_task("x * torch.rsqrt(y + 1e-5).view(1, 64, 1, 1)", f"{_randn(2, 64, 4, 4)}, {_randn(64)}"),
                         ["add.Tensor", "rsqrt.default", "view.default", "mul.Tensor"]),
}


@pytest.mark.parametrize("name", list(CASES))
def test_plan_counts_each_op_once(name: str) -> None:
    source, ops = CASES[name]
    assert list(_plan(source).ops) == [A + op for op in ops]


@pytest.mark.parametrize("name", ["five-elementwise", "softmax", "layernorm", "per-channel-chain"])
def test_the_reply_says_the_op_count(name: str) -> None:
    source, ops = CASES[name]
    prompt = f"Write a faster version of this program.\n\n```python\n{source}```\n"
    (reply,) = BuiltinPolicy().generate([[{"role": "user", "content": prompt}]], Sampling())
    assert reply.ok, reply.text
    assert f" kernel for {len(ops)} ops (" in reply.text.splitlines()[0]


@pytest.mark.parametrize("task", [t for t in SUITE if t.category in ("chain3+", "norm")], ids=lambda t: t.name)
def test_suite_plans_count_every_aten_call_of_the_graph_once(task) -> None:
    gm, _ = trace(task.source)
    calls = [n for n in gm.graph.nodes if n.op == "call_function" and n.target is not operator.getitem]
    assert list(_plan(task.source).ops) == [op_name(n) for n in calls]



_TARGETS = "torch.randint(0, 128, (64,))"


@pytest.mark.parametrize(("reduction", "op"), [("mean", "mean"), ("sum", "sum"), ("none", None)])
def test_cross_entropy_picks_the_target_and_reduces_the_rows_last(reduction: str, op: str | None) -> None:
    plan = plan_task(_task(f"F.cross_entropy(x, y, reduction='{reduction}')", f"{_randn(64, 128)}, {_TARGETS}"))
    assert isinstance(plan, Plan), plan
    (pick,) = plan.picks
    assert pick.pick is not None and pick.pick[1] == "in1"
    target = plan.inputs[1]
    assert target.kind.value == "row" and target.view == ((64, 1), (1, 0))
    if op is None:
        assert plan.final is None and plan.outputs[0].shape == (64,)
    else:
        assert plan.final is not None and plan.final.op == op and plan.final.ignore == -100
        assert plan.outputs[0].shape == (64,) and str(plan.outputs[0].dtype) == "torch.float32"  # the per-row values


@pytest.mark.parametrize(("forward", "why"), [
    ("F.cross_entropy(x, y, weight=torch.ones(128, device=x.device))", ""),  # class weights
    ("x * y[:, None]", "integer dtype torch.int64"),
    ("F.cross_entropy(x, y, label_smoothing=0.1)", ""),
])
def test_int64_inputs_are_declined_except_as_targets(forward: str, why: str) -> None:
    plan = plan_task(_task(forward, f"{_randn(64, 128)}, {_TARGETS}"))
    assert isinstance(plan, Declined), plan
    assert why in plan.reason


def test_a_partition_that_makes_scalars_on_the_gpu_is_planned_on_meta() -> None:
    """A partition's task (backend/task.py) makes its scalars where the graph ran:
    `aten.full.default(..., device=torch.device('cuda', 0))` in the forward. Traced beside meta
    inputs, they must be meta too (KL divergence's partition was declined on the GPU machine:
    'Tensor on device cuda:0 is not on the expected device meta')."""
    forward = ("torch.ops.aten.where.self(torch.ops.aten.eq.Scalar(x, 0), torch.ops.aten.full.default([], 0.0, "
               "dtype=torch.float32, layout=torch.strided, device=torch.device('cuda', 0), pin_memory=False), x * y).sum()")
    plan = plan_task(_task(forward, f"{_randn(64, 128)}, {_randn(64, 128)}"))
    assert isinstance(plan, Plan), plan
    assert any(n.expr == "0.0f" for n in plan.nodes)


@pytest.mark.parametrize("forward", [
    "x.gather(1, y[:, None])",  # a gather at int64 positions, no ignore mask: not cross-entropy's
    "-torch.where(y != -100, x.gather(1, torch.where(y != 5, y, 0)[:, None])[:, 0], 0.0).sum()",  # masks that differ
])
def test_only_cross_entropys_own_gather_is_declared(forward: str) -> None:
    """`BuiltinSupport` declares a gather and the int64 ops around it only as the whole pattern
    Inductor makes of nll_loss_forward (`DecomposedNll`); anything like it stays with Inductor."""
    import torch
    from torch._inductor.decomposition import select_decomp_table
    from torch.fx.experimental.proxy_tensor import make_fx

    from kevin_backend.backend.partition import partition_graph
    from kevin_backend.generate.builtin.builtin_support import BuiltinSupport
    from kevin_backend.generate.builtin.cross_entropy import match_decomposed_nll

    fn = eval(f"lambda x, y: {forward}", {"torch": torch})  # noqa: S307 (the test's own expression)
    gm = make_fx(fn, decomposition_table=select_decomp_table(), tracing_mode="fake")(torch.randn(64, 128), torch.randint(0, 128, (64,)))
    (gather,) = [n for n in gm.graph.nodes if n.target is torch.ops.aten.gather.default]
    assert match_decomposed_nll(gather) is None
    plan = partition_graph(gm.graph, BuiltinSupport())
    assert "gather" in {lo.node for lo in plan.left_out}
