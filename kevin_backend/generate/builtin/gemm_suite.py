"""The GEMM-epilogue suite: KernelBench-format tasks whose time is in a matmul or a convolution
and the ops that follow it (issue 36), so that a writer of GEMM and convolution kernels with their
epilogues can be measured where level-2 problems and real models spend their time.

    for task in GEMM_SUITE: task.name, task.category, task.source

Each task's name ends in its dtype and its sizes (M x K x N for a GEMM: rows, reduced dimension,
columns; batch x channels x height x width for a convolution's input), and its Model's docstring
ends in a line `Output: SHAPE DTYPE` (several shapes for several outputs, each with its own dtype
where they differ), which `tests/test_gemm_suite.py` checks against the forward run on meta tensors.

Categories:
    `linear`       level-2 chains after an `nn.Linear` (the weight and bias are parameters, as in
                   KernelBench): activations, scales, bias adds, group and layer norms, row
                   reductions (sum, max, logsumexp), softmax; batch 128 x 1024 -> 512 as
                   published level-2 problems, larger ones, and odd sizes;
    `gemm`         large GEMMs whose weights are forward inputs, as a torch.compile partition hands
                   them over: 4096^3 and 8192^3 in bf16/f16, f32 where natural, M up to 16384, an
                   f32 -> bf16 cast before the GEMM (a prologue), awkward sizes (1000, 4097, 513);
    `conv`         conv1d/2d/3d and transposed convolutions with their epilogues (bias, activations,
                   group norm, softmax over the channels, min, a residual add): 3x3 on 128
                   channels at 32x32 with batch 128, KernelBench's 3 -> 16 channel problems (a
                   min, a softmax, Mish, LeakyReLU and GELU, per-channel parameters), a mobile
                   network's strided bf16 stem with its batch norm, a 1x1 convolution on a
                   channels-last input, ResNet layers with their batch norm, weights as
                   parameters and as inputs;
    `transformer`  blocks of real models: QKV with bias (three outputs), an MLP up projection with
                   GELU, a SiLU-gated MLP, a down projection with the residual add, a pre-norm
                   QKV, a GPT-2 MLP with its parameters, LM heads over 50257 classes (logits, and
                   cross-entropy); and what a compiled model in training hands on: the residual
                   stream with its float32 copy, the pre-activation beside its GELU, a backward
                   matmul summed with two gradients;
    `attention`    batched matmuls of attention shapes: scores and softmax, the whole softmax(QK^T)V,
                   baddbmm with a scale, ViT's 197 tokens.

dtypes f32, f16 and bf16; inputs are made on the CPU the way published KernelBench problems make
them (the judge moves them to the GPU).
"""

from __future__ import annotations

from kevin_backend.generate.builtin.suite import SuiteTask, kernelbench_program

__all__ = ["GEMM_SUITE", "CATEGORIES"]

CATEGORIES = ("linear", "gemm", "conv", "transformer", "attention")

_TORCH_DTYPE = {"f32": "torch.float32", "f16": "torch.float16", "bf16": "torch.bfloat16"}


def _t(name: str, category: str, doc: str, out: str, sizes: dict[str, int | str], body: str,
       inputs: list[tuple[str, str]], init: tuple[str, str, str] = ("", "", "")) -> SuiteTask:
    assert category in CATEGORIES, category
    return SuiteTask(name, category, kernelbench_program(f"{doc}\n    Output: {out}", sizes, body, inputs, init))


def _randn(dims: str, dt: str) -> str:
    return f"torch.randn({dims})" if dt == "f32" else f"torch.randn({dims}, dtype={_TORCH_DTYPE[dt]})"


def _dtype_arg(dt: str) -> str:
    return "" if dt == "f32" else f", dtype={_TORCH_DTYPE[dt]}"


def _linear(name: str, doc: str, out: str, dt: str, rows: int, k: int, n: int, body: str,
            extra_init: str = "", extra_params: str = "", extra_values: str = "",
            extra_sizes: dict[str, int | str] | None = None) -> SuiteTask:
    """A level-2 chain: `self.gemm = nn.Linear(in_features, out_features)` in `dt`, then `body`
    (of `x`, the GEMM's output after `x = self.gemm(x)`)."""
    params = "in_features, out_features" + (f", {extra_params}" if extra_params else "")
    init = (params, f"self.gemm = nn.Linear(in_features, out_features{_dtype_arg(dt)})\n{extra_init}",
            "in_features, out_features" + (f", {extra_values}" if extra_values else ""))
    sizes = {"batch_size": rows, "in_features": k, "out_features": n, **(extra_sizes or {})}
    return _t(name, "linear", doc, out, sizes, "x = self.gemm(x)\n" + body.strip(),
              [("x", _randn("batch_size, in_features", dt))], init)


