"""The built-in writer's CUTLASS 3.x GEMM with its epilogue (`generate/builtin/gemm_kernel.py`):
the source per epilogue kind (its structure, not its text), the variants' limits, what the static
rules say of a program that holds it, and (where nvcc and CUTLASS's headers are here) that it
compiles for sm_90a through the fast build's own nvcc command."""

from __future__ import annotations

import dataclasses
import re
import shutil
import subprocess
import textwrap
from pathlib import Path

import pytest

from kevin_backend.generate.builtin.gemm_kernel import (ACTIVATIONS, GEMM_CPP_SOURCE, gemm_cpp_source, GEMM_CUDA_FLAGS, Epilogue, Sm80Tiling, GemmSpec,
                                                         GEMM_TILINGS, GemmTiling, gemm_cuda_source, gemm_device_source, gemm_unaligned,
                                                         tilings_for)
from kevin_backend.toolchain.cutlass_headers import find_cutlass
from kevin_backend.toolchain.static_rules import check_program
from conftest import FULL, full_tier
from cutlass_builds import compiled_symbols


def _fusion(source: str) -> str:
    return re.search(r"using Fusion = (.*);", source).group(1)  # type: ignore[union-attr]


# a visitor tree: a bias over N, a column over M and a tensor of the output's size, read by a function
_TREE = Epilogue(activation="function", operands=("n", "m", "mn"),
                 function="    float t0 = v + a0;\n    float t1 = fmaxf(t0, 0.0f) * a1 + a2;\n    return static_cast<T>(t1);")


@pytest.mark.parametrize("activation", sorted(ACTIVATIONS))
def test_the_epilogue_names_its_activation_and_its_bias(activation: str) -> None:
    function = "    return static_cast<T>(v * 2.0f);" if activation == "function" else ""
    source = gemm_device_source(GemmSpec("bfloat16", Epilogue(bias=True, activation=activation, alpha=0.5, function=function)),
                                GemmTiling())
    # an activation of the built-in writer's helpers (SiLU, sigmoid) is a function calling them
    own = {"silu": "kevin_silu", "sigmoid": "kevin_sigmoid"}.get(activation)
    assert ("struct KevinEpilogueFn" in source) == (activation == "function" or own is not None)
    assert (own is None) or f"return static_cast<T>({own}(v));" in source
    named = ACTIVATIONS["function"] if own else ACTIVATIONS[activation]
    assert _fusion(source).startswith(f"cutlass::epilogue::fusion::LinCombPerColBiasEltAct<{named}, ElementD,")
    # the helpers sit before the kernel's namespace; the program, not the device part, asks for fast math
    assert source.index("kevin_silu(float x)") < source.index("namespace kevin_gemm {") and "KEVIN_FAST_MATH 1" not in source
    assert "args.epilogue.thread.bias_ptr = static_cast<Element const*>(bias);" in source
    assert "args.epilogue.thread.alpha = 0.5f;" in source and "args.epilogue.thread.beta = 0.0f;" in source
    assert "using ElementC = void;" in source  # no residual: C is never read


def test_rows_of_n_not_16_byte_aligned_are_stored_directly_as_a_plain_linear_combination() -> None:
    # an LM head's 50257 logits: TMA stores no such rows; the output is stored from registers, one
    # element at a time (no shared memory), as CUTLASS's plain linear combination; a residual as C
    spec = GemmSpec("float16", Epilogue(alpha=0.5, residual=True, beta=2.0), direct_store=True)
    source = gemm_cuda_source(spec, GemmTiling())
    assert _fusion(source) == "cutlass::epilogue::fusion::LinearCombination<ElementD, float, cutlass::half_t, float>"
    assert "cutlass::epilogue::NoSmemWarpSpecialized, Fusion>" in source and "constexpr int kAlignD = 1 ? 1 :" in source
    assert "args.epilogue.thread.alpha = 0.5f;" in source and "args.epilogue.thread.beta = 2.0f;" in source
    assert "k % 8 == 0 && n % 1 == 0" in source  # (K still 16-byte rows: x and w through TMA)
    aligned = gemm_cuda_source(dataclasses.replace(spec, direct_store=False), GemmTiling())
    assert "NoSmemWarpSpecialized" not in aligned and "k % 8 == 0 && n % 8 == 0" in aligned
    assert tilings_for(spec, (512, 50257, 4096)) == GEMM_TILINGS  # (no split-K: each tile stored whole)


def test_a_residual_is_read_as_c_and_scaled_by_beta() -> None:
    source = gemm_device_source(GemmSpec("float16", Epilogue(residual=True, beta=2.0, activation="silu")), GemmTiling())
    assert _fusion(source) == ("cutlass::epilogue::fusion::LinCombEltAct<KevinEpilogueFn, ElementD, float, "
                               "ElementC, float>".replace("ElementC", "cutlass::half_t"))
    assert "using ElementC = cutlass::half_t;" in source and "args.epilogue.thread.beta = 2.0f;" in source
    assert "static_cast<Element const*>(residual), stride_c" in source and "bias_ptr" not in source


def test_the_variant_is_the_tile_the_cluster_and_the_schedule() -> None:
    pingpong = gemm_device_source(GemmSpec("bfloat16"), GemmTiling((64, 128, 64), (2, 1, 1), "pingpong"))
    assert "using TileShape = Shape<_64, _128, _64>;" in pingpong and "using ClusterShape = Shape<_2, _1, _1>;" in pingpong
    assert "cutlass::gemm::KernelTmaWarpSpecializedPingpong" in pingpong and "cutlass::epilogue::TmaWarpSpecialized," in pingpong
    cooperative = gemm_device_source(GemmSpec("bfloat16"), GemmTiling())
    assert "cutlass::gemm::KernelTmaWarpSpecializedCooperative" in cooperative
    assert GemmTiling((128, 256, 64), (1, 2, 1)).name == "cooperative tile 128x256x64 cluster 1x2"


@pytest.mark.parametrize("align", [4, 1])
def test_the_float32_gemm_is_three_tf32_products_with_its_source_as_bias_or_residual(align: int) -> None:
    from kevin_backend.generate.builtin.gemm_kernel import F32_TILINGS

    bias = gemm_device_source(GemmSpec("float32", Epilogue(bias=True, activation="gelu"), "nk", align), F32_TILINGS[0])
    assert "cutlass::arch::OpMultiplyAddFastF32>" in bias and "cutlass::arch::Sm80" in bias  # never plain TF32
    assert f"constexpr int kAlign = {align};" in bias
    assert "LinearCombinationGeneric<cutlass::epilogue::thread::GELU, ElementD, kAlignD, float, float>" in bias
    assert "using Element = float;" in bias and "using ElementD = float;" in bias
    assert "static_cast<ElementD const*>(bias), out," in bias and "k, k, 0, n);" in bias  # the bias: a row read by every row
    assert "EpilogueOp::Params epilogue(1.0f, 1.0f)" in bias and "cutlass::layout::ColumnMajor" in bias
    residual = gemm_device_source(GemmSpec("float32", Epilogue(residual=True, beta=0.5), "kn", align), F32_TILINGS[1])
    assert "static_cast<ElementD const*>(residual), out," in residual and "k, n, n, n);" in residual
    assert "EpilogueOp::Params epilogue(1.0f, 0.5f)" in residual and "Element, cutlass::layout::RowMajor, Element, cutlass::layout::RowMajor" in residual
    plain = gemm_device_source(GemmSpec("float32", Epilogue(alpha=2.0)), F32_TILINGS[2])
    assert "EpilogueOp::Params epilogue(2.0f, 0.0f)" in plain  # beta 0: C never read
    host = gemm_cuda_source(GemmSpec("float32", align=align), F32_TILINGS[0])
    assert "at::kFloat" in host and f"k % {align} == 0 && n % {align} == 0" in host


