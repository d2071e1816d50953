"""The direct convolution (`direct_conv.py`): which convolutions and epilogues it takes, which it
leaves to the implicit GEMM and why, the structure of its kernel and host function, and its place in
a search's turns. Its values against PyTorch on a GPU: test_direct_conv_gpu.py; its programs through
the judge's fast build: test_gemm_fast_build.py."""

from __future__ import annotations

import re

import pytest

from direct_conv_tasks import DIRECT_TASKS
from kevin_backend.generate.builtin.direct_conv import MAX_TAPS, DirectTiling, plan_direct
from kevin_backend.generate.builtin.direct_conv_source import direct_extension
from kevin_backend.generate.builtin.gemm_plan import DirectConv, gemm_turn, plan_gemm, plan_tilings, write_gemm_program
from kevin_backend.generate.builtin.ops import Unsupported
from kevin_backend.generate.builtin.plan import Declined
from kevin_backend.generate.builtin.tracing import trace_with_parameters
from test_gemm_plan import task

# what each task's plan reads: (its epilogue's ops, outputs over the channels or per position)
EXPECTED = {
    "min-tanh-f32": (["amin over the channels", "tanh", "tanh"], [False]),
    "conv3d-softmax-f32": (["amax over the channels", "sub", "exp", "sum over the channels", "div"], [True]),
    "strided-relu-residual-bf16": (["relu", "add"], [True]),
    "mish-mish-f32": (["softplus", "tanh", "mul", "softplus", "tanh", "mul"], [True]),
    "stem-bn-silu-bf16": (["sub", "mul", "mul", "add", "_to_copy", "_to_copy", "sigmoid", "mul", "_to_copy"], [True]),
    "channels-last-scale-mean-f16": (["mul", "tanh", "mean over the channels", "sub", "mean over the channels"], [True, False]),
    "conv1d-dilated-max-gelu-f32": (["amax over the channels", "gelu"], [False]),
    "viewed-bias-sigmoid-f32": (["mul", "add", "sigmoid"], [True]),
    "transpose2d-bias-clamp-f32": (["add", "clamp", "mul"], [True]),
    "transpose3d-add-hardswish-f32": (["add", "add", "clamp", "clamp", "mul", "div"], [True]),
    "transpose1d-dilated-softmax-bf16": (["_to_copy", "amax over the channels", "sub", "exp", "sum over the channels", "div", "_to_copy"],
                                         [True]),
    "depthwise-bn-relu6-f32": (["sub", "mul", "add", "hardtanh"], [True]),
    "depthwise7x7-channels-last-bf16": ([], [True]),
    "depthwise-strided-silu-f16": (["_to_copy", "sigmoid", "mul", "_to_copy"], [True]),
    "grouped-bn-relu-f32": (["sub", "mul", "add", "relu"], [True]),
    "grouped-multiplier-channels-last-bf16": (["gelu"], [True]),
    "grouped1d-strided-silu-f16": (["_to_copy", "sigmoid", "mul", "_to_copy"], [True]),
    "grouped-channels-last-relu-bf16": (["relu"], [True]),
    "depthwise-channels-last-out-f16": (["relu"], [True]),
}


@pytest.mark.parametrize("name", sorted(DIRECT_TASKS))
def test_a_convolution_of_few_input_channels_is_one_direct_kernel_with_its_whole_epilogue(name: str) -> None:
    plan = plan_gemm(DIRECT_TASKS[name], arch="sm90")
    assert isinstance(plan, DirectConv), (name, plan)
    ops, per_channel = EXPECTED[name]
    assert list(plan.ops) == ops
    assert [o.per_channel for o in plan.outputs] == per_channel
    assert plan.taps <= MAX_TAPS and "convolution" in plan.describe()
    # the direct variants first, then the implicit GEMM's (its fallback), whose program is CUTLASS's
    tilings = plan_tilings(plan)
    direct = [t for t in tilings if isinstance(t, DirectTiling)]
    assert tilings[:len(direct)] == tuple(direct) and len(direct) >= 2
    # (the implicit GEMM's plan reads no product of two tensors before the convolution, nor these transposed
    # convolutions: 3 input channels, 3 dimensions, a dilation; nor grouped ones: none after the direct variants)
    if name == "viewed-bias-sigmoid-f32" or name.startswith(("transpose", "depthwise", "grouped")):
        assert plan.fallback is None and len(tilings) == len(direct)
        return
    assert plan.fallback is not None and len(tilings) > len(direct)
    program = write_gemm_program(plan, tilings[len(direct)], task_source=DIRECT_TASKS[name])
    assert "cutlass" in program and "kevin_direct_conv" not in program


