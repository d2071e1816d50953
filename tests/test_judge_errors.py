"""Compiler errors trimmed to the candidate's own lines, on real nvcc and g++ output."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from kevin_backend.toolchain.build_errors import SourceFile, parse_errors, trim_compiler_output

BROKEN_CUDA = """\
#include <cuda_runtime.h>
__global__ void k(float* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = undefined_thing[i];
}
void launch(float* out, int n) {
    k<<<1, 32>>>(out, n, 7);
}
"""

BROKEN_CPP = """\
int twice(int x) {
    return x * 2
}
int main() { return twice(not_declared); }
"""

PRELUDE = "#include <cstdint>\n#include <cstddef>\n"  # stands in for lines a build prepends


def compile_output(tool: str, name: str, text: str, tmp_path: Path) -> str:
    path = tmp_path / name
    path.write_text(PRELUDE + text)
    cmd = [tool, "-c", str(path), "-o", str(tmp_path / "out.o")]
    if tool == "nvcc":
        cmd += ["-arch=sm_90"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert out.returncode != 0
    return out.stdout + out.stderr


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
def test_nvcc_errors_point_into_cuda_sources(tmp_path: Path) -> None:
    output = compile_output("nvcc", "cuda.cu", BROKEN_CUDA, tmp_path)
    files = {"cuda.cu": SourceFile("cuda_sources", BROKEN_CUDA, offset=PRELUDE.count("\n"))}
    errors = parse_errors(output, files)
    assert [e.where for e in errors] == ["cuda_sources line 4", "cuda_sources line 7"]
    assert "undefined_thing" in errors[0].message and "undefined_thing" in errors[0].quote
    text = trim_compiler_output(output, files)
    assert str(tmp_path) not in text and "cuda_sources line 4: error:" in text


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")
def test_gcc_errors_point_into_cpp_sources(tmp_path: Path) -> None:
    output = compile_output("g++", "main.cpp", BROKEN_CPP, tmp_path)
    files = {"main.cpp": SourceFile("cpp_sources", BROKEN_CPP, offset=PRELUDE.count("\n"))}
    errors = parse_errors(output, files)
    assert errors and errors[0].where == "cpp_sources line 2"
    assert any("not_declared" in e.message for e in errors)
    assert trim_compiler_output(output, files, max_errors=1).count("error:") == 1


def test_many_errors_are_cut_and_unknown_output_keeps_its_tail() -> None:
    output = "\n".join(f"/build/x/cuda.cu({i}): error: bad thing {i}" for i in range(1, 30))
    text = trim_compiler_output(output, {"cuda.cu": SourceFile("cuda_sources", "a\n" * 40)}, max_errors=3)
    assert text.count("error:") == 3 and "26 more error(s)" in text
    odd = "ninja: build stopped\nsomething odd happened\n"
    assert "something odd happened" in trim_compiler_output(odd, {})


def test_linker_errors_are_kept() -> None:
    output = "ImportError: /tmp/b/ext.so: undefined symbol: _Z5gatedN2at6TensorES0_\n"
    (error,) = parse_errors(output, {})
    assert error.where == "link" and "undefined symbol" in error.message
