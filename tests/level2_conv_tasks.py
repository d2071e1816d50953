"""KernelBench level-2 style convolution problems, in KernelBench's own format (a Model built from
`get_init_inputs()`, its input from `get_inputs()`, module-level sizes, CPU-made inputs): the
habits of the published set, written here from its patterns (a 3 -> 16 convolution of a 3x32x32
batch of 128, then activations, per-channel parameters, a min or softmax over the channels,
normalisations and poolings the writer's kernels do not take).

Each entry: (source, ops the convolution's partition holds in a compiled model, ops it leaves to
other partitions or Inductor, by a part of their names); a convolution whose partition holds
nothing else (an instance norm's statistics after it) is left to Inductor whole."""

from __future__ import annotations

_HEAD = """import torch
import torch.nn as nn
import torch.nn.functional as F

"""


def _task(init_args: str, init_body: str, forward: str, sizes: str, inputs: str = "torch.randn(batch_size, in_channels, height, width)",
          init_inputs: str = "in_channels, out_channels, kernel_size") -> str:
    body = "\n".join("        " + line for line in init_body.strip().splitlines())
    fwd = "\n".join("        " + line for line in forward.strip().splitlines())
    return (_HEAD + f"class Model(nn.Module):\n    def __init__(self, {init_args}):\n        super().__init__()\n{body}\n\n"
            f"    def forward(self, x):\n{fwd}\n\n\n{sizes.strip()}\n\n\n"
            f"def get_inputs():\n    return [{inputs}]\n\n\ndef get_init_inputs():\n    return [{init_inputs}]\n")


_2D = "batch_size = 128\nin_channels = 3\nout_channels = 16\nheight, width = 32, 32\nkernel_size = 3"
_3D = "batch_size = 128\nin_channels = 3\nout_channels = 16\ndepth, height, width = 16, 32, 32\nkernel_size = 3"
_3D_INPUT = "torch.randn(batch_size, in_channels, depth, height, width)"

