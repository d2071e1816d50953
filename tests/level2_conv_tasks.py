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
              "x = self.conv(x)\nx = x - self.subtract1_value\nx = torch.tanh(x)\nx = x - self.subtract2_value\nreturn self.avgpool(x)",
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
              "self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)\nself.instance_norm = nn.InstanceNorm2d(out_channels)\n"
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
              "x = self.conv(x)\nx = F.hardswish(x)\nx = torch.relu(x)\nx = torch.softmax(x, dim=1)\nreturn torch.mean(x, dim=[2, 3, 4])",
              _3D, inputs=_3D_INPUT),
        {"relu", "amax", "exp", "div"}, {"mean"}),
    # transposed: a 3 -> 16 ConvTranspose2d (stride 2, padding 1, output padding 1) with a bias parameter,
    # clamps and a scaling; a ConvTranspose3d scaled, then an average pool (outside), a bias and a scale
    "convtranspose2d-biasadd-clamp-scaling-clamp-divide": (
        _task("in_channels, out_channels, kernel_size, stride, padding, output_padding, bias_shape, scaling_factor",
              "self.conv_transpose = nn.ConvTranspose2d(in_channels, out_channels, kernel_size, stride=stride, padding=padding, "
              "output_padding=output_padding)\nself.bias = nn.Parameter(torch.randn(bias_shape))\nself.scaling_factor = scaling_factor",
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