def _mm(name: str, doc: str, out: str, dt: str, m: int, k: int, n: int, body: str,
        extra: list[tuple[str, str]] | None = None, category: str = "gemm") -> SuiteTask:
    """A GEMM whose operands are forward inputs: `a` [M, K], `b` [K, N], then whatever `extra` adds."""
    return _t(name, category, doc, out, {"M": m, "K": k, "N": n}, body,
              [("a", _randn("M, K", dt)), ("b", _randn("K, N", dt)), *(extra or [])])


def _fc(name: str, doc: str, out: str, dt: str, sizes: dict[str, int | str], body: str, x: str, weights: list[tuple[str, str]]) -> SuiteTask:
    """A transformer block's projection: activations `x` and weights in nn.Linear's [out, in]
    layout as forward inputs."""
    return _t(name, "transformer", doc, out, sizes, body, [("x", _randn(x, dt)), *((w, _randn(s, dt)) for w, s in weights)])


_L2 = (128, 1024, 512)  # batch 128, 1024 -> 512: published level-2 GEMM problems' sizes

LINEAR: tuple[SuiteTask, ...] = (
    _linear("linear-gelu-f32-128x1024x512", "Linear, then GELU.", "[128, 512] float32", "f32", *_L2, "return F.gelu(x)"),
    _linear("linear-relu-scale-f32-128x1024x512", "Linear, ReLU, then a scale.", "[128, 512] float32", "f32", *_L2,
            "return torch.relu(x) * self.scaling_factor", "self.scaling_factor = scaling_factor",
            "scaling_factor", "scaling_factor", {"scaling_factor": 0.5}),
    _linear("linear-sigmoid-sum-f32-128x1024x512", "Linear, sigmoid, then the sum of each row.",
            "[128, 1] float32", "f32", *_L2, "return torch.sigmoid(x).sum(dim=1, keepdim=True)"),
    _linear("linear-max-sub-gelu-f32-128x1024x512",
            "Linear, the max of each row, less the mean of those maxima, then GELU.", "[128, 1] float32", "f32", *_L2,
            "x = torch.max(x, dim=1, keepdim=True).values\nx = x - x.mean(dim=1, keepdim=True)\nreturn F.gelu(x)"),
    _linear("linear-bias-swish-scale-f16-1024x4096x4096", "Linear, a bias parameter added, swish, then a scale.",
            "[1024, 4096] float16", "f16", 1024, 4096, 4096,
            "x = x + self.bias\nreturn x * torch.sigmoid(x) * 2.0",
            "self.bias = nn.Parameter(torch.randn(bias_shape, dtype=torch.float16))", "bias_shape", "bias_shape",
            {"bias_shape": "(out_features,)"}),
    _linear("linear-softmax-f16-512x4096x8192", "Linear, then softmax over each row.", "[512, 8192] float16", "f16",
            512, 4096, 8192, "return torch.softmax(x, dim=1)"),
    _linear("linear-logsumexp-bf16-2048x4096x4096", "Linear, then the logsumexp of each row.", "[2048, 1] bfloat16",
            "bf16", 2048, 4096, 4096, "return torch.logsumexp(x, dim=1, keepdim=True)"),
    _linear("linear-groupnorm-hardtanh-f32-128x1024x512", "Linear, group norm (8 groups), then hardtanh.",
            "[128, 512] float32", "f32", *_L2, "return F.hardtanh(self.group_norm(x), min_val=-2.0, max_val=2.0)",
            "self.group_norm = nn.GroupNorm(num_groups, out_features)", "num_groups", "num_groups", {"num_groups": 8}),
    _linear("linear-layernorm-gelu-bf16-4096x1024x4096", "Linear, layer norm over the features, then GELU.",
            "[4096, 4096] bfloat16", "bf16", 4096, 1024, 4096, "return F.gelu(self.norm(x))",
            "self.norm = nn.LayerNorm(out_features, dtype=torch.bfloat16)"),
    _linear("linear-tanh-residual-f32-1000x999x777", "Linear on odd sizes, tanh, then a scaled copy of itself added.",
            "[1000, 777] float32", "f32", 1000, 999, 777, "return torch.tanh(x) + x * 0.1"),
)