def test_the_sm80_kernel_is_cutlass_2x_with_16_bit_mma_and_alignments_of_its_own() -> None:
    from kevin_backend.generate.builtin.gemm_kernel import SM80_CUDA_FLAGS, SM80_TILINGS, gemm_cuda_flags

    # an LM head's rows with a bias and a GELU: x and w read 8 values at a time, the output stored one by one
    spec = GemmSpec("bfloat16", Epilogue(bias=True, activation="gelu"), "nk", 8, arch="sm80", out_align=1)
    source = gemm_cuda_source(spec, SM80_TILINGS[0])
    assert "cutlass::arch::OpMultiplyAdd>" in source and "cutlass::arch::Sm80" in source  # mma.sync, not 3xTF32
    assert "cutlass::gemm::GemmShape<16, 8, 16>" in source and "cutlass::gemm::GemmShape<64, 64, 32>" in source  # the warp's tile
    assert "using Element = cutlass::bfloat16_t;" in source and "using ElementD = cutlass::bfloat16_t;" in source
    assert "constexpr int kAlign = 8;" in source and "constexpr int kAlignD = 1;" in source
    assert "LinearCombinationGeneric<cutlass::epilogue::thread::GELU, ElementD, kAlignD, float, float>" in source
    assert "static_cast<ElementD const*>(bias), out," in source and "k, k, 0, n);" in source  # the bias: C with row stride 0
    assert "k % 8 == 0 && n % 1 == 0" in source and "at::kBFloat16" in source
    assert "Sm90" not in source and "TmaWarpSpecialized" not in source
    # its build: no architecture of its own (the judge builds the GPU's); Hopper's kernels ask for sm_90a
    assert gemm_cuda_flags(spec) == SM80_CUDA_FLAGS and not any("arch" in f for f in SM80_CUDA_FLAGS)
    assert gemm_cuda_flags(GemmSpec("bfloat16")) == GEMM_CUDA_FLAGS == gemm_cuda_flags(GemmSpec("float32"))
    # a K x N weight's rows are N long: N must suit x's and w's accesses too
    kn = gemm_cuda_source(GemmSpec("float16", Epilogue(residual=True, beta=0.5), "kn", 2, arch="sm80", out_align=2), SM80_TILINGS[3])
    assert "k % 2 == 0 && n % 2 == 0" in kn and "Element, cutlass::layout::RowMajor, ElementD, cutlass::layout::RowMajor" in kn
    assert "static_cast<ElementD const*>(residual), out," in kn and "EpilogueOp::Params epilogue(1.0f, 0.5f)" in kn
    # a float32 end (a softmax after it): 16 bytes of floats a store
    wide = GemmSpec("float16", arch="sm80", store="float32")
    assert wide.alignments == (8, 4) and "using ElementD = float;" in gemm_device_source(wide, SM80_TILINGS[0])


@pytest.mark.parametrize(("dtype", "n", "k", "weight", "expected"), [
    ("bfloat16", 4096, 4096, "nk", (8, 8)),
    ("bfloat16", 50257, 768, "nk", (8, 1)),  # an LM head: x and w whole vectors, the logits one by one
    ("float16", 4096, 1002, "nk", (2, 8)),  # K of 2 mod 8: 4-byte copies
    ("bfloat16", 4097, 513, "nk", (0, 1)),  # odd K: no cp.async copy
    ("float16", 50, 64, "kn", (2, 2)),  # w's rows are N long
    ("float32", 999, 777, "nk", (1, 1)),
    ("float32", 1024, 512, "nk", (4, 4)),
    ("float16", 4096, 4096, "nk", (8, 8)),
])
def test_the_sm80_kernels_accesses_are_as_wide_as_the_rows_allow(dtype: str, n: int, k: int, weight: str, expected: tuple[int, int]) -> None:
    from kevin_backend.generate.builtin.gemm_kernel_sm80 import sm80_alignment

    assert sm80_alignment(dtype, n, k, weight) == expected


def test_a_16_bit_product_stored_in_float32_by_the_sm80_kernel_stores_16_bytes_at_a_time() -> None:
    # rows of N = 512 halves: 8 values an access; the same rows in float32 (a softmax's end kept
    # unrounded for the writer's kernel after it) 4 values, still 16 bytes, and the program writes
    from kevin_backend.generate.builtin.gemm_kernel import SM80_TILINGS

    for out_align, expected in ((8, 4), (2, 2), (1, 1), (0, 4)):
        spec = GemmSpec("float16", store="float32", arch="sm80", out_align=out_align)
        assert spec.alignments == (8, expected), (out_align, spec.alignments)
        assert f"constexpr int kAlignD = {expected};" in gemm_cuda_source(spec, SM80_TILINGS[0])
    assert GemmSpec("float16", arch="sm80", out_align=8).alignments == (8, 8)


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_on_the_sm80_kernel_a_tree_is_cutlass_2xs_visitor_tree_over_the_same_function(dtype: str) -> None:
    from kevin_backend.generate.builtin.gemm_kernel import F32_TILINGS, SM80_TILINGS

    spec = GemmSpec(dtype, _TREE, "kn", 8 if dtype == "bfloat16" else 1, arch="sm80", out_align=8 if dtype == "bfloat16" else 1)
    source = gemm_cuda_source(spec, (SM80_TILINGS if dtype == "bfloat16" else F32_TILINGS)[0])
    tree = source[source.index("using Tree = "):source.index("using Kernel = ")]
    order = [tree.index(node) for node in ("VisitorCompute<KevinTreeFn", "VisitorAccFetch", "VisitorRowBroadcast", "VisitorColBroadcast",
                                           "VisitorAuxLoad", "VisitorAuxStore")]
    assert order == sorted(order), tree
    assert "static float scalar(float v, float a0, float a1, float a2)" in source and "DefaultGemmWithVisitor<" in source
    assert ("cutlass::arch::OpMultiplyAddFastF32, 1>::GemmKernel" in source) == (dtype == "float32")
    # the vectors from the launcher's array (none when only the workspace is asked), the tensor as the residual
    assert "{vectors ? static_cast<Element const*>(vectors[0]) : nullptr, Element(0), {_0{}, _1{}, int32_t(0)}}" in source
    assert "{vectors ? static_cast<Element const*>(vectors[1]) : nullptr, Element(0), {_1{}, _0{}, int32_t(0)}}" in source
    assert "static_cast<Element*>(const_cast<void*>(residual))" in source and "LinearCombinationGeneric" not in source
    assert "const void* vectors[] = {a0.data_ptr(), a1.data_ptr()};" in source and "const void* residual_ptr = a2.data_ptr();" in source


def test_the_sm80_variants_put_the_small_tile_first_for_a_small_output() -> None:
    from kevin_backend.generate.builtin.gemm_kernel import F32_TILINGS, SM80_TILINGS

    spec = GemmSpec("bfloat16", arch="sm80")
    assert tilings_for(spec, (8192, 8192, 4096)) == SM80_TILINGS
    assert tilings_for(spec, (512, 1024, 4096))[0] == SM80_TILINGS[-1] == Sm80Tiling((64, 64, 64), 4, (32, 32, 64), True)
    assert set(tilings_for(spec, (512, 1024, 4096))) == set(SM80_TILINGS)
    assert tilings_for(GemmSpec("float32", arch="sm80"), (512, 1024, 4096)) == F32_TILINGS
    assert SM80_TILINGS[0].name == "sm80 tile 128x128x32 warp 64x64 stages 4" and F32_TILINGS[0].name == "3xtf32 tile 64x64x32 stages 4"
    for t in SM80_TILINGS:  # within the 99 KiB of shared memory a block has on sm86 and sm89
        m, n, k = t.tile
        assert (m + n) * k * 2 * t.stages <= 99 * 1024, t.name


@pytest.mark.parametrize(("make", "message"), [
    (lambda: GemmSpec("bfloat16", direct_store=True, arch="sm80"), "no direct store"),
    (lambda: GemmSpec("bfloat16", Epilogue(bias=True), store="float32", arch="sm80"), "a float32 end reads neither"),
    (lambda: GemmSpec("bfloat16", arch="sm70"), "'sm90' or 'sm80'"),
    (lambda: gemm_device_source(GemmSpec("bfloat16", arch="sm80"), Sm80Tiling()), "takes a 16-bit tiling"),
    (lambda: gemm_device_source(GemmSpec("bfloat16", arch="sm80"), GemmTiling()), "takes an Sm80Tiling"),
    (lambda: gemm_device_source(GemmSpec("float16", arch="sm80", align=1), Sm80Tiling((128, 128, 32), 4, None, True)), "8, 4 or 2"),
    (lambda: gemm_device_source(GemmSpec("float16", arch="sm80", out_align=3), Sm80Tiling((128, 128, 32), 4, None, True)),
     "a power of two"),
    (lambda: Sm80Tiling((128, 128, 16), 4, None, True), "K 32 or 64"),
    (lambda: Sm80Tiling((128, 128, 32), 4, (64, 64, 16), True), "K whole"),
    (lambda: Sm80Tiling((256, 256, 32), 3, (32, 32, 32), True), "1 to 8 warps"),
])
def test_what_the_sm80_kernel_cannot_build_is_refused_with_its_reason(make, message: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match=message):
        make()


