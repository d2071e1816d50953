"""The built-in writer's GEMM with its epilogue, as a CUTLASS 3.x kernel for Hopper (sm_90a) in
float16 and bfloat16 (float32, and 16-bit values on Ampere and Ada: CUTLASS 2.x's sm80 kernel,
`gemm_kernel_sm80.py`, with the same entry points and host function; `GemmSpec.arch`).

    spec = GemmSpec("bfloat16", Epilogue(bias=True, activation="gelu", alpha=0.5))
    source = gemm_device_source(spec, GemmTiling((128, 128, 64), (1, 2, 1), "cooperative"))

computes, for x (M x K, row-major), w (N x K, row-major, as `nn.Linear` keeps its weight; or,
`GemmSpec.weight` "kn", K x N as `x @ w` reads it), an optional bias over N and an optional
residual r (M x N):

    out = activation(alpha * (x @ w.T) + bias + beta * r)        (accumulated in float32; x @ w for "kn")

in one kernel: a TMA warp-specialised mainloop on the tensor cores (wgmma) and the epilogue fused
into its store (CUTLASS's `LinCombPerColBiasEltAct` family: no round trip of x @ w.T through
memory). A tree (`Epilogue.operands`) is instead one generated function of the accumulator and
its operands, each a vector over N, a vector over M or a tensor of the output's size (an
`Sm90EVT` of row and column broadcasts and the source C). The tile, the cluster, the schedule
(cooperative: two consumer warp groups on one tile; ping-pong: each on its own) and how tiles
become work (persistent, split-K, stream-K) are the search's variants (`GemmTiling`, `tilings_for`).

The source is the device part of a candidate program: the kernel's types and an `extern "C"`
launcher (`kevin_gemm_run`) that a host function calls with raw pointers; it builds only for the
arch-specific form of Hopper (`-gencode=arch=compute_90a,code=sm_90a`: `GEMM_CUDA_FLAGS`, which
the judge's builds take as the form to build, `fast_build.build_arch`). TMA needs 16-byte aligned
rows: K and N multiples of 8 for 16-bit values (`gemm_unaligned`)."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

from kevin_backend.generate.builtin.codegen import cuda_code
from kevin_backend.generate.builtin.gemm_host import CLASSIC_OPERANDS, HOST, PACK_CALLS
from kevin_backend.generate.builtin.gpu_properties import FULL_ROUNDS, slot_share
from kevin_backend.generate.builtin.gemm_kernel_sm80 import ELEMENTS, ENTRY_POINTS, F32_TILINGS, SM80_TILINGS, Sm80Tiling, sm80_device_source, sm80_tilings, source_operand

__all__ = ["F32_TILINGS", "SM80_TILINGS", "Sm80Tiling", "tilings_for", "gemm_cuda_flags", "SM80_CUDA_FLAGS", "ACTIVATIONS", "OPERAND_KINDS", "Epilogue", "GEMM_CPP_SOURCE", "gemm_cpp_source", "GEMM_CUDA_FLAGS", "GEMM_TILINGS", "GemmSpec", "GemmTiling",
           "gemm_cuda_source", "gemm_device_source", "gemm_unaligned"]

GEMM_CUDA_FLAGS = ("-gencode=arch=compute_90a,code=sm_90a", "--expt-relaxed-constexpr", "-DNDEBUG")
# An sm80 kernel's (`GemmSpec.arch`): no architecture of its own; the judge's build makes the GPU's
SM80_CUDA_FLAGS = ("--expt-relaxed-constexpr", "-DNDEBUG")

# PyTorch's activation -> CUTLASS's functor (cutlass/epilogue/thread/activation.h), computed in float32
ACTIVATIONS = {
    "identity": "cutlass::epilogue::thread::Identity",
    "relu": "cutlass::epilogue::thread::ReLu",
    "gelu": "cutlass::epilogue::thread::GELU",  # erf, as torch's default
    "gelu_tanh": "cutlass::epilogue::thread::GELU_taylor",  # approximate="tanh"
    "silu": "cutlass::epilogue::thread::SiLu",
    "sigmoid": "cutlass::epilogue::thread::Sigmoid",
    "function": "KevinEpilogueFn",  # `Epilogue.function`: any elementwise function of the value, written out
}

# The functor of an `Epilogue.function`: the function on one float32 value, and on the fragments
# CUTLASS's epilogue visits (`Sm90Compute` calls it on arrays), element by element.
_FUNCTION = """template <class T> struct KevinEpilogueFn {{
  CUTLASS_HOST_DEVICE T operator()(T const& value) const {{
    float v = static_cast<float>(value);
{body}
  }}
}};
template <class T, int N> struct KevinEpilogueFn<cutlass::Array<T, N>> {{
  CUTLASS_HOST_DEVICE cutlass::Array<T, N> operator()(cutlass::Array<T, N> const& value) const {{
    KevinEpilogueFn<T> fn;
    cutlass::Array<T, N> out;
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < N; ++i) {{ out[i] = fn(value[i]); }}
    return out;
  }}
}};
"""

# Activations the built-in writer's helpers compute (cuda/device_helpers.cuh) in place of CUTLASS's
# functors, whose sigmoid is a precise exp and an IEEE division: some twenty instructions an element
# in an epilogue that no mainloop overlaps (the cooperative schedule's). A program whose every output
# is 16-bit defines KEVIN_FAST_MATH (`gemm_plan.write_gemm_program`), as the writer's own kernels do,
# and the helpers then take the device's exp and division, a few float32 ulps.
_OWN_ACTIVATIONS = {"silu": "kevin_silu", "sigmoid": "kevin_sigmoid"}
# The helpers, ahead of the kernel's namespace (an epilogue's function calls them): the macros that
# rename expf and logf under fast math end with them, before the host part's headers; KEVIN_EXPF and
# KEVIN_LOGF are the exp and log a function calls, the device's under fast math, else the precise ones.
MATH_HELPERS = cuda_code("device_helpers.cuh") + """
#undef expf
#undef logf
#ifndef KEVIN_EXPF
#define KEVIN_EXPF(x) expf(x)
#define KEVIN_LOGF(x) logf(x)
#endif
"""
FAST_MATH = "#define KEVIN_FAST_MATH 1\n"

# What a tree's operand is (`Epilogue.operands`): one value per output column (a bias over N: CUTLASS's
# row broadcast), one per output row (a column of M values: its column broadcast), or one per element
# (a tensor of the output's size: the first read as the GEMM's source C, any other loaded from global
# memory beside it, `_MORE_MN`)
OPERAND_KINDS = {"n": "cutlass::epilogue::fusion::Sm90RowBroadcast<0, TileShape, Element, float>",
                 "m": "cutlass::epilogue::fusion::Sm90ColBroadcast<0, TileShape, Element, float>",
                 "mn": "cutlass::epilogue::fusion::Sm90SrcFetch<Element>"}
# the store of a kept value (`Epilogue.after`): from registers, beside the output's; or staged
# (`Epilogue.after_staged`) through shared memory and TMA, in the epilogue's subtiles as the output is
# stored (`_STAGED_TYPES`: that subtile, the kept tensor's row-major strides)
_KEPT_STAGED = ("cutlass::epilogue::fusion::Sm90AuxStore<2, EpilogueTile, Element, cutlass::FloatRoundStyle::round_to_nearest, KeptStride, "
                "decltype(cutlass::epilogue::collective::detail::sm90_get_epilogue_smem_swizzle_layout_atom<KeptStride, Element, EpilogueTile>()), "
                "decltype(cutlass::epilogue::collective::detail::sm90_get_smem_store_op_for_accumulator<KeptStride, Element, EpilogueTile>()), "
                "128 / cute::sizeof_bits_v<Element>>")
_STAGED_TYPES = """using EpilogueTile = decltype(cutlass::epilogue::collective::detail::sm90_compute_tile_shape_or_override<
    ElementD, {epilogue_tile}, {epilogue_schedule}, TileShape>());
