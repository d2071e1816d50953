"""The built-in writer's convolutions with their epilogue: CUTLASS 2.x's implicit GEMM for sm80
(`cutlass::conv::device::ImplicitGemmConvolution`; Ampere's kernel, which runs on Ada and Hopper
too), the same epilogue as the sm80 GEMM's (`gemm_kernel_sm80.py`: alpha, a bias over the output
channels or a residual, an activation or any elementwise function). Three kinds:

- a 2-D convolution (a 1-D one as height 1): forward propagation (`DefaultConv2dFprop`);
- a 3-D convolution: `DefaultConv3dFprop`;
- a 2-D transposed convolution (ConvTranspose2d; a 1-D one as height 1): the gradient of a
  convolution with respect to its input, which is what a transposed convolution computes
  (`DefaultConv2dDgrad`, strided: CUTLASS splits the output by its position modulo the stride).
  CUTLASS 2.x has no tensor-core kernel for a transposed 3-D convolution.

    spec = GemmSpec("float16", Epilogue(bias=True, activation="relu"), convolution=Conv((3, 3), (1, 1)))
    source = conv_cuda_source(spec, SM80_TILINGS[0], ...)

The kernel reads activations with their channels innermost (N x [D x] H x W x C), filters as
K x [T x] R x S x C, and writes N x [Z x] P x Q x K. The program's host function
(`gemm_epilogue(x, w, bias, residual)`, as the GEMMs': x N x C x [D x] H x W and w as PyTorch lays
them: C_out x C_in x f... for a convolution, C_in x C_out x f... for a transposed one) gives it
those layouts:

- x is read in place when it is channels-last with its channels a multiple of the kernel's
  access; else it is first copied into N x [D x] H x W x C' (C rounded up to that access, zeros
  after C) by the GEMM's packing kernel (`gemm_kernel_sm80.PACK`), which transposes a plain input
  through shared memory;
- w is packed by the same kernel (the filter is small), or read in place where a convolution's
  filter is channels-last (as `model.to(memory_format=torch.channels_last)` makes it) with its
  channels a multiple of the access: that is the kernel's K x [T x] R x S x C;
- the output: returned as it lies (which the program views as the channels-last tensor eager makes
  of a channels-last input), or transposed by the packing kernel into the N x C_out x ... tensor
  eager makes of a plain input (`Conv.channels_last`).

A transposed convolution's input and output channels must both be multiples of that access (the
gradient's kernel reads its filter along the output channels, and would read padding channels of
a padded input); its dilation 1 (CUTLASS's strided kernel takes no other).

The epilogue is CUTLASS's `LinearCombinationGeneric` (D = f(alpha * acc + beta * C), C the bias
read with strides 0, or a residual), or, where it reads other tensors (a per-channel parameter
after the activation, the input added back), a tree: CUTLASS's `EpilogueWithBroadcast` with the
writer's own output operation (`KevinConvTreeOp`), the tree's function (`gemm_kernel._tree`'s
`KevinTreeFn`) of the accumulator, a vector over the output channels it broadcasts (V) and its
source C: a second vector (strides 0) or a tensor of the output's size, read channels innermost
(in place where channels-last, else packed first by the program). Hopper's kernel reads a tree as
the GEMM's visitor tree does: any vectors over the output channels (their pointers in a host array)
and a tensor of the output's size. Groups are declined by the plan
(`conv_plan.read_conv`). A float32 convolution's mainloop is 3xTF32's, as a float32 GEMM's
(`gemm_kernel_sm80.py` says why not plain TF32's)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from kevin_backend.generate.builtin.gemm_kernel_sm80 import ELEMENTS, PACK, Sm80Tiling, mainloop_fields

__all__ = ["Conv", "ConvTiling", "SM90_CONV_TILINGS", "conv_alignment", "conv_cuda_source", "conv_device_source",
           "conv_tree_refusal", "hopper_conv", "sm90_conv_fits"]


@dataclass(frozen=True)
class Conv:
    """The convolution's constants, one per spatial dimension ((R, S), or (T, R, S) for 3-D): the
    filter's size, the padding, stride and dilation (default 0, 1, 1), a transposed convolution's
    output padding; whether it is transposed, whether the input (and so the output eager
    returns) is channels-last, and whether the output of a plain input is returned as it lies
    too, N x ... x C_out (`out_as_it_lies`: for the built-in writer's kernel after it, reading its
    channels contiguous, without the transpose back)."""

    filter: tuple[int, ...]
    padding: tuple[int, ...] = ()
    stride: tuple[int, ...] = ()
    dilation: tuple[int, ...] = ()
    channels_last: bool = False
    transposed: bool = False
    output_padding: tuple[int, ...] = ()
    out_as_it_lies: bool = False

    def __post_init__(self) -> None:
        dims = len(self.filter)
        for name, default in (("padding", 0), ("stride", 1), ("dilation", 1), ("output_padding", 0)):
            value = tuple(int(v) for v in getattr(self, name)) or (default,) * dims
            object.__setattr__(self, name, value)
        object.__setattr__(self, "filter", tuple(int(v) for v in self.filter))
        if dims not in (2, 3) or any(len(getattr(self, n)) != dims for n in ("padding", "stride", "dilation", "output_padding")):
            raise ValueError(f"a convolution's filter, padding, stride, dilation and output padding: 2 or 3 values each, "
                             f"one per spatial dimension (filter {self.filter})")
        if min(self.filter + self.stride + self.dilation) < 1 or min(self.padding + self.output_padding) < 0:
            raise ValueError(f"a convolution of filter {self.filter}, stride {self.stride}, dilation {self.dilation}, padding "
                             f"{self.padding}: sizes of 1 or more, padding 0 or more")
        if self.transposed and (dims != 2 or self.dilation != (1, 1)):
            raise ValueError("a transposed convolution on CUTLASS 2.x's tensor cores: 2-D (or 1-D), dilation 1")
        if any(o >= s for o, s in zip(self.output_padding, self.stride)) or (any(self.output_padding) and not self.transposed):
            raise ValueError(f"output padding {self.output_padding}: a transposed convolution's, each below its stride {self.stride}")

    @property
    def dims(self) -> int:
        return len(self.filter)

    def describe(self) -> str:
        x = "x".join
        return (f"a {x(map(str, self.filter))} {'transposed ' if self.transposed else ''}{self.dims}-D convolution, "
                f"stride {x(map(str, self.stride))}, padding {x(map(str, self.padding))}"
                + (f", dilation {x(map(str, self.dilation))}" if set(self.dilation) != {1} else "")
                + (f", output padding {x(map(str, self.output_padding))}" if any(self.output_padding) else "")
                + (" of a channels-last input" if self.channels_last else "")
                + (", its output channels innermost as it lies" if self.out_as_it_lies and not self.channels_last else ""))


@dataclass(frozen=True)
class ConvTiling:
    """A variant of Hopper's convolution (CUTLASS 3.x's implicit GEMM: im2col TMA loads into shared
    memory, wgmma, one consumer warp group, a TMA store): the CTA's tile (M, N, K) and the cluster's
    shape along M and N."""

    tile: tuple[int, int, int] = (128, 128, 64)
    cluster: tuple[int, int] = (1, 1)

    def __post_init__(self) -> None:
        m, n, k = self.tile
        if m not in (64, 128) or n % 16 or not 16 <= n <= 256 or k != 64 or self.cluster not in ((1, 1), (2, 1), (1, 2)):
            raise ValueError(f"tile {self.tile}, cluster {self.cluster}: M 64 or 128 (one warp group), N a multiple of 16 "
                             "up to 256, K 64; a cluster of 1 or 2 CTAs")

    @property
    def name(self) -> str:
        return f"sm90 conv tile {'x'.join(map(str, self.tile))} cluster {'x'.join(map(str, self.cluster))}"


# Hopper's convolution variants, tried before CUTLASS 2.x's (`SM80_TILINGS`) on a Hopper GPU; one
# consumer warp group holds a 128 x 128 float32 accumulator at most
SM90_CONV_TILINGS = (ConvTiling((128, 128, 64), (1, 1)), ConvTiling((128, 128, 64), (2, 1)), ConvTiling((128, 64, 64), (1, 1)))


def hopper_conv(spec: Any) -> bool:
    """Whether `spec` is what Hopper's convolution computes, its epilogue aside: a 16-bit forward
    convolution on sm90 whose output channels TMA stores whole (a multiple of 8), no residual
    beside a bias."""
    e, c = spec.epilogue, spec.convolution
    return (c is not None and spec.arch == "sm90" and spec.dtype != "float32" and not c.transposed and not e.residual
            and spec.alignments[1] == 8)


def sm90_conv_fits(spec: Any) -> bool:
    """Whether Hopper's convolution takes `spec` (`hopper_conv`), its epilogue a bias and a function
    or a tree it reads (`conv_tree_refusal`)."""
    e = spec.epilogue
    return hopper_conv(spec) and not (e.tree and conv_tree_refusal(e.operands, hopper=True))


def conv_alignment(dtype: str) -> int:
    """The channels the kernel reads at a time (16 bytes): C is rounded up to a multiple of it."""
    return 4 if dtype == "float32" else 8


def conv_tree_refusal(operands: tuple[str, ...], transposed: bool = False, hopper: bool = False) -> str:
    """Why a convolution's kernel cannot read a tree epilogue's `operands` ("" where it can).
    CUTLASS 2.x's reads two at most: a vector over the output channels that it broadcasts (V, its
    `EpilogueWithBroadcast`), and a source C: a second such vector (read with strides 0) or a
    tensor of the output's size; not with a transposed convolution (it has no such kernel).
    Hopper's (`hopper`: the GEMM's visitor tree) reads any vectors over the output channels (an
    inference batch norm's four, say) and one tensor of the output's size."""
    if transposed:
        return "a transposed convolution's epilogue: no visitor tree (CUTLASS 2.x's strided gradient kernel reads one source)"
    if set(operands) - {"n", "mn"} or operands.count("mn") > 1:
        return f"a convolution's tree reads vectors over the output channels and one tensor of the output's size, not {list(operands)}"
    if len(operands) > 2 and not hopper:
        return (f"a convolution's tree of {len(operands)} operands: CUTLASS 2.x's reads one vector over the output channels "
                "and one more such vector or a tensor of the output's size (Hopper's, of a 16-bit convolution, reads more)")
    return ""


def _tree_roles(operands: tuple[str, ...]) -> tuple[int | None, int | None]:
    """Which operand the kernel broadcasts (V: the first vector) and which it reads as its source C."""
    vector = next((j for j, kind in enumerate(operands) if kind == "n"), None)
    source = next((j for j in range(len(operands)) if j != vector), None)
    return vector, source


def _three(values: tuple[int, ...], fill: int) -> tuple[int, int, int]:
    """(depth, height, width) of a 2-D or 3-D convolution's constants, a 2-D one's depth `fill`."""
    return tuple([fill] * (3 - len(values)) + list(values))  # type: ignore[return-value]


def conv_device_source(spec: Any, tiling: Sm80Tiling | ConvTiling, activation: str, functor: str,
                       tree_fusion: tuple[str, str] = ("", "")) -> str:
    """The device part: the kernel's types, `kevin_conv_run(shape, ...)` and `kevin_conv_workspace(shape)`
    (shape: N, D, H, W, C, K, Z, P, Q: the activation N x D x H x W x C, the filter K x T x R x S x C,
    the output N x Z x P x Q x K; a transposed convolution's activation is its output, its filter's
    K its input's channels), and the packing kernel. `tree_fusion`: a tree's visitor tree for
    Hopper's kernel and the lines setting its arguments (`gemm_kernel._tree`)."""
    if isinstance(tiling, ConvTiling):
        return _sm90_device_source(spec, tiling, activation, functor, tree_fusion) + PACK
    e, c = spec.epilogue, spec.convolution  # (what it may read: `GemmSpec`'s checks)
    if e.tree and (conv_tree_refusal(e.operands, c.transposed) or e.wide):
        raise ValueError(f"{tiling.name}: {conv_tree_refusal(e.operands, c.transposed) or 'float32 vectors: Hopper reads them'}")
    vector, from_c = _tree_roles(e.operands) if e.tree else (None, None)
    source = "static_cast<ElementD*>(const_cast<void*>(bias))" if e.bias else "static_cast<ElementD*>(const_cast<void*>(residual))" \
        if e.residual or from_c is not None else "static_cast<ElementD*>(out)"
    (t, r, s), (pd, ph, pw), (sd, sh, sw), (dd, dh, dw) = (_three(v, f) for v, f in
                                                           ((c.filter, 1), (c.padding, 0), (c.stride, 1), (c.dilation, 1)))
    with_broadcast = "WithBroadcast" if e.tree else ""
    if c.dims == 3:
        problem = (f"cutlass::conv::Conv3dProblemSize problem(n, d, h, w_, c, k, {t}, {r}, {s}, z, p, q, {pd}, {ph}, {pw}, {sd}, {sh}, "
                   f"{sw}, {dd}, {dh}, {dw}, cutlass::conv::Mode::kCrossCorrelation, 1, 1)")
        layout, include, kernel = "cutlass::layout::TensorNDHWC", f"default_conv3d_fprop{'_with_broadcast' * e.tree}.h", _FPROP3D
    else:
        problem = (f"cutlass::conv::Conv2dProblemSize problem(n, h, w_, c, k, {r}, {s}, p, q, {ph}, {pw}, {sh}, {sw}, {dh}, {dw}, "
                   "cutlass::conv::Mode::kCrossCorrelation, 1, 1)")
        layout = "cutlass::layout::TensorNHWC"
        include, kernel = ("default_conv2d_dgrad.h", _DGRAD) if c.transposed else \
            (f"default_conv2d_fprop{'_with_broadcast' * e.tree}.h", _FPROP2D)
    sizes = "n, d, h, w_, c" if c.dims == 3 else "n, h, w_, c"
    filt = f"k, {t}, {r}, {s}, c" if c.dims == 3 else f"k, {r}, {s}, c"
    outs = "n, z, p, q, k" if c.dims == 3 else "n, p, q, k"
    # the activation (A of a convolution, C and D of a transposed one) and the output (the reverse)
    act, res = (f"{layout}::packed({{{outs}}})", f"{layout}::packed({{{sizes}}})") if c.transposed else \
        (f"{layout}::packed({{{sizes}}})", f"{layout}::packed({{{outs}}})")
    if e.tree:  # (the function of the accumulator, V and C: `_TREE_OP`)
        reads = ", ".join("vec[i]" if j == vector else "static_cast<float>(c[i])" for j in range(len(e.operands)))
        op = _TREE_OP.format(reads=f", {reads}" if reads else "", source=int(from_c is not None))
        epilogue_op, params = "KevinConvTreeOp<ElementD, kAlignD>", "epilogue, cutlass::conv::SplitKMode::kSerial, const_cast<void*>(bias)"
        stride_0 = from_c is not None and e.operands[from_c] == "n"
    else:
        op, params, stride_0 = "", "epilogue", bool(e.bias)
        epilogue_op = "cutlass::epilogue::thread::LinearCombinationGeneric<{activation}, ElementD, kAlignD, float, float>".format(
            activation=activation)
    return _DEVICE.format(
        **mainloop_fields(spec.dtype, tiling), functor=functor + op, align=conv_alignment(spec.dtype), out_align=spec.alignments[1],
        epilogue_op=epilogue_op, include=include, **{**kernel, "kernel": kernel["kernel"] + with_broadcast}, layout=layout,
        problem=problem, layout_x=act, layout_w=f"{layout}::packed({{{filt}}})", layout_out=res, arguments=params,
        epilogue="typename EpilogueOp::Params epilogue" + ("" if e.tree else
                                                             f"({float(e.alpha)!r}f, {float(e.beta) if e.residual else 1.0 if e.bias else 0.0!r}f)"),
        source=source, layout_c=f"{layout}({layout}::Stride(0))" if stride_0 else "layout_out") + _ENTRY + PACK


def _sm90_device_source(spec: Any, tiling: ConvTiling, activation: str, functor: str, tree_fusion: tuple[str, str]) -> str:
    """Hopper's device part (`ConvTiling`): CUTLASS 3.x's `ConvUniversal` with the GEMM's fusions (a
    bias over the output channels and an activation or function; a tree: `tree_fusion`, the GEMM's
    visitor tree and the lines setting its arguments, as the GEMM's reads them: `bias` the host
    array of its vectors' pointers, `residual` its tensor of the output's size), the same entry points."""
    if not sm90_conv_fits(spec):
        raise ValueError(f"{tiling.name}: Hopper's convolution takes a 16-bit forward convolution on sm90, its output "
                         "channels a multiple of 8, no residual, a tree of vectors and one tensor of the output's size")
    e, c = spec.epilogue, spec.convolution
    pads, strides, dilations = (", ".join(map(str, v)) for v in (c.padding, c.stride, c.dilation))
    taps = ", ".join(map(str, c.filter))
    reads_c = "mn" in e.operands
    if e.tree:
        fusion, thread_args = tree_fusion
    else:
        fusion = (f"cutlass::epilogue::fusion::LinCombPerColBiasEltAct<{activation}, ElementD, float, Element, void, float>" if e.bias
                  else f"cutlass::epilogue::fusion::LinCombEltAct<{activation}, ElementD, float, void, float>")
        thread_args = (f"    args.epilogue.thread.alpha = {float(e.alpha)!r}f;\n    args.epilogue.thread.beta = 0.0f;\n"
                       + ("    args.epilogue.thread.bias_ptr = static_cast<Element const*>(bias);\n" if e.bias else ""))
    (tm, tn, tk), (cm, cn) = tiling.tile, tiling.cluster
    return _DEVICE_SM90.format(
        element=ELEMENTS[spec.dtype], functor=functor, tm=tm, tn=tn, tk=tk, cm=cm, cn=cn, fusion=fusion,
        layout="cutlass::layout::TensorNDHWC" if c.dims == 3 else "cutlass::layout::TensorNHWC",
        act="{n, d, h, w_, c}" if c.dims == 3 else "{n, h, w_, c}", flt=f"{{k, {taps}, c}}", pads=f"{{{pads}}}",
        strides=f"{{{strides}}}", dilations=f"{{{dilations}}}", thread_args=thread_args,
        source_element="Element" if reads_c else "void", c_ptr="static_cast<Element const*>(residual)" if reads_c else "nullptr") + _ENTRY


def conv_cuda_source(spec: Any, tiling: Sm80Tiling | ConvTiling, activation: str, functor: str, scalar: str, params: str,
                     tree_fusion: tuple[str, str] = ("", "")) -> str:
    """The whole CUDA source: the device part and the host function `gemm_epilogue(x, w, bias, residual)`
    (a tree's: `gemm_epilogue(x, w, a0, a1, ...)`)."""
    c = spec.convolution
    (t, r, s), (pd, ph, pw), (sd, sh, sw), (dd, dh, dw), (od, oh, ow) = (
        _three(v, f) for v, f in ((c.filter, 1), (c.padding, 0), (c.stride, 1), (c.dilation, 1), (c.output_padding, 0)))
    e, align = spec.epilogue, spec.alignments[1]  # (the epilogue reads its vectors and source as it stores)
    if e.tree and isinstance(tiling, ConvTiling):  # (Hopper's: its vectors' pointers in an array, as the GEMM's tree)
        vectors = [j for j, kind in enumerate(e.operands) if kind == "n"]
        operands = ([f"    const void* vectors[{len(vectors)}] = {{}};\n"] if vectors else []) + [
            _VECTOR.format(name=f"a{j}", ptr=f"vectors[{i}]", scalar="at::kFloat" if j in e.wide else scalar, align=align)
            for i, j in enumerate(vectors)] + (
            ["    bias_ptr = vectors;\n"] if vectors else []) + [
            _SOURCE.format(name=f"a{j}", scalar=scalar, last=c.dims + 1, align=align) for j, kind in enumerate(e.operands) if kind == "mn"]
    elif e.tree:  # (CUTLASS 2.x's: its operands a0, a1 the vector V and the source C)
        vector, source = _tree_roles(e.operands)
        operands = ([_VECTOR.format(name=f"a{vector}", ptr="bias_ptr", scalar=scalar, align=align)] if vector is not None else []) + (
            [] if source is None else [_VECTOR.format(name=f"a{source}", ptr="residual_ptr", scalar=scalar, align=align)] if e.operands[source] == "n"
            else [_SOURCE.format(name=f"a{source}", scalar=scalar, last=c.dims + 1, align=align)])
    else:
        operands = ([_VECTOR.format(name="bias", ptr="bias_ptr", scalar=scalar, align=align)] if e.bias else []) + (
            [_SOURCE.format(name="residual", scalar=scalar, last=c.dims + 1, align=align)] if e.residual else [])
    return conv_device_source(spec, tiling, activation, functor, tree_fusion) + _HOST.format(operands="".join(operands),
        scalar=scalar, params=params, dims=c.dims, filter=f"{t}, {r}, {s}", pad=f"{pd}, {ph}, {pw}", stride=f"{sd}, {sh}, {sw}",
        dilation=f"{dd}, {dh}, {dw}", output_padding=f"{od}, {oh}, {ow}", taps=math.prod(c.filter), transposed=int(c.transposed),
        align=conv_alignment(spec.dtype), out_align=spec.alignments[1],
        channels_last=int(c.channels_last), as_it_lies=int(c.channels_last or c.out_as_it_lies), last=c.dims + 1, spatial=", ".join(f"out[{3 - c.dims + i}]" for i in range(c.dims)))


# the three kernels: the name of CUTLASS's default kernel, its threadblock order, its last arguments
_FPROP2D = dict(kernel="DefaultConv2dFprop", swizzle="cutlass::gemm::threadblock::GemmIdentityThreadblockSwizzle<>",
                trailer="cutlass::conv::IteratorAlgorithm::kOptimized, cutlass::conv::StrideSupport::kStrided, kAlign, kAlign")
_FPROP3D = dict(kernel="DefaultConv3dFprop", swizzle="cutlass::gemm::threadblock::GemmIdentityThreadblockSwizzle<>",
                trailer="cutlass::conv::IteratorAlgorithm::kOptimized, cutlass::conv::StrideSupport::kStrided")  # (16-byte accesses)
_DGRAD = dict(kernel="DefaultConv2dDgrad", swizzle="cutlass::conv::threadblock::StridedDgradIdentityThreadblockSwizzle<1>",
              trailer="cutlass::conv::IteratorAlgorithm::kOptimized, cutlass::conv::StrideSupport::kStrided, kAlign, kAlign")

_DEVICE = """#include <cutlass/cutlass.h>
#include <cutlass/conv/kernel/{include}>
#include <cutlass/conv/threadblock/threadblock_swizzle.h>
#include <cutlass/conv/device/implicit_gemm_convolution.h>
#include <cutlass/epilogue/thread/linear_combination_generic.h>
#include <cutlass/epilogue/thread/activation.h>

namespace kevin_gemm {{
using Element = {element};
using ElementD = {element};  // (the output in the inputs' dtype)
{functor}constexpr int kAlign = {align};  // channels read at a time
constexpr int kAlignD = {out_align};  // output channels stored at a time
static_assert(kAlign * sizeof(Element) == 16, "the channels are read 16 bytes at a time");
using EpilogueOp = {epilogue_op};
using Kernel = typename cutlass::conv::kernel::{kernel}<
    Element, {layout}, Element, {layout}, ElementD, {layout}, float,
    cutlass::arch::OpClassTensorOp, cutlass::arch::Sm80,
    cutlass::gemm::GemmShape<{tm}, {tn}, {tk}>, cutlass::gemm::GemmShape<{wm}, {wn}, {wk}>, cutlass::gemm::GemmShape<{instruction}>,
    EpilogueOp, {swizzle}, {stages}, {operator},
    {trailer}>::Kernel;
using Conv = cutlass::conv::device::ImplicitGemmConvolution<Kernel>;

static typename Conv::Arguments arguments(int const* shape, void const* x, void const* w, void const* bias, void const* residual,
                                          void* out) {{
    // shape: N, D, H, W, C (the packed channels), K, Z, P, Q: the activation N x D x H x W x C, the filter
    // K x T x R x S x C, the output N x Z x P x Q x K (a 2-D convolution's D and Z 1); a transposed
    // convolution reads the output and writes the activation. C: the bias as one row of channels read
    // everywhere (strides 0), the residual, or (beta 0) not read
    const int n = shape[0], d = shape[1], h = shape[2], w_ = shape[3], c = shape[4], k = shape[5], z = shape[6], p = shape[7],
              q = shape[8];
    (void)d, (void)z;
    {problem};
    auto layout_x = {layout_x};
    auto layout_w = {layout_w};
    auto layout_out = {layout_out};
    {epilogue};
    return typename Conv::Arguments(
        problem, {{static_cast<Element*>(const_cast<void*>(x)), layout_x}}, {{static_cast<Element*>(const_cast<void*>(w)), layout_w}},
        {{{source}, {layout_c}}}, {{static_cast<ElementD*>(out), layout_out}}, {arguments});
}}
}}  // namespace kevin_gemm

"""

# The entry points both kernels' device parts end with: the workspace's bytes, and a run (0, or
# CUTLASS's status where it cannot take the problem or fails to start)
_ENTRY = """
extern "C" size_t kevin_conv_workspace(int const* shape) {
    return kevin_gemm::Conv::get_workspace_size(kevin_gemm::arguments(shape, nullptr, nullptr, nullptr, nullptr, nullptr));
}

extern "C" int kevin_conv_run(int const* shape, void const* x, void const* w, void const* bias, void const* residual, void* out,
                              void* workspace, cudaStream_t stream) {
    kevin_gemm::Conv conv;
    auto args = kevin_gemm::arguments(shape, x, w, bias, residual, out);
    cutlass::Status status = conv.can_implement(args);
    if (status != cutlass::Status::kSuccess) return static_cast<int>(status);
    status = conv.initialize(args, workspace, stream);
    if (status != cutlass::Status::kSuccess) return static_cast<int>(status);
    return static_cast<int>(conv.run(stream));
}
"""

# Hopper's: CUTLASS 3.x's convolution (the GEMM's epilogue builder and fusions; CUTLASS's utility
# headers, `cutlass_headers.CutlassHeaders.includes`, for its strides)
_DEVICE_SM90 = """#include <cutlass/cutlass.h>
#include <cutlass/kernel_hardware_info.hpp>
#include <cute/tensor.hpp>
#include <cutlass/conv/convnd_problem_shape.hpp>
#include <cutlass/conv/collective/collective_builder.hpp>
#include <cutlass/conv/kernel/conv_universal.hpp>
#include <cutlass/conv/device/conv_universal_adapter.hpp>
#include <cutlass/epilogue/collective/collective_builder.hpp>
#include <cutlass/epilogue/fusion/operations.hpp>
#include <cutlass/epilogue/thread/activation.h>

namespace kevin_gemm {{
using namespace cute;
using Element = {element};
using ElementD = {element};  // (the output in the inputs' dtype)
{functor}constexpr int kAlign = 8;  // channels read and stored at a time: TMA's 16 bytes
using TileShape = Shape<_{tm}, _{tn}, Shape<_{tk}>>;
using ClusterShape = Shape<_{cm}, _{cn}, _1>;
using Layout = {layout};
using Fusion = {fusion};
using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
    cutlass::epilogue::collective::EpilogueTileAuto, float, float,
    {source_element}, Layout, kAlign, ElementD, Layout, kAlign, cutlass::epilogue::TmaWarpSpecialized, Fusion>::CollectiveOp;
using CollectiveMainloop = typename cutlass::conv::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, cutlass::conv::Operator::kFprop,
    Element, Layout, kAlign, Element, Layout, kAlign, float, TileShape, ClusterShape,
    cutlass::conv::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename CollectiveEpilogue::SharedStorage))>,
    cutlass::conv::KernelImplicitTmaWarpSpecializedSm90>::CollectiveOp;
using ProblemShape = cutlass::conv::ConvProblemShape<cutlass::conv::Operator::kFprop, CollectiveMainloop::DispatchPolicy::NumSpatialDimensions>;
using Kernel = cutlass::conv::kernel::ConvUniversal<ProblemShape, CollectiveMainloop, CollectiveEpilogue>;
using Conv = cutlass::conv::device::ConvUniversalAdapter<Kernel>;

static typename Conv::Arguments arguments(int const* shape, void const* x, void const* w, void const* bias, void const* residual,
                                          void* out) {{
    // shape: N, D, H, W, C (the packed channels), K, Z, P, Q (`conv_device_source`); the problem
    // computes the output's extent and packed strides itself
    const int n = shape[0], d = shape[1], h = shape[2], w_ = shape[3], c = shape[4], k = shape[5];
    (void)d, (void)bias, (void)residual;
    ProblemShape problem(cutlass::conv::Mode::kCrossCorrelation, {act}, {flt}, {pads}, {pads}, {strides}, {dilations}, 1);
    typename Kernel::StrideD stride_d;
    cute::for_each(cute::make_seq<cute::rank<0>(typename Kernel::StrideD{{}})>{{}}, [&](auto i) {{
        cute::get<0, i>(stride_d) = problem.stride_C[ProblemShape::RankT - 2 - i];
    }});
    typename Conv::Arguments args{{problem, {{static_cast<Element const*>(x), static_cast<Element const*>(w)}},
                                  {{{{}}, {c_ptr}, stride_d, static_cast<ElementD*>(out), stride_d}}}};
{thread_args}    return args;
}}
}}  // namespace kevin_gemm
"""

# a vector over the output channels the kernel reads (a bias, or a tree's operand)
_VECTOR = """    TORCH_CHECK({name}.numel() == co && {name}.scalar_type() == {scalar} && {name}.is_contiguous()
                && reinterpret_cast<uintptr_t>({name}.data_ptr()) % ({align} * {name}.element_size()) == 0,
                "gemm_epilogue: {name}, a vector of C_out values of the kernel's dtype, aligned to its accesses");
    {ptr} = {name}.data_ptr();
"""

# a tensor of the output's size the kernel reads as its source C, channels innermost: in place where
# it lies so (channels-last), else packed as x is (per image, its positions' rows of channels)
_SOURCE = """    {{
        TORCH_CHECK({name}.dim() == x.dim() && {name}.numel() == n * co * out_spatial && {name}.scalar_type() == {scalar}
                    && {name}.size(0) == n && {name}.size(1) == co, "gemm_epilogue: {name}, a tensor of the output's size");
        bool last = !{name}.is_contiguous() && {name}.stride(1) == 1 && {name}.stride({last}) == co && {name}.stride(0) == out_spatial * co;
        for (int i = {last}; last && i > 2; --i) last = {name}.stride(i - 1) == {name}.stride(i) * {name}.size(i);
        TORCH_CHECK((last || {name}.is_contiguous()) && reinterpret_cast<uintptr_t>({name}.data_ptr()) % ({align} * {name}.element_size()) == 0,
                    "gemm_epilogue: {name} contiguous or channels-last, aligned to the kernel's accesses");
        residual_ptr = {name}.data_ptr();
        if (!last && co > 1 && out_spatial > 1) {{
            packed_source = torch::empty({{n * out_spatial * co}}, {name}.options());
            int status = kevin_gemm_pack({name}.data_ptr(), packed_source.data_ptr(), static_cast<int>(n), out_spatial, co, co,
                                         co * out_spatial, 1, out_spatial, at::cuda::getCurrentCUDAStream().stream());
            TORCH_CHECK(status == 0, "gemm_epilogue: packing {name}: CUDA error ", status);
            residual_ptr = packed_source.data_ptr();
        }}
    }}
"""

_HOST = """
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>

torch::Tensor gemm_epilogue({params}) {{
    // x N x C_in x [D x] H x W (plain or channels-last); w C_out x C_in x filter (a transposed
    // convolution's: C_in x C_out x filter); the output N x C_out x ... as eager's (channels-last
    // of a channels-last input). Sizes along depth, height and width; a 2-D convolution's depth 1
    const int64_t kFilter[3] = {{{filter}}}, kPad[3] = {{{pad}}}, kStride[3] = {{{stride}}}, kDilation[3] = {{{dilation}}},
                  kOutputPadding[3] = {{{output_padding}}};
    const bool transposed = {transposed};
    TORCH_CHECK(x.is_cuda() && w.is_cuda() && x.scalar_type() == {scalar} && w.scalar_type() == {scalar} && x.dim() == {dims} + 2
                && w.dim() == {dims} + 2, "gemm_epilogue: x and w of a {dims}-D convolution on the GPU, of the kernel's dtype");
    const int64_t n = x.size(0), ci = x.size(1), co = w.size(transposed ? 1 : 0);
    TORCH_CHECK(ci > 0 && w.size(transposed ? 0 : 1) == ci, "gemm_epilogue: w's input channels are x's");
    int64_t in[3] = {{1, 1, 1}}, out[3] = {{1, 1, 1}};
    for (int i = 0; i < {dims}; ++i) {{
        const int j = 3 - {dims} + i;
        TORCH_CHECK(w.size(2 + i) == kFilter[j], "gemm_epilogue: w's filter of the size the kernel was written for");
        in[j] = x.size(2 + i);
        const int64_t span = in[j] + 2 * kPad[j] - kDilation[j] * (kFilter[j] - 1) - 1;
        TORCH_CHECK(transposed || span >= 0, "gemm_epilogue: an input smaller than the filter");
        out[j] = transposed ? (in[j] - 1) * kStride[j] - 2 * kPad[j] + kDilation[j] * (kFilter[j] - 1) + kOutputPadding[j] + 1
                            : span / kStride[j] + 1;
        TORCH_CHECK(out[j] > 0, "gemm_epilogue: an output of at least one position along each dimension");
    }}
    const int64_t spatial = in[0] * in[1] * in[2], out_spatial = out[0] * out[1] * out[2];
    const int64_t cip = (ci + {align} - 1) / {align} * {align};  // (input channels rounded up to the kernel's access)
    TORCH_CHECK(co % {out_align} == 0 && (!transposed || (cip == ci && co % {align} == 0)),
                "gemm_epilogue: output channels a multiple of {out_align} (a transposed convolution's channels multiples of {align})");
    // channels-last as the plan read it: not contiguous, the channels innermost, the rest packed
    // (a 1 x 1 image or one channel is both)
    bool channels_last = !x.is_contiguous() && x.stride(1) == 1 && x.stride({last}) == ci && x.stride(0) == x.stride(2) * x.size(2);
    for (int i = {last}; i > 2; --i) channels_last = channels_last && x.stride(i - 1) == x.stride(i) * x.size(i);
    // w as it lies: contiguous, or (a convolution's) channels-last, which is the kernel's K x [T x] R x S x C
    bool w_last = !transposed && !w.is_contiguous() && w.stride(1) == 1 && w.stride({last}) == ci && w.stride(0) == {taps} * ci;
    for (int i = {last}; i > 2; --i) w_last = w_last && w.stride(i - 1) == w.stride(i) * w.size(i);
    TORCH_CHECK(channels_last == bool({channels_last}) && (channels_last || x.is_contiguous()) && (w_last || w.is_contiguous()),
                "gemm_epilogue: x laid out as the kernel was written for, w contiguous or channels-last");
    cudaStream_t stream = at::cuda::getCurrentCUDAStream().stream();
    const void* bias_ptr = nullptr;  // (a bias over the output channels; a tree's vector V)
    const void* residual_ptr = nullptr;  // (the residual; a tree's source C)
    torch::Tensor packed_source;
{operands}    auto y = torch::empty({{n, {spatial}, co}}, x.options());
    if (n == 0 || co == 0) return {as_it_lies} ? y : torch::empty({{n, co, {spatial}}}, x.options());
    // x with its channels innermost: in place, or packed (from a channels-last input: its rows of
    // channels; from a plain one: per image, its positions' rows of channels a column apart)
    const void* x_ptr = x.data_ptr();
    torch::Tensor xp;
    int packed = 0;
    if (!channels_last || cip != ci) {{
        xp = torch::empty({{n * spatial * cip}}, x.options());
        packed = channels_last ? kevin_gemm_pack(x.data_ptr(), xp.data_ptr(), 1, n * spatial, ci, cip, 0, ci, 1, stream)
                               : kevin_gemm_pack(x.data_ptr(), xp.data_ptr(), static_cast<int>(n), spatial, ci, cip, ci * spatial, 1,
                                                 spatial, stream);
        x_ptr = xp.data_ptr();
    }}
    // w with its channels innermost: in place (channels-last, its channels a multiple of the access), or
    // packed: per filter row (C_out of a convolution, C_in of a transposed one), its taps' rows of
    // channels a column apart (plain), or its rows of channels (channels-last)
    const int64_t rows = w.size(0), cols = w.size(1), colsp = transposed ? cols : cip;
    const void* w_ptr = w.data_ptr();
    torch::Tensor wp;
    if (!w_last || colsp != cols) {{
        wp = torch::empty({{rows * {taps} * colsp}}, w.options());
        if (packed == 0) packed = w_last ? kevin_gemm_pack(w.data_ptr(), wp.data_ptr(), 1, rows * {taps}, cols, colsp, 0, cols, 1, stream)
                                         : kevin_gemm_pack(w.data_ptr(), wp.data_ptr(), static_cast<int>(rows), {taps}, cols, colsp,
                                                           cols * {taps}, 1, {taps}, stream);
        w_ptr = wp.data_ptr();
    }}
    TORCH_CHECK(packed == 0, "gemm_epilogue: packing x and w: CUDA error ", packed);
    // the kernel's activation is x (a transposed convolution's: the output), its output the other
    const int64_t* act = transposed ? out : in;
    const int64_t* res = transposed ? in : out;
    const int shape[9] = {{static_cast<int>(n), static_cast<int>(act[0]), static_cast<int>(act[1]), static_cast<int>(act[2]),
                          static_cast<int>(transposed ? co : cip), static_cast<int>(transposed ? ci : co), static_cast<int>(res[0]),
                          static_cast<int>(res[1]), static_cast<int>(res[2])}};
    auto workspace = torch::empty({{static_cast<int64_t>(kevin_conv_workspace(shape))}}, x.options().dtype(torch::kUInt8));
    int status = kevin_conv_run(shape, x_ptr, w_ptr, bias_ptr, residual_ptr, y.data_ptr(), workspace.data_ptr(), stream);
    TORCH_CHECK(status == 0, "gemm_epilogue: CUTLASS status ", status);
    if ({as_it_lies}) return y;  // (N x ... x C_out: channels-last, or for the writer's kernel after it)
    // N x ... x C_out into N x C_out x ...: per image, C_out rows of its positions, a column apart
    auto o = torch::empty({{n, co, {spatial}}}, x.options());
    packed = kevin_gemm_pack(y.data_ptr(), o.data_ptr(), static_cast<int>(n), co, out_spatial, out_spatial, out_spatial * co, 1, co, stream);
    TORCH_CHECK(packed == 0, "gemm_epilogue: the output's transpose: CUDA error ", packed);
    return o;
}}
"""

# A tree epilogue's output operation for CUTLASS's `EpilogueWithBroadcast` (in place of its
# `LinearCombinationResidualBlock`): the tree's function (`KevinTreeFn`, `gemm_kernel._tree`) of the
# accumulator and its operands, one the broadcast vector V, the other the source C (`_tree_roles`)
_TREE_OP = """template <typename ElementOutput_, int Count>
struct KevinConvTreeOp {{
  static bool const kIsSingleSource = true;
  static bool const kIsHeavy = true;
  static bool const kStoreZ = true;
  static bool const kStoreT = false;
  static int const kElementsPerAccess = Count;
  static int const kCount = Count;
  using ElementOutput = ElementOutput_;
  using ElementC = ElementOutput_;
  using ElementZ = ElementOutput_;
  using ElementT = ElementOutput_;
  using ElementVector = ElementOutput_;
  using ElementAccumulator = float;
  using ElementCompute = float;
  using FragmentAccumulator = cutlass::Array<float, Count>;
  using FragmentCompute = cutlass::Array<float, Count>;
  using FragmentC = cutlass::Array<ElementC, Count>;
  using FragmentOutput = cutlass::Array<ElementOutput, Count>;
  using FragmentZ = FragmentOutput;
  using FragmentT = FragmentOutput;
  struct Params {{}};
  CUTLASS_HOST_DEVICE explicit KevinConvTreeOp(Params const&) {{}}
  CUTLASS_HOST_DEVICE bool is_source_needed() const {{ return {source}; }}
  CUTLASS_HOST_DEVICE void set_k_partition(int, int) {{}}
  CUTLASS_HOST_DEVICE void operator()(FragmentZ& z, FragmentT&, FragmentAccumulator const& ab, FragmentC const& c,
                                      FragmentCompute const& vec) const {{
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < Count; ++i) {{ z[i] = ElementOutput(KevinTreeFn<FragmentCompute>::scalar(ab[i]{reads})); }}
  }}
  CUTLASS_HOST_DEVICE void operator()(FragmentZ& z, FragmentT& t, FragmentAccumulator const& ab, FragmentCompute const& vec) const {{
    FragmentC c;
    c.clear();
    (*this)(z, t, ab, c, vec);
  }}
}};
"""