GEMM: tuple[SuiteTask, ...] = (
    _t("mm-bias-gelu-bf16-4096x4096x4096", "gemm", "x @ weight^T + bias (weight in nn.Linear's layout), then GELU.",
       "[4096, 4096] bfloat16", {"M": 4096, "K": 4096, "N": 4096}, "F.gelu(F.linear(x, weight, bias))",
       [("x", _randn("M, K", "bf16")), ("weight", _randn("N, K", "bf16")), ("bias", _randn("N", "bf16"))]),
    _mm("mm-relu-f16-8192x8192x8192", "A @ B, then ReLU.", "[8192, 8192] float16", "f16", 8192, 8192, 8192,
        "torch.relu(a @ b)"),
    _mm("mm-scale-residual-bf16-8192x8192x8192", "A @ B scaled, plus a residual.", "[8192, 8192] bfloat16", "bf16",
        8192, 8192, 8192, "torch.matmul(a, b) * 0.5 + c", [("c", _randn("M, N", "bf16"))]),
    _mm("mm-rowsum-f32-4096x4096x4096", "A @ B, then the sum of each row (in f32).", "[4096] float32", "f32",
        4096, 4096, 4096, "torch.mm(a, b).sum(dim=-1)"),
    _t("addmm-silu-f16-16384x1024x4096", "gemm", "bias + x @ w (addmm), then SiLU.", "[16384, 4096] float16",
       {"M": 16384, "K": 1024, "N": 4096}, "F.silu(torch.addmm(bias, x, w))",
       [("bias", _randn("N", "f16")), ("x", _randn("M, K", "f16")), ("w", _randn("K, N", "f16"))]),
    _t("mm-bias-tanh-bf16-1000x513x4097", "gemm", "Awkward sizes (no dimension a multiple of 8): x @ weight^T + bias, then tanh.",
       "[1000, 4097] bfloat16", {"M": 1000, "K": 513, "N": 4097}, "torch.tanh(F.linear(x, weight, bias))",
       [("x", _randn("M, K", "bf16")), ("weight", _randn("N, K", "bf16")), ("bias", _randn("N", "bf16"))]),
    _mm("mm-softmax-f32-2048x1024x2048", "A @ B, then softmax over each row.", "[2048, 2048] float32", "f32",
        2048, 1024, 2048, "torch.softmax(a @ b, dim=-1)"),
    _t("mm-cast-prologue-bf16-4096x4096x4096", "gemm", "An f32 activation cast to bf16 (a prologue), times a bf16 weight, then ReLU squared.",
       "[4096, 4096] bfloat16", {"M": 4096, "K": 4096, "N": 4096}, "torch.relu(x.to(torch.bfloat16) @ w) ** 2",
       [("x", _randn("M, K", "f32")), ("w", _randn("K, N", "bf16"))]),
    _mm("mm-bias-rows-f16-512x16384x512", "A long reduction (K = 16384): A @ B plus a column of biases, one per row.",
        "[512, 512] float16", "f16", 512, 16384, 512, "a @ b + c", [("c", _randn("M, 1", "f16"))]),
)

def _norm_inputs(dt: str, channels_last: bool) -> list[tuple[str, str]]:
    """A convolution's input and 3x3 filter (channels-last, as a model moved to that layout has
    both) and its inference batch norm as a compiled model hands it on: the running mean and
    reciprocal deviation in float32, the weight and bias in `dt`, each C x 1 x 1."""
    layout = ".contiguous(memory_format=torch.channels_last)" if channels_last else ""
    return [("x", _randn("batch_size, channels, height, width", dt) + layout), ("weight", _randn("channels, channels, 3, 3", dt) + layout),
            ("mean", _randn("channels, 1, 1", "f32")), ("invstd", "torch.rand(channels, 1, 1) + 0.5"),
            ("gamma", _randn("channels, 1, 1", dt)), ("beta", _randn("channels, 1, 1", dt))]


_CONV = {"batch_size": 128, "in_channels": 128, "out_channels": 128, "height": 32, "width": 32, "kernel_size": 3}
_CONV_INIT = "in_channels, out_channels, kernel_size"


def _conv(name: str, doc: str, out: str, dt: str, sizes: dict[str, int | str], layer: str, body: str,
          x: str = "batch_size, in_channels, height, width", extra_init: str = "", extra_params: str = "",
          made: str = "") -> SuiteTask:
    """A convolution layer (`self.conv = nn.<layer>(in_channels, out_channels, kernel_size<...>)` in
    `dt`) then `body` of `x`, the convolution's output."""
    init = (_CONV_INIT + (f", {extra_params}" if extra_params else ""),
            f"self.conv = nn.{layer}{_dtype_arg(dt)})\n{extra_init}", _CONV_INIT + (f", {extra_params}" if extra_params else ""))
    return _t(name, "conv", doc, out, sizes, "x = self.conv(x)\n" + body.strip(), [("x", made or _randn(x, dt))], init)