def _graph(source: str):  # type: ignore[no-untyped-def]
    gm, metas, _ = trace_with_parameters(source)
    return gm.graph, metas


DECLINED = {
    "576 input values per output": ("torch.relu(F.conv_transpose2d(v[0], v[1]))", "torch.randn(2, 64, 8, 8), torch.randn(64, 16, 3, 3)"),
    # groups of 64 input channels (576 values per output), and a transposed grouped one
    "a convolution of 2 groups": ("torch.relu(F.conv2d(v[0], v[1], groups=2))", "torch.randn(2, 128, 8, 8), torch.randn(32, 64, 3, 3)"),
    "a transposed convolution of 2 groups": ("torch.relu(F.conv_transpose2d(v[0], v[1], groups=2))",
                                             "torch.randn(2, 8, 8, 8), torch.randn(8, 2, 3, 3)"),
    "input values per output": ("torch.relu(F.conv2d(v[0], v[1]))", "torch.randn(2, 64, 8, 8), torch.randn(16, 64, 3, 3)"),
    "reduces over the channels alone": ("F.conv2d(v[0], v[1]).amax(-1)", "torch.randn(2, 3, 8, 8), torch.randn(16, 3, 3, 3)"),
    "over a depthwise or grouped convolution's channels": ("F.conv2d(v[0], v[1], groups=8).amax(1)",
                                                           "torch.randn(2, 8, 8, 8), torch.randn(8, 1, 3, 3)"),
    "sum.dim_IntList over a depthwise or grouped": ("F.conv2d(v[0], v[1], groups=2).sum(1)", "torch.randn(2, 8, 8, 8), torch.randn(16, 4, 3, 3)"),
    "the index of a min or max": ("torch.min(F.conv2d(v[0], v[1]), dim=1)[1]", "torch.randn(2, 3, 8, 8), torch.randn(16, 3, 3, 3)"),
    "makes a value of shape": ("F.group_norm(F.conv2d(v[0], v[1]), 4)", "torch.randn(2, 3, 8, 8), torch.randn(16, 3, 3, 3)"),
    "computed in the graph": ("F.conv2d(v[0], v[1] * 2.0)", "torch.randn(2, 3, 8, 8), torch.randn(16, 3, 3, 3)"),
    # (a max over the channels without their dimension, broadcast back over them: right-aligned, it lines up
    # with the channels only by the batch's being 1)
    "the channels' dimension gone) where a value over the channels": ("(lambda y: y + y.amax(1))(F.conv2d(v[0], v[1]))",
                                                                       "torch.randn(1, 3, 8, 8), torch.randn(16, 3, 3, 3)"),
}


@pytest.mark.parametrize("why", sorted(DECLINED))
def test_what_the_direct_kernel_leaves_to_the_implicit_gemm_says_why(why: str) -> None:
    forward, inputs = DECLINED[why]
    graph, metas = _graph(task(forward, inputs))
    with pytest.raises(Unsupported, match=re.escape(why)):
        plan_direct(graph, metas)
    assert not isinstance(plan_gemm(task(forward, inputs), arch="sm90"), DirectConv)


