"""The GEMM writer's plan of a task whose product is a convolution (`gemm_plan.plan_gemm` comes
here when the graph holds no matmul): the convolution with its epilogue (a bias, a scale, an
activation or any elementwise function), and the built-in writer's own kernel after it where a
reduction follows (a min over the channels, a softmax, a group norm: `gemm_tail.plan_tail`).

    plan = plan_conv(graph, metas, "sm90")    # a GemmPlan or GemmTail, or Unsupported with the reason

Which kernel:
- a 1x1 convolution (stride 1, unpadded) of a channels-last input is the GEMM of the input's
  N*H*W rows of C channels (as it lies) by the C_out x C weight, its output returned as the
  N x C_out x H x W view that is channels-last as eager's (`GemmPlan.conv`);
- other 2-D, 3-D and 1-D convolutions, and 2-D and 1-D transposed ones, of one group: CUTLASS
  2.x's implicit GEMM (`conv_kernel.py`; a 1-D one as 2-D of height 1, `GemmPlan.conv1d`);
- an epilogue reading other tensors than the convolution's bias (a `(C_out, 1, 1)` parameter added
  after the activation, the input added back, an inference batch norm's running mean and variance,
  weight and bias): a tree (`_conv_tree`), one function of the accumulator and its operands, each a
  vector over the output channels or a tensor of the output's size, as the values meet the
  convolution's (through unsqueezes and ops of operands alone: `gemm_reading.broadcast_shape`);
  `conv_kernel.conv_tree_refusal` says how many each kernel reads (CUTLASS 2.x's two).

Declined, each with what it is: groups, a transposed 3-D convolution (CUTLASS 2.x has no tensor-core
kernel for it), a dilated transposed one, a transposed one whose channels are not multiples of the
kernel's 16-byte access or whose epilogue reads other tensors, an operand of another shape (one
value per column of the output, say), a tree of more operands than the kernels for the
convolution read, a channels-last convolution's output viewed in another shape (a group norm's).
"""

from __future__ import annotations

import functools
import math
from typing import Any

import torch
import torch.fx as fx

from kevin_backend.generate.builtin.conv_kernel import Conv, conv_alignment, conv_tree_refusal
from kevin_backend.generate.builtin.gemm_kernel import Epilogue, GemmSpec, gemm_unaligned
from kevin_backend.generate.builtin.gemm_kernel_sm80 import sm80_alignment
from kevin_backend.generate.builtin.gemm_reading import (DTYPES, GemmPlan, TreeOperands, broadcast_shape, epilogue_input, gemm_spec,
                                                         read_epilogue, read_outputs, wide_operand)
from kevin_backend.generate.builtin.gemm_tail import GemmTail, has_tail, plan_tail
from kevin_backend.generate.builtin.ops import Unsupported
from kevin_backend.types import channels_last_form

__all__ = ["plan_conv", "read_conv"]

aten = torch.ops.aten


def _convolutions(graph: fx.Graph) -> list[fx.Node]:
    return [n for n in graph.nodes if n.op == "call_function" and n.target is aten.convolution.default]


def _channels_last(value: torch.Tensor) -> bool:
    """Whether a 4-D or 5-D tensor lies channels-last (channels innermost)."""
    return channels_last_form(value) is not None


def plan_conv(graph: fx.Graph, metas: list[Any], arch: str) -> GemmPlan | GemmTail:
    """The plan of a graph whose product is its one convolution (its inputs `metas`), for `arch`.
    A reduction after it reads the kernel's output as it lies, channels innermost (no transpose
    back), where the input is channels-last or each reduction is over the channels alone (a
    softmax, a min over them: rows the writer's kernel reads contiguous); else N x C_out x ...."""
    read = functools.partial(read_conv, arch=arch)
    convs = _convolutions(graph)
    if not (len(convs) == 1 and has_tail(graph)):
        return read(graph, metas)
    (conv,) = convs
    dims = conv.meta["val"].dim()
    x = conv.args[0]
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    channels_last = x in placeholders and _channels_last(metas[placeholders.index(x)])
    layout = {4: torch.channels_last, 5: torch.channels_last_3d}.get(dims)
    if layout is not None and (channels_last or _over_channels_alone(graph, conv)):
        tail = plan_tail(graph, metas, functools.partial(read_conv, arch=arch, as_it_lies=True), end_layout=layout)
    else:
        tail = plan_tail(graph, metas, read)
    return tail


