"""The built-in writer's reading of a GEMM task (`generate/builtin/gemm_plan.py`): which matmul and
which epilogue it fuses, each task it declines with the reason, and the program it writes (which
the static rules take)."""

from __future__ import annotations

import pytest

from kevin_backend.generate.builtin.gemm_kernel import GemmTiling
from kevin_backend.generate.builtin.gemm_plan import DirectConv, GemmPlan, GemmTail, plan_gemm, write_gemm_program
from kevin_backend.generate.builtin.plan import Declined
from kevin_backend.toolchain.static_rules import check_program
from conftest import full_tier


def task(forward: str, inputs: str) -> str:
    return f"""import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def forward(self, *v):
        return {forward}


def get_inputs():
    return [{inputs}]


def get_init_inputs():
    return []
"""


BF16 = "dtype=torch.bfloat16"
LINEAR_GELU = task("F.gelu(F.linear(v[0], v[1], v[2]))",
                   f"torch.randn(4, 512, 1024, {BF16}), torch.randn(2048, 1024, {BF16}), torch.randn(2048, {BF16})")


def _plan(source: str) -> GemmPlan:
    plan = plan_gemm(source)
    plan = getattr(plan, "fallback", None) or plan  # (a direct convolution's implicit GEMM: test_direct_conv.py tests the direct kernel)
    assert isinstance(plan, GemmPlan), plan
    return plan


def test_a_linear_with_its_bias_and_gelu_over_a_3d_input() -> None:
    plan = _plan(LINEAR_GELU)
    assert (plan.m, plan.n, plan.k, plan.x, plan.w, plan.bias, plan.residual) == (2048, 2048, 1024, 0, 1, 2, None)
    assert plan.spec.dtype == "bfloat16" and plan.spec.epilogue.bias and plan.spec.epilogue.activation == "gelu"
    assert plan.describe() == "2048x2048x1024 bfloat16, bias, gelu"


def test_a_scaled_product_with_a_residual_and_silu() -> None:
    f16 = "dtype=torch.float16"
    source = task("F.silu(torch.add((v[0] @ v[1].t()) * 0.25, v[2], alpha=2.0))",
                  f"torch.randn(1024, 768, {f16}), torch.randn(512, 768, {f16}), torch.randn(1024, 512, {f16})")
    plan = _plan(source)
    e = plan.spec.epilogue
    assert (e.alpha, e.residual, e.beta, e.activation, e.bias, plan.residual) == (0.25, True, 2.0, "silu", False, 2)
    tanh = _plan(task("F.gelu(v[0] @ v[1].t() + v[2], approximate='tanh')",
                      f"torch.randn(256, 512, {BF16}), torch.randn(1024, 512, {BF16}), torch.randn(1024, {BF16})"))
    assert tanh.spec.epilogue.activation == "gelu_tanh" and tanh.bias == 2
    assert _plan(task("torch.sigmoid(v[0] @ v[1].t())", f"torch.randn(256, 512, {BF16}), torch.randn(1024, 512, {BF16})")
                 ).spec.epilogue.activation == "sigmoid"


def test_a_k_by_n_weight_is_read_as_it_lies() -> None:
    plan = _plan(task("F.relu(v[0] @ v[1])", f"torch.randn(256, 512, {BF16}), torch.randn(512, 1024, {BF16})"))
    assert (plan.m, plan.n, plan.k, plan.spec.weight, plan.spec.epilogue.activation) == (256, 1024, 512, "kn", "relu")
    assert plan.describe() == "256x1024x512 bfloat16, K x N weight, relu"
    program = write_gemm_program(plan, GemmTiling())
    assert "Element, cutlass::layout::RowMajor, kAlign,\n    float, TileShape" in program  # B row-major: K x N
    assert "n = w.size(-1)" in program and check_program(program) == ()


