"""The built-in writer's 2-D convolution with its epilogue: CUTLASS 2.x's implicit GEMM for sm80
(`cutlass::conv::device::ImplicitGemmConvolution`, forward propagation; Ampere's kernel, which runs
on Ada and Hopper too), the same epilogue as the sm80 GEMM's (`gemm_kernel_sm80.py`: alpha, a bias
over the output channels or a residual, an activation or any elementwise function).

    spec = GemmSpec("float16", Epilogue(bias=True, activation="relu"), conv2d=Conv2d(3, 3, 1, 1, 1, 1, 1, 1))
    source = conv_cuda_source(spec, SM80_TILINGS[0])

The kernel reads activations as N x H x W x C and filters as K x R x S x C (channels innermost) and
writes N x P x Q x K. The program's host function (`gemm_epilogue(x, w, bias, residual)`, as the
GEMMs': x N x C x H x W, w K x C x R x S as PyTorch lays them) gives it those layouts:

- x is read in place when it is channels-last with C a multiple of the kernel's channel access;
  else it is first copied into N x H x W x C' (C rounded up to that access, zeros after C) by the
  GEMM's packing kernel (`gemm_kernel_sm80.PACK`), which transposes a plain N x C x H x W input
  through shared memory;
- w is packed into K x R x S x C' by the same kernel (a K x C x R x S weight is small);
- the output: returned as it lies (N x P x Q x K, which the program views as the N x K x P x Q
  channels-last tensor eager makes of a channels-last input), or transposed by the packing kernel
  into the N x K x P x Q tensor eager makes of a plain input (`Conv2d.channels_last`).

The kernel reads a residual in place as C, so only a channels-last one (the plan gives it none yet:
a tensor read after the convolution declines the task, as do groups, 3-D and transposed
convolutions: `gemm_plan._read_conv_gemm`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kevin_backend.generate.builtin.gemm_kernel_sm80 import PACK, Sm80Tiling, mainloop_fields

__all__ = ["Conv2d", "conv_alignment", "conv_cuda_source", "conv_device_source"]


@dataclass(frozen=True)
class Conv2d:
    """The convolution's constants: the filter's R x S, the padding, stride and dilation along H
    and W, and whether the input (and so the output eager returns) is channels-last."""

    r: int
    s: int
    pad_h: int = 0
    pad_w: int = 0
    stride_h: int = 1
    stride_w: int = 1
    dilation_h: int = 1
    dilation_w: int = 1
    channels_last: bool = False

    def __post_init__(self) -> None:
        if min(self.r, self.s, self.stride_h, self.stride_w, self.dilation_h, self.dilation_w) < 1 or min(self.pad_h, self.pad_w) < 0:
            raise ValueError(f"a convolution of filter {self.r}x{self.s}, stride {self.stride_h}x{self.stride_w}, "
                             f"dilation {self.dilation_h}x{self.dilation_w}, padding {self.pad_h}x{self.pad_w}: sizes of 1 or more, padding 0 or more")

    def describe(self) -> str:
        return (f"a {self.r}x{self.s} convolution, stride {self.stride_h}x{self.stride_w}, padding {self.pad_h}x{self.pad_w}"
                + (f", dilation {self.dilation_h}x{self.dilation_w}" if (self.dilation_h, self.dilation_w) != (1, 1) else "")
                + (" of a channels-last input" if self.channels_last else ""))


def conv_alignment(dtype: str) -> int:
    """The channels the kernel reads at a time (16 bytes): C is rounded up to a multiple of it."""
    return 4 if dtype == "float32" else 8


def conv_device_source(spec: Any, tiling: Sm80Tiling, activation: str, functor: str) -> str:
    """The device part: the kernel's types, `kevin_conv_run(shape, ...)` and `kevin_conv_workspace(shape)`
    (shape: N, H, W, C, K, P, Q), and the packing kernel."""
    e, c = spec.epilogue, spec.conv2d  # (what it may read: `GemmSpec`'s checks)
    source = "static_cast<ElementD*>(const_cast<void*>(bias))" if e.bias else "static_cast<ElementD*>(const_cast<void*>(residual))" \
        if e.residual else "static_cast<ElementD*>(out)"
    return _DEVICE.format(
        **mainloop_fields(spec.dtype, tiling), functor=functor, align=conv_alignment(spec.dtype), out_align=spec.alignments[1],
        activation=activation, r=c.r, s=c.s, pad_h=c.pad_h, pad_w=c.pad_w, stride_h=c.stride_h, stride_w=c.stride_w, dil_h=c.dilation_h, dil_w=c.dilation_w,
        alpha=f"{float(e.alpha)!r}f", beta=f"{float(e.beta) if e.residual else 1.0 if e.bias else 0.0!r}f", source=source,
        layout_c="cutlass::layout::TensorNHWC(cutlass::layout::TensorNHWC::Stride(0))" if e.bias else "layout_out") + PACK


def conv_cuda_source(spec: Any, tiling: Sm80Tiling, activation: str, functor: str, scalar: str, params: str) -> str:
    """The whole CUDA source: the device part and the host function `gemm_epilogue(x, w, bias, residual)`."""
    c = spec.conv2d
    return conv_device_source(spec, tiling, activation, functor) + _HOST.format(
        scalar=scalar, params=params, r=c.r, s=c.s, pad_h=c.pad_h, pad_w=c.pad_w, stride_h=c.stride_h, stride_w=c.stride_w,
        dil_h=c.dilation_h, dil_w=c.dilation_w, align=conv_alignment(spec.dtype), bias=spec.epilogue.bias,
        residual=spec.epilogue.residual, out_align=spec.alignments[1], channels_last=int(c.channels_last))


_DEVICE = """#include <cutlass/cutlass.h>
#include <cutlass/conv/kernel/default_conv2d_fprop.h>
#include <cutlass/conv/device/implicit_gemm_convolution.h>
#include <cutlass/epilogue/thread/linear_combination_generic.h>
#include <cutlass/epilogue/thread/activation.h>