LEVEL2 = {
    "conv2d-relu-biasadd": (
        _task("in_channels, out_channels, kernel_size, bias_shape",
              "self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)\nself.bias = nn.Parameter(torch.randn(bias_shape))",
              "x = self.conv(x)\nx = torch.relu(x)\nreturn x + self.bias",
              _2D + "\nbias_shape = (out_channels, 1, 1)", init_inputs="in_channels, out_channels, kernel_size, bias_shape"),
        {"relu", "add"}, set()),
    "conv2d-mish-mish": (
        _task("in_channels, out_channels, kernel_size", "self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)",
              "x = self.conv(x)\nx = F.mish(x)\nreturn F.mish(x)", _2D),
        {"tanh"}, set()),
    "conv2d-scaling-min": (
        _task("in_channels, out_channels, kernel_size, scale_factor",
              "self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)\nself.scale_factor = scale_factor",
              "x = self.conv(x) * self.scale_factor\nreturn torch.min(x, dim=1, keepdim=True)[0]",
              _2D + "\nscale_factor = 2.0", init_inputs="in_channels, out_channels, kernel_size, scale_factor"),
        {"mul", "min"}, set()),
    "conv2d-multiply-leakyrelu-gelu": (
        _task("in_channels, out_channels, kernel_size, multiplier_shape",
              "self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)\n"
              "self.multiplier = nn.Parameter(torch.randn(multiplier_shape))\nself.leaky_relu = nn.LeakyReLU()",
              "x = self.conv(x) * self.multiplier\nx = self.leaky_relu(x)\nreturn F.gelu(x)",
              _2D + "\nmultiplier_shape = (out_channels, 1, 1)",
              init_inputs="in_channels, out_channels, kernel_size, multiplier_shape"),
        {"mul", "erf"}, set()),
    "conv2d-subtract-tanh-subtract-avgpool": (
        _task("in_channels, out_channels, kernel_size, subtract1_value, subtract2_value, kernel_size_pool",
              "self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)\nself.subtract1_value = subtract1_value\n"
              "self.subtract2_value = subtract2_value\nself.avgpool = nn.AvgPool2d(kernel_size_pool)",
              "x = self.conv(x)\nx = x - self.subtract1_value\nx = torch.tanh(x)\nx = x - self.subtract2_value\n"
              "return self.avgpool(x)",
              _2D + "\nsubtract1_value = 0.5\nsubtract2_value = 0.2\nkernel_size_pool = 2",
              init_inputs="in_channels, out_channels, kernel_size, subtract1_value, subtract2_value, kernel_size_pool"),
        {"sub", "tanh"}, {"avg_pool"}),
    "conv2d-hardswish-relu-maxpool": (
        _task("in_channels, out_channels, kernel_size", "self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, padding=1)",
              "x = self.conv(x)\nx = F.hardswish(x)\nx = torch.relu(x)\nreturn F.max_pool2d(x, 2)", _2D),
        {"relu"}, {"max_pool"}),
    "conv2d-gelu-globalavgpool": (
        _task("in_channels, out_channels, kernel_size", "self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)",
              "x = self.conv(x)\nx = F.gelu(x)\nx = F.adaptive_avg_pool2d(x, 1)\nreturn x.squeeze(-1).squeeze(-1)", _2D),
        {"erf"}, {"mean"}),
    "conv2d-instancenorm-divide": (
        _task("in_channels, out_channels, kernel_size, divide_by",
              "self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)\n"
              "self.instance_norm = nn.InstanceNorm2d(out_channels)\n"
              "self.divide_by = divide_by",
              "x = self.conv(x)\nx = self.instance_norm(x)\nreturn x / self.divide_by",
              _2D + "\ndivide_by = 2.0", init_inputs="in_channels, out_channels, kernel_size, divide_by"),
        set(), {"var_mean"}),
    "conv3d-softmax-maxpool-maxpool": (
        _task("in_channels, out_channels, kernel_size, pool_kernel_size",
              "self.conv = nn.Conv3d(in_channels, out_channels, kernel_size)\nself.pool1 = nn.MaxPool3d(pool_kernel_size)\n"
              "self.pool2 = nn.MaxPool3d(pool_kernel_size)",
              "x = self.conv(x)\nx = torch.softmax(x, dim=1)\nx = self.pool1(x)\nreturn self.pool2(x)",
              _3D + "\npool_kernel_size = 2", inputs=_3D_INPUT,
              init_inputs="in_channels, out_channels, kernel_size, pool_kernel_size"),
        {"amax", "exp", "sum", "div"}, {"max_pool"}),
    "conv3d-hardswish-relu-softmax-mean": (
        _task("in_channels, out_channels, kernel_size", "self.conv = nn.Conv3d(in_channels, out_channels, kernel_size)",
              "x = self.conv(x)\nx = F.hardswish(x)\nx = torch.relu(x)\nx = torch.softmax(x, dim=1)\n"
              "return torch.mean(x, dim=[2, 3, 4])",
              _3D, inputs=_3D_INPUT),
        {"relu", "amax", "exp", "div"}, {"mean"}),
    # transposed: a 3 -> 16 ConvTranspose2d (stride 2, padding 1, output padding 1) with a bias parameter,
    # clamps and a scaling; a ConvTranspose3d scaled, then an average pool (outside), a bias and a scale
    "convtranspose2d-biasadd-clamp-scaling-clamp-divide": (
        _task("in_channels, out_channels, kernel_size, stride, padding, output_padding, bias_shape, scaling_factor",
              "self.conv_transpose = nn.ConvTranspose2d(in_channels, out_channels, kernel_size, stride=stride, padding=padding, "
              "output_padding=output_padding)\nself.bias = nn.Parameter(torch.randn(bias_shape))\n"
              "self.scaling_factor = scaling_factor",
              "x = self.conv_transpose(x)\nx = x + self.bias\nx = torch.clamp(x, min=0.0, max=1.0)\nx = x * self.scaling_factor\n"
              "x = torch.clamp(x, min=0.0, max=1.0)\nreturn x / self.scaling_factor",
              _2D + "\nstride = 2\npadding = 1\noutput_padding = 1\nbias_shape = (out_channels, 1, 1)\nscaling_factor = 2.0",
              init_inputs="in_channels, out_channels, kernel_size, stride, padding, output_padding, bias_shape, scaling_factor"),
        {"add", "mul", "div"}, set()),
    "convtranspose3d-scale-avgpool-biasadd-scale": (
        _task("in_channels, out_channels, kernel_size, stride, padding, scale1, scale2, bias_shape",
              "self.conv_transpose = nn.ConvTranspose3d(in_channels, out_channels, kernel_size, stride=stride, padding=padding)\n"
              "self.scale1 = nn.Parameter(torch.tensor(scale1))\nself.avg_pool = nn.AvgPool3d(kernel_size=2)\n"
              "self.bias = nn.Parameter(torch.randn(bias_shape))\nself.scale2 = nn.Parameter(torch.tensor(scale2))",
              "x = self.conv_transpose(x)\nx = x * self.scale1\nx = self.avg_pool(x)\nx = x + self.bias\nreturn x * self.scale2",
              _3D + "\nstride = 2\npadding = 1\nscale1 = 0.5\nscale2 = 1.0\nbias_shape = (out_channels, 1, 1, 1)", inputs=_3D_INPUT,
              init_inputs="in_channels, out_channels, kernel_size, stride, padding, scale1, scale2, bias_shape"),
        {"mul"}, {"avg_pool"}),
}