def _kernel(name: str, positions: int = 2) -> str:
    plan = plan_gemm(DIRECT_TASKS[name], arch="sm90")
    assert isinstance(plan, DirectConv)
    cuda, _ = direct_extension(plan, next(t for t in plan_tilings(plan) if getattr(t, "positions", 0) == positions))
    return cuda


def test_the_kernel_reads_the_filter_once_a_block_and_multiplies_in_float32() -> None:
    cuda = _kernel("conv3d-softmax-f32")
    assert "__shared__ __align__(16) float ws[1296];" in cuda  # 3 x 27 taps x 16 channels
    assert "__shared__ float bs[16];" in cuda and "acc[p][c] = bs[c]" in cuda
    assert "acc[p][c] = fmaf(xv[p], wv, acc[p][c]);" in cuda
    assert "__constant__" not in cuda and "tf32" not in cuda.lower()
    assert "#define KEVIN_FAST_MATH" not in cuda  # (a float32 output: the precise math)
    assert "kevin_maximum(" in cuda and "expf(" in cuda  # the softmax's max and exp in registers
    # an unpadded window whose positions divide evenly reads without a bound check; the host checks the strides
    assert "xv[p] = (true)" in cuda
    assert "in0.strides() == torch::IntArrayRef({49152, 16384, 1024, 32, 1})" in cuda
    assert "torch::empty_strided({128, 16, 14, 30, 30}, {201600, 12600, 900, 30, 1}" in cuda
    assert "if (blocks > 0) kevin_direct_conv<<<" in cuda  # (an empty batch launches nothing)


def test_padding_and_strides_bound_each_read_and_operands_broadcast_by_their_own_strides() -> None:
    cuda = _kernel("strided-relu-residual-bf16")
    assert "if ((unsigned)i0 >= 65u) continue;" in cuda  # the padded rows
    assert "((unsigned)il < 63u)" in cuda  # the padded columns
    assert "(ol + p) * 2 - 1" in cuda  # stride 2, padding 1
    assert "kevin_ld(p_in3, n * 25344LL + c * 1056LL + o0 * 32LL + (ol + p) * 1LL)" in cuda  # the residual, whole
    viewed = _kernel("viewed-bias-sigmoid-f32")
    assert "kevin_ld(p_in2, c * 1LL)" in viewed  # the (C,) bias viewed (C, 1, 1): one value per channel
    half = _kernel("channels-last-scale-mean-f16", positions=1)
    assert "#define KEVIN_FAST_MATH" not in half  # (16-bit outputs too: the precise math)
    # the channels-last input read in place (channels innermost), its outputs stored as eager lays them out
    assert "n * 4800LL + ci * 1LL + i0 * 120LL + il * 3LL" in half
    assert "std::vector<torch::Tensor> kevin_run" in half and half.count("kevin_st(p_out") == 2


def test_a_search_tries_the_direct_variants_first_then_the_implicit_gemm() -> None:
    source = DIRECT_TASKS["min-tanh-f32"]
    plan = plan_gemm(source, arch="sm90")
    assert isinstance(plan, DirectConv)
    history: list[tuple[str, float | None]] = []
    names = []
    for _ in range(4):
        choice, program, _ = gemm_turn(source, plan, 0, history)
        names.append(choice)
        history.append((choice, 1.0))
    assert [n.startswith("direct") for n in names] == [True, True, True, False]
    first = gemm_turn(source, plan, 0, [])[1]
    assert "kevin_direct_conv<<<" in first and "class ModelNew(KevinTaskParameters)" in first
    assert "self.get_parameter('conv.weight')" in first and "self.get_parameter('conv.bias')" in first


def test_a_plan_without_an_implicit_gemm_keeps_its_direct_variants_alone() -> None:
    # (a float32 value exponentiated after a float32 convolution: the implicit GEMM's 3xTF32 declines it)
    source = DIRECT_TASKS["conv3d-softmax-f32"]
    plan = plan_gemm(source, arch="sm90")
    assert not isinstance(plan, Declined)
    bare = DirectConv(**{**plan.__dict__, "fallback": None})
    assert all(isinstance(t, DirectTiling) for t in plan_tilings(bare))
    with pytest.raises(ValueError, match="without an implicit GEMM"):
        write_gemm_program(bare, plan_tilings(plan)[-1], task_source=source)


