"""The fast build's split: torch-free CUDA (compiled here by nvcc) and host code with launchers."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from judge_cases import HONEST
from kevin_backend.toolchain.candidate import Candidate
from kevin_backend.toolchain.fast_build import _failure, fast_sources
from kevin_backend.toolchain.host_device import SOURCE_NAME, SplitError, split_cuda
from test_judge_static import KEVIN_STYLE


@pytest.mark.parametrize("case", HONEST, ids=lambda c: c.name)
def test_honest_candidates_split_into_torch_free_cuda_and_host_code(case, tmp_path: Path) -> None:
    (ext,) = Candidate.parse(case.source).extensions
    split = split_cuda(ext.cuda_sources)
    assert "torch" not in split.device and "at::" not in split.device
    assert "<<<" not in split.host and all(f"{name}(" in split.host for name in split.launchers)
    if shutil.which("nvcc"):
        (tmp_path / "device.cu").write_text(split.device)
        out = subprocess.run(
            ["nvcc", "-c", str(tmp_path / "device.cu"), "-o", str(tmp_path / "device.o"), "-arch=sm_90", "-O3"],
            capture_output=True, text=True, timeout=300,
        )
        assert out.returncode == 0, out.stderr[-2000:]


def test_launch_configuration_and_arguments_are_kept() -> None:
    cuda = (
        "#include <torch/extension.h>\n"
        "__global__ void k(const float* x, float* y, int n) { y[0] = x[0] + n; }\n"
        "torch::Tensor f(torch::Tensor x) {\n"
        "    auto y = torch::empty_like(x);\n"
        "    k<<<dim3(2, 1), 32>>>(x.data_ptr<float>(), y.data_ptr<float>(), (int)x.numel());  // a launch\n"
        "    return y;\n"
        "}\n"
    )
    split = split_cuda(cuda)
    assert "kevin_launch_k(dim3(2, 1), 32, 0, 0, x.data_ptr<float>(), y.data_ptr<float>(), (int)x.numel());" in split.host
    assert "void kevin_launch_k(dim3 kevin_grid, dim3 kevin_block, size_t kevin_smem, cudaStream_t kevin_stream, const float* kevin_arg0, float* kevin_arg1, int kevin_arg2)" in split.device
    assert "k<<<kevin_grid, kevin_block, kevin_smem, kevin_stream>>>(kevin_arg0, kevin_arg1, kevin_arg2);" in split.device


def test_kernels_with_a_cluster_shape_or_register_cap_are_found() -> None:
    """Hopper kernels declare their cluster at compile time (`__cluster_dims__`), before or after
    `void`, beside `__launch_bounds__`; the split and the static rules still see the kernel."""
    from kevin_backend.toolchain.static_forward import _GLOBAL

    cuda = (
        "#include <torch/extension.h>\n#include <cooperative_groups.h>\n"
        "__global__ void __cluster_dims__(2, 1, 1) __launch_bounds__(256) k(const float* x, float* y) {\n"
        "    cooperative_groups::this_cluster().sync(); y[0] = x[0];\n}\n"
        "__global__ __launch_bounds__(128) void __maxnreg__(64) g(float* y) { y[0] = 1.0f; }\n"
        "torch::Tensor f(torch::Tensor x) {\n"
        "    auto y = torch::empty_like(x);\n"
        "    k<<<2, 256>>>(x.data_ptr<float>(), y.data_ptr<float>());\n"
        "    g<<<1, 128>>>(y.data_ptr<float>());\n"
        "    return y;\n"
        "}\n"
    )
    split = split_cuda(cuda)
    assert set(split.launchers) == {"kevin_launch_k", "kevin_launch_g"}
    assert "cooperative_groups" not in split.host and "__cluster_dims__(2, 1, 1)" in split.device
    assert set(_GLOBAL.findall(cuda)) == {"k", "g"}


@pytest.mark.parametrize(
    "cuda, why",
    [
        ("#include <torch/extension.h>\n__global__ void k(at::PackedTensorAccessor32<float, 2> x) {}\n"
         "torch::Tensor f(torch::Tensor x) { k<<<1, 1>>>(x.packed_accessor32<float, 2>()); return x; }\n",
         "names at::PackedTensorAccessor32"),
        ('extern "C" { __global__ void k(float* x) {} }\nvoid f(float* x) { k<<<1, 1>>>(x); }\n', 'extern "C"'),
        ("#include <torch/extension.h>\n__global__ void k(float* x) {}\ntorch::Tensor f(torch::Tensor x) { return x; }\n", "no kernel launch"),
    ],
    ids=["torch-accessor-in-device-code", "extern-c-block", "no-launch"],
)
def test_what_cannot_be_split_says_why(cuda: str, why: str) -> None:
    with pytest.raises(SplitError, match=why):
        split_cuda(cuda)


def test_a_torch_free_launching_function_goes_with_the_kernels() -> None:
    cuda = (
        "__global__ void k(const float* x, float* y, int n) { y[0] = x[0] + n; }\n"
        "void launch_k(const float* x, float* y, int n, cudaStream_t s) { k<<<1, 32, 0, s>>>(x, y, n); }\n"
    )
    split = split_cuda(cuda)
    assert "void launch_k(const float* x, float* y, int n, cudaStream_t s);" in split.host
    assert "k<<<1, 32, 0, s>>>" in split.device and "<<<" not in split.host


@pytest.mark.parametrize("case", HONEST, ids=lambda c: c.name)
def test_fast_sources_register_each_function_as_an_operator(case) -> None:
    (ext,) = Candidate.parse(case.source).extensions
    sources = fast_sources(ext.cpp_sources, ext.cuda_sources, ext.functions, "abc123")
    assert sources.namespace == "kevin_abc123"
    assert "TORCH_LIBRARY_FRAGMENT(kevin_abc123, m)" in sources.host
    for name in ext.functions:
        assert f'm.def("{name}", &kevin_adapt<&{name}>::call);' in sources.host
    assert "torch/extension.h" not in sources.host and "torch" not in sources.device


@pytest.mark.parametrize(
    "cpp, functions, why",
    [
        ("PYBIND11_MODULE(x, m) {}", ("f",), "Python bindings"),
        ("torch::Tensor f(torch::Tensor x);", (), "no functions"),
        ("torch::Tensor f(torch::Tensor x);", ("a-b",), "cannot name an operator"),
    ],
    ids=["pybind", "no-functions", "bad-name"],
)
def test_fast_sources_refuse_what_the_whole_build_must_take(cpp: str, functions: tuple[str, ...], why: str) -> None:
    (ext,) = Candidate.parse(HONEST[0].source).extensions
    with pytest.raises(SplitError, match=why):
        fast_sources(cpp, ext.cuda_sources, functions, "abc")


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
def test_an_error_in_kernel_code_is_final_and_points_at_the_candidates_line(tmp_path: Path) -> None:
    (ext,) = Candidate.parse(HONEST[0].source).extensions
    lines = ext.cuda_sources.splitlines()
    kernel_line = next(i for i, line in enumerate(lines) if "__global__" in line) + 2  # inside the kernel body
    lines.insert(kernel_line - 1, "    float broken = 1.0f +;")
    cuda = "\n".join(lines) + "\n"
    sources = fast_sources(ext.cpp_sources, cuda, ext.functions, "abc")
    (tmp_path / "device.cu").write_text(sources.device)
    out = subprocess.run(["nvcc", "-c", str(tmp_path / "device.cu"), "-o", str(tmp_path / "device.o"), "-arch=sm_90"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode != 0
    outcome = _failure(out.stdout + out.stderr, cuda)
    assert outcome.final and f"cuda_sources line {kernel_line}" in outcome.error and "1.0f +" in outcome.error
    # a name the whole build's headers might have supplied is not final: the whole build decides
    assert not _failure(f'{SOURCE_NAME}(3): error: identifier "at_helper" is undefined\n', cuda).final


def test_types_are_shared_at_namespace_scope_and_helpers_stay_private() -> None:
    cuda = (
        "#include <torch/extension.h>\n"
        "struct Dims { long long size[4]; };\n"
        "static inline int cdiv(int a, int b) { return (a + b - 1) / b; }\n"
        "__global__ void k(const float* x, Dims d) {}\n"
        "torch::Tensor f(torch::Tensor x) { Dims d{}; k<<<cdiv(4, 2), 32>>>(x.data_ptr<float>(), d); return x; }\n"
    )
    split = split_cuda(cuda)
    host_before_namespace = split.host.split("namespace {")[0]
    assert "struct Dims" in host_before_namespace and "struct Dims" in split.device
    assert "cdiv" in split.host.split("namespace {")[1].split("}  // namespace")[0]


def test_a_templated_kernel_under_a_dispatch_macro_gets_instantiated_launchers(tmp_path: Path) -> None:
    (ext,) = Candidate.parse(KEVIN_STYLE).extensions  # AT_DISPATCH_FLOATING_TYPES_AND_HALF
    split = split_cuda(ext.cuda_sources)
    assert split.templated and "kevin_launch_scale_add_kernel<scalar_t>(" in split.host
    instantiated = sorted(line.split("<")[1].split(">")[0] for line in split.device.splitlines() if line.startswith("template void"))
    assert instantiated == ["c10::Half", "double", "float"] and "#include <c10/util/Half.h>" in split.device
    two = split_cuda(ext.cuda_sources.replace("AT_DISPATCH_FLOATING_TYPES_AND_HALF(",
                                              "AT_DISPATCH_FLOATING_TYPES_AND2(at::ScalarType::Half, at::ScalarType::BFloat16, "))
    assert sum(line.startswith("template void") for line in two.device.splitlines()) == 4
    with pytest.raises(SplitError, match="does not instantiate"):
        split_cuda(ext.cuda_sources.replace("AT_DISPATCH_FLOATING_TYPES_AND_HALF(", "AT_DISPATCH_ALL_TYPES("))
    if shutil.which("nvcc"):
        import torch.utils.cpp_extension as cpp_extension

        (tmp_path / "device.cu").write_text(split.device)
        out = subprocess.run(["nvcc", "-c", str(tmp_path / "device.cu"), "-o", str(tmp_path / "device.o"), "-arch=sm_90",
                              "-std=c++17", "-D__CUDA_NO_HALF_OPERATORS__", "-D__CUDA_NO_HALF_CONVERSIONS__",
                              "--expt-relaxed-constexpr", f"-I{cpp_extension.include_paths('cpu')[0]}"],
                             capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr[-2000:]