@pytest.mark.parametrize(("make", "message"), [
    (lambda: GemmTiling((64, 128, 64), (1, 1, 1), "cooperative"), "multiple of 128"),
    (lambda: GemmTiling((128, 512, 64)), "N of 8 up to 256"),
    (lambda: GemmTiling((128, 128, 64), (4, 2, 1)), "at most 4 CTAs"),
    (lambda: GemmTiling(schedule="streamk"), "one of cooperative, pingpong"),
    (lambda: GemmSpec("float64"), "one of float16, bfloat16, float32"),
    (lambda: Sm80Tiling((100, 128, 16)), "multiples of 32"),
    (lambda: gemm_device_source(GemmSpec("float32"), GemmTiling()), "takes an Sm80Tiling"),
    (lambda: gemm_device_source(GemmSpec("float16"), Sm80Tiling()), "takes a GemmTiling"),
    (lambda: gemm_device_source(GemmSpec("float32", Epilogue(bias=True, residual=True)), Sm80Tiling()), "not both"),
    (lambda: Epilogue(activation="mish"), "one of identity"),
    (lambda: GemmSpec("bfloat16", weight="nn"), "'nk' or 'kn'"),
    (lambda: GemmSpec("bfloat16", store="float16"), "the inputs' dtype or float32"),
    (lambda: GemmSpec("bfloat16", Epilogue(bias=True), direct_store=True), "a direct store is a 16-bit kernel's plain linear"),
    (lambda: Epilogue(activation="function", function="    return static_cast<T>(v);", operands=("k",)), "each one of n, m, mn"),
    (lambda: Epilogue(bias=True, activation="function", function="    return static_cast<T>(v);", operands=("n",)),
     "whole epilogue"),
    (lambda: GemmTiling(scheduler="splitk"), "2 or more"),
    (lambda: GemmTiling(splits=4), "2 or more"),
    (lambda: GemmTiling((128, 128, 64), (1, 1, 1), "pingpong", "streamk"), "cooperative schedule's"),
    (lambda: GemmTiling(scheduler="dynamic"), "one of persistent, splitk, streamk"),
    (lambda: GemmTiling(swizzle=3), "a swizzle of 1, 2, 4 or 8"),
    (lambda: GemmTiling(raster="k"), "a raster along 'm', 'n' or ''"),
])
def test_what_cannot_be_built_is_refused_with_its_reason(make, message: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match=message):
        make()


def test_a_tree_visits_the_accumulator_and_each_operand_in_order() -> None:
    source = gemm_cuda_source(GemmSpec("bfloat16", _TREE), GemmTiling())
    tree = source[source.index("using Fusion = "):]
    order = [tree.index(node) for node in ("Sm90Compute<KevinTreeFn", "Sm90AccFetch", "Sm90RowBroadcast", "Sm90ColBroadcast",
                                           "Sm90SrcFetch")]
    assert order == sorted(order), tree[:600]
    assert "static float scalar(float v, float a0, float a1, float a2)" in source
    assert "out[i] = scalar(v[i], a0[i], a1[i], a2[i]);" in source
    # the vectors' pointers in order, the tensor of the output's size as the source C
    assert "args.epilogue.thread = {{}, {vectors ? static_cast<Element const*>(vectors[0]) : nullptr}, " \
           "{vectors ? static_cast<Element const*>(vectors[1]) : nullptr}, {}, {}};" in source
    assert "using ElementC = cutlass::bfloat16_t;" in source and "static_cast<Element const*>(residual), stride_c" in source
    assert "const void* vectors[] = {a0.data_ptr(), a1.data_ptr()};" in source and "residual_ptr = a2.data_ptr();" in source
    assert 'a1.numel() == m && a1.scalar_type() == at::kBFloat16' in source
    assert gemm_cpp_source(GemmSpec("bfloat16", _TREE)) == (
        "torch::Tensor gemm_epilogue(torch::Tensor x, torch::Tensor w, torch::Tensor a0, torch::Tensor a1, torch::Tensor a2);")
    assert gemm_cpp_source(GemmSpec("bfloat16", Epilogue(bias=True))) == GEMM_CPP_SOURCE
    # no tensor of the output's size: no source C read
    vectors = gemm_cuda_source(GemmSpec("float16", Epilogue(activation="function", operands=("m",),
                                                             function="    return static_cast<T>(v * a0);")), GemmTiling())
    assert "using ElementC = void;" in vectors and "Sm90SrcFetch" not in vectors and "residual_ptr = nullptr;" in vectors


@pytest.mark.parametrize("arch", ["sm90", "sm80"])
def test_a_trees_second_tensor_of_the_outputs_size_is_loaded_beside_the_source_c(arch: str) -> None:
    from kevin_backend.generate.builtin.gemm_kernel import tilings_for

    spec = GemmSpec("bfloat16", Epilogue(activation="function", operands=("mn", "n", "mn"),
                                         function="    return static_cast<T>((v + a1) * a0 + a2);"), arch=arch)
    source = gemm_cuda_source(spec, tilings_for(spec)[0])
    # the first the source C (the launcher's `residual`), the vector and the second from `vectors`, in order
    assert "const void* vectors[] = {a1.data_ptr(), a2.data_ptr()};" in source and "residual_ptr = a0.data_ptr();" in source
    assert 'a2.numel() == batch * m * n && a2.scalar_type() == at::kBFloat16' in source
    if arch == "sm90":
        tree = source[source.index("using Fusion = "):]
        order = [tree.index(node) for node in ("Sm90AccFetch", "Sm90SrcFetch", "Sm90RowBroadcast", "Sm90AuxLoad<0, TileShape, Element")]
        assert order == sorted(order) and tree.count("Sm90SrcFetch") == 1, tree[:800]
        assert ("args.epilogue.thread = {{}, {}, {vectors ? static_cast<Element const*>(vectors[0]) : nullptr}, "
                "{vectors ? static_cast<Element const*>(vectors[1]) : nullptr, Element(0), {int64_t(n), cute::Int<1>{}, "
                "int64_t(m) * n}}, {}};") in source
    else:
        assert source.count("VisitorAuxLoad<") == 2 and "static_cast<Element*>(const_cast<void*>(residual))" in source
        assert "static_cast<Element*>(const_cast<void*>(vectors ? vectors[1] : nullptr)), Element(0), {int64_t(n), _1{}, " \
               "int64_t(m) * n}" in source
    # (the workspace is asked with no operands: each read of the launcher's array guarded)
    device = source[:source.index("#include <torch/extension.h>")]
    assert device.count("vectors[") == device.count("vectors ? ") + device.count("const void* vectors[") == 2, device
    # a convolution's kernel reads one
    from kevin_backend.generate.builtin.conv_kernel import conv_tree_refusal

    assert "one tensor of the output's size" in conv_tree_refusal(("mn", "n", "mn"), hopper=True)


def test_tilings_whose_last_round_leaves_sms_idle_come_after_those_that_fill_their_rounds() -> None:
    from kevin_backend.generate.builtin.gemm_kernel import GEMM_TILINGS, tilings_for
    from kevin_backend.generate.builtin.gpu_properties import gpu_properties, slot_share

    if gpu_properties().multiprocessors != 132:  # (the order below is an H100's or H200's, and a machine's without a GPU)
        pytest.skip(f"a GPU of {gpu_properties().multiprocessors} SMs")
    # a backward matmul of GPT-2 (M 8192, N 768): 128 x 256 tiles make 192, two rounds on 132 SMs
    # with 72 idle in the second; 128 x 128 tiles make 384, three rounds with 12 idle
    assert round(slot_share((128, 256, 64), (1, 2, 1), 8192, 768), 3) == 0.727
    assert round(slot_share((128, 128, 64), (2, 1, 1), 8192, 768), 3) == 0.97
    assert round(slot_share((64, 256, 64), (1, 2, 1), 8192, 768), 3) == 0.727  # (768 columns: two clusters of 512)
    order = tilings_for(GemmSpec("bfloat16"), (8192, 768, 3072))
    assert [t.tile[:2] for t in order] == [(128, 128), (128, 128), (128, 256), (256, 128), (64, 256)]
    assert set(order) == set(GEMM_TILINGS)
    assert tilings_for(GemmSpec("bfloat16"), (8192, 4096, 4096)) == GEMM_TILINGS  # 1024 tiles: every order fills its rounds
    assert tilings_for(GemmSpec("float16"), (4096, 50257, 768)) == GEMM_TILINGS  # (a ragged N: 99% of the slots)