class _ConvReduce(__import__("torch").nn.Module):
    """A convolution (or a transposed one), then a min or a softmax over its channels (KernelBench
    level 2's habit)."""

    def __init__(self, c_in: int, softmax: bool, transposed: bool = False) -> None:
        import torch

        super().__init__()
        conv = torch.nn.ConvTranspose2d(c_in, 16, 3, stride=2) if transposed else torch.nn.Conv2d(c_in, 16, 3)
        self.conv, self.softmax = conv, softmax

    def forward(self, x):  # type: ignore[no-untyped-def]
        import torch

        y = self.conv(x)
        return torch.softmax(y, dim=1) if self.softmax else torch.tanh(torch.min(y, dim=1, keepdim=True)[0])


@pytest.mark.parametrize("transposed", [False, True])
@pytest.mark.parametrize("softmax", [False, True])
def test_a_compiled_models_reduction_over_a_direct_convolutions_channels_shares_its_partition(
        hopper_with_cutlass, softmax: bool, transposed: bool) -> None:  # type: ignore[no-untyped-def]
    import torch
    from conftest import builtin_partitions

    from kevin_backend.backend.task import extract_task

    def partitions(c_in: int) -> list:  # type: ignore[type-arg]
        return list(builtin_partitions(_ConvReduce(c_in, softmax, transposed), torch.randn(2, c_in, 12, 12)).partitions)

    (few,) = partitions(3)
    assert "aten.convolution.default" in few.ops
    reduction = "aten.amax.default" if softmax else "aten.min.dim"
    assert reduction in few.ops and ("aten.exp.default" if softmax else "aten.tanh.default") in few.ops, few.ops
    plan = plan_gemm(extract_task(few).source, arch="sm90")
    assert isinstance(plan, DirectConv) and len(plan.outputs) == 1, plan
    # (of 64 input channels, 576 values per output: the implicit GEMM's, which no reduction joins; its
    # transposed twin's too)
    many = partitions(64)
    assert any(reduction in p.ops for p in many) and not any(
        reduction in p.ops and "aten.convolution.default" in p.ops for p in many), [p.ops for p in many]


@pytest.mark.parametrize("name", sorted(__import__("level2_conv_tasks").LEVEL2))
def test_kernelbench_level2_convolutions_compile_to_direct_kernels_with_their_epilogues(
        hopper_with_cutlass, name: str) -> None:  # type: ignore[no-untyped-def]
    # a KernelBench level-2 problem compiled as a user's model: the partition holding its convolution
    # plans to the direct kernel with every op the partitioner gave it; poolings and norms over the
    # positions stay outside it (not declared, or other reductions)
    from conftest import builtin_partitions
    from level2_conv_tasks import LEVEL2

    from kevin_backend.backend.task import extract_task
    from kevin_backend.types import load_program

    source, inside, outside = LEVEL2[name]
    module = load_program(source, "kevin_level2_" + name.replace("-", "_"))
    model = module.Model(*module.get_init_inputs()).eval()
    plan = builtin_partitions(model, *(t[:2] for t in module.get_inputs()))
    convs = [p for p in plan.partitions if "aten.convolution.default" in p.ops]
    if not inside:  # (the convolution alone: left to Inductor, as too small a partition)
        assert not convs and any(o.node == "convolution" for o in plan.left_out), plan
        return
    (part,) = convs
    short = {op.split(".")[1] for op in part.ops if op.startswith("aten.")}
    assert inside <= short and not any(o in op for o in outside for op in part.ops), part.ops
    direct = plan_gemm(extract_task(part).source, arch="sm90")
    # (the implicit GEMM after it where its epilogue takes the ops: not a comparison, as a compiled
    # LeakyReLU or Mish has; the direct kernel takes any op of the writer's table), and no implicit GEMM of
    # a transposed convolution of 3 input channels (CUTLASS reads them 4 at a time) or of 3 dimensions
    no_gemm = ("conv2d-mish-mish", "conv2d-multiply-leakyrelu-gelu", "convtranspose2d-biasadd-clamp-scaling-clamp-divide",
               "convtranspose3d-scale-avgpool-biasadd-scale")
    assert isinstance(direct, DirectConv) and (direct.fallback is None) == (name in no_gemm), direct
    assert len(direct.outputs) == len(part.outputs)