@pytest.mark.parametrize(("forward", "inputs", "reason"), [
    ("F.relu(v[0] @ v[1].t())", "torch.randn(256, 512, dtype=torch.float64), torch.randn(1024, 512, dtype=torch.float64)",
     "takes float16, bfloat16 and float32"),
    ("v[0] @ v[1].exp()", f"torch.randn(256, 512, {BF16}), torch.randn(512, 1024, {BF16})", "right operand is not an input"),
    ("v[0] @ v[1].t() + v[2].t()", f"torch.randn(256, 512, {BF16}), torch.randn(1024, 512, {BF16}), torch.randn(1024, 256, {BF16})",
     "aten.t.default in the epilogue"),
    ("(v[0] @ v[1].t()).view(4, 64, 1024) + v[2]", f"torch.randn(256, 512, {BF16}), torch.randn(1024, 512, {BF16}), "
     f"torch.randn(1, 64, 1024, {BF16})", "per row (M = 256) nor per element"),
    ("(((((v[0] @ v[1]) @ v[1]) @ v[1]) @ v[1]) @ v[1])", f"torch.randn(256, 512, {BF16}), torch.randn(512, 512, {BF16})",
     "5 matmuls: the GEMM writer chains at most 4"),
    ("(h := torch.tanh(v[0])) @ v[1] + h", f"torch.randn(256, 512, {BF16}), torch.randn(512, 512, {BF16})",
     "a value of the matmul's prologue is read after the matmul too"),
    ("F.relu(h := v[0] @ v[1]) @ v[2] + h", f"torch.randn(256, 512, {BF16}), torch.randn(512, 512, {BF16}), "
     f"torch.randn(512, 512, {BF16})", "hands on 2 values"),
    ("torch.cumsum(v[0] @ v[1].t(), -1)", f"torch.randn(256, 512, {BF16}), torch.randn(1024, 512, {BF16})",
     "not an elementwise op the GEMM writer fuses"),
    ("torch.softmax(v[0] @ v[1], -1)", "torch.randn(256, 512), torch.randn(512, 1024)", "3xTF32 products are less exact"),
    ("(v[0] @ v[1], v[0] + 1)", f"torch.randn(256, 512, {BF16}), torch.randn(512, 1024, {BF16})",
     "does not broadcast to the iteration space"),  # (a value apart from the product's: not the writer's kernel after it)
    # convolutions: 1-D, 2-D, 3-D and transposed 1-D and 2-D ones of one group, their own bias and
    # functions after; a tensor after them (its elements lie channel by channel, not as the kernel's
    # rows), groups of many channels (few a group are the direct kernel's), a transposed 3-D or dilated one, a
    # transposed one of channels the kernel cannot read whole: declined
    ("F.conv2d(v[0], v[1], groups=2)", f"torch.randn(2, 128, 8, 8, {BF16}), torch.randn(32, 64, 3, 3, {BF16})",
     "a 2-D convolution, kernel 3x3, stride [1, 1], padding [0, 0], dilation [1, 1], 2 group(s)"),
    ("F.conv_transpose3d(v[0], v[1], stride=2)", f"torch.randn(2, 16, 4, 4, 4, {BF16}), torch.randn(16, 8, 3, 3, 3, {BF16})",
     "a transposed 3-D convolution, kernel 3x3x3"),
    ("F.conv_transpose2d(v[0], v[1], stride=2, dilation=2)", f"torch.randn(2, 16, 8, 8, {BF16}), torch.randn(16, 8, 4, 4, {BF16})",
     "not dilated"),
    ("F.conv_transpose2d(v[0], v[1], stride=2)", f"torch.randn(2, 12, 8, 8, {BF16}), torch.randn(12, 8, 4, 4, {BF16})",
     "its channels (12 in, 8 out) multiples of 8"),
    # (a tree after a convolution: vectors over its channels and one tensor of its size; CUTLASS 2.x's,
    # which computes a float32 one, two of them at most)
    ("F.relu(F.conv2d(v[0], v[1], padding=1)) * v[2] + v[3]", f"torch.randn(2, 16, 8, 8, {BF16}), torch.randn(32, 16, 3, 3, {BF16}), "
     f"torch.randn(2, 32, 8, 8, {BF16}), torch.randn(2, 32, 8, 8, {BF16})", "not ['mn', 'mn']"),
    ("F.relu(F.conv2d(v[0], v[1], v[2])) * v[3] + v[4]", "torch.randn(2, 16, 8, 8), torch.randn(32, 16, 3, 3), "
     "torch.randn(32), torch.randn(32, 1, 1), torch.randn(2, 32, 6, 6)", "a convolution's tree of 3 operands: CUTLASS 2.x's"),
    # (an operand broadcast against another before it meets the convolution's output: not one value per channel)
    ("F.conv2d(v[0], v[1]) + (v[2].unsqueeze(-1) + v[3])", f"torch.randn(2, 16, 8, 8, {BF16}), torch.randn(32, 16, 3, 3, {BF16}), "
     f"torch.randn(32, 1, {BF16}), torch.randn(6, {BF16})", "broadcast against another operand first"),
    # (a value of operands alone read in two shapes: once per channel, once per column)
    ("F.conv2d(v[0], v[1]) * (s := v[2] * 2.0).view(32, 1, 1) + s.view(1, 1, 32)", f"torch.randn(2, 16, 8, 34, {BF16}), "
     f"torch.randn(32, 16, 3, 3, {BF16}), torch.randn(32, {BF16})", "meets the product in shapes"),
    # (of 160 input channels: 16 would be the direct kernel's, which reads any operand that broadcasts)
    ("F.conv2d(v[0], v[1]) + v[2]", f"torch.randn(2, 160, 8, 32, {BF16}).contiguous(memory_format=torch.channels_last), "
     f"torch.randn(32, 160, 1, 1, {BF16}), torch.randn(32, {BF16})", "not one value per output channel (32) nor a tensor"),
    # (of 160 input channels: 16 would be the direct kernel's, transposed or not)
    ("F.conv_transpose2d(v[0], v[1], stride=2) + v[2]", f"torch.randn(2, 160, 8, 8, {BF16}), torch.randn(160, 8, 2, 2, {BF16}), "
     f"torch.randn(8, 1, 1, {BF16})", "strided gradient kernel reads one source"),
    # a channels-last convolution's output viewed in another shape (eager copies it: no view of the kernel's)
    ("torch.relu(F.conv2d(v[0], v[1], padding=1)).flatten(1)", f"torch.randn(2, 16, 8, 8, {BF16}).contiguous("
     f"memory_format=torch.channels_last), torch.randn(32, 16, 3, 3, {BF16})", "a view of a channels-last convolution's output"),
    # batches: a column per row of each product (the kernel's column is one for the whole batch); a broadcast batch of weights
    ("torch.bmm(v[0], v[1]) * v[2]", f"torch.randn(4, 64, 32, {BF16}), torch.randn(4, 32, 64, {BF16}), torch.randn(4, 64, 1, {BF16})",
     "a column of values per row in a batch"),
    ("v[0] @ v[1].expand(4, 32, 64)", f"torch.randn(4, 64, 32, {BF16}), torch.randn(1, 32, 64, {BF16})",
     "bmm's right operand is not an input's packed"),
])
def test_what_it_cannot_fuse_is_declined_with_the_reason(forward: str, inputs: str, reason: str) -> None:
    declined = plan_gemm(task(forward, inputs))
    assert isinstance(declined, Declined) and reason in declined.reason, declined


def test_a_16_bit_trees_float32_vectors_are_read_as_float32_by_hoppers_kernel() -> None:
    # a Linear, then an inference batch norm as a compiled model hands it on: its running mean and
    # reciprocal deviation computed in float32 by another kernel, its weight and bias in bfloat16
    source = task("F.relu(((F.linear(v[0], v[1], v[2]) - v[3]) * v[4] * v[5] + v[6]).to(torch.bfloat16))",
                  f"torch.randn(64, 32, {BF16}), torch.randn(48, 32, {BF16}), torch.randn(48, {BF16}), torch.randn(48), "
                  f"torch.rand(48) + 0.5, torch.randn(48, {BF16}), torch.randn(48, {BF16})")
    plan = plan_gemm(source, arch="sm90")
    assert isinstance(plan, GemmPlan) and plan.spec.epilogue.operands == ("n",) * 5 and plan.spec.epilogue.wide == (1, 2), plan
    program = write_gemm_program(plan, GemmTiling())
    assert program.count("Sm90RowBroadcast<0, TileShape, float, float>") == 2 and program.count("Sm90RowBroadcast<0, TileShape, Element") == 3
    assert "static_cast<float const*>(vectors[1])" in program and "a2.scalar_type() == at::kFloat" in program
    assert "a3.scalar_type() == at::kBFloat16" in program and check_program(program) == ()
    declined = plan_gemm(source, arch="sm80")  # (CUTLASS 2.x's tree reads its dtype's values)
    assert isinstance(declined, Declined) and "Hopper's visitor tree reads them" in declined.reason, declined
    # a float32 tensor of the output's size: Hopper's tree loads it as float32 beside the source C
    # (which is its dtype's; here none), the output stored in float32; CUTLASS 2.x's reads its dtype's:
    # the writer's kernel after the GEMM reads it
    product = task("F.linear(v[0], v[1]) * v[2]", f"torch.randn(64, 32, {BF16}), torch.randn(48, 32, {BF16}), torch.randn(64, 48)")
    full = plan_gemm(product, arch="sm90")
    assert isinstance(full, GemmPlan) and full.spec.epilogue.operands == ("mn",) and full.spec.epilogue.wide == (0,), full
    program = write_gemm_program(full, GemmTiling())
    assert "Sm90AuxLoad<0, TileShape, float," in program and "Sm90SrcFetch" not in program and "using ElementC = void;" in program
    assert "static_cast<float const*>(vectors[0])" in program and "residual_ptr = nullptr;" in program and check_program(program) == ()
    full = plan_gemm(product, arch="sm80")
    assert isinstance(full, GemmTail) and full.tail.ops == ("aten.mul.Tensor",) and not full.gemm.spec.epilogue.tree, full


