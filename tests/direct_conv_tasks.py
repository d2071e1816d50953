"""Convolutions of few input channels with their epilogues, as the direct kernel takes them
(`direct_conv.py`): KernelBench level-2's habits (3 -> 16 channels, a bias, a min or softmax over the
channels) and what a compiled model hands on (a channels-last input, a parameter reshaped, the
input added back, a 1-D convolution padded and dilated). Shared by the CPU tests, the fast build's
test and the GPU test."""

from __future__ import annotations

from kevin_backend.generate.builtin.gemm_suite import GEMM_SUITE
from test_gemm_plan import task

F16, BF16 = "dtype=torch.float16", "dtype=torch.bfloat16"


def _suite(name: str) -> str:
    return next(t.source for t in GEMM_SUITE if t.name == name)


DIRECT_TASKS = {
    # the suite's KernelBench tasks: nn.Conv2d / nn.Conv3d parameters, a min over the channels then tanh
    # twice; a softmax over the channels of a 3-D convolution
    "min-tanh-f32": _suite("conv2d-min-tanh-f32-128x3x32x32"),
    "conv3d-softmax-f32": _suite("conv3d-softmax-f32-128x3x16x32x32"),
    # Mish twice (softplus, tanh, a product); a mobile network's bf16 stem, strided and padded, with its
    # inference batch norm (float32 statistics) and SiLU
    "mish-mish-f32": _suite("conv2d-mish-mish-f32-128x3x32x32"),
    "stem-bn-silu-bf16": _suite("conv2d-stem-bn-silu-bf16-32x3x224x224"),
    # strided and padded, bf16, a tensor of the output's size added after the activation
    "strided-relu-residual-bf16": task("torch.relu(F.conv2d(v[0], v[1], v[2], stride=2, padding=1)) + v[3]",
                                       f"torch.randn(16, 4, 65, 63, {BF16}), torch.randn(24, 4, 3, 3, {BF16}), "
                                       f"torch.randn(24, {BF16}), torch.randn(16, 24, 33, 32, {BF16})"),
    # a channels-last f16 input without a bias, scaled per channel by a (1, C, 1, 1) tensor, then the
    # mean over the channels kept and subtracted (two outputs: the value and the mean)
    "channels-last-scale-mean-f16": task("(lambda y: (y - y.mean(1, keepdim=True), y.mean(1)))"
                                         "(torch.tanh(F.conv2d(v[0], v[1]) * v[2]))",
                                         f"torch.randn(8, 3, 40, 40, {F16}).contiguous(memory_format=torch.channels_last), "
                                         f"torch.randn(16, 3, 5, 5, {F16}), torch.randn(1, 16, 1, 1, {F16})"),
    # a 1-D convolution padded and dilated, its max over the channels (no dimension kept), then GELU
    "conv1d-dilated-max-gelu-f32": task("F.gelu(F.conv1d(v[0], v[1], v[2], padding=2, dilation=2).amax(1))",
                                        "torch.randn(32, 8, 1000), torch.randn(32, 8, 3), torch.randn(32)"),
    # a compiled model's partition: the bias given as (C,) and viewed (C, 1, 1) in the graph (the view
    # before the convolution: its scale, of two tensors, then too)
    "viewed-bias-sigmoid-f32": task("(lambda b, s: torch.sigmoid(F.conv2d(v[0], v[1]) * s + b))"
                                    "(v[2].view(-1, 1, 1), v[3].view(-1, 1, 1) * v[3].view(-1, 1, 1))",
                                    "torch.randn(64, 3, 30, 30), torch.randn(16, 3, 3, 3), torch.randn(16), torch.randn(16)"),
    # transposed (gathered: a tap where its position divides by the stride): KernelBench's ConvTranspose2d
    # 3 -> 16, stride 2, padding 1, output padding 1, a bias parameter added, clamped, scaled
    "transpose2d-bias-clamp-f32": task("torch.clamp(F.conv_transpose2d(v[0], v[1], v[2], stride=2, padding=1, output_padding=1)"
                                       " + v[3], 0.0, 1.0) * 2.0",
                                       "torch.randn(32, 3, 16, 16), torch.randn(3, 16, 3, 3), torch.randn(16), torch.randn(16, 1, 1)"),
    # a 3-D one of a stride 1 and 2 by dimension, a tensor of the output's size added, then hardswish
    "transpose3d-add-hardswish-f32": task("F.hardswish(F.conv_transpose3d(v[0], v[1], stride=(1, 2, 1), padding=(1, 1, 0)) + v[2])",
                                          "torch.randn(2, 3, 5, 6, 7), torch.randn(3, 8, 3, 3, 3), torch.randn(2, 8, 5, 11, 9)"),
    # a 1-D bf16 one, stride 3 and dilated, its bias, then a softmax over the channels
    "transpose1d-dilated-softmax-bf16": task("torch.softmax(F.conv_transpose1d(v[0], v[1], v[2], stride=3, padding=2, dilation=2), dim=1)",
                                             f"torch.randn(4, 5, 50, {BF16}), torch.randn(5, 12, 4, {BF16}), torch.randn(12, {BF16})"),
    # depthwise (one channel a group): MobileNet's 3x3 with its inference batch norm and ReLU6; a ConvNeXt's
    # 7x7 of a channels-last bf16 input with its bias; a strided f16 one of 20 channels (4 a thread) with SiLU
    "depthwise-bn-relu6-f32": task("F.hardtanh((F.conv2d(v[0], v[1], padding=1, groups=32) - v[2]) * v[3] + v[4], 0.0, 6.0)",
                                   "torch.randn(4, 32, 14, 15), torch.randn(32, 1, 3, 3), torch.randn(32, 1, 1), "
                                   "torch.rand(32, 1, 1) + 0.5, torch.randn(32, 1, 1)"),
    "depthwise7x7-channels-last-bf16": task("F.conv2d(v[0], v[1], v[2], padding=3, groups=48)",
                                            f"torch.randn(2, 48, 14, 14, {BF16}).contiguous(memory_format=torch.channels_last), "
                                            f"torch.randn(48, 1, 7, 7, {BF16}), torch.randn(48, {BF16})"),
    "depthwise-strided-silu-f16": task("F.silu(F.conv2d(v[0], v[1], v[2], stride=2, padding=1, groups=20))",
                                       f"torch.randn(3, 20, 17, 16, {F16}), torch.randn(20, 1, 3, 3, {F16}), torch.randn(20, {F16})"),
    # grouped (a thread holds its group's output channels, reads its group's input channels): ResNeXt's
    # 3x3 of 8 groups of 4 channels with its inference batch norm and ReLU; a channels-last bf16 one whose
    # groups double their one input channel (a depth multiplier of 2) with a bias and GELU; a strided f16
    # 1-D one of 4 groups (6 -> 12 channels a group) with its bias and SiLU
    "grouped-bn-relu-f32": task("torch.relu((F.conv2d(v[0], v[1], padding=1, groups=8) - v[2]) * v[3] + v[4])",
                                "torch.randn(3, 32, 13, 11), torch.randn(32, 4, 3, 3), torch.randn(32, 1, 1), "
                                "torch.rand(32, 1, 1) + 0.5, torch.randn(32, 1, 1)"),
    "grouped-multiplier-channels-last-bf16": task("F.gelu(F.conv2d(v[0], v[1], v[2], padding=2, groups=12))",
                                                  f"torch.randn(2, 12, 15, 14, {BF16}).contiguous(memory_format=torch.channels_last), "
                                                  f"torch.randn(24, 1, 5, 5, {BF16}), torch.randn(24, {BF16})"),
    # ResNeXt's form channels-last in bf16: each thread's group's 4 input channels read at once, its 4 output
    # channels stored at once
    "grouped-channels-last-relu-bf16": task("torch.relu(F.conv2d(v[0], v[1], v[2], padding=1, groups=8))",
                                            f"torch.randn(2, 32, 9, 10, {BF16}).contiguous(memory_format=torch.channels_last), "
                                            f"torch.randn(32, 4, 3, 3, {BF16}), torch.randn(32, {BF16})"),
    # a depthwise one whose output is asked for channels-last as well: its 8 channels stored at once
    "depthwise-channels-last-out-f16": task("torch.relu(F.conv2d(v[0], v[1], v[2], padding=1, groups=16))"
                                            ".contiguous(memory_format=torch.channels_last)",
                                            f"torch.randn(2, 16, 17, 18, {F16}).contiguous(memory_format=torch.channels_last), "
                                            f"torch.randn(16, 1, 3, 3, {F16}), torch.randn(16, {F16})"),
    "grouped1d-strided-silu-f16": task("F.silu(F.conv1d(v[0], v[1], v[2], stride=2, padding=1, groups=4))",
                                       f"torch.randn(3, 24, 37, {F16}), torch.randn(48, 6, 3, {F16}), torch.randn(48, {F16})"),
}