using KeptStride = cute::Stride<int64_t, cute::Int<1>, int64_t>;
"""
_KEPT = ("cutlass::epilogue::fusion::Sm90AuxStore<0, TileShape, Element, cutlass::FloatRoundStyle::round_to_nearest, "
         "cutlass::layout::RowMajor, void, void, 128 / cute::sizeof_bits_v<Element>>")
_MORE_MN = "cutlass::epilogue::fusion::Sm90AuxLoad<0, TileShape, {t}, cutlass::layout::RowMajor, void, void, 128 / cute::sizeof_bits_v<{t}>>"

_SCHEDULERS = {"persistent": "void", "splitk": "cutlass::gemm::StreamKScheduler", "streamk": "cutlass::gemm::StreamKScheduler"}

_SCALARS = {"float16": "at::kHalf", "bfloat16": "at::kBFloat16", "float32": "at::kFloat"}
_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4}
# CUTLASS's check wants N a multiple of the store's 16 bytes, and TMA wants only the rows' stride so:
# a GEMM storing rows padded to 16 bytes (`GemmSpec.row_pad`; TMA stores the first N columns of each)
# is checked as the problem of the padded N, the same in all else (w's rows are K long: N x K)
_PADDED_CHECK = """static typename Gemm::Arguments padded_problem(typename Gemm::Arguments args) {
    cute::get<1>(args.problem_shape) = (cute::get<1>(args.problem_shape) + kAlignD - 1) / kAlignD * kAlignD;
    return args;
}
"""
# the output's strides: packed rows, or rows padded to 16 bytes (`GemmSpec.row_pad`)
_STRIDE_D = "cute::make_stride(int64_t(n), cute::Int<1>{}, int64_t(m) * n)"
_PADDED_D = "cute::make_stride(int64_t(n + kAlignD - 1) / kAlignD * kAlignD, cute::Int<1>{}, int64_t(m) * ((n + kAlignD - 1) / kAlignD * kAlignD))"
_SCHEDULES = {
    "cooperative": ("cutlass::gemm::KernelTmaWarpSpecializedCooperative", "cutlass::epilogue::TmaWarpSpecializedCooperative"),
    "pingpong": ("cutlass::gemm::KernelTmaWarpSpecializedPingpong", "cutlass::epilogue::TmaWarpSpecialized"),
}


@dataclass(frozen=True)
class Epilogue:
    """What follows the product, in the order it is applied: `alpha *`, `+ bias` (one value per
    output column), `+ beta * residual` (a tensor the size of the output), then `activation`:
    one of CUTLASS's, or "function", the C++ statements of `function` on the float32 value `v`
    (ending in `return static_cast<T>(...);`), as `gemm_plan` writes an elementwise chain that is
    none of them (a decomposed tanh-GELU, a scale after an activation, a clamp)."""

    bias: bool = False
    activation: str = "identity"
    alpha: float = 1.0
    residual: bool = False
    beta: float = 1.0
    function: str = ""
    # a tree: the function reads the accumulator `v` and these operands `a0, a1, ...` (OPERAND_KINDS),
    # and is the whole epilogue (no alpha, bias or residual of its own)
    operands: tuple[str, ...] = ()
    # which of them (their numbers) are vectors of float32 values read by a 16-bit kernel (an
    # inference batch norm's mean and reciprocal deviation as a compiled model computes them):
    # Hopper's visitor tree reads them so; the others are the kernel's dtype
    wide: tuple[int, ...] = ()
    # a tree that keeps its value (`kept`: a compiled model's pre-activation saved for the backward
    # pass, its residual stream): Hopper's kernel stores the function's value in its dtype beside the
    # output, and the output is this second function of it (statements on `v`, `function`'s form)
    after: str = ""
    after_from: int = 0  # (the operands `after` reads: those from this one on; the tree's value reads the others)
    after_staged: bool = False  # (the kept value stored through shared memory and TMA, else from registers)

    def __post_init__(self) -> None:
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"activation {self.activation!r}: one of {', '.join(ACTIVATIONS)}")
        if (self.activation == "function") != bool(self.function):
            raise ValueError("an epilogue function comes with activation 'function', and only with it")
        if self.operands:
            unknown = set(self.operands) - set(OPERAND_KINDS)
            if unknown:
                raise ValueError(f"operands {sorted(unknown)}: each one of {', '.join(OPERAND_KINDS)}")
            if self.activation != "function" or self.bias or self.residual or self.alpha != 1:
                raise ValueError("a tree's function is its whole epilogue: no activation, alpha, bias or residual beside it")
        if self.after and not (self.operands and 0 <= self.after_from <= len(self.operands)):
            raise ValueError("a value kept beside the output is a tree's (its second function's operands among the tree's)")
        if self.after_staged and not self.after:
            raise ValueError("a staged store is a kept value's")
        if any(not 0 <= j < len(self.operands) for j in self.wide):
            raise ValueError(f"float32 operands {list(self.wide)}: not among the tree's operands {list(self.operands)}")

    @property
    def tree(self) -> bool:
        return bool(self.operands)

    @property
    def source(self) -> int | None:
        """The operand the kernel reads as its source C (`source_operand`: among the tree's value's own)."""
        return source_operand(self.operands[:self.after_from] if self.after else self.operands, self.wide)


@dataclass(frozen=True)
class GemmSpec:
    dtype: str  # the inputs' and the output's: "float16" or "bfloat16" (accumulated in float32), or "float32" (`gemm_kernel_sm80.py`)
    epilogue: Epilogue = Epilogue()
    weight: str = "nk"  # the weight's layout: "nk" (N x K, read transposed) or "kn" (K x N), row-major either way
    # the sm80 kernel's elements per access of x and w (`align`) and of the output (`out_align`:
    # `gemm_kernel_sm80.sm80_alignment`); 0: 16 bytes' worth (TMA's, on sm90)
    align: int = 0
    # the output's dtype where it is not the inputs': "float32" keeps a 16-bit GEMM's float32 result
    # unrounded for a kernel after it (`gemm_tail`: a softmax's exponent would magnify the rounding)
    store: str = ""
    # rows of N not 16-byte aligned (an LM head's 50257 logits): the output stored element by element
    # from registers, without shared memory or TMA (CUTLASS's NoSmemWarpSpecialized epilogue), which
    # computes a plain linear combination (alpha, a residual) only
    direct_store: bool = False
    # or (an end only the writer's own kernel after the GEMM reads: an LM head's logits before their
    # loss) stored by TMA into rows padded to 16 bytes, the output a view of their first N columns
    row_pad: bool = False
    # the kernels: "sm90" (Hopper's TMA and wgmma, built for sm_90a; float32 and convolutions still on
    # the sm80 kernel) or "sm80" (`gemm_kernel_sm80.py`: Ampere's and Ada's, built for the GPU it is
    # on; on Hopper for rows TMA cannot read)
    arch: str = "sm90"
    out_align: int = 0
    # 16-bit rows no 4-byte copy reads (odd K; a K x N weight of odd N): the sm80 kernel's program
    # first packs x and w into rows of K rounded up to 8, zeros after K, w as N x K (`gemm_kernel_sm80.PACK`)
    pad_k: bool = False
    # a convolution's constants (`conv_kernel.Conv`): CUTLASS's implicit GEMM instead of a GEMM (2.x's;
    # on Hopper 3.x's too, as tilings of their own: `conv_kernel.ConvTiling`)
    convolution: Any = None
    # a float32 GEMM whose task's numerics let cuBLAS compute it in TF32 (its key's `matmul_tf32`):
    # its search tries TF32's tilings beside 3xTF32's (`gemm_kernel_sm80.sm80_tilings`)
    tf32: bool = False

    def __post_init__(self) -> None:
        if self.dtype not in ELEMENTS:
            raise ValueError(f"dtype {self.dtype!r}: one of {', '.join(ELEMENTS)}")
        if self.store not in ("", self.dtype, "float32"):
            raise ValueError(f"store {self.store!r}: the inputs' dtype or float32")
        if self.weight not in ("nk", "kn"):
            raise ValueError(f"weight {self.weight!r}: 'nk' or 'kn'")
        e = self.epilogue
        if self.direct_store and (self.dtype == "float32" or e.bias or e.tree or e.activation != "identity"):
            raise ValueError("a direct store is a 16-bit kernel's plain linear combination: no bias, activation or tree")
        if self.arch not in ("sm90", "sm80"):
            raise ValueError(f"arch {self.arch!r}: 'sm90' or 'sm80'")
        if self.sm80 and (self.direct_store or self.row_pad):
            raise ValueError("the sm80 kernel stores any row: no direct store or padded rows")
        if self.row_pad and (self.direct_store or self.weight != "nk" or e.bias or e.residual or e.tree or e.activation != "identity" or self.convolution):
            raise ValueError("padded rows: a 16-bit GEMM's plain product (alpha) of an N x K weight, stored by TMA, no bias, residual, "
                             "activation or tree")
        if e.after and (self.sm80 or self.convolution is not None or self.dtype == "float32"):
            raise ValueError("a value kept beside the output: Hopper's 16-bit GEMM stores it, no other kernel")
        if self.convolution is not None and ((e.bias and e.residual) or self.pad_k or self.direct_store or self.store
                                             or self.weight != "nk"):
            raise ValueError("a convolution's epilogue: one source (a bias or a residual); no packed rows, direct "
                             "store, float32 end or K x N weight")
        if self.convolution is not None and e.tree:
            from kevin_backend.generate.builtin.conv_kernel import conv_tree_refusal, hopper_conv  # (they read GemmSpec)

            hopper = hopper_conv(self)
            why = conv_tree_refusal(e.operands, self.convolution.transposed, hopper=hopper)
            if not why and any(e.operands[j] == "mn" for j in e.wide):
                why = "a convolution's tensor of the output's size of float32: its kernel reads one in its own dtype"
            if why or (e.wide and not hopper):
                raise ValueError(why or "float32 vectors read by a 16-bit convolution: Hopper's visitor tree reads them, not CUTLASS 2.x's")
        if e.wide and (self.dtype == "float32" or self.arch != "sm90"):
            raise ValueError("float32 vectors read by a 16-bit kernel: Hopper's visitor tree reads them, not CUTLASS 2.x's")
        if self.pad_k and (self.dtype == "float32" or not self.sm80 or self.align not in (0, 8)):
            raise ValueError("packed rows are the sm80 kernel's for 16-bit values, read 8 at a time")
        if self.tf32 and (self.dtype != "float32" or self.convolution is not None):
            raise ValueError("TF32 is a float32 GEMM's: not a 16-bit one's nor a convolution's")
        if self.output != self.dtype and not self.can_end_in_float32:
            raise ValueError("the sm80 kernel reads its bias or residual in its output's dtype: a float32 end reads neither")

    @property
    def can_end_in_float32(self) -> bool:
        """Whether its product may be stored in float32 (`store`): not by the sm80 kernel beside a
        bias or a residual, which it reads in its output's dtype."""
        return not (self.sm80 and (self.epilogue.bias or self.epilogue.residual))

    @property
    def alignments(self) -> tuple[int, int]:
        """The sm80 kernel's elements per access of x and w, and of the output (16 bytes at most: an
        `out_align` read from N for 16-bit values, halved where the product is stored in float32)."""
        align = self.align or (4 if self.dtype == "float32" else 8)
        widest = 16 // (4 if self.output == "float32" else 2)
        return align, min(self.out_align or align, widest)

    @property
    def sm80(self) -> bool:
        """Whether CUTLASS 2.x computes it (`gemm_kernel_sm80.py`, `conv_kernel.py`): float32, convolutions (their
        host code and 2.x tilings; Hopper's own convolution is a tiling of theirs), and 16-bit on sm80."""
        return self.dtype == "float32" or self.arch == "sm80" or self.convolution is not None

    @property
    def output(self) -> str:
        """The output's dtype."""
        return self.store or self.dtype