@pytest.mark.parametrize(("forward", "inputs", "planned"), [
    # float32 values beside a 16-bit product: a float32 bias (its sum float32: the writer's kernel
    # adds it after the GEMM); a float32 column (read as float32 by Hopper's tree, the output
    # stored in float32); a float16 column beside bf16 values (the writer's kernel multiplies); the
    # product cast to float32 (stored so)
    ("v[0] @ v[1].t() + v[2]", f"torch.randn(256, 512, {BF16}), torch.randn(1024, 512, {BF16}), torch.randn(1024)", "tail"),
    ("v[0] @ v[1].t() * v[2]", f"torch.randn(256, 512, {BF16}), torch.randn(1024, 512, {BF16}), torch.randn(256, 1)", "float32"),
    ("v[0] @ v[1].t() * v[2]", f"torch.randn(256, 512, {BF16}), torch.randn(1024, 512, {BF16}), torch.randn(256, 1, dtype=torch.float16)",
     "tail"),
    ("(v[0] @ v[1].t()).float()", f"torch.randn(256, 512, {BF16}), torch.randn(1024, 512, {BF16})", "float32"),
])
def test_values_of_other_dtypes_beside_a_16_bit_product_are_planned(forward: str, inputs: str, planned: str) -> None:
    plan = plan_gemm(task(forward, inputs))
    if planned == "tail":  # (the GEMM stores its product; the writer's pointwise kernel does the rest)
        assert isinstance(plan, GemmTail) and not plan.tail.is_rows and plan.gemm.spec.output == "bfloat16", plan
    else:
        assert isinstance(plan, GemmPlan) and plan.spec.output == "float32", plan


def test_the_program_calls_the_kernel_with_the_tasks_inputs_and_passes_the_static_rules() -> None:
    program = write_gemm_program(_plan(LINEAR_GELU), GemmTiling((128, 256, 64), (1, 2, 1)))
    assert "return ext.gemm_epilogue(v0, v1, v2, torch.empty(0, device=v0.device, dtype=v0.dtype))" in program
    assert "cooperative tile 128x256x64 cluster 1x2" in program and "compute_90a" in program
    assert check_program(program) == ()


def compiled_graph(model, *inputs, decompositions=None):  # type: ignore[no-untyped-def]
    """The forward graph AOT autograd gives a compiler for `model` on `inputs` (as the backend
    gets it, with `decompositions` such as Inductor's)."""
    from torch._functorch.aot_autograd import aot_function

    graphs = []

    def keep(gm, example_inputs):  # type: ignore[no-untyped-def]
        graphs.append(gm)
        return gm

    aot_function(model, fw_compiler=keep, decompositions=decompositions)(*inputs)
    return graphs[0].graph


def test_the_partitioner_gives_a_matmul_its_epilogue_and_nothing_else(hopper_with_cutlass) -> None:  # type: ignore[no-untyped-def]
    import torch
    import torch.nn.functional as F
    from torch.fx.experimental.proxy_tensor import make_fx

    from kevin_backend.backend.partition import partition_graph
    from kevin_backend.generate.builtin.builtin_support import BuiltinSupport

    def model(x, w, b):  # type: ignore[no-untyped-def]
        h = torch.tanh(x) * 2.0  # a prologue: a partition of its own
        y = F.gelu(h @ w.t() + b)  # the GEMM and its epilogue
        return y.sum(-1), y  # a reduction of the output: not in the GEMM's kernel

    gm = make_fx(model)(torch.randn(64, 32), torch.randn(16, 32), torch.randn(16))
    plan = partition_graph(gm.graph, BuiltinSupport())
    ops = [sorted({n.target.__name__.split(".")[0] for n in p.nodes if n.op == "call_function"}) for p in plan.partitions]
    (gemm,) = [set(o) for o in ops if {"mm", "addmm"} & set(o)]
    assert "gelu" in gemm and not {"tanh", "mul", "sum"} & gemm, ops  # the epilogue only
    assert ["mul", "tanh"] in ops and ["sum"] in ops, ops  # the prologue and the reduction: partitions of their own


def test_the_builtin_policy_writes_the_gemm_and_searches_its_tilings(hopper_with_cutlass) -> None:  # type: ignore[no-untyped-def]
    from kevin_backend.generate.builtin.builtin_policy import BuiltinPolicy
    from kevin_backend.generate.builtin.gemm_kernel import GEMM_TILINGS
    from kevin_backend.generate.policy import EarlierTurn, Reply, Sampling

    messages = [{"role": "user", "content": f"Write a kernel for:\n```python\n{LINEAR_GELU}```\n"}]
    first, second = BuiltinPolicy().generate([messages, messages], Sampling())
    assert first.extra["variant"] == GEMM_TILINGS[0].name and second.extra["variant"] == GEMM_TILINGS[1].name
    assert "A CUTLASS GEMM with its epilogue (2048x2048x1024 bfloat16, bias, gelu)" in first.text
    assert "ext.gemm_epilogue(v0, v1, v2," in first.text
    from kevin_backend.judge.result import JudgeResult, JudgeTimings, Reason, Stage

    def verdict(ms: float | None) -> JudgeResult:
        return (JudgeResult(Stage.RUN, Reason.MISMATCH) if ms is None else
                JudgeResult(Stage.RUN, Reason.ACCEPTED, timings=JudgeTimings(kernel_ms=ms)))

    names = [t.name for t in GEMM_TILINGS]
    earlier = [EarlierTurn(Reply("", extra={"variant": name}), verdict(ms)) for name, ms in zip(names, (0.30, None, 0.20, 0.25, 0.22))]
    (last,) = BuiltinPolicy().generate_after([messages], [earlier], Sampling())
    assert last.extra["variant"] == names[2] and "every tiling tried: the fastest again" in last.text