CONV: tuple[SuiteTask, ...] = (
    _conv("conv2d-relu-bias-f32-128x128x32x32", "Conv2d 3x3 (padding 1), ReLU, then a per-channel bias parameter added.",
          "[128, 128, 32, 32] float32", "f32", {**_CONV, "bias_shape": "(out_channels, 1, 1)"},
          "Conv2d(in_channels, out_channels, kernel_size, padding=1", "return torch.relu(x) + self.bias",
          extra_init="self.bias = nn.Parameter(torch.randn(bias_shape))", extra_params="bias_shape"),
    _conv("conv2d-groupnorm-scale-f32-128x128x32x32", "Conv2d 3x3 (padding 1), group norm (8 groups), then a scale.",
          "[128, 128, 32, 32] float32", "f32", {**_CONV, "num_groups": 8},
          "Conv2d(in_channels, out_channels, kernel_size, padding=1", "return self.group_norm(x) * 2.0",
          extra_init="self.group_norm = nn.GroupNorm(num_groups, out_channels)", extra_params="num_groups"),
    _conv("conv2d-hardswish-f16-128x128x32x32", "Conv2d 3x3 (padding 1) in f16, then HardSwish.",
          "[128, 128, 32, 32] float16", "f16", _CONV, "Conv2d(in_channels, out_channels, kernel_size, padding=1",
          "return F.hardswish(x)"),
    _conv("conv2d-min-tanh-f32-128x3x32x32", "KernelBench's small convolution: Conv2d 3 -> 16 channels, the min over the "
          "channels, then tanh twice.", "[128, 1, 30, 30] float32", "f32",
          {**_CONV, "in_channels": 3, "out_channels": 16}, "Conv2d(in_channels, out_channels, kernel_size",
          "x = torch.min(x, dim=1, keepdim=True)[0]\nreturn torch.tanh(torch.tanh(x))"),
    _conv("conv2d-1x1-relu-channels-last-bf16-64x256x56x56", "A 1x1 convolution (256 -> 512) of a channels-last input, "
          "then ReLU.", "[64, 512, 56, 56] bfloat16", "bf16",
          {"batch_size": 64, "in_channels": 256, "out_channels": 512, "height": 56, "width": 56, "kernel_size": 1},
          "Conv2d(in_channels, out_channels, kernel_size", "return torch.relu(x)",
          made=_randn("batch_size, in_channels, height, width", "bf16") + ".contiguous(memory_format=torch.channels_last)"),
    _conv("conv2d-3x3-relu-channels-last-bf16-32x128x56x56", "A ResNet block's 3x3 convolution (128 -> 128, padding 1) of a "
          "channels-last input, then ReLU.", "[32, 128, 56, 56] bfloat16", "bf16",
          {"batch_size": 32, "in_channels": 128, "out_channels": 128, "height": 56, "width": 56, "kernel_size": 3},
          "Conv2d(in_channels, out_channels, kernel_size, padding=1", "return torch.relu(x)",
          made=_randn("batch_size, in_channels, height, width", "bf16") + ".contiguous(memory_format=torch.channels_last)"),
    _conv("conv-transpose2d-sigmoid-scale-f32-128x64x16x16", "ConvTranspose2d 4x4 (stride 2, padding 1: 16x16 -> 32x32), "
          "sigmoid, then a scale.", "[128, 32, 32, 32] float32", "f32",
          {"batch_size": 128, "in_channels": 64, "out_channels": 32, "height": 16, "width": 16, "kernel_size": 4},
          "ConvTranspose2d(in_channels, out_channels, kernel_size, stride=2, padding=1",
          "return torch.sigmoid(x) * 2.0"),
    _conv("conv-transpose3d-add-hardswish-f32-16x32x16x32x32", "ConvTranspose3d 3x3x3 (stride 2), an input added, then "
          "x * hardswish(x).", "[16, 16, 32, 64, 64] float32", "f32",
          {"batch_size": 16, "in_channels": 32, "out_channels": 16, "depth": 16, "height": 32, "width": 32, "kernel_size": 3},
          "ConvTranspose3d(in_channels, out_channels, kernel_size, stride=2, padding=1, output_padding=1",
          "return x * F.hardswish(x)", x="batch_size, in_channels, depth, height, width"),
    _conv("conv3d-softmax-f32-128x3x16x32x32", "Conv3d 3 -> 16 channels, then softmax over the channels.",
          "[128, 16, 14, 30, 30] float32", "f32",
          {"batch_size": 128, "in_channels": 3, "out_channels": 16, "depth": 16, "height": 32, "width": 32, "kernel_size": 3},
          "Conv3d(in_channels, out_channels, kernel_size", "return torch.softmax(x, dim=1)",
          x="batch_size, in_channels, depth, height, width"),
    # KernelBench level 2's habit: a 3 -> 16 convolution of 128 images of 32x32, then activations and
    # per-channel parameters; and a mobile network's stem (a strided 3 -> 32 convolution of 224x224
    # bf16 images, its inference batch norm and SiLU): the direct kernel's (`direct_conv.py`)
    _conv("conv2d-relu-biasadd-f32-128x3x32x32", "Conv2d 3 -> 16 channels, ReLU, then a per-channel bias parameter added.",
          "[128, 16, 30, 30] float32", "f32", {**_CONV, "in_channels": 3, "out_channels": 16, "bias_shape": "(out_channels, 1, 1)"},
          "Conv2d(in_channels, out_channels, kernel_size", "return torch.relu(x) + self.bias",
          extra_init="self.bias = nn.Parameter(torch.randn(bias_shape))", extra_params="bias_shape"),
    _conv("conv2d-mish-mish-f32-128x3x32x32", "Conv2d 3 -> 16 channels, then Mish twice.", "[128, 16, 30, 30] float32", "f32",
          {**_CONV, "in_channels": 3, "out_channels": 16}, "Conv2d(in_channels, out_channels, kernel_size", "return F.mish(F.mish(x))"),
    _conv("conv2d-multiply-leakyrelu-gelu-f32-128x3x32x32", "Conv2d 3 -> 16 channels, times a per-channel multiplier parameter, "
          "LeakyReLU, then GELU.", "[128, 16, 30, 30] float32", "f32",
          {**_CONV, "in_channels": 3, "out_channels": 16, "multiplier_shape": "(out_channels, 1, 1)"},
          "Conv2d(in_channels, out_channels, kernel_size", "return F.gelu(F.leaky_relu(x * self.multiplier))",
          extra_init="self.multiplier = nn.Parameter(torch.randn(multiplier_shape))", extra_params="multiplier_shape"),
    _t("conv2d-stem-bn-silu-bf16-32x3x224x224", "conv", "A mobile network's stem: a 3x3 convolution (3 -> 32, stride 2, padding 1) "
       "of bf16 images, its inference batch norm, then SiLU.", "[32, 32, 112, 112] bfloat16",
       {"batch_size": 32, "height": 224, "width": 224},
       "y = F.conv2d(x, weight, stride=2, padding=1)\nreturn F.silu(((y - mean) * invstd * gamma + beta).to(torch.bfloat16))",
       [("x", _randn("batch_size, 3, height, width", "bf16")), ("weight", _randn("32, 3, 3, 3", "bf16")),
        ("mean", _randn("32, 1, 1", "f32")), ("invstd", "torch.rand(32, 1, 1) + 0.5"), ("gamma", _randn("32, 1, 1", "bf16")),
        ("beta", _randn("32, 1, 1", "bf16"))]),
    # MobileNetV2's depthwise 3x3 of an expanded stage (144 channels at 56x56, channels-last bf16) with its
    # inference batch norm and ReLU6: the direct kernel's depthwise form
    _t("conv2d-depthwise-bn-relu6-bf16-64x144x56x56", "conv", "MobileNetV2's depthwise 3x3 convolution (144 channels, "
       "padding 1) of channels-last bf16 activations, its inference batch norm, then ReLU6.", "[64, 144, 56, 56] bfloat16",
       {"batch_size": 64, "channels": 144, "height": 56, "width": 56},
       "y = F.conv2d(x, weight, padding=1, groups=channels)\nreturn F.hardtanh((y - mean) * scale + shift, 0.0, 6.0)",
       [("x", _randn("batch_size, channels, height, width", "bf16") + ".contiguous(memory_format=torch.channels_last)"),
        ("weight", _randn("channels, 1, 3, 3", "bf16")), ("mean", _randn("channels, 1, 1", "bf16")),
        ("scale", "torch.rand(channels, 1, 1, dtype=torch.bfloat16) + 0.5"), ("shift", _randn("channels, 1, 1", "bf16"))]),
    # ResNeXt-50's grouped 3x3 of its first stage (32 groups of 4 channels at 56x56, channels-last bf16) with
    # its inference batch norm and ReLU: the direct kernel's grouped form
    _t("conv2d-grouped-bn-relu-bf16-64x128x56x56", "conv", "ResNeXt-50's grouped 3x3 convolution (128 channels in 32 groups, "
       "padding 1) of channels-last bf16 activations, its inference batch norm, then ReLU.", "[64, 128, 56, 56] bfloat16",
       {"batch_size": 64, "channels": 128, "groups": 32, "height": 56, "width": 56},
       "y = F.conv2d(x, weight, padding=1, groups=groups)\nreturn torch.relu((y - mean) * scale + shift)",
       [("x", _randn("batch_size, channels, height, width", "bf16") + ".contiguous(memory_format=torch.channels_last)"),
        ("weight", _randn("channels, channels // groups, 3, 3", "bf16")), ("mean", _randn("channels, 1, 1", "bf16")),
        ("scale", "torch.rand(channels, 1, 1, dtype=torch.bfloat16) + 0.5"), ("shift", _randn("channels, 1, 1", "bf16"))]),
    # KernelBench's ConvTranspose2d of 3 -> 16 channels with its bias, clamps and scaling: the direct
    # kernel's transposed form (CUTLASS reads channels 4 at a time)
    _conv("conv-transpose2d-biasadd-clamp-f32-128x3x32x32", "KernelBench's ConvTranspose2d 3 -> 16 channels (3x3, stride 2, "
          "padding 1, output padding 1: 32x32 -> 64x64), a per-channel bias parameter added, clamped to [0, 1], scaled by 2, "
          "clamped, then divided by 2.", "[128, 16, 64, 64] float32", "f32",
          {**_CONV, "in_channels": 3, "out_channels": 16, "bias_shape": "(out_channels, 1, 1)"},
          "ConvTranspose2d(in_channels, out_channels, kernel_size, stride=2, padding=1, output_padding=1",
          "x = torch.clamp(x + self.bias, min=0.0, max=1.0)\nx = torch.clamp(x * 2.0, min=0.0, max=1.0)\nreturn x / 2.0",
          extra_init="self.bias = nn.Parameter(torch.randn(bias_shape))", extra_params="bias_shape"),
    _conv("conv1d-gelu-f16-64x512x1024", "Conv1d 3 (padding 1) over a sequence of 1024, 512 -> 512 channels, then GELU.",
          "[64, 512, 1024] float16", "f16",
          {"batch_size": 64, "in_channels": 512, "out_channels": 512, "length": 1024, "kernel_size": 3},
          "Conv1d(in_channels, out_channels, kernel_size, padding=1", "return F.gelu(x)", x="batch_size, in_channels, length"),
    _t("conv2d-silu-residual-bf16-32x256x64x64", "conv", "F.conv2d 3x3 (padding 1) with its weight and bias as inputs, "
       "SiLU, then the residual added.", "[32, 256, 64, 64] bfloat16",
       {"batch_size": 32, "channels": 256, "height": 64, "width": 64},
       "return F.silu(F.conv2d(x, weight, bias, padding=1)) + x",
       [("x", _randn("batch_size, channels, height, width", "bf16")), ("weight", _randn("channels, channels, 3, 3", "bf16")),
        ("bias", _randn("channels", "bf16"))]),
    # a ResNet's convolution with its inference batch norm as a compiled model hands it on (the
    # running mean and reciprocal deviation in float32, made by a kernel before; the norm's weight
    # and bias C x 1 x 1), then ReLU; the block's end with its input added back; a plain f16 one
    _t("conv2d-bn-relu-channels-last-bf16-64x256x28x28", "conv", "A ResNet layer's 3x3 convolution (256 -> 256, padding 1) "
       "of a channels-last model, its inference batch norm, then ReLU.", "[64, 256, 28, 28] bfloat16",
       {"batch_size": 64, "channels": 256, "height": 28, "width": 28},
       "y = F.conv2d(x, weight, padding=1)\nreturn torch.relu(((y - mean) * invstd * gamma + beta).to(torch.bfloat16))",
       _norm_inputs("bf16", channels_last=True)),
    _t("conv2d-bn-add-relu-channels-last-bf16-64x128x56x56", "conv", "A ResNet block's end: 3x3 convolution (128 -> 128, "
       "padding 1) of a channels-last model, its inference batch norm, the block's input added, then ReLU.",
       "[64, 128, 56, 56] bfloat16", {"batch_size": 64, "channels": 128, "height": 56, "width": 56},
       "y = F.conv2d(x, weight, padding=1)\nreturn torch.relu(((y - mean) * invstd * gamma + beta).to(torch.bfloat16) + x)",
       _norm_inputs("bf16", channels_last=True)),
    _t("conv2d-bn-relu-f16-64x256x28x28", "conv", "A 3x3 convolution (256 -> 256, padding 1) of a plain f16 model, its "
       "inference batch norm, then ReLU.", "[64, 256, 28, 28] float16",
       {"batch_size": 64, "channels": 256, "height": 28, "width": 28},
       "y = F.conv2d(x, weight, padding=1)\nreturn torch.relu(((y - mean) * invstd * gamma + beta).to(torch.float16))",
       _norm_inputs("f16", channels_last=False)),
)