@dataclass(frozen=True)
class GemmTiling:
    """A variant: the CTA's tile (M, N, K), the cluster's shape in CTAs (M, N, 1) and the schedule."""

    tile: tuple[int, int, int] = (128, 128, 64)
    cluster: tuple[int, int, int] = (1, 2, 1)
    schedule: str = "cooperative"
    # how output tiles become work: "persistent" (a tile each, CTAs looping over them), "splitk"
    # (each tile's K split `splits` ways, the partial sums reduced before the epilogue) or
    # "streamk" (CUTLASS's stream-K: the K iterations of all tiles shared evenly among the SMs)
    scheduler: str = "persistent"
    splits: int = 1
    # the order the work's tiles are visited (CUTLASS's tile scheduler, read at run time): `swizzle`
    # tiles (1, 2, 4 or 8) side by side across the raster's direction, so CTAs running at once
    # share their operands' rows in L2, and the raster along M or N ("": CUTLASS's heuristic, along
    # the output's longer side of tiles)
    swizzle: int = 1
    raster: str = ""
    # the epilogue's subtile along N (the output stored through shared memory that many columns at
    # a time; 0: CUTLASS's choice, 32 for a 16-bit output): fewer, wider subtiles, fewer of the
    # epilogue's barriers and TMA stores a tile, for the shared memory of a wider one
    epilogue_n: int = 0

    def __post_init__(self) -> None:
        m, n, k = self.tile
        if self.swizzle not in (1, 2, 4, 8) or self.raster not in ("", "m", "n"):
            raise ValueError(f"swizzle {self.swizzle}, raster {self.raster!r}: a swizzle of 1, 2, 4 or 8, a raster along 'm', 'n' or ''")
        if self.schedule not in _SCHEDULES:
            raise ValueError(f"schedule {self.schedule!r}: one of {', '.join(_SCHEDULES)}")
        if self.scheduler not in _SCHEDULERS:
            raise ValueError(f"scheduler {self.scheduler!r}: one of {', '.join(_SCHEDULERS)}")
        if (self.scheduler == "splitk") != (self.splits > 1):
            raise ValueError(f"split-K with {self.splits} splits: split-K has 2 or more, the other schedulers 1")
        if self.scheduler != "persistent" and self.schedule != "cooperative":
            raise ValueError("split-K and stream-K: the cooperative schedule's")
        if self.schedule == "cooperative" and m % 128:
            raise ValueError(f"a cooperative tile's M is a multiple of 128 (two warp groups of 64 rows): {self.tile}")
        if m % 64 or n % 8 or n > 256 or k % 16:
            raise ValueError(f"tile {self.tile}: M a multiple of 64, N of 8 up to 256, K of 16 (wgmma's shapes)")
        if self.epilogue_n and (self.epilogue_n % 16 or n % self.epilogue_n):
            raise ValueError(f"epilogue subtile of {self.epilogue_n} columns: a multiple of 16 that divides the tile's N ({n})")
        cm, cn, ck = self.cluster
        if ck != 1 or cm * cn > 4 or cm < 1 or cn < 1:
            raise ValueError(f"cluster {self.cluster}: (M, N, 1) of at most 4 CTAs (TMA multicast on Hopper)")

    @property
    def name(self) -> str:
        work = {"persistent": "", "streamk": " stream-K", "splitk": f" split-K {self.splits}"}[self.scheduler]
        order = (f" swizzle {self.swizzle}" if self.swizzle > 1 else "") + (f" along {self.raster.upper()}" if self.raster else "")
        epilogue = f" epilogue {self.epilogue_m}x{self.epilogue_n}" if self.epilogue_n else ""
        return f"{self.schedule} tile {'x'.join(map(str, self.tile))} cluster {'x'.join(map(str, self.cluster[:2]))}{work}{order}{epilogue}"

    @property
    def epilogue_m(self) -> int:
        """The epilogue subtile's rows: the cooperative schedule's two warp groups' 128, or one warp group's 64."""
        return 128 if self.schedule == "cooperative" else 64

    @property
    def epilogue_tile(self) -> str:
        """CUTLASS's epilogue tile: its own choice, or `epilogue_n` columns."""
        if not self.epilogue_n:
            return "cutlass::epilogue::collective::EpilogueTileAuto"
        return f"Shape<_{self.epilogue_m}, _{self.epilogue_n}>"