def test_without_cutlass_a_gpu_still_gets_the_direct_convolution(monkeypatch: pytest.MonkeyPatch) -> None:
    # (CUTLASS's headers missing: the writer declares no matmul and no convolution an implicit GEMM
    # needs, but the direct kernel is plain CUDA for any GPU of compute capability 7.0 or later)
    import torch
    import torch.nn.functional as F
    from torch.fx.experimental.proxy_tensor import make_fx

    from kevin_backend.generate.builtin import builtin_policy, builtin_support
    from kevin_backend.generate.builtin.builtin_support import BuiltinSupport
    from kevin_backend.generate.policy import Sampling
    from kevin_backend.toolchain import cutlass_headers

    monkeypatch.delenv("KEVIN_CUTLASS_INCLUDE", raising=False)
    monkeypatch.setattr(cutlass_headers, "PACKAGE", "kevin-no-such-package")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (7, 5))
    assert not builtin_support.gemm_available() and builtin_support.direct_available()
    graph = make_fx(lambda x, w, v, u: (torch.relu(F.conv2d(x, w)), F.conv2d(v, u), torch.mm(x[0, 0], x[0, 1])))(
        torch.randn(1, 3, 4, 4), torch.randn(2, 3, 3, 3), torch.randn(1, 64, 4, 4), torch.randn(8, 64, 3, 3)).graph
    few, many, mm = [n for n in graph.nodes if n.target in (torch.ops.aten.convolution.default, torch.ops.aten.mm.default)]
    support = BuiltinSupport()
    assert support.supports(few) == (True, "")
    assert not support.supports(many)[0] and "CUTLASS's headers are not installed" in support.supports(many)[1]
    assert not support.supports(mm)[0]

    messages = [{"role": "user", "content": f"```python\n{DIRECT_TASKS['min-tanh-f32']}```"}]
    policy = builtin_policy.BuiltinPolicy()
    (reply,) = policy.generate([messages], Sampling())
    assert reply.finish_reason != "declined" and "kevin_direct_conv<<<" in reply.text and "cutlass" not in reply.text.lower()
    # every later turn a direct variant (the implicit GEMM's dropped), foreseen alike
    history = [(name, 1.0) for name in ("direct 128 threads x 2 positions", "direct 256 threads x 1 position",
                                        "direct 64 threads x 4 positions")]
    plan = builtin_policy._gemm_here(DIRECT_TASKS["min-tanh-f32"], (False, False))
    assert isinstance(plan, DirectConv) and plan.fallback is None
    assert gemm_turn(DIRECT_TASKS["min-tanh-f32"], plan, 0, history)[0].startswith("direct")
    assert all("cutlass" not in p.lower() for p in policy.foresee([messages], [()]))
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (6, 1))  # (no GPU it runs on: declined)
    (reply,) = policy.generate([messages], Sampling())
    assert reply.finish_reason == "declined"


