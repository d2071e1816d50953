"""The fast build's split: torch-free CUDA (compiled here by nvcc) and host code with launchers."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from judge_cases import HONEST
from kevin_backend.judge.candidate import Candidate
from kevin_backend.judge.split import SplitError, split_cuda
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


@pytest.mark.parametrize(
    "cuda, why",
    [
        (None, "templated kernel"),
        ("namespace a { __global__ void k() {} }\nvoid f() { a::k<<<1, 1>>>(); }\n", "namespace"),
        ("#include <torch/extension.h>\n__global__ void k(at::Half* x) {}\ntorch::Tensor f(torch::Tensor x) { k<<<1, 1>>>(nullptr); return x; }\n", "device code names torch"),
        ("#include <torch/extension.h>\n__global__ void k(float* x) {}\ntorch::Tensor f(torch::Tensor x) { return x; }\n", "no kernel launch"),
    ],
    ids=["templated", "namespace", "torch-in-device-code", "no-launch"],
)
def test_what_cannot_be_split_says_why(cuda: str | None, why: str) -> None:
    if cuda is None:
        (ext,) = Candidate.parse(KEVIN_STYLE).extensions
        cuda = ext.cuda_sources
    with pytest.raises(SplitError, match=why):
        split_cuda(cuda)