TRANSFORMER: tuple[SuiteTask, ...] = (
    _fc("qkv-bias-bf16-8192x4096x12288", "The QKV projection with bias, split into queries, keys and values.",
        "([8, 1024, 4096], [8, 1024, 4096], [8, 1024, 4096]) bfloat16",
        "bf16", {"batch_size": 8, "seq_len": 1024, "hidden": 4096},
        "q, k, v = F.linear(x, w_qkv, b_qkv).chunk(3, dim=-1)\nreturn q, k, v", "batch_size, seq_len, hidden",
        [("w_qkv", "3 * hidden, hidden"), ("b_qkv", "3 * hidden")]),
    _fc("mlp-up-gelu-f16-8192x768x3072", "GPT-2's MLP up projection with bias, then tanh GELU.",
        "[8, 1024, 3072] float16", "f16", {"batch_size": 8, "seq_len": 1024, "hidden": 768, "ffn": 3072},
        "F.gelu(F.linear(x, w_fc, b_fc), approximate='tanh')", "batch_size, seq_len, hidden",
        [("w_fc", "ffn, hidden"), ("b_fc", "ffn")]),
    _fc("swiglu-mlp-bf16-8192x4096x11008", "LLaMA's SiLU-gated MLP up: silu(x @ W_gate^T) * (x @ W_up^T).",
        "[4, 2048, 11008] bfloat16", "bf16", {"batch_size": 4, "seq_len": 2048, "hidden": 4096, "ffn": 11008},
        "F.silu(F.linear(x, w_gate)) * F.linear(x, w_up)", "batch_size, seq_len, hidden",
        [("w_gate", "ffn, hidden"), ("w_up", "ffn, hidden")]),
    _t("down-proj-residual-bf16-8192x11008x4096", "transformer", "LLaMA's MLP down projection, then the residual add.",
       "[4, 2048, 4096] bfloat16", {"batch_size": 4, "seq_len": 2048, "hidden": 4096, "ffn": 11008},
       "residual + F.linear(h, w_down)",
       [("h", _randn("batch_size, seq_len, ffn", "bf16")), ("w_down", _randn("hidden, ffn", "bf16")),
        ("residual", _randn("batch_size, seq_len, hidden", "bf16"))]),
    _fc("prenorm-qkv-f16-4096x1024x3072", "A pre-norm block's layer norm (a prologue), then the QKV projection with bias.",
        "[4, 1024, 3072] float16", "f16", {"batch_size": 4, "seq_len": 1024, "hidden": 1024},
        "F.linear(F.layer_norm(x, (hidden,), ln_w, ln_b), w_qkv, b_qkv)", "batch_size, seq_len, hidden",
        [("ln_w", "hidden"), ("ln_b", "hidden"), ("w_qkv", "3 * hidden, hidden"), ("b_qkv", "3 * hidden")]),
    _t("gpt2-mlp-f32-2048x768x3072", "transformer", "GPT-2's whole MLP with its parameters: up (768 -> 3072), tanh GELU, "
       "down (3072 -> 768).", "[2, 1024, 768] float32",
       {"batch_size": 2, "seq_len": 1024, "hidden": 768, "ffn": 3072},
       "return self.down(F.gelu(self.up(x), approximate='tanh'))",
       [("x", _randn("batch_size, seq_len, hidden", "f32"))],
       ("hidden, ffn", "self.up = nn.Linear(hidden, ffn)\nself.down = nn.Linear(ffn, hidden)", "hidden, ffn")),
    _fc("lm-head-f16-4096x768x50257", "GPT-2's LM head: the logits over a vocabulary of 50257 (odd) classes.",
        "[4096, 50257] float16", "f16", {"tokens": 4096, "hidden": 768, "vocab": 50257}, "F.linear(x, w_vocab)",
        "tokens, hidden", [("w_vocab", "vocab, hidden")]),
    # partitions a compiled GPT-2 in training hands on: the attention's output projection with the
    # residual stream and its float32 copy for the next norm; the MLP's pre-activation saved for the
    # backward pass beside its GELU; a backward matmul summed with two gradients of its size
    _t("stream-residual-float-bf16-8192x768x768", "transformer", "GPT-2's attention output projection with bias, the "
       "residual stream added, returned with its float32 copy (what the next layer norm reads).",
       "([8, 1024, 768] bfloat16, [8, 1024, 768] float32)", {"batch_size": 8, "seq_len": 1024, "hidden": 768},
       "h = F.linear(a, w_proj, b_proj) + residual\nreturn h, h.float()",
       [("a", _randn("batch_size, seq_len, hidden", "bf16")), ("w_proj", _randn("hidden, hidden", "bf16")),
        ("b_proj", _randn("hidden", "bf16")), ("residual", _randn("batch_size, seq_len, hidden", "bf16"))]),
    _t("mlp-up-pre-activation-gelu-bf16-8192x768x3072", "transformer", "GPT-2's MLP up projection in training: the "
       "pre-activation (saved for the backward pass) and its tanh GELU.", "([8, 1024, 3072], [8, 1024, 3072]) bfloat16",
       {"batch_size": 8, "seq_len": 1024, "hidden": 768, "ffn": 3072},
       "y = F.linear(x, w_fc, b_fc)\nreturn y, F.gelu(y, approximate='tanh')",
       [("x", _randn("batch_size, seq_len, hidden", "bf16")), ("w_fc", _randn("ffn, hidden", "bf16")),
        ("b_fc", _randn("ffn", "bf16"))]),
    _t("backward-two-gradients-bf16-8192x3072x768", "transformer", "A backward pass's input gradient of GPT-2's MLP "
       "down projection (its weight K x N), summed with two other gradients of its size.", "[8, 1024, 768] bfloat16",
       {"batch_size": 8, "seq_len": 1024, "hidden": 768, "ffn": 3072},
       "return grad_a + (torch.matmul(grad_h, w_down) + grad_b)",
       [("grad_h", _randn("batch_size, seq_len, ffn", "bf16")), ("w_down", _randn("ffn, hidden", "bf16")),
        ("grad_a", _randn("batch_size, seq_len, hidden", "bf16")), ("grad_b", _randn("batch_size, seq_len, hidden", "bf16"))]),
    _t("lm-head-cross-entropy-bf16-8192x768x50257", "transformer", "The LM head and its cross-entropy loss: logits over "
       "50257 classes in bf16, the loss in f32 against int64 targets.", "[] float32",
       {"tokens": 8192, "hidden": 768, "vocab": 50257}, "F.cross_entropy(F.linear(x, w_vocab).float(), targets)",
       [("x", _randn("tokens, hidden", "bf16")), ("w_vocab", _randn("vocab, hidden", "bf16")),
        ("targets", "torch.randint(0, vocab, (tokens,))")]),
)