# The host function's declaration, for load_inline's cpp_sources (an absent bias or residual: an empty tensor)
GEMM_CPP_SOURCE = "torch::Tensor gemm_epilogue(torch::Tensor x, torch::Tensor w, torch::Tensor bias, torch::Tensor residual);"


# The search's variants, in the order a search tries them (each trajectory starts at another),
# as the H200 ranked them on six suite tasks (benchmarks/RESULTS.md, fdf9776): the cooperative
# schedule's tile wide along N (fastest on five), a tile tall along M (second on five), the square
# tile (fastest on the sixth, a short K), the square tile with a cluster along M, and the pingpong
# schedule (one warp group a tile, 64 x 256) last, the slowest on five of six. A search of three
# turns tries the first three: each of the six tasks' fastest among them.
GEMM_TILINGS = (
    GemmTiling((128, 256, 64), (1, 2, 1), "cooperative"),
    GemmTiling((256, 128, 64), (2, 1, 1), "cooperative"),
    GemmTiling((128, 128, 64), (1, 2, 1), "cooperative"),
    GemmTiling((128, 128, 64), (2, 1, 1), "cooperative"),
    GemmTiling((64, 256, 64), (1, 2, 1), "pingpong"),
)


def gemm_unaligned(m: int, n: int, k: int) -> str:
    """Why TMA cannot take these sizes ("" when it can): 16-byte aligned rows of 16-bit values."""
    bad = [f"{name} = {v}" for name, v in (("K", k), ("N", n)) if v % 8]
    return f"rows not 16-byte aligned ({', '.join(bad)}: not multiples of 8)" if bad else ""