def test_the_builtin_policy_writes_chains_and_reductions_after_the_product(hopper_with_cutlass) -> None:  # type: ignore[no-untyped-def]
    from kevin_backend.generate.builtin.builtin_policy import BuiltinPolicy
    from kevin_backend.generate.builtin.gemm_suite import GEMM_SUITE
    from kevin_backend.generate.policy import Sampling
    from kevin_backend.toolchain.static_rules import check_program

    tasks = {name: next(t.source for t in GEMM_SUITE if t.name == name)
             for name in ("gpt2-mlp-f32-2048x768x3072", "linear-logsumexp-bf16-2048x4096x4096")}
    chain, tail = (BuiltinPolicy().generate([[{"role": "user", "content": f"Write a kernel for:\n```python\n{source}```\n"}]],
                                            Sampling())[0] for source in tasks.values())
    assert chain.text.startswith("A chain of CUTLASS GEMMs ([2048x3072x768 float32, bias, gelu_tanh] -> [2048x768x3072 float32, bias])")
    assert chain.extra["variant"] == "3xtf32 tile 64x64x32 stages 4 + 3xtf32 tile 64x64x32 stages 4"
    assert tail.text.startswith("A CUTLASS GEMM with its epilogue and my own kernels around it ([2048x4096x4096 bfloat16, bias] -> "
                                "[the built-in writer's row kernel: ")
    for reply in (chain, tail):
        program = reply.text.split("```python\n")[1].split("```")[0]
        assert check_program(program) == ()
    # the logsumexp of a bf16 product: once a turn is not accepted, the next keeps the product in float32
    from kevin_backend.generate.policy import EarlierTurn
    from kevin_backend.judge.result import JudgeResult, JudgeTimings, Reason, Stage

    messages = [{"role": "user", "content": f"Write a kernel for:\n```python\n{tasks['linear-logsumexp-bf16-2048x4096x4096']}```\n"}]
    for verdict, wide in ((JudgeResult(Stage.RUN, Reason.ACCEPTED, timings=JudgeTimings(kernel_ms=0.2)), False),
                          (JudgeResult(Stage.RUN, Reason.MISMATCH), True)):
        (after,) = BuiltinPolicy().generate_after([messages], [[EarlierTurn(tail, verdict)]], Sampling())
        assert after.extra["variant"].endswith(", its end in float32") == wide, after.extra
        assert ("using ElementD = float;" in after.text) == wide and ("stored in float32" in after.text) == wide


# the planned suite tasks whose epilogue is a visitor tree
TREES = {"linear-bias-swish-scale-f16-1024x4096x4096", "mm-bias-rows-f16-512x16384x512", "swiglu-mlp-bf16-8192x4096x11008",
         "backward-two-gradients-bf16-8192x3072x768"}


def _specs(plan) -> list:  # type: ignore[no-untyped-def]
    if hasattr(plan, "plans"):
        return [s for p in plan.plans for s in _specs(p)]
    return _specs(plan.gemm) if hasattr(plan, "gemm") else [plan.spec]


@pytest.mark.slow
def test_on_ampere_each_planned_task_is_cutlass_2x_visitor_trees_too() -> None:
    from kevin_backend.generate.builtin.gemm_plan import plan_tilings
    from kevin_backend.generate.builtin.gemm_suite import GEMM_SUITE

    planned = {}
    for t in GEMM_SUITE:
        plan = plan_gemm(t.source, arch="sm80")
        if isinstance(plan, Declined):
            assert t.name not in (PLANNED | AMPERE_ONLY) - HOPPER_ONLY, (t.name, plan.reason)
            assert t.name not in HOPPER_ONLY or "CUTLASS 2.x's reads" in plan.reason, (t.name, plan.reason)
            continue
        if isinstance(plan, DirectConv):  # (a direct convolution first: its implicit GEMM's plan is CUTLASS 2.x's)
            assert "conv" in t.name, t.name
            # (no implicit GEMM on Ampere: a batch norm's four vectors, Hopper's alone; a transposed convolution of 3
            # channels, which CUTLASS reads 4 at a time; a depthwise or grouped one; the direct kernel is any GPU's)
            if plan.fallback is None:
                assert t.name in ("conv2d-stem-bn-silu-bf16-32x3x224x224", "conv-transpose2d-biasadd-clamp-f32-128x3x32x32",
                                  "conv2d-depthwise-bn-relu6-bf16-64x144x56x56", "conv2d-grouped-bn-relu-bf16-64x128x56x56"), t.name
                planned[t.name] = plan
                continue
            plan = plan.fallback
        planned[t.name] = plan
        assert all(s.arch == "sm80" and s.sm80 and not s.direct_store for s in _specs(plan)), (t.name, _specs(plan))
        program = write_gemm_program(plan, plan_tilings(plan)[0], task_source=t.source)
        assert "cutlass::arch::Sm80" in program and "Sm90" not in program and "compute_90a" not in program, t.name
        assert "extra_cuda_cflags=['--expt-relaxed-constexpr', '-DNDEBUG']" in program and check_program(program) == (), t.name
        # (and a bias beside a residual: CUTLASS 2.x's plain epilogue reads one source)
        assert ("Sm80EVT" in program) == (t.name in TREES or t.name == "stream-residual-float-bf16-8192x768x768"), t.name
    assert set(planned) == (PLANNED | AMPERE_ONLY) - HOPPER_ONLY, sorted(set(planned) ^ ((PLANNED | AMPERE_ONLY) - HOPPER_ONLY))
    # an LM head's logits: x and w read 8 values at a time, the 50257 logits stored one by one
    assert [(s.align, s.out_align) for s in _specs(planned["lm-head-f16-4096x768x50257"])] == [(8, 1)]


