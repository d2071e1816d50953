"""The roofline suite: memory-bound KernelBench-format tasks at sizes where a kernel's time is set
by how fast it moves bytes, so that a kernel writer can be measured against the GPU's copy bandwidth.

    for task in ROOFLINE_SUITE: task.name, task.category, task.source

Every task reads each input once and writes each output once at best, and does little arithmetic
per byte: its floor is `bytes / bandwidth`, with bytes = the inputs' storage read once + the
outputs written once (`task_bytes(task.source)` counts both on meta tensors, allocating nothing).
A kernel's time set against that floor says how far from the roofline the writer is, which a
speedup over Inductor alone does not (Inductor may itself sit far from it, or right at it).

Categories:
    `norm`       layer norm (over the last dim, rows of 64 to 4M, and over [C, H, W]), RMS norm
                 written out (over the last dim, rows of 64 in fp16 to 393216 in fp32, and over
                 dim 1 of a 4-D tensor), a residual add fused with an RMS norm (two outputs), group
                 norm, instance norm, inference batch norm;
    `softmax`    softmax and log-softmax over the last dim, over a middle dim and over dim 0,
                 rows of 64 to 4M elements, 50257 of them in bf16 (every other row starting off a
                 4-byte boundary);
    `reduction`  sum, mean, max (values and indices), argmax, argmin, min over dims 0, 1 and 2 of
                 3-D tensors, the full sum of a long vector, and two outputs from one read of
                 each row (max and sum; variance and mean over 65535 values);
    `normalize`  L1 and L2 normalisation over rows and columns, Frobenius normalisation;
    `loss`       MSE, smooth-L1 / Huber, KL-divergence, cross-entropy (int64 targets) over 32000,
                 50257 and 131072 classes;
    `activation` chains of three to six pointwise ops (GELU, SiLU, tanh, sigmoid, softplus,
                 hardtanh);
    `layout`     transposed and permuted inputs (a softmax, an L2 normalisation, a layer norm and
                 an RMS norm over a channels-last view among them), and forwards that transpose
                 or permute.

The shapes of the comparison with QuACK in issue 35 are among them (softmax 4096x393216 fp32,
16384x8192 fp32, 32768x16384 and 32768x65536 bf16; RMS norm 4096x393216 fp32, 32768x16384 and
32768x65536 bf16; cross-entropy 8192x50257 fp32, 16384x50257 and 16384x131072 bf16):
`benchmarks/quack_peer.py` says which tasks QuACK takes and times it on them.

Inputs run from 64 MiB to 8 GiB a task, in fp32, fp16 and bf16, and are made on the CPU the way
published KernelBench problems make them (the judge moves them to the GPU). Norm weights, biases
and running statistics are forward inputs, as a torch.compile partition hands them over: no task
has parameters or buffers. Run it with

    python benchmarks/bench_builtin.py --suite roofline
"""

from __future__ import annotations

from typing import Any

from kevin_backend.generate.builtin.suite import SuiteTask, kernelbench_program

__all__ = ["ROOFLINE_SUITE", "CATEGORIES", "task_bytes"]

CATEGORIES = ("norm", "softmax", "reduction", "normalize", "loss", "activation", "layout")

_DT = {"f32": "", "f16": ", dtype=torch.float16", "bf16": ", dtype=torch.bfloat16"}


def _randn(dims: str, dt: str) -> str:
    return f"torch.randn({dims}{_DT[dt]})"


def _t(name: str, category: str, doc: str, sizes: dict[str, int | str], body: str,
       inputs: list[tuple[str, str]]) -> SuiteTask:
    assert category in CATEGORIES, category
    return SuiteTask(name, category, kernelbench_program(doc, sizes, body, inputs))


def _layernorm(name: str, dt: str, rows: int, dim: int) -> SuiteTask:
    return _t(name, "norm", "Layer norm over the last dimension, with weight and bias.",
              {"batch_size": rows, "dim": dim}, "F.layer_norm(x, (dim,), weight, bias, eps=1e-5)",
              [("x", _randn("batch_size, dim", dt)), ("weight", _randn("dim", dt)), ("bias", _randn("dim", dt))])