def test_wide_outputs_take_fewer_positions_a_thread_first() -> None:
    # (16 channels: two positions first; 24 and 32: one first, at most two; the registers a thread holds)
    names = {name: [t.name for t in plan_tilings(plan_gemm(DIRECT_TASKS[name], arch="sm90")) if isinstance(t, DirectTiling)]
             for name in ("min-tanh-f32", "strided-relu-residual-bf16", "stem-bn-silu-bf16", "grouped-bn-relu-f32")}
    # (a grouped convolution's thread holds its group's 4 channels: four positions first, as on an H200)
    assert names.pop("grouped-bn-relu-f32") == ["direct 64 threads x 4 positions x 4 channels", "direct 128 threads x 2 positions x 4 channels",
                                                "direct 256 threads x 1 position x 4 channels"]
    assert names == {"min-tanh-f32": ["direct 128 threads x 2 positions", "direct 256 threads x 1 position", "direct 64 threads x 4 positions"],
                     "strided-relu-residual-bf16": ["direct 256 threads x 1 position", "direct 128 threads x 2 positions"],
                     "stem-bn-silu-bf16": ["direct 256 threads x 1 position", "direct 128 threads x 2 positions"]}, names


@pytest.mark.parametrize("reduce", [False, True])
def test_a_compiled_mobilenet_depthwise_block_is_one_direct_kernel(hopper_with_cutlass, reduce: bool) -> None:  # type: ignore[no-untyped-def]
    # MobileNet's depthwise 3x3 with its batch norm (eval) and ReLU6, compiled as a user's model: one
    # partition, the depthwise direct kernel with the whole epilogue (no implicit GEMM takes a grouped
    # convolution); a mean over its channels after it stays a partition of its own (a depthwise thread
    # holds a few channels), where a one-group convolution's would join it
    import torch
    from conftest import builtin_partitions

    from kevin_backend.backend.task import extract_task

    block = torch.nn.Sequential(torch.nn.Conv2d(32, 32, 3, padding=1, groups=32, bias=False), torch.nn.BatchNorm2d(32),
                                torch.nn.ReLU6()).eval()
    with torch.no_grad():
        block[1].running_mean.uniform_(-1, 1), block[1].running_var.uniform_(0.5, 2)
    model = torch.nn.Sequential(block, *([_ChannelMean()] if reduce else [])).eval()
    plan = builtin_partitions(model, torch.randn(2, 32, 12, 12))
    convs = [p for p in plan.partitions if "aten.convolution.default" in p.ops]
    (part,) = convs
    assert "aten.hardtanh.default" in part.ops or "aten.clamp_max.default" in part.ops or "aten.clamp.default" in part.ops, part.ops
    assert not any("mean" in op or "sum" in op for op in part.ops), part.ops
    direct = plan_gemm(extract_task(part).source, arch="sm90")
    assert isinstance(direct, DirectConv) and direct.depthwise and direct.fallback is None, direct
    assert [(t.positions, t.channels) for t in plan_tilings(direct)] == [(4, 8), (2, 8), (1, 8), (1, 4)]
    if reduce:
        assert any(any("mean" in op or "sum" in op for op in p.ops) for p in plan.partitions if p is not part), plan.partitions


class _ChannelMean(__import__("torch").nn.Module):
    def forward(self, x):  # type: ignore[no-untyped-def]
        return x.mean(1)


def test_a_depthwise_kernel_of_a_channels_last_input_runs_its_threads_along_the_channels() -> None:
    # a warp's threads take neighbouring channel blocks of one position where the channels are innermost in
    # memory (each thread's 8 the next ones), and neighbouring positions of one channel block otherwise
    last = _kernel("depthwise7x7-channels-last-bf16", positions=1)
    plain = _kernel("depthwise-bn-relu6-f32", positions=1)
    assert "const int c0 = (int)(t % 6) * CB; long long r = t / 6;" in last and "constexpr int CB = 8;" in last
    assert "const int ol = (int)(t % 15) * 1; long long r = t / 15;" in plain and "const int c0 = (int)(r % 4) * CB;" in plain
    assert "__shared__" not in last and "kevin_ld(p_in1, (c0 + c) * 49LL" in last  # (the filter words through the cache)