def test_on_hopper_rows_tma_cannot_read_go_to_the_sm80_kernel() -> None:
    f16 = "dtype=torch.float16"
    # rows of K = 1002 (not 16-byte aligned): TMA reads none; cp.async copies 4 bytes at a time
    odd_k = _plan(task("F.relu(F.linear(v[0], v[1], v[2]))", f"torch.randn(256, 1002, {f16}), torch.randn(512, 1002, {f16}), torch.randn(512, {f16})"))
    assert (odd_k.spec.arch, odd_k.spec.align, odd_k.spec.out_align, odd_k.spec.epilogue.bias) == ("sm80", 2, 8, True)
    # an LM head with a bias and a GELU: the direct store takes neither; the sm80 kernel stores one logit at a time
    head = _plan(task("F.gelu(F.linear(v[0], v[1], v[2]))", f"torch.randn(256, 768, {f16}), torch.randn(50257, 768, {f16}), torch.randn(50257, {f16})"))
    assert (head.spec.arch, head.spec.align, head.spec.out_align, head.spec.direct_store) == ("sm80", 8, 1, False)
    # a plain scale of those logits: still Hopper's kernel, stored directly
    plain = _plan(task("(v[0] @ v[1].t()) * 0.5", f"torch.randn(256, 768, {f16}), torch.randn(50257, 768, {f16})"))
    assert (plain.spec.arch, plain.spec.direct_store) == ("sm90", True)
    # the logits with nothing fused (a bare LM head, either weight layout): declined on Hopper, where
    # their store without TMA loses to cuBLAS; Ampere's kernel stores every row the same way and takes them
    for forward, weight in (("v[0] @ v[1].t()", "50257, 768"), ("F.linear(v[0], v[1])", "50257, 768"), ("v[0] @ v[1]", "768, 50257")):
        bare = task(forward, f"torch.randn(256, 768, {f16}), torch.randn({weight}, {f16})")
        declined = plan_gemm(bare, arch="sm90")
        assert isinstance(declined, Declined) and "nothing fused after the product" in declined.reason, (forward, declined)
        assert plan_gemm(bare, arch="sm80").spec.arch == "sm80"
    # aligned rows with nothing fused stay Hopper's; the same logits cast to float32 are the cast's kernel's
    assert _plan(task("v[0] @ v[1].t()", f"torch.randn(256, 768, {f16}), torch.randn(50264, 768, {f16})")).spec.arch == "sm90"
    cast = plan_gemm(task("(v[0] @ v[1].t()).float()", f"torch.randn(256, 768, {f16}), torch.randn(50257, 768, {f16})"), arch="sm90")
    assert isinstance(cast, GemmTail) and cast.gemm.spec.row_pad, cast
    # rows of odd K, and a K x N weight of odd N: no 4-byte copy reads them; x and w packed first into rows of 8
    for forward, inputs, weight in (
            ("torch.tanh(v[0] @ v[1] + v[2])", f"torch.randn(100, 513, {f16}), torch.randn(513, 4097, {f16}), torch.randn(4097, {f16})", "kn"),
            ("torch.tanh(v[0] @ v[1].t() + v[2])", f"torch.randn(100, 513, {f16}), torch.randn(4097, 513, {f16}), torch.randn(4097, {f16})", "nk"),
            ("torch.relu(v[0] @ v[1])", f"torch.randn(256, 512, {f16}), torch.randn(512, 50257, {f16})", "kn")):
        packed = _plan(task(forward, inputs))
        assert (packed.spec.arch, packed.spec.pad_k, packed.spec.align, packed.spec.weight) == ("sm80", True, 8, weight), packed.spec
    # visitor trees too: rows of K = 1002, and an LM head's logits gated by a tensor of their size
    for forward, inputs in (("F.relu(v[0] @ v[1].t() + v[2]) * v[3]", f"torch.randn(64, 1002, {f16}), torch.randn(48, 1002, {f16}), "
                             f"torch.randn(48, {f16}), torch.randn(64, 48, {f16})"),
                            ("F.relu(v[0] @ v[1].t()) * v[2]", f"torch.randn(256, 512, {f16}), torch.randn(50257, 512, {f16}), "
                             f"torch.randn(256, 50257, {f16})")):
        tree = _plan(task(forward, inputs))
        assert (tree.spec.arch, tree.spec.epilogue.tree) == ("sm80", True), tree.spec
    # float32's trees are the sm80 kernel's on any GPU: a second tensor after a bias and a ReLU
    f32 = _plan(task("F.relu(v[0] @ v[1].t() + v[2]) + v[3]", "torch.randn(256, 512), torch.randn(1024, 512), torch.randn(1024), torch.randn(256, 1024)"))
    assert (f32.spec.arch, f32.spec.sm80, f32.spec.epilogue.operands) == ("sm90", True, ("n", "mn")), f32.spec


@pytest.mark.parametrize(("capability", "arch"), [((9, 0), "sm90"), ((8, 0), "sm80"), ((8, 6), "sm80"), ((8, 9), "sm80"),
                                                  ((10, 0), "sm80"), ((7, 5), "")])
def test_the_gemm_kernels_follow_the_gpu(capability: tuple[int, int], arch: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    from kevin_backend.generate.builtin import builtin_support

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: capability)
    assert builtin_support.gemm_arch() == arch
    assert _plan(LINEAR_GELU).spec.arch == (arch or "sm90")  # (a plan without such a GPU: Hopper's)
    reason = builtin_support.no_matmul_reason("aten.mm.default")
    assert (reason == "") == bool(arch) or "CUTLASS's headers are not installed" in reason, reason
    if not arch and "CUTLASS's headers" not in reason:
        assert "needs a GPU of compute capability 8.0 or later (compute capability 7.5;" in reason, reason


def test_without_cutlass_the_policy_says_why_it_declines(monkeypatch: pytest.MonkeyPatch) -> None:
    from kevin_backend.generate.builtin import builtin_policy
    from kevin_backend.generate.policy import Sampling

    monkeypatch.setattr(builtin_policy, "gemm_available", lambda: False)
    messages = [{"role": "user", "content": f"```python\n{LINEAR_GELU}```"}]
    (reply,) = builtin_policy.BuiltinPolicy().generate([messages], Sampling())
    assert reply.finish_reason == "declined" and "```" not in reply.text


def test_a_compiled_linear_is_planned_from_its_partition(hopper_with_cutlass) -> None:  # type: ignore[no-untyped-def]
    # What torch.compile gives the backend for F.gelu(F.linear(x, w, b)) on 3-D activations: the
    # weight's transpose and x's flattening are views outside the partition, whose task then reads
    # `addmm(b, x2d, wT)` with wT a K x N view of the N x K weight (strides (1, K)), and views the
    # product back to 3-D. The GEMM writer declined it ("w is not contiguous"): no compiled
    # transformer got a GEMM kernel.
    import torch
    import torch.nn.functional as F

    from kevin_backend.backend.partition import partition_graph
    from kevin_backend.backend.task import extract_task
    from kevin_backend.generate.builtin.builtin_support import BuiltinSupport
    from kevin_backend.generate.builtin.gemm_kernel import GemmTiling
    from kevin_backend.generate.builtin.gemm_plan import GemmPlan, plan_gemm, write_gemm_program

    def model(x, w, b):  # type: ignore[no-untyped-def]
        return F.gelu(F.linear(x, w, b), approximate="tanh")

    x, w, b = torch.randn(2, 16, 64), torch.randn(128, 64), torch.randn(128)
    graph = compiled_graph(model, *(t.to(torch.bfloat16) for t in (x, w, b)))
    (gemm,) = [p for p in partition_graph(graph, BuiltinSupport()).partitions
               if any(n.target is torch.ops.aten.addmm.default for n in p.nodes)]
    source = extract_task(gemm).source
    plan = plan_gemm(source)
    assert isinstance(plan, GemmPlan), plan
    assert (plan.m, plan.n, plan.k, plan.spec.weight, plan.w_view, plan.out_shape) == (32, 128, 64, "nk", True, (2, 16, 128))
    assert plan.spec.epilogue.bias and plan.spec.epilogue.activation == "gelu_tanh"
    program = write_gemm_program(plan, GemmTiling())
    call = program.split("return ext.gemm_epilogue(")[1].splitlines()[0]
    assert f"v{plan.w}.t()" in call and call.endswith(".view([2, 16, 128])"), call