def test_rows_padded_to_16_bytes_are_stored_by_tma_and_checked_as_the_padded_problem() -> None:
    # an LM head's logits over 50257 classes, read only by their loss's kernel: TMA stores rows of a
    # 16-byte multiple (50264 bf16 values, 50260 floats), the output a view of the first N columns
    spec = GemmSpec("bfloat16", Epilogue(), "nk", row_pad=True)
    source = gemm_cuda_source(spec, GemmTiling())
    assert "gemm.can_implement(kevin_gemm::padded_problem(args))" in source and "gemm.initialize(args," in source
    assert "(cute::get<1>(args.problem_shape) + kAlignD - 1) / kAlignD * kAlignD" in source
    assert "stride_d = cute::make_stride(int64_t(n + kAlignD - 1) / kAlignD * kAlignD," in source
    assert "constexpr int kAlignD = 0 ?" in source and "NoSmemWarpSpecialized" not in source  # (TMA's store, not a direct one)
    assert "out_sizes.back() = (n + 7) / 8 * 8;" in source and ".narrow(-1, 0, n);" in source and "n % 1 == 0" in source
    wide = gemm_cuda_source(dataclasses.replace(spec, store="float32"), GemmTiling())
    assert "out_sizes.back() = (n + 3) / 4 * 4;" in wide
    plain = gemm_cuda_source(GemmSpec("bfloat16", Epilogue(), "nk"), GemmTiling())
    assert "padded_problem" not in plain and ".narrow(" not in plain and "out_sizes.back() = n;" in plain
    for bad in (dict(epilogue=Epilogue(bias=True)), dict(weight="kn"), dict(direct_store=True), dict(dtype="float32")):
        with pytest.raises(ValueError):
            dataclasses.replace(spec, **bad)


def test_a_long_reduction_into_a_small_output_tries_split_k_and_stream_k_first() -> None:
    from kevin_backend.generate.builtin.gemm_kernel import GEMM_TILINGS, tilings_for

    spec = GemmSpec("float16")
    small = tilings_for(spec, (512, 512, 16384))  # 16 output tiles of 128 x 128 for 132 SMs
    assert [(t.scheduler, t.splits) for t in small[:2]] == [("splitk", 8), ("streamk", 1)] and small[2:] == GEMM_TILINGS
    assert small[0].name == "cooperative tile 128x128x64 cluster 1x1 split-K 8"
    assert tilings_for(spec, (256, 256, 4096))[0].splits == 8  # 4 tiles: at most K / 512 splits
    assert tilings_for(spec, (8192, 8192, 8192)) == GEMM_TILINGS  # enough tiles for every SM
    assert set(tilings_for(spec, (512, 512, 512))) == set(GEMM_TILINGS)  # too short a K to share
    assert tilings_for(GemmSpec("float32"), (512, 512, 16384)) == tilings_for(GemmSpec("float32"))
    source = gemm_device_source(spec, small[0])
    assert "CollectiveEpilogue, cutlass::gemm::StreamKScheduler>;" in source
    assert "args.scheduler.splits = 8;" in source and "decomposition_mode)::SplitK;" in source
    assert "decomposition_mode)::StreamK;" in gemm_device_source(spec, small[1])
    persistent = gemm_device_source(spec, GemmTiling())
    assert "CollectiveEpilogue, void>;" in persistent and "args.scheduler" not in persistent


def test_the_order_of_the_tiles_work_is_the_tile_schedulers_arguments() -> None:
    spec = GemmSpec("bfloat16", Epilogue(bias=True))
    swizzled = GemmTiling(swizzle=8, raster="m")
    assert swizzled.name == "cooperative tile 128x128x64 cluster 1x2 swizzle 8 along M"
    source = gemm_device_source(spec, swizzled)
    assert "args.scheduler.max_swizzle_size = 8;" in source and "raster_order)::AlongM;" in source
    assert "CollectiveEpilogue, void>;" in source  # (the persistent scheduler's arguments, read at run time)
    streamk = gemm_device_source(spec, GemmTiling((128, 128, 64), (1, 1, 1), scheduler="streamk", raster="n"))
    assert "decomposition_mode)::StreamK;" in streamk and "raster_order)::AlongN;" in streamk and "max_swizzle_size" not in streamk
    # the default order is CUTLASS's own: no line, the name and the source as before
    assert GemmTiling(swizzle=1, raster="").name == "cooperative tile 128x128x64 cluster 1x2"


def test_the_epilogues_subtile_is_cutlasss_unless_the_tiling_names_its_columns() -> None:
    spec = GemmSpec("bfloat16", Epilogue(bias=True))
    auto = gemm_device_source(spec, GemmTiling((256, 128, 64), (2, 1, 1)))
    assert "TileShape, ClusterShape,\n    cutlass::epilogue::collective::EpilogueTileAuto, float, float," in auto
    wide = GemmTiling((256, 128, 64), (2, 1, 1), epilogue_n=64)
    assert wide.name == "cooperative tile 256x128x64 cluster 2x1 epilogue 128x64"
    assert "TileShape, ClusterShape,\n    Shape<_128, _64>, float, float," in gemm_device_source(spec, wide)
    # one warp group's subtile is 64 rows; a kept value staged beside the output takes the same subtile
    assert GemmTiling((64, 256, 64), (1, 2, 1), "pingpong", epilogue_n=64).epilogue_tile == "Shape<_64, _64>"
    kept = gemm_device_source(GemmSpec("bfloat16", Epilogue(activation="function", operands=("n",), function=_TREE.function.split("\n")[0]
                                                          + "\n    return static_cast<T>(t0);", after=1, after_staged=True)), wide)
    assert "ElementD, Shape<_128, _64>, cutlass::epilogue::TmaWarpSpecializedCooperative, TileShape>());" in kept
    with pytest.raises(ValueError, match="epilogue subtile of 48 columns"):
        GemmTiling((128, 128, 64), epilogue_n=48)
    with pytest.raises(ValueError, match="a direct store has no epilogue subtile"):
        gemm_device_source(GemmSpec("bfloat16", Epilogue(), direct_store=True), wide)


def test_rows_tma_cannot_take_are_named() -> None:
    assert gemm_unaligned(4096, 4096, 4096) == ""
    assert gemm_unaligned(4096, 50257, 1024) == "rows not 16-byte aligned (N = 50257: not multiples of 8)"
    assert "K = 100" in gemm_unaligned(512, 512, 100)


def _program(spec: GemmSpec, tiling: GemmTiling) -> str:
    return textwrap.dedent('''\
        import torch
        import torch.nn as nn
        from torch.utils.cpp_extension import load_inline

        CUDA = r"""''') + gemm_cuda_source(spec, tiling) + textwrap.dedent(f'''\
        """
        ext = load_inline(name="gemm_ext", cpp_sources="{GEMM_CPP_SOURCE}", cuda_sources=CUDA, functions=["gemm_epilogue"],
                          extra_cuda_cflags={list(GEMM_CUDA_FLAGS)!r})


        class ModelNew(nn.Module):
            def __init__(self, in_features, out_features):
                super().__init__()
                self.linear = nn.Linear(in_features, out_features)

            def forward(self, x):
                return ext.gemm_epilogue(x, self.linear.weight, self.linear.bias, torch.empty(0, device=x.device, dtype=x.dtype))
        ''')


def test_the_static_rules_take_the_program() -> None:
    for epilogue in (Epilogue(bias=True, activation="gelu"), Epilogue(residual=True)):
        assert check_program(_program(GemmSpec("bfloat16", epilogue), GemmTiling())) == ()


@pytest.mark.full
@pytest.mark.slow
@pytest.mark.parametrize("epilogue", [Epilogue(bias=True, activation="silu"), _TREE], ids=["bias-silu-fast-math", "tree"])
def test_the_kernel_compiles_for_sm90a_through_the_fast_builds_nvcc_command(epilogue: Epilogue, tmp_path: Path) -> None:
    """The device part, with the program's flags, through `device_command` (which builds the
    arch-specific form the flags ask for): about a minute of nvcc."""
    from kevin_backend.generate.builtin.gemm_kernel import FAST_MATH

    # (the tree's in CUTLASS's order of tiles and precise math; the other's with a swizzle and a raster
    # of its own, its SiLU the helpers' under the fast math a 16-bit program defines)
    tiling = GemmTiling() if epilogue.tree else GemmTiling(swizzle=8, raster="m")
    fast = "" if epilogue.tree else FAST_MATH
    symbols = compiled_symbols(tmp_path, fast + gemm_device_source(GemmSpec("bfloat16", epilogue), tiling), "9.0", GEMM_CUDA_FLAGS)
    assert "kevin_gemm_run" in symbols and "MainloopSm90TmaGmmaWarpSpecialized" in symbols  # the wgmma mainloop, instantiated