# The GPU's SMs the work is shared among (an H200's 132: what the order of `tilings_for` assumes)
_SMS = 132


def tilings_for(spec: GemmSpec, shape: tuple[int, int, int] | None = None) -> tuple[Any, ...]:
    """The search's variants for this GEMM of `shape` (M, N, K): the float32 kernel's
    (`gemm_kernel_sm80.sm80_tilings`: float32's, and 16-bit ones on sm80) or the sm90 16-bit ones;
    a convolution's: Hopper's own and CUTLASS 2.x's in turn where Hopper's takes it
    (`conv_kernel.SM90_CONV_TILINGS`; Hopper's alone for a tree of more operands than 2.x's
    reads), else CUTLASS 2.x's (a float32 one of few channels: a narrow tile first). A 16-bit GEMM
    whose output has fewer 128 x 128 tiles than the GPU has SMs, over a K long enough to share (a
    long reduction into a small output), tries split-K and stream-K first: one CTA a tile would
    leave most SMs idle. The others in `GEMM_TILINGS` order, but those whose rounds of tiles leave
    more of the SMs' slots idle than `FULL_ROUNDS` allows after the rest (`gpu_properties.slot_share`)."""
    if spec.sm80:
        if spec.convolution is not None:  # (on Hopper, its own convolution's and CUTLASS 2.x's in turn)
            from kevin_backend.generate.builtin.conv_kernel import SM90_CONV_TILINGS, conv_tree_refusal, sm90_conv_fits

            e = spec.epilogue  # (a tree only Hopper's reads: its tilings alone)
            older = () if e.wide or (e.tree and conv_tree_refusal(e.operands)) else sm80_tilings(spec.dtype, shape, convolution=True)
            own = SM90_CONV_TILINGS if sm90_conv_fits(spec) else ()
            return tuple(t for pair in itertools.zip_longest(own, older) for t in pair if t is not None)  # (one of each first)
        return sm80_tilings(spec.dtype, shape, tf32=spec.tf32)
    if shape is None or spec.direct_store:  # (a direct store: each tile's output whole, no split)
        return GEMM_TILINGS
    m, n, k = shape
    tiles = -(-m // 128) * -(-n // 128)
    if tiles >= _SMS or k < 1024:
        return tuple(sorted(GEMM_TILINGS, key=lambda t: -min(FULL_ROUNDS, slot_share(t.tile, t.cluster, m, n))))
    splits = max(2, min(16, _SMS // tiles, k // 512))
    shared = (GemmTiling((128, 128, 64), (1, 1, 1), "cooperative", "splitk", splits),
              GemmTiling((128, 128, 64), (1, 1, 1), "cooperative", "streamk"))
    return shared + GEMM_TILINGS


def _functor(epi: Epilogue) -> tuple[str, str]:
    """The functor of the epilogue's elementwise function (its own statements, or an activation the
    built-in writer's helpers compute: `_OWN_ACTIVATIONS`) and the activation CUTLASS is given
    (that functor's name, else CUTLASS's own)."""
    body = epi.function or (f"    return static_cast<T>({_OWN_ACTIVATIONS[epi.activation]}(v));"
                            if epi.activation in _OWN_ACTIVATIONS else "")
    return (_FUNCTION.format(body=body), ACTIVATIONS["function"]) if body else ("", ACTIVATIONS[epi.activation])


def _with_helpers(device: str) -> str:
    """`device` with the math helpers (`MATH_HELPERS`) ahead of its namespace."""
    start = device.index("\nnamespace kevin_gemm {")
    return device[:start] + MATH_HELPERS + device[start:]


def gemm_device_source(spec: GemmSpec, tiling: Any) -> str:
    """The device part: the kernel's types and `extern "C" int kevin_gemm_run(...)` (0 on success,
    else CUTLASS's status), `kevin_gemm_workspace(m, n, k, batch)` the bytes of workspace it needs."""
    return _with_helpers(_device_source(spec, tiling))


def _device_source(spec: GemmSpec, tiling: Any) -> str:
    epi = spec.epilogue
    functor, activation = _functor(epi)
    if spec.sm80:
        if not isinstance(tiling, Sm80Tiling) and spec.convolution is None:
            raise ValueError(f"a {spec.dtype} GEMM on the sm80 kernel takes an Sm80Tiling, not {tiling!r}")
        if spec.convolution is not None:  # (an Sm80Tiling, or Hopper's `conv_kernel.ConvTiling`)
            from kevin_backend.generate.builtin.conv_kernel import conv_device_source  # (it reads GemmSpec)

            functor, fusion, thread_args = _tree(epi) if epi.tree else (functor, "", "")
            return conv_device_source(spec, tiling, activation, functor, (fusion, thread_args))
        if epi.tree:  # (CUTLASS 2.x's visitor tree: `Sm80EVT`, the same functor)
            functor = _tree(epi)[0]
        return sm80_device_source(spec.dtype, spec.output, activation, functor, epi.alpha, epi.beta, epi.bias,
                                  epi.residual, spec.weight, tiling, *spec.alignments, pack=spec.pad_k, tree=epi.operands)
    if not isinstance(tiling, GemmTiling):
        raise ValueError(f"a 16-bit GEMM takes a GemmTiling, not {tiling!r}")
    element = ELEMENTS[spec.dtype]
    mainloop_schedule, epilogue_schedule = _SCHEDULES[tiling.schedule]
    if spec.direct_store:
        if tiling.epilogue_n:
            raise ValueError(f"{tiling.name}: a direct store has no epilogue subtile (its output stored from registers)")
        epilogue_schedule = "cutlass::epilogue::NoSmemWarpSpecialized"
    reads_c = epi.residual or epi.source is not None
    source_element = element if reads_c else "void"
    if epi.tree:
        functor, fusion, thread_args = _tree(epi)
    elif spec.direct_store:
        fusion = f"cutlass::epilogue::fusion::LinearCombination<ElementD, float, {source_element}, float>"
        thread_args = (f"    args.epilogue.thread.alpha = {float(epi.alpha)!r}f;\n"
                       f"    args.epilogue.thread.beta = {float(epi.beta) if epi.residual else 0.0!r}f;\n")
    else:
        fusion = (f"cutlass::epilogue::fusion::LinCombPerColBiasEltAct<{activation}, ElementD, float, Element, "
                  f"{source_element}, float>" if epi.bias else
                  f"cutlass::epilogue::fusion::LinCombEltAct<{activation}, ElementD, float, {source_element}, float>")
        thread_args = (f"    args.epilogue.thread.alpha = {float(epi.alpha)!r}f;\n"
                       f"    args.epilogue.thread.beta = {float(epi.beta) if epi.residual else 0.0!r}f;\n"
                       + ("    args.epilogue.thread.bias_ptr = static_cast<Element const*>(bias);\n" if epi.bias else ""))
    tm, tn, tk = tiling.tile
    cm, cn, _ = tiling.cluster
    return _DEVICE.format(functor=functor, element=element, output=ELEMENTS[spec.output], source_element=source_element,
                          store_align="1" if spec.direct_store else "0", stride_d=_PADDED_D if spec.row_pad else _STRIDE_D, fusion=fusion, tm=tm, tn=tn, tk=tk, cm=cm, cn=cn,
                          # (CUTLASS's check of the problem as the padded one its TMA stores: `_PADDED_CHECK`)
                          padded_check=_PADDED_CHECK if spec.row_pad else "", checked="kevin_gemm::padded_problem(args)" if spec.row_pad else "args",
                          epilogue_types=_STAGED_TYPES.format(epilogue_schedule=epilogue_schedule, epilogue_tile=tiling.epilogue_tile)
                          if epi.after_staged else "",
                          epilogue_tile="EpilogueTile" if epi.after_staged else tiling.epilogue_tile,
                          mainloop_schedule=mainloop_schedule, epilogue_schedule=epilogue_schedule,
                          thread_args=thread_args, scheduler=_SCHEDULERS[tiling.scheduler],
                          scheduler_args=_scheduler_args(tiling), c_ptr="static_cast<Element const*>(residual)" if reads_c else "nullptr",
                          layout_b="cutlass::layout::ColumnMajor" if spec.weight == "nk" else "cutlass::layout::RowMajor",
                          stride_b="cute::make_stride(int64_t(k), cute::Int<1>{}, int64_t(n) * k)" if spec.weight == "nk"
                          else "cute::make_stride(cute::Int<1>{}, int64_t(n), int64_t(n) * k)")


def _scheduler_args(tiling: GemmTiling) -> str:
    """The lines setting the tile scheduler's arguments that differ from CUTLASS's defaults."""
    lines = ""
    if tiling.swizzle > 1:
        lines += f"    args.scheduler.max_swizzle_size = {tiling.swizzle};\n"
    if tiling.raster:
        lines += f"    args.scheduler.raster_order = decltype(args.scheduler.raster_order)::Along{tiling.raster.upper()};\n"
    if tiling.scheduler == "persistent":
        return lines
    mode = "SplitK" if tiling.scheduler == "splitk" else "StreamK"
    return (f"    args.scheduler.splits = {tiling.splits};\n"
            f"    args.scheduler.decomposition_mode = decltype(args.scheduler.decomposition_mode)::{mode};\n") + lines


def _tree(epi: Epilogue) -> tuple[str, str, str]:
    """A tree epilogue's functor, its visitor tree (the function over the accumulator and each
    operand: `OPERAND_KINDS`) and the lines setting its arguments. The launcher's `bias` pointer
    is then the host array of the operands' pointers, in order, but the source C's (`residual`,
    `Epilogue.source`), then a kept value's (`Epilogue.after`: the tree's value stored beside the
    output, the output the second function of it and of the operands from `after_from` on)."""
    types = ["float" if j in epi.wide else "Element" for j in range(len(epi.operands))]  # (each operand's values in memory)
    source = epi.source
    vectors = {j: k for k, j in enumerate(j for j in range(len(epi.operands)) if j != source)}
    nodes, children = [], []
    for j, (kind, t) in enumerate(zip(epi.operands, types)):
        if j == source:
            nodes.append(OPERAND_KINDS[kind])
            children.append("{}")
        elif kind == "mn":  # (its pointer, the value where it is null, its (row, column, batch) strides)
            nodes.append(_MORE_MN.format(t=t))
            children.append(f"{{vectors ? static_cast<{t} const*>(vectors[{vectors[j]}]) : nullptr, {t}(0), "
                            "{int64_t(n), cute::Int<1>{}, int64_t(m) * n}}")
        else:
            nodes.append(OPERAND_KINDS[kind].replace("Element, float>", f"{t}, float>"))
            children.append(f"{{vectors ? static_cast<{t} const*>(vectors[{vectors[j]}]) : nullptr}}")
    first = epi.after_from if epi.after else len(epi.operands)
    functor = _tree_function("KevinTreeFn", epi.function, range(first))
    fusion = _evt("KevinTreeFn", "float" if epi.after else "ElementD", ["cutlass::epilogue::fusion::Sm90AccFetch", *nodes[:first]])
    arguments = f"{{{{}}, {''.join(c + ', ' for c in children[:first])}{{}}}}"
    if epi.after:  # (the tree's value stored beside the output, the launcher's last pointer; the output its function)
        functor += _tree_function("KevinAfterFn", epi.after, range(first, len(epi.operands)))
        kept = f"cutlass::epilogue::fusion::Sm90EVT<{_KEPT_STAGED if epi.after_staged else _KEPT}, {fusion}>"
        fusion = _evt("KevinAfterFn", "ElementD", [kept, *nodes[first:]])
        kept_args = (f"{{{arguments}, {{vectors ? static_cast<Element*>(const_cast<void*>(vectors[{len(vectors)}])) : nullptr, "
                     "{int64_t(n), cute::Int<1>{}, int64_t(m) * n}}}")
        arguments = f"{{{kept_args}, {''.join(c + ', ' for c in children[first:])}{{}}}}"
    thread_args = (("    void const* const* vectors = static_cast<void const* const*>(bias);\n" if vectors or epi.after else "")
                   + f"    args.epilogue.thread = {arguments};\n")
    return functor, fusion, thread_args


def _evt(functor: str, output: str, children: list[str]) -> str:
    """A visitor tree's node computing `functor` (stored as `output`) of its children's values."""
    return ("cutlass::epilogue::fusion::Sm90EVT<\n"
            f"    cutlass::epilogue::fusion::Sm90Compute<{functor}, {output}, float, cutlass::FloatRoundStyle::round_to_nearest>"
            + "".join(f",\n    {child}" for child in children) + ">")


def _tree_function(name: str, body: str, operands: range) -> str:
    """The functor `name` of the value `v` and the operands numbered `operands` (`_TREE_FUNCTION`)."""
    names = [f"a{j}" for j in operands]
    return _TREE_FUNCTION.format(params="".join(f", float {a}" for a in names), body=body,
                                 arrays="".join(f", cutlass::Array<float, N> const& {a}" for a in names),
                                 values="".join(f", {a}[i]" for a in names)).replace("KevinTreeFn", name)


# A tree's functor: the function of the accumulator `v` and the operands `a0, a1, ...`, each a float32
# value, on the fragments CUTLASS's `Sm90Compute` visits (every child's converted to float32 first)
_TREE_FUNCTION = """template <class A> struct KevinTreeFn;
template <int N> struct KevinTreeFn<cutlass::Array<float, N>> {{
  CUTLASS_HOST_DEVICE static float scalar(float v{params}) {{
    using T = float;
{body}
  }}
  CUTLASS_HOST_DEVICE cutlass::Array<float, N> operator()(cutlass::Array<float, N> const& v{arrays}) const {{
    cutlass::Array<float, N> out;
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < N; ++i) {{ out[i] = scalar(v[i]{values}); }}
    return out;
  }}
}};
"""


def gemm_cuda_source(spec: GemmSpec, tiling: Any) -> str:
    """The whole CUDA source of a candidate program: the device part and the host function
    `gemm_epilogue(x, w, bias, residual)` (x of any leading dimensions, its last K; w N x K or K x N; the
    output x's leading dimensions and N; a tree's: `gemm_epilogue(x, w, a0, a1, ...)`, its operands
    `gemm_cpp_source`), which checks what the kernel assumes, takes its
    workspace from torch's allocator and runs on the current stream."""
    epi = spec.epilogue
    params = gemm_cpp_source(spec).split("(", 1)[1].rsplit(")", 1)[0]
    if spec.convolution is not None:  # (a convolution's: `conv_kernel.py`)
        from kevin_backend.generate.builtin.conv_kernel import conv_cuda_source

        functor, activation = _functor(epi)
        functor, fusion, thread_args = _tree(epi) if epi.tree else (functor, "", "")
        return _with_helpers(conv_cuda_source(spec, tiling, activation, functor, _SCALARS[spec.dtype], params, (fusion, thread_args)))
    align, n_align = spec.alignments if spec.sm80 else (8, 1 if spec.direct_store or spec.row_pad else 8)
    if spec.sm80 and spec.weight == "kn":
        n_align = max(align, n_align)  # (w's rows are N long)
    if spec.pad_k:  # (x and w packed first: rows of any length)
        align, n_align = 1, spec.alignments[1]
    pack = PACK_CALLS.format(w_strides="k, 1" if spec.weight == "nk" else "1, n") if spec.pad_k else ""
    scalar = _SCALARS[spec.dtype]
    epi = spec.epilogue
    if epi.tree:
        sizes = {"n": ("n", "N values"), "m": ("m", "M values (one per output row)"), "mn": ("batch * m * n", "the output's size")}
        checks = "".join(
            f'    TORCH_CHECK(a{j}.numel() == {sizes[kind][0]} && a{j}.scalar_type() == {"at::kFloat" if j in epi.wide else scalar}, '
            f'"gemm_epilogue: a{j} of {sizes[kind][1]}");\n'
            f"    a{j} = a{j}.contiguous();\n" for j, kind in enumerate(epi.operands))
        source = epi.source
        vectors = [f"a{j}.data_ptr()" for j in range(len(epi.operands)) if j != source] + (["kept.data_ptr()"] if epi.after else [])
        kept = "    auto kept = torch::empty(out_sizes, x.options());  // (the tree's value, stored beside the output)\n"
        operands = (checks + (kept if epi.after else "") + f"    const void* vectors[] = {{{', '.join(vectors) or 'nullptr'}}};\n"
                    "    const void* bias_ptr = vectors;\n"
                    f"    const void* residual_ptr = {'nullptr' if source is None else f'a{source}.data_ptr()'};\n")
    else:
        operands = CLASSIC_OPERANDS.format(scalar=scalar, bias=epi.bias, residual=epi.residual)
    per = 16 // _BYTES[spec.output]  # (a padded row's elements per 16 bytes: `GemmSpec.row_pad`)
    host = HOST.format(
        scalar=scalar, stored=_SCALARS[spec.output], align=align, n_align=n_align,
        params=params, operands=operands, pack=pack, out_row=f"(n + {per - 1}) / {per} * {per}" if spec.row_pad else "n",
        narrow=".narrow(-1, 0, n)" if spec.row_pad else "",
        n="w.size(-2)" if spec.weight == "nk" else "w.size(-1)", kdim=-1 if spec.weight == "nk" else -2,
        shape="N x K" if spec.weight == "nk" else "K x N")
    if epi.after:  # (both returned: the output, then the kept value)
        host = host.replace("torch::Tensor gemm_epilogue(", "std::vector<torch::Tensor> gemm_epilogue(").replace(
            "return out;", "return {out, kept};")
    return gemm_device_source(spec, tiling) + host


def gemm_cuda_flags(spec: GemmSpec) -> tuple[str, ...]:
    """nvcc's flags for the program of `spec`: Hopper's arch-specific form, or none (sm80's)."""
    return SM80_CUDA_FLAGS if spec.arch == "sm80" else GEMM_CUDA_FLAGS


def gemm_cpp_source(spec: GemmSpec) -> str:
    """The host function's declaration, for load_inline's cpp_sources: `GEMM_CPP_SOURCE`, or a tree's
    `gemm_epilogue(x, w, a0, a1, ...)` (its operands in `Epilogue.operands` order)."""
    if not spec.epilogue.tree:
        return GEMM_CPP_SOURCE
    operands = "".join(f", torch::Tensor a{j}" for j in range(len(spec.epilogue.operands)))
    returned = "std::vector<torch::Tensor>" if spec.epilogue.after else "torch::Tensor"
    return f"{returned} gemm_epilogue(torch::Tensor x, torch::Tensor w{operands});"


_DEVICE = """#include <cutlass/cutlass.h>
#include <cute/tensor.hpp>
#include <cutlass/gemm/device/gemm_universal_adapter.h>
#include <cutlass/gemm/kernel/gemm_universal.hpp>
#include <cutlass/gemm/collective/collective_builder.hpp>
#include <cutlass/epilogue/collective/collective_builder.hpp>
#include <cutlass/epilogue/fusion/operations.hpp>
#include <cutlass/epilogue/thread/activation.h>

namespace kevin_gemm {{
using namespace cute;
using Element = {element};
using ElementC = {source_element};
using ElementD = {output};
{functor}constexpr int kAlign = 128 / cutlass::sizeof_bits<Element>::value;
// the output's (and the source's) elements per access: TMA's 16 bytes, or one (a direct store)
constexpr int kAlignD = {store_align} ? 1 : 128 / cutlass::sizeof_bits<ElementD>::value;
constexpr int kAlignC = {store_align} ? 1 : kAlign;
using TileShape = Shape<_{tm}, _{tn}, _{tk}>;
using ClusterShape = Shape<_{cm}, _{cn}, _1>;
{epilogue_types}using Fusion = {fusion};
using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
    {epilogue_tile}, float, float,
    ElementC, cutlass::layout::RowMajor, kAlignC,
    ElementD, cutlass::layout::RowMajor, kAlignD,
    {epilogue_schedule}, Fusion>::CollectiveOp;
using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp,
    Element, cutlass::layout::RowMajor, kAlign,
    Element, {layout_b}, kAlign,
    float, TileShape, ClusterShape,
    cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename CollectiveEpilogue::SharedStorage))>,
    {mainloop_schedule}>::CollectiveOp;
using Kernel = cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, CollectiveMainloop, CollectiveEpilogue, {scheduler}>;
using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;

static typename Gemm::Arguments arguments(int m, int n, int k, int batch, void const* x, void const* w, void const* bias,
                                          void const* residual, void* out) {{
    // every operand packed: x (m, k), w (n, k) or (k, n), residual and out (m, n), row-major, each
    // `batch` times (the bias and the vectors over N are one for all)
    typename Kernel::StrideA stride_a = cute::make_stride(int64_t(k), cute::Int<1>{{}}, int64_t(m) * k);
    typename Kernel::StrideB stride_b = {stride_b};
    typename Kernel::StrideC stride_c = cute::make_stride(int64_t(n), cute::Int<1>{{}}, int64_t(m) * n);
    typename Kernel::StrideD stride_d = {stride_d};
    typename Gemm::Arguments args{{
        cutlass::gemm::GemmUniversalMode::kGemm, {{m, n, k, batch}},
        {{static_cast<Element const*>(x), stride_a, static_cast<Element const*>(w), stride_b}},
        {{{{}}, {c_ptr}, stride_c, static_cast<ElementD*>(out), stride_d}}}};
{thread_args}{scheduler_args}    return args;
}}
{padded_check}}}  // namespace kevin_gemm

""" + ENTRY_POINTS
