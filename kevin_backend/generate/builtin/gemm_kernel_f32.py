"""The float32 GEMM: CUTLASS 2.x's tensor-core GEMM for sm80 (run on Hopper as well) with three
TF32 products per multiply-add (`OpMultiplyAddFastF32`: each operand split into a TF32 value and
its remainder, the small cross terms kept), float32's accuracy where one TF32 product has 10
mantissa bits; never plain TF32, which a task under torch's default numerics does not allow.

Same host function and entry points as the 16-bit kernels (`gemm_kernel.py`): `kevin_gemm_run`,
`kevin_gemm_workspace`. The epilogue is CUTLASS's `LinearCombinationGeneric`, D = f(alpha * acc +
beta * C): a bias is C read as one row for every row (its row stride 0), a residual is C itself;
not both. Rows need not be 16-byte aligned: the operands' alignment is 4 floats where K and N allow
it, else 1.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ENTRY_POINTS", "F32_TILINGS", "F32Tiling", "f32_alignment", "f32_device_source"]


@dataclass(frozen=True)
class F32Tiling:
    """A variant: the CTA's tile (M, N, K) (four warps, each a quarter of it) and the pipeline's stages."""

    tile: tuple[int, int, int] = (128, 128, 16)
    stages: int = 4

    def __post_init__(self) -> None:
        m, n, k = self.tile
        if m % 32 or n % 32 or k not in (16, 32) or not 2 <= self.stages <= 6:
            raise ValueError(f"tile {self.tile}, {self.stages} stages: M and N multiples of 32, K 16 or 32, 2 to 6 stages")

    @property
    def name(self) -> str:
        return f"3xtf32 tile {'x'.join(map(str, self.tile))} stages {self.stages}"


# The search's variants for float32, in the order a search tries them: as the H200 ranked them on the
# suite's three float32 tasks (benchmarks/RESULTS.md, 1ef6dee: level-2 sizes, 128 and 1000 rows),
# small tiles first (64 x 64 fastest on two, 128 x 64 on the third; 1.29-1.59x Inductor), the
# 256 x 128 tile last (0.10-0.13x: 2 to 8 tiles for 132 SMs).
F32_TILINGS = (
    F32Tiling((64, 64, 32), 4),
    F32Tiling((128, 64, 32), 3),
    F32Tiling((128, 128, 16), 4),
    F32Tiling((256, 128, 16), 3),
)


def f32_alignment(n: int, k: int) -> int:
    """Floats per access: 4 (16 bytes) when every row of x, w and the output starts 16-byte aligned, else 1."""
    return 4 if n % 4 == 0 and k % 4 == 0 else 1


def f32_device_source(activation: str, functor: str, alpha: float, beta: float, bias: bool, residual: bool,
                      weight: str, tiling: F32Tiling, align: int) -> str:
    """The device part of a float32 GEMM (`activation`: a CUTLASS functor's name; `functor`: the
    C++ of an `Epilogue.function`, or "")."""
    if bias and residual:
        raise ValueError("the float32 GEMM's epilogue reads one source: a bias or a residual, not both")
    tm, tn, tk = tiling.tile
    c_ptr = ("static_cast<float const*>(bias)" if bias else "static_cast<float const*>(residual)" if residual
             else "static_cast<float const*>(out)")
    return _DEVICE.format(functor=functor, align=align, activation=activation, tm=tm, tn=tn, tk=tk, wm=tm // 2, wn=tn // 2,
                          stages=tiling.stages, alpha=f"{float(alpha)!r}f",
                          beta=f"{float(beta) if residual else 1.0 if bias else 0.0!r}f", c_ptr=c_ptr,
                          ldc="0" if bias else "n", c_batch="0" if bias else "int64_t(m) * n",
                          layout_b="cutlass::layout::ColumnMajor" if weight == "nk" else "cutlass::layout::RowMajor",
                          ldb="k" if weight == "nk" else "n")


# The entry points every GEMM program's device part ends with (the 16-bit kernels' too), around
# `kevin_gemm::Gemm` and `kevin_gemm::arguments` (a format string: braces doubled)
ENTRY_POINTS = """extern "C" size_t kevin_gemm_workspace(int m, int n, int k, int batch) {{
    return kevin_gemm::Gemm::get_workspace_size(kevin_gemm::arguments(m, n, k, batch, nullptr, nullptr, nullptr, nullptr, nullptr));
}}

extern "C" int kevin_gemm_run(int m, int n, int k, int batch, void const* x, void const* w, void const* bias, void const* residual,
                              void* out, void* workspace, cudaStream_t stream) {{
    kevin_gemm::Gemm gemm;
    auto args = kevin_gemm::arguments(m, n, k, batch, x, w, bias, residual, out);
    cutlass::Status status = gemm.can_implement(args);
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
{functor}constexpr int kAlign = {align};
using EpilogueOp = cutlass::epilogue::thread::LinearCombinationGeneric<{activation}, float, kAlign, float, float>;
using Gemm = cutlass::gemm::device::GemmUniversal<
    float, cutlass::layout::RowMajor, float, {layout_b}, float, cutlass::layout::RowMajor, float,
    cutlass::arch::OpClassTensorOp, cutlass::arch::Sm80,
    cutlass::gemm::GemmShape<{tm}, {tn}, {tk}>, cutlass::gemm::GemmShape<{wm}, {wn}, {tk}>, cutlass::gemm::GemmShape<16, 8, 8>,
    EpilogueOp, cutlass::gemm::threadblock::GemmIdentityThreadblockSwizzle<>, {stages}, kAlign, kAlign,
    cutlass::arch::OpMultiplyAddFastF32>;

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