def _over_channels_alone(graph: fx.Graph, conv: fx.Node) -> bool:
    """Whether every reduction after the convolution reduces over its output's channels alone
    (dimension 1), the values the reductions read of the convolution's output's shape."""
    from kevin_backend.generate.builtin.graph_nodes import REDUCTIONS

    shape = tuple(conv.meta["val"].shape)
    after = list(graph.nodes)[list(graph.nodes).index(conv) + 1:]
    reductions = [n for n in after if n.op == "call_function" and n.target in REDUCTIONS]
    for n in reductions:
        dims = n.args[1] if len(n.args) > 1 else n.kwargs.get("dim")
        dims = [dims] if isinstance(dims, int) else list(dims or [])
        source = n.args[0].meta.get("val") if isinstance(n.args[0], fx.Node) else None
        if not isinstance(source, torch.Tensor) or tuple(source.shape) != shape or [d % len(shape) for d in dims] != [1]:
            return False
    return bool(reductions)


def read_conv(graph: fx.Graph, metas: list[Any], arch: str, as_it_lies: bool = False) -> GemmPlan:
    """The GemmPlan of a graph of one convolution and its epilogue (the module's docstring says
    which kernel), or Unsupported with what it is; `as_it_lies`: its output returned as the kernel
    leaves it, N x ... x C_out, for the built-in writer's kernel after it (`Conv.out_as_it_lies`)."""
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    index = {p: i for i, p in enumerate(placeholders)}
    convs = _convolutions(graph)
    if len(convs) != 1:
        raise Unsupported("no matmul (mm, addmm, bmm, baddbmm) nor one convolution")
    (conv,) = convs
    x, w, bias, stride, padding, dilation, transposed, output_padding, groups = conv.args
    if not (isinstance(x, fx.Node) and x in index and isinstance(w, fx.Node) and w in index):
        raise Unsupported("a convolution of values computed in the task (the GEMM writer reads inputs)")
    xv, wv = metas[index[x]], metas[index[w]]
    what = (f"a {'transposed ' if transposed else ''}{wv.dim() - 2}-D convolution, kernel {'x'.join(map(str, wv.shape[2:]))}, "
            f"stride {list(stride)}, padding {list(padding)}, dilation {list(dilation)}, {groups} group(s)")
    if groups != 1 or wv.dim() not in (3, 4, 5):
        raise Unsupported(f"{what}: the GEMM writer takes 1-D, 2-D and 3-D ones of one group")
    if transposed and (wv.dim() == 5 or set(dilation) != {1}):
        raise Unsupported(f"{what}: CUTLASS 2.x's tensor-core kernels take transposed convolutions of 1 or 2 dimensions, "
                          "not dilated")
    if xv.dtype not in DTYPES or wv.dtype != xv.dtype:
        raise Unsupported(f"a convolution of {xv.dtype} by {wv.dtype}: the GEMM writer takes one of float16, bfloat16, float32")
    dtype = DTYPES[xv.dtype]
    out, views = read_outputs(graph)
    value = out.meta.get("val")
    if views or not isinstance(value, torch.Tensor):
        raise Unsupported("several outputs of a convolution")
    channels_last = _channels_last(xv) and not xv.is_contiguous()
    if not (channels_last or xv.is_contiguous()) or not (wv.is_contiguous() or (_channels_last(wv) and not transposed)):
        raise Unsupported("a convolution of an input neither contiguous nor channels-last, or of a filter neither contiguous nor "
                          "(not transposed) channels-last")
    # (an output viewed in another shape, a group norm's groups or a flatten: the kernel's contiguous output, viewed)
    reshaped = tuple(value.shape) != tuple(conv.meta["val"].shape)
    if reshaped and channels_last:
        raise Unsupported(f"a view of a channels-last convolution's output as {list(value.shape)} (eager's is no view of it)")
    c_in, c_out = (int(wv.shape[0]), int(wv.shape[1])) if transposed else (int(wv.shape[1]), int(wv.shape[0]))
    if transposed and (c_in % conv_alignment(dtype) or c_out % conv_alignment(dtype)):
        raise Unsupported(f"{what}: its channels ({c_in} in, {c_out} out) multiples of {conv_alignment(dtype)} "
                          "(the kernel's 16-byte access)")
    n, k = c_out, c_in * math.prod(int(d) for d in wv.shape[2:])
    m = value.numel() // n
    try:
        epilogue, bias_in, residual_in, operands = read_epilogue(conv, out, bias, index, metas, (m, n), xv.dtype)
        plain = not (operands or residual_in is not None or bias_in != (index.get(bias) if isinstance(bias, fx.Node) else None))
    except Unsupported as exc:
        if "epilogue operand" not in str(exc):
            raise
        plain = False
    if not plain:  # (other tensors read: its elements lie channel by channel, not as a GEMM's rows)
        if transposed:
            raise Unsupported(f"{what}, its epilogue reading other tensors than its bias: CUTLASS 2.x's strided gradient "
                              "kernel reads one source")
        epilogue, operands = _conv_tree(conv, out, bias, index, metas, tuple(int(d) for d in value.shape), xv.dtype)
        bias_in = residual_in = None
    one_by_one = (not epilogue.tree and wv.dim() == 4 and not transposed and tuple(wv.shape[2:]) == (1, 1)
                  and list(stride) == [1, 1] and list(padding) == [0, 0])
    if one_by_one and channels_last and list(dilation) == [1, 1] and not (dtype != "float32" and arch == "sm90"
                                                                            and gemm_unaligned(m, n, k)):
        return GemmPlan(gemm_spec(dtype, epilogue, True, n, k, arch), m, n, k, len(index), index[x], index[w], bias_in,
                        conv=True, views=("return y.permute(0, 3, 1, 2)",))
    # (others, and 1x1 ones of rows TMA cannot read: the output laid out as eager's on a GPU, channels-last
    # of a channels-last input, though meta tensors say contiguous)
    flat = wv.dim() == 3  # (1-D: as 2-D of height 1)
    if as_it_lies and (flat or reshaped):
        raise Unsupported("a convolution's output as it lies, channels innermost, for a 1-D one or one viewed in another shape")
    shape = Conv(((1,) if flat else ()) + tuple(wv.shape[2:]), ((0,) if flat else ()) + tuple(padding),
                 ((1,) if flat else ()) + tuple(stride), ((1,) if flat else ()) + tuple(dilation), channels_last, bool(transposed),
                 (((0,) if flat else ()) + tuple(output_padding)) if transposed else (), out_as_it_lies=as_it_lies and not channels_last)
    out_align = sm80_alignment(dtype, n, k)[1]  # (the output channels stored at a time)
    try:
        spec = GemmSpec(dtype, epilogue, "nk", conv_alignment(dtype), arch=arch, out_align=out_align, convolution=shape)
    except ValueError as exc:  # (a tree of more operands than the kernels for this one read)
        raise Unsupported(f"{what}: {exc}") from None
    dims = wv.dim() - 2
    return GemmPlan(spec, m, n, k, len(index), index[x], index[w], bias_in, conv1d=flat, operands=operands,
                    out_shape=tuple(int(d) for d in value.shape) if flat or reshaped else None,
                    views=(f"return y.permute(0, {dims + 1}, {', '.join(str(i) for i in range(1, dims + 1))})",) if channels_last or as_it_lies
                    else ())