# More problems in the published set's habits (its ConvTranspose3d of 32 -> 64 channels, stride 2 and an
# output padding; norms, poolings and reductions over other dimensions after the convolution; grouped
# convolutions), each with what the built-in writer does with its convolution's partition, compiled in
# eval mode: "direct" (the direct kernel, the partition whole), "declined: <why>" (the partition's plan
# says why; Inductor keeps it) or "inductor" (the convolution left to Inductor alone: its partition held
# nothing else the writer takes)
_T3D = ("batch_size = 16\nin_channels = 32\nout_channels = 64\ndepth, height, width = 16, 32, 32\nkernel_size = 3\nstride = 2\n"
        "padding = 1\noutput_padding = 1")
_2DB = "batch_size = 128\nin_channels = 32\nout_channels = 64\nheight, width = 32, 32\nkernel_size = 3"
_CT3 = ("self.conv_transpose = nn.ConvTranspose3d(in_channels, out_channels, kernel_size, stride=stride, padding=padding, "
        "output_padding=output_padding)")
_CT3_ARGS = "in_channels, out_channels, kernel_size, stride, padding, output_padding"
_PUBLISHED_SOURCES = {
    "ct3d-add-hardswish": _task("in_channels, out_channels, kernel_size, stride, padding, output_padding, bias_shape",
        _CT3 + "\nself.bias = nn.Parameter(torch.randn(bias_shape))",
        "x = self.conv_transpose(x)\nx = x + self.bias\nreturn x * torch.nn.functional.hardswish(x)",
        _T3D + "\nbias_shape = (out_channels, 1, 1, 1)", inputs=_3D_INPUT, init_inputs=_CT3_ARGS + ", bias_shape"),
    "ct3d-sum-layernorm-avgpool-gelu": _task(
        "in_channels, out_channels, kernel_size, stride, padding, output_padding, sum_weight, norm_shape, pool_kernel_size",
        _CT3 + "\nself.sum_weight = nn.Parameter(torch.tensor(sum_weight))\nself.norm = nn.LayerNorm(norm_shape)\n"
        "self.avg_pool = nn.AvgPool3d(kernel_size=pool_kernel_size)\nself.gelu = nn.GELU()",
        "x = self.conv_transpose(x)\nx = x + self.sum_weight\nx = self.norm(x)\nx = self.avg_pool(x)\nreturn self.gelu(x)",
        _T3D + "\nsum_weight = 1.0\nnorm_shape = (out_channels,)\npool_kernel_size = (2, 2, 2)", inputs=_3D_INPUT,
        init_inputs=_CT3_ARGS + ", sum_weight, norm_shape, pool_kernel_size"),
    "ct3d-max-max-sum": _task("in_channels, out_channels, kernel_size, stride, padding",
        "self.conv_transpose = nn.ConvTranspose3d(in_channels, out_channels, kernel_size, stride=stride, padding=padding)\n"
        "self.max_pool1 = nn.MaxPool3d(kernel_size=2)\nself.max_pool2 = nn.MaxPool3d(kernel_size=3)",
        "x = self.conv_transpose(x)\nx = self.max_pool1(x)\nx = self.max_pool2(x)\nreturn torch.sum(x, dim=1, keepdim=True)",
        "batch_size = 16\nin_channels = 8\nout_channels = 16\ndepth, height, width = 16, 32, 32\nkernel_size = 3\n"
        "stride = 2\npadding = 1", inputs=_3D_INPUT,
        init_inputs="in_channels, out_channels, kernel_size, stride, padding"),
    "ct2d-subtract-tanh": _task("in_channels, out_channels, kernel_size, bias_shape, stride, padding, output_padding",
        "self.conv_transpose = nn.ConvTranspose2d(in_channels, out_channels, kernel_size, stride=stride, padding=padding, "
        "output_padding=output_padding)\n"
        "self.bias = nn.Parameter(torch.randn(bias_shape))",
        "x = self.conv_transpose(x)\nx = x - self.bias\nreturn torch.tanh(x)",
        "batch_size = 128\nin_channels = 32\nout_channels = 16\nheight, width = 16, 16\nkernel_size = 4\n"
        "bias_shape = (out_channels, 1, 1)\nstride = 2\npadding = 1\noutput_padding = 1",
        init_inputs="in_channels, out_channels, kernel_size, bias_shape, stride, padding, output_padding"),
    "conv3d-min-softmax": _task("in_channels, out_channels, kernel_size, dim",
        "self.conv = nn.Conv3d(in_channels, out_channels, kernel_size)\nself.dim = dim",
        "x = self.conv(x)\nx = torch.min(x, dim=self.dim)[0]\nreturn torch.softmax(x, dim=1)",
        _3D + "\ndim = 2", inputs=_3D_INPUT, init_inputs="in_channels, out_channels, kernel_size, dim"),
    "conv2d-min-tanh-tanh": _task("in_channels, out_channels, kernel_size",
        "self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)",
        "x = self.conv(x)\nx = torch.min(x, dim=1, keepdim=True)[0]\nx = torch.tanh(x)\nreturn torch.tanh(x)", _2D),
    "conv2d-batchnorm-scaling": _task("in_channels, out_channels, kernel_size, scaling_factor",
        "self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)\nself.bn = nn.BatchNorm2d(out_channels)\n"
        "self.scaling_factor = scaling_factor",
        "x = self.conv(x)\nx = self.bn(x)\nreturn x * self.scaling_factor", _2D + "\nscaling_factor = 2.0",
        init_inputs="in_channels, out_channels, kernel_size, scaling_factor"),
    "conv3d-groupnorm-mean": _task("in_channels, out_channels, kernel_size, num_groups",
        "self.conv = nn.Conv3d(in_channels, out_channels, kernel_size)\nself.group_norm = nn.GroupNorm(num_groups, out_channels)",
        "x = self.conv(x)\nx = self.group_norm(x)\nreturn x.mean(dim=[1, 2, 3, 4])", _3D + "\nnum_groups = 8", inputs=_3D_INPUT,
        init_inputs="in_channels, out_channels, kernel_size, num_groups"),
    "conv2d-divide-leakyrelu": _task("in_channels, out_channels, kernel_size, divisor",
        "self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)\nself.divisor = divisor",
        "x = self.conv(x)\nx = x / self.divisor\nreturn torch.nn.functional.leaky_relu(x, negative_slope=0.01)",
        _2D + "\ndivisor = 2",
        init_inputs="in_channels, out_channels, kernel_size, divisor"),
    "conv3d-leakyrelu-sum-clamp-gelu": _task("in_channels, out_channels, kernel_size, sum_tensor_shape",
        "self.conv = nn.Conv3d(in_channels, out_channels, kernel_size)\n"
        "self.sum_tensor = nn.Parameter(torch.randn(sum_tensor_shape))",
        "x = self.conv(x)\nx = torch.nn.functional.leaky_relu(x, negative_slope=0.2)\nx = x + self.sum_tensor\n"
        "x = torch.clamp(x, min=-1.0, max=1.0)\nreturn torch.nn.functional.gelu(x)",
        _3D + "\nsum_tensor_shape = (out_channels, 1, 1, 1)", inputs=_3D_INPUT,
        init_inputs="in_channels, out_channels, kernel_size, sum_tensor_shape"),
    "ct2d-globalavgpool-biasadd-logsumexp-sum-multiply": _task("in_channels, out_channels, kernel_size, bias_shape",
        "self.conv_transpose = nn.ConvTranspose2d(in_channels, out_channels, kernel_size)\n"
        "self.bias = nn.Parameter(torch.randn(bias_shape))",
        "x = self.conv_transpose(x)\nx = torch.mean(x, dim=(2, 3), keepdim=True)\nx = x + self.bias\n"
        "x = torch.logsumexp(x, dim=1, keepdim=True)\nx = torch.sum(x, dim=(2, 3))\nreturn x * 10.0",
        "batch_size = 128\nin_channels = 3\nout_channels = 16\nheight, width = 32, 32\nkernel_size = 3\n"
        "bias_shape = (out_channels, 1, 1)",
        init_inputs="in_channels, out_channels, kernel_size, bias_shape"),
    "conv2d-tanh-scaling-biasadd-max": _task(
        "in_channels, out_channels, kernel_size, scaling_factor, bias_shape, pool_kernel_size",
        "self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)\nself.scaling_factor = scaling_factor\n"
        "self.bias = nn.Parameter(torch.randn(bias_shape))\nself.max_pool = nn.MaxPool2d(pool_kernel_size)",
        "x = self.conv(x)\nx = torch.tanh(x)\nx = x * self.scaling_factor\nx = x + self.bias\nreturn self.max_pool(x)",
        _2D + "\nscaling_factor = 2.0\nbias_shape = (out_channels, 1, 1)\npool_kernel_size = 2",
        init_inputs="in_channels, out_channels, kernel_size, scaling_factor, bias_shape, pool_kernel_size"),
    "conv2d-grouped-relu": _task("in_channels, out_channels, kernel_size, groups",
        "self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, groups=groups, bias=False)",
        "return torch.relu(self.conv(x))", _2DB + "\ngroups = 4", init_inputs="in_channels, out_channels, kernel_size, groups"),
    "ct3d-grouped-relu-groupnorm": _task("in_channels, out_channels, kernel_size, groups, num_groups",
        "self.conv_transpose = nn.ConvTranspose3d(in_channels, out_channels, kernel_size, groups=groups, bias=False)\n"
        "self.relu = nn.ReLU()\nself.group_norm = nn.GroupNorm(num_groups=num_groups, num_channels=out_channels)",
        "x = self.conv_transpose(x)\nx = self.relu(x)\nreturn self.group_norm(x)",
        "batch_size = 16\nin_channels = 64\nout_channels = 128\ndepth, height, width = 8, 16, 16\nkernel_size = 3\n"
        "groups = 8\nnum_groups = 8", inputs=_3D_INPUT,
        init_inputs="in_channels, out_channels, kernel_size, groups, num_groups"),
}
_OUTCOMES = {
    "ct3d-add-hardswish": "declined: a transposed 3-D convolution",
    "ct3d-sum-layernorm-avgpool-gelu": "declined: a transposed 3-D convolution",
    "ct3d-max-max-sum": "inductor",
    "ct2d-subtract-tanh": "declined: its epilogue reading other tensors than its bias",
    "conv3d-min-softmax": "inductor",
    "conv2d-min-tanh-tanh": "direct",
    "conv2d-batchnorm-scaling": "direct",
    "conv3d-groupnorm-mean": "inductor",
    "conv2d-divide-leakyrelu": "direct",
    "conv3d-leakyrelu-sum-clamp-gelu": "direct",
    "ct2d-globalavgpool-biasadd-logsumexp-sum-multiply": "inductor",
    "conv2d-tanh-scaling-biasadd-max": "direct",
    "conv2d-grouped-relu": "direct",
    "ct3d-grouped-relu-groupnorm": "declined: 8 group(s): the GEMM writer takes 1-D, 2-D and 3-D ones of one group",
}
PUBLISHED = {name: (source, _OUTCOMES[name]) for name, source in _PUBLISHED_SOURCES.items()}