def _rmsnorm(name: str, dt: str, rows: int, dim: int) -> SuiteTask:
    """RMS norm over the last dimension with a weight: written out in fp32, and for 16-bit
    inputs computed in fp32 and cast back before the weight (LLaMA style)."""
    if dt == "f32":
        return _t(name, "norm", "RMS norm over the last dimension, with a weight.",
                  {"batch_size": rows, "dim": dim, "eps": "1e-6"},
                  "x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight",
                  [("x", "torch.randn(batch_size, dim)"), ("weight", "torch.randn(dim)")])
    return _t(name, "norm",
              f"RMS norm over the last dimension computed in fp32 and cast back to {dt} (LLaMA style), with a weight.",
              {"batch_size": rows, "dim": dim, "eps": "1e-6"},
              "(x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * weight",
              [("x", _randn("batch_size, dim", dt)), ("weight", _randn("dim", dt))])


def _cross_entropy(name: str, dt: str, rows: int, classes: int) -> SuiteTask:
    return _t(name, "loss", f"Cross-entropy over {classes} classes{'' if dt == 'f32' else ' in ' + dt}.",
              {"batch_size": rows, "num_classes": classes}, "F.cross_entropy(predictions, targets)",
              [("predictions", _randn("batch_size, num_classes", dt)),
               ("targets", "torch.randint(0, num_classes, (batch_size,))")])


def _softmax(name: str, op: str, dt: str, shape: tuple[int, ...], dim: int) -> SuiteTask:
    names = ("batch_size", "dim") if len(shape) == 2 else ("batch_size", "dim1", "dim2")
    where = "the last dimension" if dim == len(shape) - 1 else f"dimension {dim}"
    return _t(name, "softmax", f"{'Log-softmax' if op == 'log_softmax' else 'Softmax'} over {where}.",
              dict(zip(names, shape)), f"torch.{op}(x, dim={dim})", [("x", _randn(", ".join(names), dt))])


def _reduce3d(name: str, body: str, doc: str, dt: str, shape: tuple[int, int, int]) -> SuiteTask:
    return _t(name, "reduction", doc, dict(zip(("batch_size", "dim1", "dim2"), shape)), body,
              [("x", _randn("batch_size, dim1, dim2", dt))])


def _image(dt: str) -> list[tuple[str, str]]:
    return [("x", _randn("batch_size, features, dim1, dim2", dt))]


_IMAGE = {"batch_size": 16, "features": 64, "dim1": 256, "dim2": 256}  # KernelBench's norm problems' shape