namespace kevin_gemm {{
using Element = {element};
using ElementD = {element};  // (the output in the inputs' dtype)
{functor}constexpr int kAlign = {align};  // channels read at a time
constexpr int kAlignD = {out_align};  // output channels stored at a time
using EpilogueOp = cutlass::epilogue::thread::LinearCombinationGeneric<{activation}, ElementD, kAlignD, float, float>;
using Kernel = typename cutlass::conv::kernel::DefaultConv2dFprop<
    Element, cutlass::layout::TensorNHWC, Element, cutlass::layout::TensorNHWC, ElementD, cutlass::layout::TensorNHWC, float,
    cutlass::arch::OpClassTensorOp, cutlass::arch::Sm80,
    cutlass::gemm::GemmShape<{tm}, {tn}, {tk}>, cutlass::gemm::GemmShape<{wm}, {wn}, {wk}>, cutlass::gemm::GemmShape<{instruction}>,
    EpilogueOp, cutlass::gemm::threadblock::GemmIdentityThreadblockSwizzle<>, {stages}, {operator},
    cutlass::conv::IteratorAlgorithm::kOptimized, cutlass::conv::StrideSupport::kStrided, kAlign, kAlign>::Kernel;
using Conv = cutlass::conv::device::ImplicitGemmConvolution<Kernel>;

static typename Conv::Arguments arguments(int const* shape, void const* x, void const* w, void const* bias, void const* residual,
                                          void* out) {{
    // shape: N, H, W, C (the packed channels), K, P, Q; x N x H x W x C, w K x R x S x C, out N x P x Q x K;
    // C: the bias as one output row read everywhere (strides 0), the residual (N x P x Q x K), or (beta 0) not read
    const int n = shape[0], h = shape[1], w_ = shape[2], c = shape[3], k = shape[4], p = shape[5], q = shape[6];
    cutlass::conv::Conv2dProblemSize problem(n, h, w_, c, k, {r}, {s}, p, q, {pad_h}, {pad_w}, {stride_h}, {stride_w}, {dil_h}, {dil_w},
                                             cutlass::conv::Mode::kCrossCorrelation, 1, 1);
    auto layout_x = cutlass::layout::TensorNHWC::packed({{n, h, w_, c}});
    auto layout_w = cutlass::layout::TensorNHWC::packed({{k, {r}, {s}, c}});
    auto layout_out = cutlass::layout::TensorNHWC::packed({{n, p, q, k}});
    typename EpilogueOp::Params epilogue({alpha}, {beta});
    return typename Conv::Arguments(
        problem, {{static_cast<Element*>(const_cast<void*>(x)), layout_x}}, {{static_cast<Element*>(const_cast<void*>(w)), layout_w}},
        {{{source}, {layout_c}}}, {{static_cast<ElementD*>(out), layout_out}}, epilogue);
}}
}}  // namespace kevin_gemm

extern "C" size_t kevin_conv_workspace(int const* shape) {{
    return kevin_gemm::Conv::get_workspace_size(kevin_gemm::arguments(shape, nullptr, nullptr, nullptr, nullptr, nullptr));
}}

extern "C" int kevin_conv_run(int const* shape, void const* x, void const* w, void const* bias, void const* residual, void* out,
                              void* workspace, cudaStream_t stream) {{
    kevin_gemm::Conv conv;
    auto args = kevin_gemm::arguments(shape, x, w, bias, residual, out);
    cutlass::Status status = conv.can_implement(args);
    if (status != cutlass::Status::kSuccess) return static_cast<int>(status);
    status = conv.initialize(args, workspace, stream);
    if (status != cutlass::Status::kSuccess) return static_cast<int>(status);
    return static_cast<int>(conv.run(stream));
}}
"""

_HOST = """
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>