def test_a_compiled_resnext_grouped_block_is_one_direct_kernel(hopper_with_cutlass) -> None:  # type: ignore[no-untyped-def]
    # ResNeXt's grouped 3x3 (32 groups of 4 channels) with its batch norm (eval) and ReLU, compiled as a
    # user's model: one partition, the grouped direct kernel with the whole epilogue (CUTLASS's implicit
    # GEMM takes no grouped convolution), a thread holding its group's 4 output channels
    import torch
    from conftest import builtin_partitions

    from kevin_backend.backend.task import extract_task

    block = torch.nn.Sequential(torch.nn.Conv2d(128, 128, 3, padding=1, groups=32, bias=False), torch.nn.BatchNorm2d(128),
                                torch.nn.ReLU()).eval()
    with torch.no_grad():
        block[1].running_mean.uniform_(-1, 1), block[1].running_var.uniform_(0.5, 2)
    plan = builtin_partitions(block, torch.randn(2, 128, 10, 10))
    (part,) = [p for p in plan.partitions if "aten.convolution.default" in p.ops]
    assert "aten.relu.default" in part.ops, part.ops
    direct = plan_gemm(extract_task(part).source, arch="sm90")
    assert isinstance(direct, DirectConv) and direct.grouped and not direct.depthwise and direct.fallback is None, direct
    assert direct.groups == 32 and direct.channels == (4, 128) and direct.taps == 36
    assert [t.channels for t in plan_tilings(direct)] == [4, 4, 4]
    assert "grouped 2-D convolution 128 -> 128 channels in 32 groups" in direct.describe()


def test_a_grouped_kernel_reads_its_groups_input_channels_and_filter_words() -> None:
    # a thread's CB output channels from c0 on (its group's), the group's input channels from (c0 / CB) x
    # C_in / groups, the whole filter in shared memory (C_out x C_in / groups x window words) read at c0 + c
    cuda = _kernel("grouped-bn-relu-f32", positions=1)
    assert "constexpr int CB = 4;" in cuda and "__shared__ __align__(16) float ws[1152];" in cuda  # 32 x 4 x 3 x 3
    assert "const int c0 = (int)(r % 8) * CB; r /= 8;" in cuda
    assert "(c0 / CB * 4 + ci) * 143LL" in cuda and "for (int ci = 0; ci < 4; ++ci)" in cuda
    assert "const float wv = wt[(c0 + c)];" in cuda and "float acc[1][CB];" in cuda
    # (a block fills the whole filter once, then computes 8 rounds of its threads' outputs)
    assert "for (int round = 0; round < 8; ++round) {" in cuda and "const long long t = ((long long)blockIdx.x * 8 + round) * 256" in cuda
    assert "const long long blocks = (" in cuda and "+ 2047) / 2048;" in cuda
    assert "int round = 0" not in _kernel("depthwise-bn-relu6-f32", positions=1) + _kernel("conv3d-softmax-f32")
    multiplier = _kernel("grouped-multiplier-channels-last-bf16", positions=1)
    assert "constexpr int CB = 2;" in multiplier and "acc[p][c] = bs[c0 + c]" in multiplier
    # (a channels-last input: a warp's threads along the groups of one position, its reads and stores coalesced,
    # a group's 4 input channels read a vector at a time; a depthwise one's 8 read, and stored where the
    # output lies channels-last too)
    last = _kernel("grouped-channels-last-relu-bf16", positions=1)
    assert "kevin_ld4(p_in0, n * 2880LL + (c0 / CB * 4) * 1LL + i0 * 320LL + il * 32LL + 0, xs + 0);" in last
    assert "% 8 == 0" in last and "kevin_ld(p_in0" not in last  # (the input's start checked, no scalar read of it)
    depthwise = _kernel("depthwise7x7-channels-last-bf16", positions=1)
    assert "kevin_ld8(p_in0," in depthwise and "% 16 == 0" in depthwise
    stored = _kernel("depthwise-channels-last-out-f16", positions=1)  # (its output channels-last: 8 stored at once)
    assert "kevin_ld8(p_in0," in stored and "kevin_st8(p_out0, n * 4896LL + c0 * 1LL + o0 * 288LL + (ol + p) * 16LL + 0," in stored
    assert "kevin_ld4(p_in" not in _kernel("depthwise-bn-relu6-f32", positions=1)  # (a plain layout: one channel at a time)
    assert "const int c0 = (int)(t % 12) * CB; long long r = t / 12;" in multiplier
    assert "const int c0 = (int)(r % 8) * CB; r /= 8;" in cuda  # (a plain one: along the positions)