@pytest.mark.slow
@pytest.mark.parametrize("epilogue", full_tier(Epilogue(bias=True, activation="gelu"), _TREE, keep=(Epilogue(bias=True, activation="gelu"),)),
                         ids=["bias-gelu", "tree"])
def test_the_sm80_kernel_compiles_for_an_ampere_gpu_through_the_fast_builds_nvcc_command(epilogue: Epilogue, tmp_path: Path) -> None:
    """The 16-bit sm80 kernel's device part for sm_80 with its program's flags (about 11 s of nvcc)."""
    from kevin_backend.generate.builtin.gemm_kernel import SM80_CUDA_FLAGS, SM80_TILINGS
    from kevin_backend.toolchain.fast_build import Toolchain, device_command

    spec = GemmSpec("float16", epilogue, "nk", 8, arch="sm80", out_align=1)
    command = device_command(Toolchain.detect(), tmp_path / "gemm.cu", tmp_path / "gemm.o", "8.0", SM80_CUDA_FLAGS, ())
    assert "-gencode=arch=compute_80,code=sm_80" in command
    symbols = compiled_symbols(tmp_path, gemm_device_source(spec, SM80_TILINGS[0]), "8.0", SM80_CUDA_FLAGS)
    assert "kevin_gemm_run" in symbols and "MmaMultistage" in symbols  # Ampere's cp.async mainloop, instantiated


def _with(spec: GemmSpec, old: str, new: str) -> str:
    program = _program(spec, GemmTiling())
    assert old in program
    return program.replace(old, new)


def test_the_static_rules_still_refuse_what_they_refused() -> None:
    spec = GemmSpec("bfloat16", Epilogue(bias=True))
    threaded = _with(spec, "    if (m == 0 || n == 0) return out;", "    std::thread worker([] {});\n    worker.join();")
    assert "no-streams-threads" in [v.rule for v in check_program(threaded)]
    never_run = _with(spec, "    return static_cast<int>(gemm.run(stream));", "    return 0;")
    assert [(v.rule, v.message) for v in check_program(never_run)] == [
        ("launches-a-kernel", "never launches its kernels (cutlass GemmUniversalAdapter)")]


def test_the_fast_build_splits_the_program_at_torchs_include() -> None:
    """A kernel from a header library has no launch of the file's own for the item split to find:
    the program's torch-free first part, with its `extern "C"` functions, is the device part."""
    from kevin_backend.toolchain.fast_build import fast_sources
    from kevin_backend.toolchain.host_device import split_cuda

    cuda = gemm_cuda_source(GemmSpec("bfloat16", Epilogue(bias=True)), GemmTiling())
    split = split_cuda(cuda)
    assert split.device.startswith('#line 1 "cuda_sources.cu"\n#include <cutlass/cutlass.h>')
    assert "torch::" not in split.device and "kevin_gemm_run" in split.device and "gemm_epilogue" not in split.device
    assert 'extern "C" int kevin_gemm_run(int m, int n, int k, int batch, void const* x,' in split.host
    line = cuda[:cuda.index("#include <torch/extension.h>")].count("\n") + 1
    assert f'#line {line} "cuda_sources.cu"\n#include <torch/extension.h>' in split.host  # errors at the candidate's lines
    host = fast_sources(GEMM_CPP_SOURCE, cuda, ["gemm_epilogue"], "0123456789abcdef").host
    assert "TORCH_LIBRARY_FRAGMENT" in host and "kevin_adapt<&gemm_epilogue>" in host
    # a launch of the file's own in the tensor part: the item split's, as before
    launching = cuda.replace("    if (m == 0 || n == 0) return out;", "    noop<<<1, 1>>>();") + "\n"
    launching = launching.replace("#include <torch/extension.h>", "#include <torch/extension.h>\n__global__ void noop() {}")
    assert "kevin_launch_noop" in split_cuda(launching).host


def test_the_tilings_are_tried_in_the_order_the_h200_ranked_them() -> None:
    # The order of GEMM_TILINGS is the H200's ranking (bench_gemm at fdf9776): the first two are
    # the best two by geomean over the six tasks, the first three (a search of three turns) hold
    # every task's fastest, the slowest by geomean comes last.
    import json
    import statistics
    from pathlib import Path

    from kevin_backend.generate.builtin.gemm_kernel import GEMM_TILINGS

    stored = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "gpu_tests" / "gemm_bench_peers_h200_fdf9776.json"
    rows = [r for r in json.loads(stored.read_text())["rows"] if r["peer"] == "inductor" and r["verdict"] == "ACCEPTED"]
    fastest = {}
    for r in rows:
        if r["task"] not in fastest or r["kernel_ms"] < fastest[r["task"]]["kernel_ms"]:
            fastest[r["task"]] = r
    assert len(fastest) == 6
    first = {t.name for t in GEMM_TILINGS[:3]}
    assert all(r["tiling"] in first for r in fastest.values()), {t: r["tiling"] for t, r in fastest.items()}
    speed: dict[str, list[float]] = {}
    for r in rows:
        speed.setdefault(r["tiling"], []).append(r["x_peer"])
    ranked = sorted(speed, key=lambda name: -statistics.geometric_mean(speed[name]))
    names = [t.name for t in GEMM_TILINGS]
    assert names[:2] == ranked[:2] and names[-1] == ranked[-1] and set(names) == set(ranked), (names, ranked)


def test_the_float32_tilings_are_tried_in_the_order_the_h200_ranked_them() -> None:
    # bench_gemm at 1ef6dee: the three float32 suite tasks; each task's fastest tiling among the
    # first two, the slowest by geomean last
    import json
    import statistics
    from pathlib import Path

    from kevin_backend.generate.builtin.gemm_kernel import F32_TILINGS

    stored = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "gpu_tests" / "gemm_bench_peers_h200_1ef6dee.json"
    rows = [r for r in json.loads(stored.read_text())["rows"]
            if r["peer"] == "inductor" and r["verdict"] == "ACCEPTED" and r["tiling"].startswith("3xtf32")]
    fastest: dict[str, dict] = {}
    for r in rows:
        if r["task"] not in fastest or r["kernel_ms"] < fastest[r["task"]]["kernel_ms"]:
            fastest[r["task"]] = r
    assert len(fastest) == 3
    assert all(r["tiling"] in {t.name for t in F32_TILINGS[:2]} for r in fastest.values())
    speed: dict[str, list[float]] = {}
    for r in rows:
        speed.setdefault(r["tiling"], []).append(r["x_peer"])
    ranked = sorted(speed, key=lambda name: -statistics.geometric_mean(speed[name]))
    assert [t.name for t in F32_TILINGS] == ranked, ranked


@pytest.mark.parametrize(("layout", "batch", "rows", "k"), [("rows", 1, 37, 13), ("rows", 2, 70, 33), ("columns", 1, 37, 13),
                                                            ("columns", 3, 33, 65), ("rows", 1, 5, 1), ("rows", 2, 130, 70),
                                                            ("columns", 2, 129, 131)])