@pytest.mark.parametrize("layout", ["plain", "channels_last", "conv3d", "transposed"])
def test_a_compiled_convolution_is_a_partition_of_its_epilogue_planned_for_the_implicit_gemm(
        layout: str, hopper_with_cutlass) -> None:  # type: ignore[no-untyped-def]
    import torch
    import torch.nn.functional as F

    from kevin_backend.backend.partition import partition_graph
    from kevin_backend.backend.task import extract_task
    from kevin_backend.generate.builtin.builtin_support import BuiltinSupport

    bf16 = dict(dtype=torch.bfloat16)
    conv = {"conv3d": F.conv3d, "transposed": F.conv_transpose2d}.get(layout, F.conv2d)

    def model(x, w, b):  # type: ignore[no-untyped-def]
        return F.relu(conv(torch.tanh(x) * 2.0, w, b, padding=1))  # (the prologue: a partition of its own)

    x = torch.randn(2, 16, 4, 10, 12, **bf16) if layout == "conv3d" else torch.randn(2, 16, 10, 12, **bf16)
    x = x.contiguous(memory_format=torch.channels_last) if layout == "channels_last" else x
    w = torch.randn(32, 16, 3, 3, 3, **bf16) if layout == "conv3d" else torch.randn(16, 32, 3, 3, **bf16) \
        if layout == "transposed" else torch.randn(32, 16, 3, 3, **bf16)
    graph = compiled_graph(model, x, w, torch.randn(32, **bf16))
    partitions = partition_graph(graph, BuiltinSupport()).partitions
    (part,) = [p for p in partitions if any(n.target is torch.ops.aten.convolution.default for n in p.nodes)]
    ops = {n.target.__name__.split(".")[0] for n in part.nodes if n.op == "call_function"}
    assert ops == {"convolution", "relu"}, ops
    plan = plan_gemm(extract_task(part).source)
    assert isinstance(plan, GemmPlan) and plan.spec.convolution is not None, plan
    c = plan.spec.convolution
    assert c.channels_last == (layout == "channels_last") and plan.spec.epilogue.bias and plan.spec.epilogue.activation == "relu"
    assert (c.dims, c.transposed) == (3 if layout == "conv3d" else 2, layout == "transposed"), c
    assert (plan.m, plan.n, plan.k) == ((960, 32, 432) if layout == "conv3d" else (240, 32, 144)), (plan.m, plan.n, plan.k)


def test_each_matmul_partition_of_a_compiled_gated_mlp_is_planned(hopper_with_cutlass) -> None:  # type: ignore[no-untyped-def]
    # Llama's MLP as torch.compile hands it over: the gate's matmul with its SiLU and the product by
    # the up projection's output (a tensor of the output's size from outside the partition: a
    # visitor tree; declined before, "not computed from the product alone"), the down projection
    # with the residual add; the up projection's lone matmul is left to Inductor (cuBLAS).
    import torch
    import torch.nn.functional as F

    from kevin_backend.backend.partition import partition_graph
    from kevin_backend.backend.task import extract_task
    from kevin_backend.generate.builtin.builtin_support import BuiltinSupport
    from kevin_backend.generate.builtin.gemm_plan import GemmPlan, plan_gemm

    def model(x, gate, up, down):  # type: ignore[no-untyped-def]
        return x + F.linear(F.silu(F.linear(x, gate)) * F.linear(x, up), down)

    tensors = (torch.randn(2, 16, 64), torch.randn(96, 64), torch.randn(96, 64), torch.randn(64, 96))
    graph = compiled_graph(model, *(t.to(torch.bfloat16) for t in tensors))
    split = partition_graph(graph, BuiltinSupport())
    partitions = [p for p in split.partitions if any(n.target is torch.ops.aten.mm.default for n in p.nodes)]
    gated, down = (plan_gemm(extract_task(p).source) for p in partitions)
    assert isinstance(gated, GemmPlan) and gated.spec.epilogue.operands == ("mn",), gated
    assert isinstance(down, GemmPlan) and down.spec.epilogue.residual and not down.spec.epilogue.tree, down
    assert [o.reason.value for o in split.left_out if o.op == "aten.mm.default"] == ["partition too small"]


def test_a_reduction_after_the_product_is_the_gemm_then_the_writers_own_kernel() -> None:
    # the GEMM's epilogue ends at the last value read once by an elementwise op in the product's
    # dtype (here the sigmoid); the rest (the sum) is planned by the built-in writer's planner,
    # reading that end (y0) and the task's inputs it needs (here a scale after the sum)
    from kevin_backend.generate.builtin.gemm_plan import GemmTail, plan_tilings, write_gemm_program
    from kevin_backend.toolchain.static_rules import check_program

    source = task("torch.sigmoid(v[0] @ v[1].t() + v[2]).sum(-1, keepdim=True) * v[3]",
                  "torch.randn(256, 512), torch.randn(1024, 512), torch.randn(1024), torch.randn(256, 1)")
    plan = plan_gemm(source)
    assert isinstance(plan, GemmTail), plan
    assert plan.gemm.spec.epilogue.bias and plan.gemm.spec.epilogue.activation == "sigmoid"
    assert plan.reads == (3, 4) and plan.tail.is_rows  # v3, then y0 (after the task's 4 inputs)
    assert plan.describe().endswith("-> [the built-in writer's row kernel: sum, mul]"), plan.describe()
    program = write_gemm_program(plan, plan_tilings(plan)[0])
    assert check_program(program) == ()
    assert "y0 = ext.gemm_epilogue(v0, v1, v2, " in program and "return tail.kevin_run(v3, y0)" in program
    # a 16-bit product cast to float32 for the reduction: the GEMM stores the 16-bit product, the tail casts
    half = plan_gemm(task("torch.softmax(v[0] @ v[1].t(), -1, dtype=torch.float32)",
                          f"torch.randn(256, 512, {BF16}), torch.randn(1024, 512, {BF16})"))
    assert isinstance(half, GemmTail) and half.gemm.spec.dtype == "bfloat16" and half.gemm.spec.epilogue.activation == "identity"