def _conv_tree(conv: fx.Node, out: fx.Node, bias: Any, index: dict[fx.Node, int], metas: list[Any], shape: tuple[int, ...],
               dtype: torch.dtype) -> tuple[Epilogue, tuple[int, ...]]:
    """The epilogue as one function of the accumulator and the tensors it reads (`conv_kernel`'s
    tree: `conv_tree_refusal` says which), the convolution's bias the first; each operand a vector
    over the output channels ("n": C_out values, as a `(C_out, 1, 1)` parameter broadcasts) or a
    tensor of the output's `shape` ("mn"). The task's inputs they are, in order."""
    from kevin_backend.generate.builtin.gemm_function import elementwise_function

    channels = shape[1]
    operands = TreeOperands()

    def operand(node: fx.Node, reader: fx.Node | None = None) -> str:
        source, value = epilogue_input(node, index, metas, dtype, wide=True)
        # (its shape as the epilogue reads it: through its views and the ops of operands alone)
        seen = (channels,) + (1,) * (len(shape) - 2) if node is bias else broadcast_shape(node, conv, reader) or tuple(value.shape)
        seen = (1,) * (len(shape) - len(seen)) + seen
        if value.numel() == channels and len(seen) == len(shape) and seen[1] == channels and value.is_contiguous():
            kind = "n"
        elif tuple(value.shape) == shape and seen == shape and (value.is_contiguous() or _channels_last(value)):
            kind = "mn"
        else:
            raise Unsupported(f"an epilogue operand of shape {tuple(value.shape)}: not one value per output channel "
                              f"({channels}) nor a tensor of the output's size {list(shape)}")
        return operands.name(index[source], kind, wide=wide_operand(value, kind, dtype))

    start = f"(v + {operand(bias)})" if isinstance(bias, fx.Node) else "v"
    function = elementwise_function(conv, out, dtype, operand=operand, start=start)
    why = conv_tree_refusal(tuple(operands.kinds), hopper=True)  # (how many the kernel reads: `GemmSpec`'s check)
    if why:
        raise Unsupported(why)
    return (Epilogue(activation="function", function=function, operands=tuple(operands.kinds), wide=tuple(operands.wide)),
            tuple(operands.inputs))