torch::Tensor gemm_epilogue({params}) {{
    // x N x C x H x W (plain or channels-last), w K x C x {r} x {s}; the output N x P x Q x K
    // (channels-last input) or N x K x P x Q
    TORCH_CHECK(x.is_cuda() && w.is_cuda() && x.scalar_type() == {scalar} && w.scalar_type() == {scalar} && x.dim() == 4 && w.dim() == 4,
                "gemm_epilogue: x and w 4-dimensional on the GPU, of the kernel's dtype");
    const int64_t n = x.size(0), c = x.size(1), h = x.size(2), wd = x.size(3), k = w.size(0);
    TORCH_CHECK(w.size(1) == c && w.size(2) == {r} && w.size(3) == {s}, "gemm_epilogue: w is K x C x {r} x {s}");
    const int64_t p = (h + 2 * {pad_h} - {dil_h} * ({r} - 1) - 1) / {stride_h} + 1, q = (wd + 2 * {pad_w} - {dil_w} * ({s} - 1) - 1) / {stride_w} + 1;
    TORCH_CHECK(p > 0 && q > 0 && k % {out_align} == 0, "gemm_epilogue: an output of at least one row and column, K a multiple of {out_align}");
    const int64_t cp = (c + {align} - 1) / {align} * {align};  // (channels rounded up to the kernel's access)
    // (as the plan read it: channels-last and not contiguous, which a 1 x 1 image or one channel is both)
    const bool channels_last = !x.is_contiguous() && x.stride(1) == 1 && x.stride(3) == c && x.stride(2) == wd * c && x.stride(0) == h * wd * c;
    TORCH_CHECK(channels_last == bool({channels_last}) && (channels_last || x.is_contiguous()) && w.is_contiguous(),
                "gemm_epilogue: x laid out as the kernel was written for, w contiguous");
    cudaStream_t stream = at::cuda::getCurrentCUDAStream().stream();
    const void* bias_ptr = nullptr;
    const void* residual_ptr = nullptr;
    if ({bias:d}) {{
        TORCH_CHECK(bias.numel() == k && bias.scalar_type() == {scalar} && bias.is_contiguous(), "gemm_epilogue: a bias of K values");
        bias_ptr = bias.data_ptr();
    }}
    if ({residual:d}) {{
        TORCH_CHECK(residual.numel() == n * k * p * q && residual.scalar_type() == {scalar} && residual.stride(1) == 1 && residual.stride(3) == k
                    && residual.stride(2) == q * k && residual.stride(0) == p * q * k, "gemm_epilogue: a channels-last residual of the output's size");
        residual_ptr = residual.data_ptr();
    }}
    auto y = torch::empty({{n, p, q, k}}, x.options());
    if (n == 0 || k == 0) return y;
    // x as N x H x W x C': in place, or packed (from a channels-last input: its rows of C; from a
    // plain one: per image, H*W rows of C values a column apart)
    const void* x_ptr = x.data_ptr();
    torch::Tensor xp, wp = torch::empty({{k * {r} * {s} * cp}}, w.options());
    int packed = 0;
    if (!channels_last || cp != c) {{
        xp = torch::empty({{n * h * wd * cp}}, x.options());
        packed = channels_last ? kevin_gemm_pack(x.data_ptr(), xp.data_ptr(), 1, n * h * wd, c, cp, 0, c, 1, stream)
                               : kevin_gemm_pack(x.data_ptr(), xp.data_ptr(), static_cast<int>(n), h * wd, c, cp, c * h * wd, 1, h * wd, stream);
        x_ptr = xp.data_ptr();
    }}
    // w as K x R x S x C': per output channel, R*S rows of C values a column apart
    if (packed == 0) packed = kevin_gemm_pack(w.data_ptr(), wp.data_ptr(), static_cast<int>(k), {r} * {s}, c, cp, c * {r} * {s}, 1, {r} * {s}, stream);
    TORCH_CHECK(packed == 0, "gemm_epilogue: packing x and w: CUDA error ", packed);
    const int shape[7] = {{static_cast<int>(n), static_cast<int>(h), static_cast<int>(wd), static_cast<int>(cp), static_cast<int>(k),
                          static_cast<int>(p), static_cast<int>(q)}};
    auto workspace = torch::empty({{static_cast<int64_t>(kevin_conv_workspace(shape))}}, x.options().dtype(torch::kUInt8));
    int status = kevin_conv_run(shape, x_ptr, wp.data_ptr(), bias_ptr, residual_ptr, y.data_ptr(), workspace.data_ptr(), stream);
    TORCH_CHECK(status == 0, "gemm_epilogue: CUTLASS status ", status);
    if ({channels_last}) return y;
    // N x P x Q x K into N x K x P x Q: per image, K rows of P*Q values a column apart
    auto out = torch::empty({{n, k, p, q}}, x.options());
    packed = kevin_gemm_pack(y.data_ptr(), out.data_ptr(), static_cast<int>(n), k, p * q, p * q, p * q * k, 1, k, stream);
    TORCH_CHECK(packed == 0, "gemm_epilogue: the output's transpose: CUDA error ", packed);
    return out;
}}
"""