ROOFLINE_SUITE: tuple[SuiteTask, ...] = (
    # ---- norm -------------------------------------------------------------------------------
    _layernorm("layernorm-last-f32-16x4M", "f32", 16, 4_194_304),  # few long rows
    _layernorm("layernorm-last-bf16-1Mx64", "bf16", 1_048_576, 64),  # many short rows
    _t("layernorm-chw-f32-16x64x256x256", "norm",
       "Layer norm over the last three dimensions [features, dim1, dim2], with elementwise weight and bias.",
       _IMAGE, "F.layer_norm(x, (features, dim1, dim2), weight, bias)",
       _image("f32") + [("weight", "torch.randn(features, dim1, dim2)"), ("bias", "torch.randn(features, dim1, dim2)")]),
    _rmsnorm("rmsnorm-last-f32-8192x8192", "f32", 8192, 8192),
    _rmsnorm("rmsnorm-last-bf16-32768x4096", "bf16", 32768, 4096),
    # QuACK's comparison table (issue 35): a long odd row in fp32, and bf16 rows of 16K and 64K
    _rmsnorm("rmsnorm-last-f32-4096x393216", "f32", 4096, 393_216),  # 6 GiB
    _rmsnorm("rmsnorm-last-bf16-32768x16384", "bf16", 32768, 16384),
    _rmsnorm("rmsnorm-last-bf16-32768x65536", "bf16", 32768, 65536),  # 4 GiB
    _rmsnorm("rmsnorm-last-f16-1Mx64", "f16", 1_048_576, 64),  # many short rows
    _layernorm("layernorm-last-bf16-16384x8192", "bf16", 16384, 8192),
    # a fused chain with two outputs: a pre-norm transformer block's residual add, then its RMS norm
    _t("add-rmsnorm-bf16-32768x4096", "norm",
       "Residual add, then RMS norm (in fp32, cast back to bf16) scaled by a weight: returns the normalised "
       "output and the new residual stream.",
       {"batch_size": 32768, "dim": 4096, "eps": "1e-6"},
       "h = x + residual\n"
       "return (h.float() * torch.rsqrt(h.float().pow(2).mean(-1, keepdim=True) + eps)).to(h.dtype) * weight, h",
       [("x", _randn("batch_size, dim", "bf16")), ("residual", _randn("batch_size, dim", "bf16")),
        ("weight", _randn("dim", "bf16"))]),
    _t("rmsnorm-dim1-f32-16x64x256x256", "norm", "RMS norm over the features (dimension 1) of a 4-D tensor.",
       {**_IMAGE, "eps": "1e-5"},
       "rms = torch.sqrt(torch.mean(x ** 2, dim=1, keepdim=True) + eps)\nreturn x / rms", _image("f32")),
    _t("groupnorm-f32-16x64x256x256", "norm", "Group norm with 8 groups, with per-channel weight and bias.",
       {**_IMAGE, "num_groups": 8}, "F.group_norm(x, num_groups, weight, bias, eps=1e-5)",
       _image("f32") + [("weight", "torch.randn(features)"), ("bias", "torch.randn(features)")]),
    _t("instancenorm-f32-16x64x256x256", "norm", "Instance norm (no affine): each channel of each sample over [dim1, dim2].",
       _IMAGE, "F.instance_norm(x, eps=1e-5)", _image("f32")),
    _t("batchnorm-infer-f32-16x64x256x256", "norm",
       "Inference batch norm: running mean and variance, weight and bias per channel.",
       _IMAGE, "F.batch_norm(x, running_mean, running_var, weight, bias, training=False, eps=1e-5)",
       _image("f32") + [("running_mean", "torch.randn(features)"), ("running_var", "torch.rand(features) + 0.5"),
                        ("weight", "torch.randn(features)"), ("bias", "torch.randn(features)")]),
    # ---- softmax ----------------------------------------------------------------------------
    _softmax("softmax-last-f32-16x1M", "softmax", "f32", (16, 1_048_576), 1),
    # few long rows: 8 rows of 4M, since 8 of 1M in fp32 would hold 32 MiB, under the suite's 64 MiB floor
    _softmax("softmax-last-f32-8x4M", "softmax", "f32", (8, 4_194_304), 1),
    _softmax("softmax-last-f32-16x4096x1024", "softmax", "f32", (16, 4096, 1024), 2),  # rows of 1K ([4096, 1024] alone is 16 MiB)
    _softmax("softmax-last-bf16-32768x4096", "softmax", "bf16", (32768, 4096), 1),
    _softmax("softmax-last-f32-1Mx64", "softmax", "f32", (1_048_576, 64), 1),  # many short rows
    _softmax("softmax-last-f32-4096x393216", "softmax", "f32", (4096, 393_216), 1),  # 6 GiB
    _softmax("softmax-mid-f32-128x4096x64", "softmax", "f32", (128, 4096, 64), 1),
    _softmax("logsoftmax-last-f16-65536x2048", "log_softmax", "f16", (65536, 2048), 1),
    _softmax("logsoftmax-mid-bf16-64x8192x128", "log_softmax", "bf16", (64, 8192, 128), 1),
    # QuACK's comparison table (issue 35)
    _softmax("softmax-last-f32-16384x8192", "softmax", "f32", (16384, 8192), 1),
    _softmax("softmax-last-bf16-32768x16384", "softmax", "bf16", (32768, 16384), 1),
    _softmax("softmax-last-bf16-32768x65536", "softmax", "bf16", (32768, 65536), 1),  # 4 GiB
    _softmax("softmax-last-bf16-16x4M", "softmax", "bf16", (16, 4_194_304), 1),  # few long rows in bf16
    _softmax("softmax-dim0-bf16-4096x16384", "softmax", "bf16", (4096, 16384), 0),  # over the columns
    # a vocabulary of 50257 in bf16: rows of an odd length, not 4-byte aligned after the first
    _softmax("logsoftmax-last-bf16-8192x50257", "log_softmax", "bf16", (8192, 50257), 1),
    # ---- reduction --------------------------------------------------------------------------
    _reduce3d("sum-dim0-f32-128x1024x1024", "torch.sum(x, dim=0)", "Sum over dimension 0.", "f32", (128, 1024, 1024)),
    _reduce3d("sum-dim1-f32-128x1024x1024", "torch.sum(x, dim=1, keepdim=True)", "Sum over dimension 1 (kept).",
              "f32", (128, 1024, 1024)),
    _reduce3d("sum-dim2-bf16-256x1024x1024", "torch.sum(x, dim=2)", "Sum over dimension 2.", "bf16", (256, 1024, 1024)),
    _reduce3d("mean-dim1-f16-64x4096x1024", "torch.mean(x, dim=1)", "Mean over dimension 1.", "f16", (64, 4096, 1024)),
    _reduce3d("mean-dim2-f32-2048x256x256", "torch.mean(x, dim=2)", "Mean over dimension 2.", "f32", (2048, 256, 256)),
    _reduce3d("max-dim0-f32-64x2048x1024", "values, indices = torch.max(x, dim=0)\nreturn values, indices",
              "Max over dimension 0: the values and their indices.", "f32", (64, 2048, 1024)),
    _reduce3d("max-dim2-f16-128x1024x1024", "values, indices = torch.max(x, dim=2)\nreturn values, indices",
              "Max over dimension 2: the values and their indices.", "f16", (128, 1024, 1024)),
    _reduce3d("argmax-dim1-f32-32x2048x2048", "torch.argmax(x, dim=1)", "Argmax over dimension 1.", "f32", (32, 2048, 2048)),
    _reduce3d("argmin-dim0-bf16-256x1024x1024", "torch.argmin(x, dim=0)", "Argmin over dimension 0.", "bf16", (256, 1024, 1024)),
    _reduce3d("min-dim1-f32-128x1024x1024", "torch.min(x, dim=1)[0]", "Min over dimension 1 (the values).",
              "f32", (128, 1024, 1024)),
    # two outputs from one read of each row
    _t("max-sum-last-f32-16384x16384", "reduction", "The max and the sum of each row.",
       {"batch_size": 16384, "dim": 16384}, "return x.amax(dim=-1), x.sum(dim=-1)",
       [("x", "torch.randn(batch_size, dim)")]),
    _t("var-mean-last-f32-8192x65535", "reduction", "The variance and the mean of each row of 65535 (odd) values.",
       {"batch_size": 8192, "dim": 65535}, "torch.var_mean(x, dim=-1)",
       [("x", "torch.randn(batch_size, dim)")]),
    _t("sum-all-f32-16M", "reduction", "Sum of every element of a vector of 2^24.", {"n": "2 ** 24"},
       "torch.sum(x)", [("x", "torch.randn(n)")]),
    _t("sum-all-f32-256M", "reduction", "Sum of every element of a vector of 2^28.", {"n": "2 ** 28"},
       "torch.sum(x)", [("x", "torch.randn(n)")]),
    # ---- normalize --------------------------------------------------------------------------
    _t("l2norm-dim1-f32-32768x65535", "normalize", "L2 normalisation of each row (8 GiB).",
       {"batch_size": 32768, "dim": 65535}, "x / torch.norm(x, p=2, dim=1, keepdim=True)",
       [("x", "torch.randn(batch_size, dim)")]),
    _t("l1norm-dim1-f32-8192x16384", "normalize", "L1 normalisation of each row.",
       {"batch_size": 8192, "dim": 16384}, "x / torch.sum(torch.abs(x), dim=1, keepdim=True)",
       [("x", "torch.randn(batch_size, dim)")]),
    _t("frobenius-f32-16x64x256x256", "normalize", "Division by the Frobenius norm of the whole tensor.",
       _IMAGE, "norm = torch.norm(x, p='fro')\nreturn x / norm", _image("f32")),
    _t("l2norm-dim0-f16-16384x8192", "normalize", "L2 normalisation of each column (over dimension 0).",
       {"batch_size": 16384, "dim": 8192}, "F.normalize(x, p=2.0, dim=0)",
       [("x", _randn("batch_size, dim", "f16"))]),
    # ---- loss -------------------------------------------------------------------------------
    _t("mse-f32-16384x16384", "loss", "Mean squared error.", {"batch_size": 16384, "dim": 16384},
       "torch.mean((predictions - targets) ** 2)",
       [("predictions", "torch.randn(batch_size, dim)"), ("targets", "torch.randn(batch_size, dim)")]),
    _t("smoothl1-f32-8192x8192", "loss", "Smooth L1 (Huber, delta 1) loss.", {"batch_size": 8192, "dim": 8192},
       "F.smooth_l1_loss(predictions, targets)",
       [("predictions", "torch.randn(batch_size, dim)"), ("targets", "torch.randn(batch_size, dim)")]),
    _t("huber-bf16-16384x8192", "loss", "Huber loss with delta 0.5.", {"batch_size": 16384, "dim": 8192},
       "F.huber_loss(predictions, targets, delta=0.5)",
       [("predictions", _randn("batch_size, dim", "bf16")), ("targets", _randn("batch_size, dim", "bf16"))]),
    _t("kldiv-f32-8192x8192", "loss", "KL divergence between two distributions over the last dimension.",
       {"batch_size": 8192, "dim": 8192}, "F.kl_div(torch.log(predictions), targets, reduction='batchmean')",
       [("predictions", "torch.randn(batch_size, dim).softmax(dim=-1)"),
        ("targets", "torch.randn(batch_size, dim).softmax(dim=-1)")]),
    _cross_entropy("crossentropy-f32-8192x32000", "f32", 8192, 32000),
    _cross_entropy("crossentropy-bf16-16384x50257", "bf16", 16384, 50257),
    # QuACK's comparison table (issue 35)
    _cross_entropy("crossentropy-f32-8192x50257", "f32", 8192, 50257),
    _cross_entropy("crossentropy-bf16-16384x131072", "bf16", 16384, 131_072),  # 4 GiB
    # ---- activation -------------------------------------------------------------------------
    _t("gelu-scale-hardtanh-f32-16384x16384", "activation", "GELU, scale, hardtanh.",
       {"batch_size": 16384, "dim": 16384}, "F.hardtanh(F.gelu(x) * 2.0, min_val=-1.0, max_val=1.0)",
       [("x", "torch.randn(batch_size, dim)")]),
    _t("silu-add-sigmoid-bf16-32768x8192", "activation", "SiLU, add, sigmoid, scale.",
       {"batch_size": 32768, "dim": 8192}, "torch.sigmoid(F.silu(x) + y) * 0.5",
       [("x", _randn("batch_size, dim", "bf16")), ("y", _randn("batch_size, dim", "bf16"))]),
    _t("tanh-softplus-sigmoid-f16-65536x4096", "activation", "Softplus of tanh, less a scaled sigmoid.",
       {"batch_size": 65536, "dim": 4096}, "F.softplus(torch.tanh(x)) - torch.sigmoid(x) * 0.1",
       [("x", _randn("batch_size, dim", "f16"))]),
    _t("gelu-softplus-sigmoid-tanh-bf16-32768x16384", "activation", "Six ops: GELU, shift, softplus, sigmoid, times tanh.",
       {"batch_size": 32768, "dim": 16384}, "torch.sigmoid(F.softplus(F.gelu(x) - 0.5)) * torch.tanh(x)",
       [("x", _randn("batch_size, dim", "bf16"))]),
    # ---- layout -----------------------------------------------------------------------------
    _t("transpose-contiguous-f32-32x4096x1024", "layout", "A contiguous copy of the transpose of the last two dims.",
       {"batch_size": 32, "dim1": 4096, "dim2": 1024}, "x.transpose(1, 2).contiguous()",
       [("x", "torch.randn(batch_size, dim1, dim2)")]),
    _t("permute-mul-f16-64x1024x2048", "layout", "A permuted tensor times a contiguous one.",
       {"batch_size": 64, "dim1": 1024, "dim2": 2048}, "x.permute(0, 2, 1) * y",
       [("x", _randn("batch_size, dim1, dim2", "f16")), ("y", _randn("batch_size, dim2, dim1", "f16"))]),
    _t("relu-add-permuted-input-f32-32x4096x512", "layout",
       "ReLU of a permuted (non-contiguous) input plus a contiguous one.",
       {"batch_size": 32, "seq_len": 4096, "channels": 512}, "torch.relu(x) + y",
       [("x", "torch.randn(batch_size, channels, seq_len).permute(0, 2, 1)"),
        ("y", "torch.randn(batch_size, seq_len, channels)")]),
    _t("softmax-transposed-input-f32-16384x4096", "layout", "Softmax over the last dim of a transposed input.",
       {"batch_size": 16384, "dim": 4096}, "torch.softmax(x, dim=-1)",
       [("x", "torch.randn(dim, batch_size).t()")]),
    _t("l2norm-transposed-input-f32-8192x16384", "layout", "L2 normalisation of the rows of a transposed input.",
       {"batch_size": 8192, "dim": 16384}, "x / torch.norm(x, p=2, dim=1, keepdim=True)",
       [("x", "torch.randn(dim, batch_size).t()")]),
    _t("layernorm-channels-last-f16-64x64x64x256", "layout",
       "Layer norm over the channels of a channels-last view (ConvNeXt style), with weight and bias.",
       {"batch_size": 64, "channels": 256, "height": 64, "width": 64},
       "F.layer_norm(x, (channels,), weight, bias, eps=1e-6)",
       [("x", f"{_randn('batch_size, channels, height, width', 'f16')}.permute(0, 2, 3, 1)"),
        ("weight", _randn("channels", "f16")), ("bias", _randn("channels", "f16"))]),
    _t("rmsnorm-channels-last-bf16-32x64x64x512", "layout",
       "RMS norm over the channels of a channels-last view, in fp32 and cast back to bf16, with a weight.",
       {"batch_size": 32, "channels": 512, "height": 64, "width": 64, "eps": "1e-6"},
       "(x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * weight",
       [("x", f"{_randn('batch_size, channels, height, width', 'bf16')}.permute(0, 2, 3, 1)"),
        ("weight", _randn("channels", "bf16"))]),
)


def task_bytes(source: str) -> tuple[int, int]:
    """(input bytes, output bytes) of a task, on meta tensors: each input's storage read once, each
    output written once. Their sum over the copy bandwidth is the task's roofline time."""
    import torch
    import torch.utils._pytree as pytree

    from kevin_backend.types import load_program

    module = load_program(source, "kevin_roofline_task")
    with torch.device("meta"):
        inputs = list(module.get_inputs())
        out: Any = module.Model(*module.get_init_inputs())(*inputs)
    tensors = [t for t in inputs if isinstance(t, torch.Tensor)]
    read = sum(t.untyped_storage().nbytes() for t in tensors)
    written = sum(t.numel() * t.element_size() for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor))
    return read, written
