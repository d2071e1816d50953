"""The GEMM on CUTLASS 2.x's multistage tensor-core kernel for sm80: Ampere's GEMM, which runs on
Ada and Hopper as well (cp.async loads into shared memory, `mma.sync` on the tensor cores).

Two uses:
- float32 on any GPU, with three TF32 products per multiply-add (`OpMultiplyAddFastF32`: each
  operand split into a TF32 value and its remainder, the small cross terms kept), float32's
  accuracy where one TF32 product has 10 mantissa bits. Plain TF32 (`Sm80Tiling.tf32`, one
  product, the operands rounded to nearest) only where the task's numerics let cuBLAS compute
  float32 matmuls in TF32 (`GemmSpec.tf32`), and then after each of 3xTF32's tilings, for the
  judge to refuse if it must (it refused 6 of 10 on an H100). Not for a convolution, whose
  float32 eager computes in TF32 under torch's defaults: on the H200 the judge refused plain TF32
  on 4 of 5 float32 convolutions against float64, 5-35% past the bound on 0.02-35% of the
  elements, where cuDNN's own TF32 stayed within it; the writer declines those
  (`gemm_plan._implicit_gemm`);
- float16 and bfloat16 (accumulated in float32) on GPUs without Hopper's TMA and wgmma: Ampere and
  Ada (`GemmSpec.arch` "sm80"); on Hopper the writer uses `gemm_kernel.py`'s sm90 kernels, and this
  one only for rows TMA cannot read.

Same host function and entry points as the sm90 kernels (`gemm_kernel.py`): `kevin_gemm_run`,
`kevin_gemm_workspace`. The epilogue is CUTLASS's `LinearCombinationGeneric`, D = f(alpha * acc +
beta * C): a bias is C read as one row for every row (its row stride 0), a residual is C itself;
not both. A visitor tree (`Epilogue.operands`) is CUTLASS 2.x's (`Sm80EVT`): the same function
of the accumulator and its operands as the sm90 kernels', stored by an auxiliary store
(`_tree_source`). Rows need not be 16-byte aligned: x's and w's
elements per access (`sm80_alignment`) are as many as their rows' length allows, down to 4 bytes
(cp.async's smallest copy: one float, two 16-bit values); the output's, as many as N allows, down
to one (an LM head's 50257 logits). 16-bit rows no copy of 4 bytes reads (odd K, or a K x N weight
of odd N) are first packed by the program (`PACK`): x and w copied into rows of K rounded up to 8,
zeros after K, w as N x K.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

__all__ = ["ELEMENTS", "ENTRY_POINTS", "PACK", "PACK_KERNEL", "mainloop_fields", "F32_TILINGS", "NARROW_CONV_TILINGS", "SM80_TILINGS", "Sm80Tiling", "TF32_TILINGS", "sm80_alignment", "sm80_device_source", "sm80_tilings",
           "source_operand"]


@dataclass(frozen=True)
class Sm80Tiling:
    """A variant: the CTA's tile (M, N, K), the pipeline's stages, and each warp's tile (M, N, K),
    by default a quarter of the CTA's (four warps). `half` for 16-bit values (the mma's K is 16;
    float32's 3xTF32 mma reads 8); `tf32` for float32 in one TF32 product (`OpMultiplyAdd`)."""

    tile: tuple[int, int, int] = (128, 128, 16)
    stages: int = 4
    warp: tuple[int, int, int] | None = None
    half: bool = False
    tf32: bool = False

    def __post_init__(self) -> None:
        m, n, k = self.tile
        wm, wn, wk = self.warps
        if m % 32 or n % 32 or k not in ((32, 64) if self.half else (16, 32)) or not 2 <= self.stages <= 6:
            raise ValueError(f"tile {self.tile}, {self.stages} stages: M and N multiples of 32, K "
                             f"{'32 or 64' if self.half else '16 or 32'}, 2 to 6 stages")
        if self.half and self.tf32:
            raise ValueError("TF32 is float32's: a 16-bit tiling has none")
        if m % wm or n % wn or wk != k or wm % 16 or wn % 8 or (m // wm) * (n // wn) not in (1, 2, 4, 8):
            raise ValueError(f"warp tile {self.warps} of tile {self.tile}: dividing it along M and N, K whole, 1 to 8 warps")

    @property
    def warps(self) -> tuple[int, int, int]:
        m, n, k = self.tile
        return self.warp or (m // 2, n // 2, k)

    @property
    def name(self) -> str:
        warp = f" warp {'x'.join(map(str, self.warps[:2]))}" if self.warp else ""
        return f"{'sm80' if self.half else 'tf32' if self.tf32 else '3xtf32'} tile {'x'.join(map(str, self.tile))}{warp} stages {self.stages}"


# The search's variants for float32, in the order a search tries them: as the H200 ranked them on the
# suite's three float32 tasks (benchmarks/RESULTS.md, 1ef6dee: level-2 sizes, 128 and 1000 rows),
# small tiles first (64 x 64 fastest on two, 128 x 64 on the third; 1.29-1.59x Inductor), the
# 256 x 128 tile last (0.10-0.13x: 2 to 8 tiles for 132 SMs).
F32_TILINGS = (
    Sm80Tiling((64, 64, 32), 4),
    Sm80Tiling((128, 64, 32), 3),
    Sm80Tiling((128, 128, 16), 4),
    Sm80Tiling((256, 128, 16), 3),
)

# The same in one TF32 product a multiply-add, where the task's numerics allow TF32 (`sm80_tilings`)
TF32_TILINGS = tuple(dataclasses.replace(t, tf32=True) for t in F32_TILINGS)

# A float32 convolution of few output channels (32 at most: a level-2 task's 16 after 3 input
# channels, which used a quarter of the 64-wide tile) tries a tile 32 wide first
NARROW_CONV_TILINGS = (Sm80Tiling((128, 32, 32), 4),)

# The 16-bit variants (Ampere's and Ada's): CUTLASS's usual 16-bit sm80 shapes, warps of 64 x 64,
# the square tile first; every one within the 99 KiB of shared memory a block has on sm86 and sm89.
SM80_TILINGS = (
    Sm80Tiling((128, 128, 32), 4, (64, 64, 32), True),
    Sm80Tiling((128, 256, 32), 3, (64, 64, 32), True),
    Sm80Tiling((256, 128, 32), 3, (64, 64, 32), True),
    Sm80Tiling((64, 64, 64), 4, (32, 32, 64), True),
)

# An A100's SMs (108): a 16-bit GEMM with fewer 128 x 128 tiles tries the small tile first
_SMS = 108


def sm80_tilings(dtype: str, shape: tuple[int, int, int] | None = None, convolution: bool = False,
                 tf32: bool = False) -> tuple[Sm80Tiling, ...]:
    """The search's variants for `dtype` on this kernel, in order, for a GEMM of `shape` (M, N, K)
    (a float32 `convolution`'s of few output channels: a narrow tile first). `tf32`: a float32
    GEMM whose task allows TF32 tries each tile in 3xTF32, then in TF32. (On an H100 under TF32
    matmuls, the suite's ten float32 GEMMs' first tile: 3xTF32 accepted on all ten, TF32 refused
    by the judge on six and faster than 3xTF32 on two, benchmarks/RESULTS.md.)"""
    if dtype == "float32" and tf32 and not convolution:
        return tuple(t for pair in zip(F32_TILINGS, TF32_TILINGS) for t in pair)
    if dtype == "float32":
        return (NARROW_CONV_TILINGS if convolution and shape is not None and shape[1] <= 32 else ()) + F32_TILINGS
    if shape is not None and -(-shape[0] // 128) * -(-shape[1] // 128) < _SMS:
        return SM80_TILINGS[-1:] + SM80_TILINGS[:-1]
    return SM80_TILINGS


def sm80_alignment(dtype: str, n: int, k: int, weight: str = "nk") -> tuple[int, int]:
    """Elements per access (up to 16 bytes) of x and w, and of the output: as many as divide their
    rows' lengths (K; and N, for a K x N weight), and N; x's and w's 0 where none does (16-bit rows
    of odd length: cp.async copies 4 bytes at least)."""
    rows = (k, n) if weight == "kn" else (k,)
    loads = next((a for a in ((4, 2, 1) if dtype == "float32" else (8, 4, 2)) if all(r % a == 0 for r in rows)), 0)
    return loads, next(a for a in (8, 4, 2, 1) if n % a == 0 and a * (4 if dtype == "float32" else 2) <= 16)


# each dtype's CUTLASS type
ELEMENTS = {"float16": "cutlass::half_t", "bfloat16": "cutlass::bfloat16_t", "float32": "float"}


def mainloop_fields(dtype: str, tiling: Sm80Tiling) -> dict[str, Any]:
    """The fields every sm80 kernel's source (the GEMM's, the tree's, the convolution's) formats
    its mainloop with: the element, the CTA's and a warp's tiles, the stages, the mma's shape and
    its operation (three TF32 products for float32, one for a `tf32` tiling); a tiling of the other
    kind is refused."""
    sixteen = dtype != "float32"
    if tiling.half != sixteen:
        raise ValueError(f"{dtype} on the sm80 kernel takes {'a float32' if tiling.half else 'a 16-bit'} tiling, not {tiling.name!r}")
    (tm, tn, tk), (wm, wn, wk) = tiling.tile, tiling.warps
    return dict(element=ELEMENTS[dtype], tm=tm, tn=tn, tk=tk, wm=wm, wn=wn, wk=wk, stages=tiling.stages,
                instruction="16, 8, 16" if sixteen else "16, 8, 8",
                operator="cutlass::arch::OpMultiplyAdd" if sixteen or tiling.tf32 else "cutlass::arch::OpMultiplyAddFastF32")


def sm80_device_source(dtype: str, output: str, activation: str, functor: str, alpha: float, beta: float, bias: bool,
                       residual: bool, weight: str, tiling: Sm80Tiling, align: int, out_align: int, pack: bool = False,
                       tree: tuple[str, ...] = ()) -> str:
    """The device part of this kernel (`dtype`: the inputs'; `output`: the output's, the inputs' or
    float32; `activation`: a CUTLASS functor's name; `functor`: the C++ of an `Epilogue.function`, or "";
    `align`, `out_align`: x's and w's elements per access, and the output's and its source's; `pack`:
    with `PACK`, x and w read as it packs them, w as N x K; `tree`: a visitor tree's operands, "n", "m"
    or "mn" each (`gemm_kernel.OPERAND_KINDS`), `functor` then its `KevinTreeFn`)."""
    if bias and residual:
        raise ValueError("the sm80 GEMM's epilogue reads one source: a bias or a residual, not both")
    if (bias or residual) and output != dtype:
        raise ValueError("the sm80 GEMM reads its bias or residual in its output's dtype: not with a float32 output")
    fields = mainloop_fields(dtype, tiling)
    if align not in ((4, 2, 1) if dtype == "float32" else (8, 4, 2)):
        raise ValueError(f"{align} {dtype} values per access: 4, 2 or 1 for float32, 8, 4 or 2 for 16-bit values")
    if out_align not in (8, 4, 2, 1) or out_align * (4 if output == "float32" else 2) > 16:
        raise ValueError(f"{out_align} {output} values per store: a power of two, 16 bytes at most")
    source = "ElementD const*"
    c_ptr = (f"static_cast<{source}>(bias)" if bias else f"static_cast<{source}>(residual)" if residual
             else f"static_cast<{source}>(out)")
    sixteen = dtype != "float32"
    if pack and (not sixteen or align != 8):
        raise ValueError("packed rows are 16-bit values' (odd rows cp.async cannot read), read 8 at a time")
    weight = "nk" if pack else weight
    if tree:
        return _tree_source(fields, output, functor, align, out_align, weight, tree) + (PACK if pack else "")
    return _DEVICE.format(**fields, functor=functor, output=ELEMENTS[output], align=align, out_align=out_align, checked="args",
                          activation=activation, alpha=f"{float(alpha)!r}f",
                          beta=f"{float(beta) if residual else 1.0 if bias else 0.0!r}f", c_ptr=c_ptr,
                          ldc="0" if bias else "n", c_batch="0" if bias else "int64_t(m) * n",
                          layout_b="cutlass::layout::ColumnMajor" if weight == "nk" else "cutlass::layout::RowMajor",
                          ldb="k" if weight == "nk" else "n") + (PACK if pack else "")


# The device part's packing of rows for the sm80 kernel (`GemmSpec.pad_k`) and around a convolution
# (a plain layout's channels moved innermost, and back): `kevin_gemm_pack` copies `batch` matrices
# of `rows` rows of K values, each read at `src + b * batch_stride + r * row_stride + c * col_stride`,
# into packed rows of kp values (zeros after K), through PACK_TILE x PACK_TILE tiles of shared
# memory: reads along whichever of rows and columns is contiguous, writes along the packed rows.
# Each of a block's 256 threads loads its 16 values before it stores any: a 32 x 32 tile's 4 loads a
# thread kept too few bytes in flight (a 16-bit image's transposes ran at about 45% of a copy's
# bandwidth on an H100). A tile's rows are padded to an odd number of 4-byte words, so a column of
# it falls in 32 different banks.
PACK_TILE = 64
PACK_KERNEL = """
namespace kevin_gemm {
constexpr int kPackTile = %d;
template <class T>
__global__ void __launch_bounds__(256) pack_rows(T const* __restrict__ src, T* __restrict__ dst, int64_t rows, int64_t k, int64_t kp,
                                                 int64_t batch_stride, int64_t row_stride, int64_t col_stride) {
    // one block of 256 threads a kPackTile x kPackTile tile of one matrix's packed rows, 16 values a thread:
    // value i of a thread at the tile's row (or column) ty + 8 * (i / 2), column (or row) tx + 32 * (i %% 2)
    __shared__ T tile[kPackTile][kPackTile + (sizeof(T) >= 4 ? 1 : 4 / sizeof(T))];
    const int64_t tiles_c = (kp + kPackTile - 1) / kPackTile, tiles_r = (rows + kPackTile - 1) / kPackTile, block = blockIdx.x;
    const int64_t c0 = block %% tiles_c * kPackTile, r0 = block / tiles_c %% tiles_r * kPackTile, b = block / (tiles_c * tiles_r);
    const int tx = threadIdx.x %% 32, ty = threadIdx.x / 32;
    const bool along_rows = row_stride == 1 && col_stride != 1;  // (a K x N weight read as N x K)
    T v[16];
#pragma unroll
    for (int i = 0; i < 16; ++i) {
        const int j = ty + 8 * (i / 2), t = tx + 32 * (i %% 2);
        const int a = along_rows ? t : j, e = along_rows ? j : t;  // (the tile's row and column)
        const int64_t r = r0 + a, c = c0 + e;
        v[i] = r < rows && c < k ? src[b * batch_stride + r * row_stride + c * col_stride] : T(0.0f);
    }
#pragma unroll
    for (int i = 0; i < 16; ++i) {
        const int j = ty + 8 * (i / 2), t = tx + 32 * (i %% 2);
        tile[along_rows ? t : j][along_rows ? j : t] = v[i];
    }
    __syncthreads();
#pragma unroll
    for (int i = 0; i < 16; ++i) {
        const int j = ty + 8 * (i / 2), t = tx + 32 * (i %% 2);
        const int64_t r = r0 + j, c = c0 + t;
        if (r < rows && c < kp) dst[(b * rows + r) * kp + c] = tile[j][t];
    }
}
}  // namespace kevin_gemm
""" % PACK_TILE

PACK = PACK_KERNEL + """
extern "C" int kevin_gemm_pack(void const* src, void* dst, int batch, int64_t rows, int64_t k, int64_t kp, int64_t batch_stride,
                               int64_t row_stride, int64_t col_stride, cudaStream_t stream) {
    const int64_t tile = kevin_gemm::kPackTile, blocks = (kp + tile - 1) / tile * ((rows + tile - 1) / tile) * batch;
    if (blocks == 0) return 0;
    kevin_gemm::pack_rows<kevin_gemm::Element><<<static_cast<unsigned>(blocks), 256, 0, stream>>>(
        static_cast<kevin_gemm::Element const*>(src), static_cast<kevin_gemm::Element*>(dst), rows, k, kp, batch_stride, row_stride,
        col_stride);
    return static_cast<int>(cudaGetLastError());
}
"""


# The entry points every GEMM program's device part ends with (the sm90 kernels' too), around
# `kevin_gemm::Gemm` and `kevin_gemm::arguments` (a format string: braces doubled); `checked`: the
# arguments CUTLASS's check reads ("args"; a GEMM storing padded rows checks the padded problem)
ENTRY_POINTS = """extern "C" size_t kevin_gemm_workspace(int m, int n, int k, int batch) {{
    return kevin_gemm::Gemm::get_workspace_size(kevin_gemm::arguments(m, n, k, batch, nullptr, nullptr, nullptr, nullptr, nullptr));
}}

extern "C" int kevin_gemm_run(int m, int n, int k, int batch, void const* x, void const* w, void const* bias, void const* residual,
                              void* out, void* workspace, cudaStream_t stream) {{
    kevin_gemm::Gemm gemm;
    auto args = kevin_gemm::arguments(m, n, k, batch, x, w, bias, residual, out);
    cutlass::Status status = gemm.can_implement({checked});
    if (status != cutlass::Status::kSuccess) return static_cast<int>(status);
    status = gemm.initialize(args, workspace, stream);
    if (status != cutlass::Status::kSuccess) return static_cast<int>(status);
    return static_cast<int>(gemm.run(stream));
}}
"""

_DEVICE = """#include <cutlass/cutlass.h>
#include <cutlass/gemm/device/gemm_universal.h>
#include <cutlass/epilogue/thread/linear_combination_generic.h>
#include <cutlass/epilogue/thread/activation.h>

namespace kevin_gemm {{
{functor}using Element = {element};
using ElementD = {output};
constexpr int kAlign = {align};  // x's and w's elements per access
constexpr int kAlignD = {out_align};  // the output's (and its source's)
using EpilogueOp = cutlass::epilogue::thread::LinearCombinationGeneric<{activation}, ElementD, kAlignD, float, float>;
using Gemm = cutlass::gemm::device::GemmUniversal<
    Element, cutlass::layout::RowMajor, Element, {layout_b}, ElementD, cutlass::layout::RowMajor, float,
    cutlass::arch::OpClassTensorOp, cutlass::arch::Sm80,
    cutlass::gemm::GemmShape<{tm}, {tn}, {tk}>, cutlass::gemm::GemmShape<{wm}, {wn}, {wk}>, cutlass::gemm::GemmShape<{instruction}>,
    EpilogueOp, cutlass::gemm::threadblock::GemmIdentityThreadblockSwizzle<>, {stages}, kAlign, kAlign,
    {operator}>;

static typename Gemm::Arguments arguments(int m, int n, int k, int batch, void const* x, void const* w, void const* bias,
                                          void const* residual, void* out) {{
    // x (m, k) and out (m, n) row-major; w (n, k) row-major (column-major k x n) or (k, n); each
    // `batch` times, packed; C: the bias as one row read by every row (row and batch strides 0),
    // the residual, or (beta 0) not read
    typename EpilogueOp::Params epilogue({alpha}, {beta});
    return typename Gemm::Arguments(
        batch > 1 ? cutlass::gemm::GemmUniversalMode::kBatched : cutlass::gemm::GemmUniversalMode::kGemm, {{m, n, k}}, batch,
        epilogue, x, w, {c_ptr}, out,
        int64_t(m) * k, int64_t(n) * k, {c_batch}, int64_t(m) * n,
        k, {ldb}, {ldc}, n);
}}
}}  // namespace kevin_gemm

""" + ENTRY_POINTS


def source_operand(operands: tuple[str, ...], wide: tuple[int, ...] = ()) -> int | None:
    """Which of a tree's operands the kernel reads as its source C (its first of the output's size
    and dtype; the launcher's `residual`), None where it reads none; each other is the launcher's `vectors`'."""
    return next((j for j, kind in enumerate(operands) if kind == "mn" and j not in wide), None)


# A tree's operands as CUTLASS 2.x's epilogue visitors read them (the sm80 twins of `gemm_kernel.OPERAND_KINDS`):
# a vector over N (a row broadcast), over M (a column broadcast), a tensor of the output's size; and
# each one's arguments (a vector's pointer from the launcher's `vectors`, the tensor's `residual`: CUTLASS
# takes its pointer as non-const, and only reads it)
_TREE_NODES = {
    "n": ("cutlass::epilogue::threadblock::VisitorRowBroadcast<OutputTileThreadMap, Element, cute::Stride<_0, _1, int32_t>>",
          "{{vectors ? static_cast<Element const*>(vectors[{j}]) : nullptr, Element(0), {{_0{{}}, _1{{}}, int32_t(0)}}}}"),
    "m": ("cutlass::epilogue::threadblock::VisitorColBroadcast<OutputTileThreadMap, Element, cute::Stride<_1, _0, int32_t>>",
          "{{vectors ? static_cast<Element const*>(vectors[{j}]) : nullptr, Element(0), {{_1{{}}, _0{{}}, int32_t(0)}}}}"),
    "mn": ("cutlass::epilogue::threadblock::VisitorAuxLoad<OutputTileThreadMap, Element, cute::Stride<int64_t, _1, int64_t>>",
           "{{static_cast<Element*>(const_cast<void*>({ptr})), Element(0), {{int64_t(n), _1{{}}, int64_t(m) * n}}}}"),
}


def _tree_source(fields: dict[str, Any], output: str, functor: str, align: int, out_align: int, weight: str,
                 tree: tuple[str, ...]) -> str:
    """The device part of a GEMM whose epilogue is a visitor tree (CUTLASS 2.x's `Sm80EVT`): the
    function of the accumulator and each operand, stored by an auxiliary store (`fields`: `mainloop_fields`)."""
    vectors, children, source = 0, [], source_operand(tree)
    for j, kind in enumerate(tree):
        children.append(_TREE_NODES[kind][1].format(j=vectors, ptr="residual" if j == source else f"vectors ? vectors[{vectors}] : nullptr"))
        vectors += j != source
    nodes = "".join(f",\n    {_TREE_NODES[kind][0]}" for kind in tree)
    return _DEVICE_TREE.format(
        **fields, functor=functor, output=ELEMENTS[output], align=align, out_align=out_align, nodes=nodes, checked="args",
        layout_b="cutlass::layout::ColumnMajor" if weight == "nk" else "cutlass::layout::RowMajor", ldb="k" if weight == "nk" else "n",
        vectors="    void const* const* vectors = static_cast<void const* const*>(bias);\n" if vectors else "",
        children="".join(f"{c}, " for c in children))


_DEVICE_TREE = """#include <cutlass/cutlass.h>
#include <cute/tensor.hpp>
#include <cutlass/gemm/device/gemm_universal_adapter.h>
#include <cutlass/gemm/kernel/default_gemm_universal_with_visitor.h>
#include <cutlass/epilogue/threadblock/fusion/visitors.hpp>

namespace kevin_gemm {{
using namespace cute;
using Element = {element};
using ElementD = {output};
{functor}constexpr int kAlign = {align};  // x's and w's elements per access
constexpr int kAlignD = {out_align};  // the output's
using ThreadblockShape = cutlass::gemm::GemmShape<{tm}, {tn}, {tk}>;
using WarpShape = cutlass::gemm::GemmShape<{wm}, {wn}, {wk}>;
using OutputTileThreadMap = cutlass::epilogue::threadblock::OutputTileThreadLayout<ThreadblockShape, WarpShape, ElementD, kAlignD, 1>;
using Tree = cutlass::epilogue::threadblock::Sm80EVT<
    cutlass::epilogue::threadblock::VisitorCompute<KevinTreeFn, ElementD, float, cutlass::FloatRoundStyle::round_to_nearest>,
    cutlass::epilogue::threadblock::VisitorAccFetch{nodes}>;
using Store = cutlass::epilogue::threadblock::Sm80EVT<
    cutlass::epilogue::threadblock::VisitorAuxStore<OutputTileThreadMap, ElementD, cutlass::FloatRoundStyle::round_to_nearest,
                                                    cute::Stride<int64_t, _1, int64_t>>,
    Tree>;
using Kernel = typename cutlass::gemm::kernel::DefaultGemmWithVisitor<
    Element, cutlass::layout::RowMajor, cutlass::ComplexTransform::kNone, kAlign,
    Element, {layout_b}, cutlass::ComplexTransform::kNone, kAlign,
    ElementD, cutlass::layout::RowMajor, kAlignD, float, float,
    cutlass::arch::OpClassTensorOp, cutlass::arch::Sm80,
    ThreadblockShape, WarpShape, cutlass::gemm::GemmShape<{instruction}>,
    Store, cutlass::gemm::threadblock::GemmIdentityThreadblockSwizzle<>, {stages}, {operator}, 1>::GemmKernel;
using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;

static typename Gemm::Arguments arguments(int m, int n, int k, int batch, void const* x, void const* w, void const* bias,
                                          void const* residual, void* out) {{
    // x (m, k) and out (m, n) row-major; w (n, k) row-major (column-major k x n) or (k, n); each
    // `batch` times, packed; `bias`: the host array of the vector operands' pointers, in order;
    // `residual`: the tensor of the output's size, where there is one
{vectors}    typename Store::Arguments tree{{
        {{{{}}, {children}{{}}}},
        {{static_cast<ElementD*>(out), {{int64_t(n), _1{{}}, int64_t(m) * n}}}}}};
    return typename Gemm::Arguments(
        batch > 1 ? cutlass::gemm::GemmUniversalMode::kBatched : cutlass::gemm::GemmUniversalMode::kGemm, {{m, n, k}}, batch,
        tree, x, w, nullptr, nullptr,
        int64_t(m) * k, int64_t(n) * k, 0, 0,
        k, {ldb}, 0, 0);
}}
}}  // namespace kevin_gemm

""" + ENTRY_POINTS