# The suite's tasks the GEMM writer plans: one that stops being planned turns this red
# a convolution's tree of more operands than CUTLASS 2.x's reads (an inference batch norm's four
# vectors, two of them float32): Hopper's alone
HOPPER_ONLY = {"conv2d-bn-relu-channels-last-bf16-64x256x28x28", "conv2d-bn-add-relu-channels-last-bf16-64x128x56x56",
               "conv2d-bn-relu-f16-64x256x28x28"}
# an LM head that returns its unaligned logits, nothing fused: Hopper's direct store of them is
# declined (slower than cuBLAS on every tiling); CUTLASS 2.x's kernel takes it on Ampere
AMPERE_ONLY = {"lm-head-f16-4096x768x50257"}
PLANNED = {
    "linear-gelu-f32-128x1024x512", "linear-relu-scale-f32-128x1024x512", "linear-sigmoid-sum-f32-128x1024x512",
    "linear-bias-swish-scale-f16-1024x4096x4096", "linear-softmax-f16-512x4096x8192", "linear-logsumexp-bf16-2048x4096x4096",
    "linear-groupnorm-hardtanh-f32-128x1024x512", "linear-layernorm-gelu-bf16-4096x1024x4096",
    "linear-tanh-residual-f32-1000x999x777", "mm-bias-gelu-bf16-4096x4096x4096", "mm-relu-f16-8192x8192x8192",
    "mm-scale-residual-bf16-8192x8192x8192", "mm-rowsum-f32-4096x4096x4096", "addmm-silu-f16-16384x1024x4096",
"mm-cast-prologue-bf16-4096x4096x4096", "mm-bias-rows-f16-512x16384x512",
    "mlp-up-gelu-f16-8192x768x3072", "swiglu-mlp-bf16-8192x4096x11008", "down-proj-residual-bf16-8192x11008x4096",
    "stream-residual-float-bf16-8192x768x768", "mlp-up-pre-activation-gelu-bf16-8192x768x3072", "backward-two-gradients-bf16-8192x3072x768",
    "prenorm-qkv-f16-4096x1024x3072", "gpt2-mlp-f32-2048x768x3072", "attn-scores-softmax-f16-32x16x512x64",
    "baddbmm-scale-relu-f32-128x512x256x512", "qkv-bias-bf16-8192x4096x12288",
    "conv2d-1x1-relu-channels-last-bf16-64x256x56x56", "linear-max-sub-gelu-f32-128x1024x512",
    "lm-head-cross-entropy-bf16-8192x768x50257", "attn-vit-softmax-f16-8x12x197x64",
    "mm-bias-tanh-bf16-1000x513x4097", "conv2d-hardswish-f16-128x128x32x32", "conv1d-gelu-f16-64x512x1024",
    "conv2d-bn-relu-channels-last-bf16-64x256x28x28", "conv2d-bn-add-relu-channels-last-bf16-64x128x56x56",
    "conv2d-bn-relu-f16-64x256x28x28",
    "conv2d-3x3-relu-channels-last-bf16-32x128x56x56", "conv2d-min-tanh-f32-128x3x32x32", "conv2d-groupnorm-scale-f32-128x128x32x32",
    "conv-transpose2d-sigmoid-scale-f32-128x64x16x16", "conv3d-softmax-f32-128x3x16x32x32", "conv2d-relu-bias-f32-128x128x32x32",
    "conv2d-silu-residual-bf16-32x256x64x64", "conv2d-relu-biasadd-f32-128x3x32x32", "conv2d-mish-mish-f32-128x3x32x32",
    "conv2d-multiply-leakyrelu-gelu-f32-128x3x32x32", "conv2d-stem-bn-silu-bf16-32x3x224x224",
    "conv-transpose2d-biasadd-clamp-f32-128x3x32x32", "conv2d-depthwise-bn-relu6-bf16-64x144x56x56",
    "conv2d-grouped-bn-relu-bf16-64x128x56x56",
}


@pytest.mark.slow
def test_every_planned_suite_task_gives_programs_the_judge_takes() -> None:
    # each planned task in its first two tilings (a two-turn search's; in the full tier every
    # tiling): the static rules pass, every extension splits for the judge's fast build (the
    # CUTLASS file as a library's, the writer's own kernels by launches). The first two of a
    # convolution are Hopper's and CUTLASS 2.x's, of a long reduction split-K and stream-K.
    from conftest import FULL
    from kevin_backend.generate.builtin.gemm_plan import plan_tilings, write_gemm_program
    from kevin_backend.generate.builtin.gemm_suite import GEMM_SUITE
    from kevin_backend.toolchain.candidate import Candidate
    from kevin_backend.toolchain.fast_build import fast_sources
    from kevin_backend.toolchain.static_rules import check_program

    planned, programs = set(), 0
    for t in GEMM_SUITE:
        plan = plan_gemm(t.source)
        if isinstance(plan, Declined):
            continue
        planned.add(t.name)
        for tiling in plan_tilings(plan)[:None if FULL else 2]:
            program = write_gemm_program(plan, tiling, task_source=t.source)
            assert check_program(program) == (), (t.name, tiling.name)
            for ext in Candidate.parse(program).extensions:
                join = (lambda s: s if isinstance(s, str) else "\n".join(s))
                fast_sources(join(ext.cpp_sources), join(ext.cuda_sources), ext.functions, "0123456789abcdef")
            programs += 1
    assert planned == PLANNED, (sorted(planned - PLANNED), sorted(PLANNED - planned))
    assert programs >= (250 if FULL else 100), programs


def test_a_1x1_convolution_of_rows_tma_cannot_read_is_the_implicit_gemm() -> None:
    # 12 input and 20 output channels of bf16: not 16-byte rows, so not Hopper's GEMM of the rows;
    # CUTLASS's implicit GEMM reads them (its channels packed), as it does any other convolution
    cl = ".contiguous(memory_format=torch.channels_last)"
    for c_in, c_out, conv2d in ((12, 20, True), (16, 24, False)):
        plan = _plan(task("F.relu(F.conv2d(v[0], v[1], v[2]))", f"torch.randn(2, {c_in}, 4, 6, {BF16}){cl}, "
                          f"torch.randn({c_out}, {c_in}, 1, 1, {BF16}), torch.randn({c_out}, {BF16})"))
        assert (plan.spec.convolution is not None, plan.conv) == (conv2d, not conv2d), plan.describe()