def test_the_pack_kernel_copies_odd_rows_into_rows_of_eight_with_zeros_after_k(layout: str, batch: int, rows: int, k: int) -> None:
    """`gemm_kernel_sm80.PACK_KERNEL`, as written, on the CPU (tests/kernel_emulator.py): `batch`
    matrices of `rows` rows of K bf16 values, lying as rows (x, an N x K weight) or as columns (a
    K x N weight), copied into rows of K rounded up to 8, zeros after K; partial tiles at both edges,
    and more than one tile along both."""
    import torch

    from kernel_emulator import has_cuda_headers, run_device_code
    from kevin_backend.generate.builtin.gemm_kernel_sm80 import PACK_KERNEL, PACK_TILE

    if shutil.which("g++") is None or not has_cuda_headers():
        pytest.skip("needs g++ and CUDA's headers")
    kp = (k + 7) // 8 * 8
    want = torch.randn(batch, rows, k).to(torch.bfloat16)
    src = want.contiguous() if layout == "rows" else want.transpose(1, 2).contiguous()  # (a K x N weight: its columns are the rows)
    strides = f"{rows * k}, {k}, 1" if layout == "rows" else f"{rows * k}, 1, {rows}"
    blocks = -(-kp // PACK_TILE) * -(-rows // PACK_TILE) * batch
    device = "namespace kevin_gemm { using Element = __nv_bfloat16; }\n" + PACK_KERNEL
    (got,) = run_device_code(device, [src], [((batch, rows, kp), torch.bfloat16)],
                             [(blocks, 256, f"kevin_gemm::pack_rows<__nv_bfloat16>(in0, out0, {rows}, {k}, {kp}, {strides})")])
    assert torch.equal(got[..., :k], want) and not got[..., k:].any(), (got, want)


def test_rows_of_odd_length_are_packed_before_the_sm80_kernel_reads_them() -> None:
    from kevin_backend.generate.builtin.gemm_kernel import SM80_TILINGS

    nk = gemm_cuda_source(GemmSpec("bfloat16", Epilogue(bias=True, activation="gelu"), "nk", arch="sm80", out_align=1, pad_k=True),
                          SM80_TILINGS[0])
    assert "kevin_gemm::pack_rows<kevin_gemm::Element><<<" in nk and nk.count("kevin_gemm_pack(") == 3  # (defined, called twice)
    assert "k_run = (k + 7) / 8 * 8;" in nk and "m * k, k, 1, stream);" in nk and "n * k, k, 1, stream);" in nk
    assert "kevin_gemm_run(static_cast<int>(m), static_cast<int>(n), static_cast<int>(k_run)" in nk and "a_ptr, b_ptr," in nk
    assert "k % 1 == 0 && n % 1 == 0" in nk and "constexpr int kAlign = 8;" in nk and "constexpr int kAlignD = 1;" in nk
    # a K x N weight: packed from its columns into N x K rows, which the kernel then reads as N x K
    kn = gemm_cuda_source(GemmSpec("float16", Epilogue(), "kn", arch="sm80", out_align=1, pad_k=True), SM80_TILINGS[0])
    assert "n * k, 1, n, stream);" in kn and "cutlass::half_t, cutlass::layout::ColumnMajor, ElementD" not in kn
    assert "Element, cutlass::layout::ColumnMajor, ElementD" in kn and "w.size(-2) == k" in kn  # (the host still takes K x N)
    assert "kevin_gemm_pack" not in gemm_cuda_source(GemmSpec("float16", arch="sm80"), SM80_TILINGS[0])
    for spec in (dict(dtype="float32"), dict(dtype="bfloat16"), dict(dtype="bfloat16", arch="sm80", align=2)):
        with pytest.raises(ValueError, match="packed rows are the sm80 kernel's for 16-bit values"):
            GemmSpec(**spec, pad_k=True)  # type: ignore[arg-type]


def test_a_convolution_is_cutlass_2xs_implicit_gemm_with_its_layouts_made_by_the_packing_kernel() -> None:
    from kevin_backend.generate.builtin.conv_kernel import Conv
    from kevin_backend.generate.builtin.gemm_kernel import F32_TILINGS, SM80_TILINGS

    plain = gemm_cuda_source(GemmSpec("float16", Epilogue(bias=True, activation="relu"), align=8, out_align=8,
                                      convolution=Conv((3, 3), (1, 1), (2, 2))), SM80_TILINGS[0])
    assert "cutlass::conv::device::ImplicitGemmConvolution<Kernel>" in plain and "IteratorAlgorithm::kOptimized" in plain
    assert "DefaultConv2dFprop<" in plain and "GemmIdentityThreadblockSwizzle<>" in plain
    assert "cutlass::conv::StrideSupport::kStrided, kAlign, kAlign>::Kernel" in plain and "cutlass::arch::OpMultiplyAdd," in plain
    assert "problem(n, h, w_, c, k, 3, 3, p, q, 1, 1, 2, 2, 1, 1," in plain and "kCrossCorrelation" in plain
    assert "layout_x = cutlass::layout::TensorNHWC::packed({n, h, w_, c})" in plain
    assert "layout_out = cutlass::layout::TensorNHWC::packed({n, p, q, k})" in plain
    assert "TensorNHWC(cutlass::layout::TensorNHWC::Stride(0))" in plain and "EpilogueOp::Params epilogue(1.0f, 1.0f)" in plain
    assert "kFilter[3] = {1, 3, 3}, kPad[3] = {0, 1, 1}, kStride[3] = {1, 2, 2}" in plain and "const bool transposed = 0;" in plain
    # a plain input: x packed per image (its positions' rows of C a column apart), w per output channel, the output transposed back
    assert ("kevin_gemm_pack(x.data_ptr(), xp.data_ptr(), static_cast<int>(n), spatial, ci, cip, ci * spatial, 1,\n"
            "                                                 spatial, stream)") in plain
    assert ": kevin_gemm_pack(w.data_ptr(), wp.data_ptr(), static_cast<int>(rows), 9, cols, colsp,\n" in plain
    # (a channels-last filter: its rows of channels packed, or read in place where they are the kernel's)
    assert "w_last ? kevin_gemm_pack(w.data_ptr(), wp.data_ptr(), 1, rows * 9, cols, colsp, 0, cols, 1, stream)" in plain
    assert "if (!w_last || colsp != cols) {" in plain and "kevin_conv_run(shape, x_ptr, w_ptr," in plain
    assert "if (0) return y;" in plain and "kevin_gemm_pack(y.data_ptr(), o.data_ptr(), static_cast<int>(n), co, out_spatial" in plain
    assert "(ci + 8 - 1) / 8 * 8" in plain and "co % 8 == 0" in plain and "torch::empty({n, out[1], out[2], co}" in plain
    # channels-last float32 (3xTF32), a residual read in place as C, the output returned as it lies
    last = gemm_cuda_source(GemmSpec("float32", Epilogue(residual=True, beta=0.5), align=4, out_align=1,
                                     convolution=Conv((1, 3), (0, 1), channels_last=True)), F32_TILINGS[0])
    assert "cutlass::arch::OpMultiplyAddFastF32," in last and "if (1) return y;" in last and "(ci + 4 - 1) / 4 * 4" in last
    assert "static_cast<ElementD*>(const_cast<void*>(residual)), layout_out" in last and "epilogue(1.0f, 0.5f)" in last
    assert check_program(_program(GemmSpec("float16", Epilogue(bias=True), align=8, out_align=8, convolution=Conv((3, 3))),
                                  SM80_TILINGS[0])) == ()
    for make, message in ((lambda: GemmSpec("float16", _TREE, convolution=Conv((3, 3))), "not \\['n', 'm', 'mn'\\]"),
                          (lambda: GemmSpec("float16", Epilogue(activation="function", function="    return v + a0;", operands=("n",)),
                                            convolution=Conv((3, 3), stride=(2, 2), transposed=True)), "no visitor tree"),
                          (lambda: GemmSpec("float16", weight="kn", convolution=Conv((3, 3))), "K x N weight"),
                          (lambda: Conv((3, 3), (-1, 0)), "padding 0 or more"),
                          (lambda: Conv((3, 3), (1,)), "one per spatial dimension"),
                          (lambda: Conv((3, 3, 3), transposed=True), "2-D \\(or 1-D\\), dilation 1"),
                          (lambda: Conv((3, 3), stride=(2, 2), dilation=(2, 1), transposed=True), "dilation 1"),
                          (lambda: Conv((3, 3), stride=(2, 2), output_padding=(2, 0), transposed=True), "each below its stride"),
                          (lambda: Conv((3, 3), stride=(2, 2), output_padding=(1, 0)), "a transposed convolution's")):
        with pytest.raises(ValueError, match=message):
            make()


def test_a_convolutions_tree_reads_a_broadcast_vector_and_a_source_through_its_own_output_op() -> None:
    from kevin_backend.generate.builtin.conv_kernel import Conv
    from kevin_backend.generate.builtin.gemm_kernel import SM80_TILINGS

    # silu(conv + bias) + residual: the bias is V (broadcast), the residual C (a tensor of the output's size)
    silu = Epilogue(activation="function", function="    float s = v + a0;\n    return s / (1.0f + expf(-s)) + a1;", operands=("n", "mn"))
    source = gemm_cuda_source(GemmSpec("bfloat16", silu, align=8, out_align=8, convolution=Conv((3, 3), (1, 1))), SM80_TILINGS[0])
    assert "default_conv2d_fprop_with_broadcast.h" in source and "DefaultConv2dFpropWithBroadcast<" in source
    assert "using EpilogueOp = KevinConvTreeOp<ElementD, kAlignD>;" in source and "static float scalar(float v, float a0, float a1)" in source
    assert "KevinTreeFn<FragmentCompute>::scalar(ab[i], vec[i], static_cast<float>(c[i]))" in source
    assert "is_source_needed() const { return 1; }" in source
    assert "layout_out}, {static_cast<ElementD*>(out), layout_out}, epilogue, cutlass::conv::SplitKMode::kSerial, " \
           "const_cast<void*>(bias));" in source
    # the host: a0 the vector, a1 packed into N x H x W x C where it is not channels-last
    assert "bias_ptr = a0.data_ptr();" in source and "residual_ptr = a1.data_ptr();" in source
    assert "kevin_gemm_pack(a1.data_ptr(), packed_source.data_ptr(), static_cast<int>(n), out_spatial, co, co," in source
    assert check_program(_program(GemmSpec("bfloat16", silu, align=8, out_align=8, convolution=Conv((3, 3), (1, 1))),
                                  SM80_TILINGS[0])) == ()
    # a tensor first, then a vector: the vector is still V; two vectors: the second read as C with strides 0;
    # one vector alone: no source read
    swapped = gemm_device_source(GemmSpec("float16", Epilogue(activation="function", function="    return v * a0 + a1;",
                                                              operands=("mn", "n")), align=8, out_align=8,
                                          convolution=Conv((3, 3, 3))), SM80_TILINGS[0])
    assert "DefaultConv3dFpropWithBroadcast<" in swapped and "scalar(ab[i], static_cast<float>(c[i]), vec[i])" in swapped
    two = gemm_device_source(GemmSpec("float16", Epilogue(activation="function", function="    return fmaxf(v + a0, 0.0f) + a1;",
                                                          operands=("n", "n")), align=8, out_align=8, convolution=Conv((3, 3))),
                             SM80_TILINGS[0])
    assert "{static_cast<ElementD*>(const_cast<void*>(residual)), cutlass::layout::TensorNHWC(cutlass::layout::TensorNHWC::Stride(0))}" in two
    one = gemm_device_source(GemmSpec("float16", Epilogue(activation="function", function="    return v * a0;", operands=("n",)),
                                      align=8, out_align=8, convolution=Conv((3, 3))), SM80_TILINGS[0])
    assert "is_source_needed() const { return 0; }" in one and "scalar(ab[i], vec[i])" in one


def test_on_hopper_a_convolution_is_also_cutlass_3xs_implicit_gemm_tried_in_turn_with_cutlass_2xs() -> None:
    from kevin_backend.generate.builtin.conv_kernel import SM90_CONV_TILINGS, Conv, ConvTiling, sm90_conv_fits
    from kevin_backend.generate.builtin.gemm_kernel import SM80_TILINGS, tilings_for

    spec = GemmSpec("bfloat16", Epilogue(bias=True, activation="relu"), align=8, out_align=8, convolution=Conv((3, 3), (1, 1), (2, 2)))
    kinds = [type(t).__name__ for t in tilings_for(spec)]
    assert kinds[:6] == ["ConvTiling", "Sm80Tiling"] * 3 and set(kinds[6:]) == {"Sm80Tiling"}, kinds  # (one of each first)
    source = gemm_cuda_source(spec, SM90_CONV_TILINGS[0])
    assert "cutlass::conv::kernel::ConvUniversal<ProblemShape, CollectiveMainloop, CollectiveEpilogue>" in source
    assert "cutlass::conv::KernelImplicitTmaWarpSpecializedSm90>" in source and "cutlass::epilogue::TmaWarpSpecialized, Fusion>" in source
    assert "LinCombPerColBiasEltAct<cutlass::epilogue::thread::ReLu, ElementD, float, Element, void, float>" in source
    assert "{n, h, w_, c}, {k, 3, 3, c}, {1, 1}, {1, 1}, {2, 2}, {1, 1}, 1);" in source and "Shape<_128, _128, Shape<_64>>" in source
    assert "args.epilogue.thread.bias_ptr" in source and "kevin_conv_run" in source and "kevin_gemm_pack" in source
    assert "problem(n, h, w_, c, k" not in source  # (CUTLASS 2.x's problem size: not in this kernel)
    assert check_program(_program(spec, SM90_CONV_TILINGS[1])) == ()
    # 3-D, a function after it: NDHWC and the GEMM's elementwise fusion
    three = gemm_device_source(GemmSpec("float16", Epilogue(activation="function", function="    return v * 0.5f;"), align=8, out_align=8,
                                        convolution=Conv((3, 3, 3), (1, 1, 1), (1, 2, 2))), SM90_CONV_TILINGS[1])
    assert "cutlass::layout::TensorNDHWC" in three and "{n, d, h, w_, c}, {k, 3, 3, 3, c}, {1, 1, 1}, {1, 1, 1}, {1, 2, 2}" in three
    assert "LinCombEltAct<KevinEpilogueFn, ElementD, float, void, float>" in three and "ClusterShape = Shape<_2, _1, _1>" in three
    # a tree: the GEMM's visitor tree, its vectors' pointers in the array `bias` points to, its tensor
    # of the output's size read as the source C
    silu = Epilogue(activation="function", function="    float s = v + a0;\n    return s / (1.0f + expf(-s)) + a1;", operands=("n", "mn"))
    tree = gemm_device_source(dataclasses.replace(spec, epilogue=silu), SM90_CONV_TILINGS[0])
    assert "cutlass::epilogue::fusion::Sm90EVT<" in tree and "Sm90RowBroadcast<0, TileShape, Element, float>" in tree
    assert "void const* const* vectors = static_cast<void const* const*>(bias);" in tree
    assert "args.epilogue.thread = {{}, {vectors ? static_cast<Element const*>(vectors[0]) : nullptr}, {}, {}};" in tree
    assert "{{}, static_cast<Element const*>(residual), stride_d" in tree and "    Element, Layout, kAlign, ElementD" in tree
    two = gemm_device_source(dataclasses.replace(spec, epilogue=Epilogue(activation="function", function="    return v * a0 + a1;",
                                                                         operands=("n", "n"))), SM90_CONV_TILINGS[0])
    assert "{vectors ? static_cast<Element const*>(vectors[0]) : nullptr}, {vectors ? static_cast<Element const*>(vectors[1]) : nullptr}" in two
    assert "{{}, nullptr, stride_d" in two and "    void, Layout, kAlign, ElementD" in two
    # an inference batch norm's four vectors and the input added back (a ResNet block's end): Hopper's
    # alone reads them, so its tilings alone are tried; the host passes the vectors' pointers in an array
    norm = Epilogue(activation="function", function="    return fmaxf((v - a0) * rsqrtf(a1 + 1e-05f) * a2 + a3 + a4, 0.0f);",
                    operands=("n", "n", "n", "n", "mn"))
    block = dataclasses.replace(spec, epilogue=norm)
    assert sm90_conv_fits(block) and tilings_for(block) == SM90_CONV_TILINGS
    host = gemm_cuda_source(block, SM90_CONV_TILINGS[2])
    assert host.count("Sm90RowBroadcast<0, TileShape, Element, float>") == 4 and "Sm90SrcFetch<Element>" in host
    assert "const void* vectors[4] = {};" in host and "vectors[3] = a3.data_ptr();" in host and "bias_ptr = vectors;" in host
    assert "residual_ptr = a4.data_ptr();" in host and "torch::Tensor a4)" in host
    with pytest.raises(ValueError, match="tree of 5 operands: CUTLASS 2.x's reads one vector"):
        gemm_device_source(block, SM80_TILINGS[0])
    for other in (dict(dtype="float32", align=4, out_align=4), dict(arch="sm80"), dict(out_align=4)):
        with pytest.raises(ValueError, match="tree of 5 operands"):
            dataclasses.replace(block, **other)
    # what it does not take stays on CUTLASS 2.x's alone: float32, Ampere, transposed, a residual, output channels TMA cannot store
    for other in (dataclasses.replace(spec, dtype="float32", align=4, out_align=4), dataclasses.replace(spec, arch="sm80"),
                  dataclasses.replace(spec, convolution=Conv((3, 3), stride=(2, 2), transposed=True)),
                  dataclasses.replace(spec, epilogue=Epilogue(residual=True)), dataclasses.replace(spec, out_align=4)):
        assert not sm90_conv_fits(other) and all(not isinstance(t, ConvTiling) for t in tilings_for(other)), other
    with pytest.raises(ValueError, match="Hopper's convolution takes"):
        gemm_device_source(dataclasses.replace(spec, out_align=4), SM90_CONV_TILINGS[0])
    for bad in (dict(tile=(256, 128, 64)), dict(tile=(128, 128, 32)), dict(cluster=(2, 2))):
        with pytest.raises(ValueError, match="one warp group"):
            ConvTiling(**bad)  # type: ignore[arg-type]
    assert SM80_TILINGS[0] in tilings_for(spec)


@pytest.mark.full
@pytest.mark.slow
def test_hoppers_convolution_compiles_for_sm_90a(tmp_path: Path) -> None:
    """CUTLASS 3.x's implicit GEMM with its bias and ReLU, with CUTLASS's utility headers (about a minute of nvcc)."""
    from kevin_backend.generate.builtin.conv_kernel import SM90_CONV_TILINGS, Conv

    spec = GemmSpec("bfloat16", Epilogue(bias=True, activation="relu"), align=8, out_align=8, convolution=Conv((3, 3), (1, 1)))
    symbols = compiled_symbols(tmp_path, gemm_device_source(spec, SM90_CONV_TILINGS[0]), "9.0", GEMM_CUDA_FLAGS, timeout=900)
    assert "kevin_conv_run" in symbols and "ConvUniversal" in symbols


def test_a_3d_convolution_is_conv3d_fprop_on_ndhwc() -> None:
    from kevin_backend.generate.builtin.conv_kernel import Conv
    from kevin_backend.generate.builtin.gemm_kernel import F32_TILINGS

    source = gemm_cuda_source(GemmSpec("float32", Epilogue(bias=True), align=4, out_align=4,
                                       convolution=Conv((3, 5, 5), (1, 2, 2), (2, 1, 1))), F32_TILINGS[0])
    assert "#include <cutlass/conv/kernel/default_conv3d_fprop.h>" in source and "DefaultConv3dFprop<" in source
    assert "problem(n, d, h, w_, c, k, 3, 5, 5, z, p, q, 1, 2, 2, 2, 1, 1, 1, 1, 1," in source
    assert "layout_x = cutlass::layout::TensorNDHWC::packed({n, d, h, w_, c})" in source
    assert "layout_w = cutlass::layout::TensorNDHWC::packed({k, 3, 5, 5, c})" in source
    assert "layout_out = cutlass::layout::TensorNDHWC::packed({n, z, p, q, k})" in source
    assert "TensorNDHWC(cutlass::layout::TensorNDHWC::Stride(0))" in source and "kStrided>::Kernel" in source
    # the host: 5-D operands, the filter's 75 taps, the output N x Z x P x Q x C_out transposed back
    assert "x.dim() == 3 + 2" in source and "kFilter[3] = {3, 5, 5}" in source and "kStride[3] = {2, 1, 1}" in source
    assert "torch::empty({n, out[0], out[1], out[2], co}" in source and "static_cast<int>(rows), 75, cols" in source
    assert "x.stride(4) == ci" in source and "i = 4; i > 2" in source  # (channels-last: NDHWC strides)
    assert check_program(_program(GemmSpec("float32", Epilogue(bias=True), align=4, out_align=4,
                                           convolution=Conv((3, 3, 3))), F32_TILINGS[0])) == ()


def test_a_transposed_convolution_is_the_strided_gradient_kernel() -> None:
    from kevin_backend.generate.builtin.conv_kernel import Conv
    from kevin_backend.generate.builtin.gemm_kernel import SM80_TILINGS

    spec = GemmSpec("bfloat16", Epilogue(bias=True, activation="relu"), align=8, out_align=8,
                    convolution=Conv((4, 4), (1, 1), (2, 2), transposed=True, output_padding=(1, 0)))
    source = gemm_cuda_source(spec, SM80_TILINGS[0])
    assert "#include <cutlass/conv/kernel/default_conv2d_dgrad.h>" in source and "DefaultConv2dDgrad<" in source
    assert "StridedDgradIdentityThreadblockSwizzle<1>" in source and "kStrided, kAlign, kAlign>::Kernel" in source
    # it reads the transposed convolution's input as the gradient (N x P x Q x K), writes its output as the activation
    assert "layout_x = cutlass::layout::TensorNHWC::packed({n, p, q, k})" in source
    assert "layout_out = cutlass::layout::TensorNHWC::packed({n, h, w_, c})" in source
    assert "const bool transposed = 1;" in source and "kOutputPadding[3] = {0, 1, 0}" in source
    assert "(in[j] - 1) * kStride[j] - 2 * kPad[j]" in source and "co = w.size(transposed ? 1 : 0)" in source
    assert "cip == ci && co % 8 == 0" in source  # (its channels whole accesses: no padding channels read)
    assert "static_cast<int>(transposed ? co : cip), static_cast<int>(transposed ? ci : co)" in source
    assert "Conv2dProblemSize problem(n, h, w_, c, k, 4, 4, p, q, 1, 1, 2, 2, 1, 1," in source
    assert check_program(_program(spec, SM80_TILINGS[0])) == ()


@pytest.mark.full
@pytest.mark.slow
def test_the_convolution_compiles_for_an_ampere_gpu(tmp_path: Path) -> None:
    """The implicit GEMM's device part for sm_80 with its program's flags (about 15 s of nvcc)."""
    from kevin_backend.generate.builtin.conv_kernel import Conv
    from kevin_backend.generate.builtin.gemm_kernel import SM80_CUDA_FLAGS, SM80_TILINGS
    from kevin_backend.toolchain.fast_build import Toolchain, device_command

    headers = find_cutlass()
    if headers is None or shutil.which("nvcc") is None:
        pytest.skip("needs nvcc and CUTLASS's headers (pip install 'kevin_backend[cutlass]')")
    spec = GemmSpec("bfloat16", Epilogue(bias=True, activation="relu"), align=8, out_align=8, arch="sm80", convolution=Conv((3, 3), (1, 1)))
    (tmp_path / "conv.cu").write_text(gemm_device_source(spec, SM80_TILINGS[0]))
    command = device_command(Toolchain.detect(), tmp_path / "conv.cu", tmp_path / "conv.o", "8.0", SM80_CUDA_FLAGS,
                             tuple(str(d) for d in headers.includes))
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    symbols = subprocess.run(["nm", "-C", str(tmp_path / "conv.o")], capture_output=True, text=True).stdout
    assert "kevin_conv_run" in symbols and "ImplicitGemmConvolution" in symbols and "kevin_gemm_pack" in symbols


def test_a_float32_convolution_of_few_channels_tries_a_narrow_tile_first_in_three_tf32_products(tmp_path: Path) -> None:
    """A float32 convolution is 3xTF32's like a float32 GEMM (plain TF32 was refused by the judge on
    the H200, see gemm_kernel_sm80.py); with 32 output channels or fewer it tries a tile 32 wide
    first, whose device part compiles for sm_80."""
    from kevin_backend.generate.builtin.conv_kernel import Conv
    from kevin_backend.generate.builtin.gemm_kernel import F32_TILINGS, SM80_CUDA_FLAGS, tilings_for
    from kevin_backend.toolchain.fast_build import Toolchain, device_command

    conv = GemmSpec("float32", Epilogue(bias=True, activation="relu"), align=4, out_align=4, convolution=Conv((3, 3), (1, 1)))
    assert tilings_for(conv) == tilings_for(conv, (115200, 64, 27)) == F32_TILINGS
    narrow = tilings_for(conv, (115200, 16, 27))
    assert [t.name for t in narrow] == ["3xtf32 tile 128x32x32 stages 4"] + [t.name for t in F32_TILINGS]
    assert tilings_for(GemmSpec("float32", Epilogue(bias=True), align=4, out_align=4), (115200, 16, 27)) == F32_TILINGS
    assert all("cutlass::arch::OpMultiplyAddFastF32," in gemm_cuda_source(conv, t) for t in narrow[:2])
    # (and a transposed one's, the strided gradient kernel: the suite's 4x4 of stride 2 into 32 channels)
    transposed = GemmSpec("float32", Epilogue(bias=True, activation="sigmoid"), align=4, out_align=4,
                          convolution=Conv((4, 4), (1, 1), (2, 2), transposed=True))
    assert tilings_for(transposed, (131072, 32, 1024))[0] == narrow[0]
    headers = find_cutlass()
    if headers is None or shutil.which("nvcc") is None:
        pytest.skip("needs nvcc and CUTLASS's headers (pip install 'kevin_backend[cutlass]')")
    if not FULL:
        pytest.skip("the two compiles (40 s of nvcc on a CPU) in the full tier only (KEVIN_TESTS_FULL=1)")
    for j, spec in enumerate((conv, transposed)):
        (tmp_path / f"conv{j}.cu").write_text(gemm_device_source(dataclasses.replace(spec, arch="sm80"), narrow[0]))
        command = device_command(Toolchain.detect(), tmp_path / f"conv{j}.cu", tmp_path / f"conv{j}.o", "8.0", SM80_CUDA_FLAGS,
                                 tuple(str(d) for d in headers.includes))
        done = subprocess.run(command, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