def _attention(name: str, doc: str, out: str, dt: str, shape: tuple[int, int, int, int], body: str,
               names: tuple[str, ...] = ("q", "k")) -> SuiteTask:
    sizes = dict(zip(("batch_size", "heads", "seq_len", "head_dim"), shape))
    return _t(name, "attention", doc, out, sizes, body,
              [(n, _randn("batch_size, heads, seq_len, head_dim", dt)) for n in names])


ATTENTION: tuple[SuiteTask, ...] = (
    _attention("attn-scores-softmax-f16-32x16x512x64", "Attention scores Q K^T / sqrt(d), then softmax over the keys.",
               "[32, 16, 512, 512] float16", "f16", (32, 16, 512, 64),
               "torch.softmax(torch.matmul(q, k.transpose(-2, -1)) * head_dim ** -0.5, dim=-1)"),
    _attention("attn-full-bf16-8x32x1024x128", "softmax(Q K^T / sqrt(d)) V, written out.", "[8, 32, 1024, 128] bfloat16",
               "bf16", (8, 32, 1024, 128),
               "p = torch.softmax(q @ k.transpose(-2, -1) * head_dim ** -0.5, dim=-1)\nreturn p @ v", ("q", "k", "v")),
    _attention("attn-vit-softmax-f16-8x12x197x64", "ViT-Base's attention scores over 197 tokens (odd), then softmax.",
               "[8, 12, 197, 197] float16", "f16", (8, 12, 197, 64),
               "torch.softmax(q @ k.transpose(-2, -1) * 0.125, dim=-1)"),
    _t("baddbmm-scale-relu-f32-128x512x256x512", "attention", "baddbmm: c + 0.5 * (a @ b) over a batch of 128, then ReLU.",
       "[128, 512, 512] float32", {"batch_size": 128, "M": 512, "K": 256, "N": 512},
       "torch.relu(torch.baddbmm(c, a, b, alpha=0.5))",
       [("c", _randn("batch_size, M, N", "f32")), ("a", _randn("batch_size, M, K", "f32")),
        ("b", _randn("batch_size, K, N", "f32"))]),
)