@pytest.mark.parametrize("name", sorted(__import__("level2_conv_tasks").PUBLISHED))
def test_more_level2_problems_are_planned_or_declined_with_the_reason(hopper_with_cutlass, name: str) -> None:  # type: ignore[no-untyped-def]
    # level-2 problems in the published set's habits (transposed 3-D convolutions of 32 -> 64 channels,
    # poolings, norms and reductions over other dimensions after the convolution, grouped convolutions),
    # compiled as a user's model (a batch of 2): the convolution's partition is the direct kernel's, or its
    # plan says why not, or the convolution is left to Inductor alone; none of them fails
    from conftest import builtin_partitions
    from level2_conv_tasks import PUBLISHED

    from kevin_backend.backend.task import extract_task
    from kevin_backend.generate.builtin.plan import Declined
    from kevin_backend.types import load_program

    source, outcome = PUBLISHED[name]
    module = load_program(source, "kevin_published_" + name.replace("-", "_"))
    model = module.Model(*module.get_init_inputs()).eval()
    plan = builtin_partitions(model, *(t[:2] for t in module.get_inputs()))
    convs = [p for p in plan.partitions if "aten.convolution.default" in p.ops]
    if outcome == "inductor":
        assert not convs and any(o.node == "convolution" for o in plan.left_out), plan
        return
    (part,) = convs
    planned = plan_gemm(extract_task(part).source, arch="sm90")
    if outcome == "direct":
        assert isinstance(planned, DirectConv), planned
    else:
        assert isinstance(planned, Declined) and outcome.removeprefix("declined: ") in planned.reason, planned


def test_a_depthwise_or_grouped_output_of_a_channels_last_input_is_written_channels_last() -> None:
    # eager on a GPU makes a channels-last input's convolution channels-last, while the meta tensors the
    # plan reads say plain: the kernel allocates its output channels-last, so that a warp along the channel
    # blocks stores consecutive vectors (MobileNetV2's depthwise 3x3 and ResNeXt's grouped 3x3, as the suite has them)
    import torch

    from kevin_backend.generate.builtin.gemm_suite import GEMM_SUITE

    suite = {t.name: t.source for t in GEMM_SUITE}
    for name, block, step in (("conv2d-depthwise-bn-relu6-bf16-64x144x56x56", 8, 144), ("conv2d-grouped-bn-relu-bf16-64x128x56x56", 4, 128)):
        plan = plan_gemm(suite[name], arch="sm90")
        assert isinstance(plan, DirectConv) and plan.blocked
        (out,) = plan.outputs
        assert out.stride == (56 * 56 * step, 1, 56 * step, step), out
        cuda, _ = direct_extension(plan, plan_tilings(plan)[0])
        assert f"kevin_st{block}(p_out0, n * {56 * 56 * step}LL + c0 * 1LL + o0 * {56 * step}LL + (ol + p) * {step}LL + 0," in cuda
        assert f"torch::empty_strided({{64, {step}, 56, 56}}, {{{56 * 56 * step}, 1, {56 * step}, {step}}}" in cuda
    # a plain input's keeps the plain layout, as does a 1-D one (eager keeps it plain) and a one-group convolution's
    for name in ("depthwise-bn-relu6-f32", "grouped1d-strided-silu-f16", "channels-last-scale-mean-f16"):
        plan = plan_gemm(DIRECT_TASKS[name], arch="sm90")
        assert isinstance(plan, DirectConv)
        assert all(o.stride == torch.empty(o.shape, device="meta").stride() for o in plan.outputs), (name, plan.outputs)