@pytest.mark.slow
def test_every_convolution_of_the_benchmarks_resnet_in_inference_is_planned(hopper_with_cutlass) -> None:  # type: ignore[no-untyped-def]
    # `kevin bench`'s ResNet-18 in bfloat16, as the kevin pass partitions it: each convolution with
    # its batch norm (and ReLU, and the block's input added back) one CUTLASS kernel on Hopper
    import torch
    from conftest import builtin_partitions

    from kevin_backend.backend.task import extract_task
    from kevin_backend.bench.models import make_model

    model, inputs = make_model("cnn", "infer", device="cpu", dtype=torch.bfloat16, size="small")
    parts = [p for p in builtin_partitions(model, *inputs).partitions if "aten.convolution.default" in p.ops]
    plans = [plan_gemm(extract_task(p).source, arch="sm90") for p in parts]
    # (the stem's, of 3 input channels, the direct kernel first: its implicit GEMM after)
    assert [isinstance(p, DirectConv) for p in plans] == [True] + [False] * 19
    plans = [getattr(p, "fallback", None) or p for p in plans]
    assert len(parts) == 20 and all(isinstance(p, GemmPlan) for p in plans), [p for p in plans if not isinstance(p, GemmPlan)]
    assert sum("aten.relu.default" in p.ops for p in parts) == 17 and all(p.spec.epilogue.wide for p in plans)


def test_a_batch_of_one_viewed_back_from_the_products_rows_keeps_the_writers_kernel_after_it() -> None:
    # GPT-2's MLP up projection in training at batch size 1 (kevin bench's small size), as the compiled
    # graph has it: the product's rows viewed back as [1, tokens, 3072] before the tanh GELU, the
    # pre-activation returned too (the backward reads it); a view that adds a dimension of 1 moves no value
    source = task("(lambda y: (y, F.gelu(y.view(1, 16, 48), approximate='tanh')))(torch.addmm(v[0], v[1], v[2]))",
                  f"torch.randn(48, {BF16}), torch.randn(16, 32, {BF16}), torch.randn(32, 48, {BF16})")
    plan = plan_gemm(source, arch="sm90")
    assert isinstance(plan, GemmTail), plan


@pytest.mark.slow
@pytest.mark.parametrize(("workload", "name"), full_tier(("infer", "gpt2"), ("infer", "llama"), ("train", "gpt2"), ("train", "llama"),
                                                   keep=(("train", "llama"),)),
                         ids=["infer-gpt2", "infer-llama", "train-gpt2", "train-llama"])
def test_the_matmuls_of_the_benchmarks_transformers_are_planned(name: str, workload: str, hopper_with_cutlass) -> None:  # type: ignore[no-untyped-def]
    # `kevin bench`'s GPT-2 and Llama in bfloat16, every graph the kevin pass gets (the backward's
    # too): each matmul's partition is a CUTLASS GEMM, most with the writer's kernel after it where
    # the partition returns more than its end (the residual stream and its float32 copy, the
    # pre-activation the backward pass reads); one of the backward's adds two tensors of the
    # output's size (the kernel reads one as its source)
    import collections

    import torch
    import torch._inductor.config as inductor_config

    from kevin_backend.backend.partition import partition_graph
    from kevin_backend.backend.task import extract_task
    from kevin_backend.bench.models import make_model, needs_transformers
    from kevin_backend.generate.builtin.builtin_support import BuiltinSupport

    if needs_transformers(name):
        pytest.importorskip("transformers")
    plans = []
    model, inputs = make_model(name, workload, device="cpu", dtype=torch.bfloat16, size="tiny")
    torch._dynamo.reset()
    try:
        with inductor_config.patch(post_grad_custom_post_pass=lambda g: plans.append(partition_graph(g, BuiltinSupport()))):
            if workload == "train":
                torch.compile(model, dynamic=False)(*inputs).backward()
            else:
                with torch.no_grad():
                    torch.compile(model, dynamic=False)(*inputs)
    finally:
        torch._dynamo.reset()
    matmuls = ("aten.mm.default", "aten.addmm.default", "aten.bmm.default")
    got = collections.Counter()
    for part in (p for plan in plans for p in plan.partitions if set(p.ops) & set(matmuls)):
        plan = plan_gemm(extract_task(part).source, arch="sm90")
        got[type(plan).__name__ if not isinstance(plan, Declined) else plan.reason] += 1
    declined = {k: v for k, v in got.items() if k not in ("GemmPlan", "GemmTail", "GemmChain", "GemmHead")}
    assert got["GemmTail"] >= 1 and not declined, got


def test_a_tied_lm_heads_weight_gradient_is_copied_into_row_major_then_multiplied() -> None:
    # GPT-2's tied LM head in a bfloat16 training step: its weight gradient reads the logits
    # gradient (tokens x vocabulary) as its transpose, an input of strides (1, 50257) to the
    # partition, and adds the embedding's gradient. The GEMM kernel takes a row-major left operand
    # only: the writer's tiled kernel copies it first (the H100 declined this partition, Inductor's
    # 2.25 ms the largest of the step's partitions)
    from kevin_backend.generate.builtin.gemm_plan import GemmHead, own_variant, plan_tilings

    source = task("v[0] @ v[1] + v[2]", f"torch.randn(4096, 50257, {BF16}).t(), torch.randn(4096, 768, {BF16}), "
                                        f"torch.randn(50257, 768, {BF16})")
    plan = plan_gemm(source, arch="sm90")
    assert isinstance(plan, GemmHead), plan
    (read,) = plan.head.inputs
    assert (read.shape, read.stride) == ((50257, 4096), (1, 50257)) and plan.reads == (0,)
    assert own_variant(plan.head).describe().startswith("32 x 32 tiles through shared memory"), own_variant(plan.head)
    assert isinstance(plan.gemm, GemmPlan) and plan.gemm.spec.epilogue.residual, plan.gemm
    program = write_gemm_program(plan, plan_tilings(plan)[0], task_source=source)
    assert check_program(program) == () and program.count("load_inline(") == 2
    # a row-major left operand, or a weight read transposed: no copy
    inputs = f"torch.randn(50257, 4096, {BF16}), torch.randn(4096, 768, {BF16}), torch.randn(50257, 768, {BF16})"
    assert isinstance(plan_gemm(task("v[0] @ v[1] + v[2]", inputs), arch="sm90"), GemmPlan)
    linear = task("F.linear(v[0], v[1], v[2])", f"torch.randn(4096, 768, {BF16}), torch.randn(3072, 768, {BF16}), torch.randn(3072, {BF16})")
    assert isinstance(plan_gemm(linear, arch="sm90"), GemmPlan)