GEMM_SUITE: tuple[SuiteTask, ...] = LINEAR + GEMM + CONV + TRANSFORMER + ATTENTION



def epilogue_share(task_source: str) -> float | None:
    """What a convolution task's epilogue moves as a kernel of its own (reading the convolution's
    output and the other tensors it reads, writing the task's outputs, as Inductor's fused kernel
    after cuDNN's does) over what the convolution moves (its input, filter, bias and output), from
    the task traced on meta tensors; None for a task without one convolution. The issue's
    convolution goal counts the tasks where it is at least a fifth."""
    import torch
    import torch.fx as fx

    from kevin_backend.generate.builtin.tracing import TRACE_LOCK, trace_with_parameters

    with TRACE_LOCK:
        gm, _, _ = trace_with_parameters(task_source)
    nodes = list(gm.graph.nodes)
    convs = [n for n in nodes if n.op == "call_function" and n.target is torch.ops.aten.convolution.default]
    if len(convs) != 1:
        return None

    def size(node: fx.Node) -> int:
        value = node.meta.get("val")
        return value.numel() * value.element_size() if isinstance(value, torch.Tensor) else 0

    (conv,) = convs
    after = nodes[nodes.index(conv) + 1:]
    read = {a for n in after if n.op == "call_function" for a in n.all_input_nodes if a.op == "placeholder"}
    (output,) = [n for n in nodes if n.op == "output"]
    written = sum(size(n) for n in output.all_input_nodes)
    own = sum(size(a) for a in conv.all_input_nodes) + size(conv)
    return (size(conv) + sum(size(a) for a in read) + written) / own if own else None
