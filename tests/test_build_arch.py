"""The architecture a candidate is built for: the present GPU's, in its arch-specific form ("9.0a")
where the program asks for it (Hopper's wgmma and TMA exist only there, and CUTLASS 3.x's sm90
kernels compiled without them trap at run time), and one form only."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

from kevin_backend.toolchain import build as build_module
from kevin_backend.toolchain.build import BuildSpec, Builder
from kevin_backend.toolchain.fast_build import Toolchain, build_arch, device_command

SPECIFIC = "-gencode=arch=compute_90a,code=sm_90a"


@pytest.mark.parametrize(("arch", "flags", "want"), [
    ("9.0", (SPECIFIC,), "9.0a"),
    ("9.0", ("-arch=sm_90a",), "9.0a"),
    ("9.0", ("-arch=sm_90", "-O3"), "9.0"),  # the plain form asked for: the plain form
    ("9.0", ("",), "9.0"),  # models write extra_cuda_cflags=[""]
    ("8.0", ("-arch=sm_90a",), "8.0"),  # another GPU's form: the present one's stays plain
    ("10.0", ("-gencode=arch=compute_100a,code=sm_100a",), "10.0a"),
    ("9.0a", (), "9.0a"),
])
def test_the_arch_specific_form_where_the_program_asks_for_it(arch: str, flags: tuple[str, ...], want: str) -> None:
    assert build_arch(arch, flags) == want


def test_both_builds_take_the_arch_specific_form(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tc = Toolchain("c++", "nvcc", ("/torch/include",), (), ("-std=c++17",), ("-O3",), "v")
    command = device_command(tc, tmp_path / "d.cu", tmp_path / "d.o", "9.0", (SPECIFIC,))
    assert [c for c in command if c.startswith("-gencode")] == [SPECIFIC, SPECIFIC]  # no plain compute_90 pass
    seen: dict = {}
    monkeypatch.setattr(build_module, "_run_worker", lambda folder, env, timeout, niceness=0: seen.update(env) or ("stopped", False, False))
    spec = BuildSpec("k", "torch::Tensor run(torch::Tensor x);", "__global__ void k() {}", ("run",), (), (SPECIFIC,), arch="9.0",
                     fast=False)
    Builder(tmp_path / "builds").build(spec)
    assert seen["TORCH_CUDA_ARCH_LIST"] == "9.0a"


GUARDED = """
#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "a device pass without sm_90a's features"
#endif
__global__ void scale(float* x, float a, int n) { int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) x[i] *= a; }
"""


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
def test_every_device_pass_has_the_features_the_program_asked_for(tmp_path: Path) -> None:
    (tmp_path / "d.cu").write_text(GUARDED)
    tc = Toolchain.detect()
    done = subprocess.run(device_command(tc, tmp_path / "d.cu", tmp_path / "d.o", "9.0", (SPECIFIC,)),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    plain = subprocess.run(device_command(tc, tmp_path / "d.cu", tmp_path / "p.o", "9.0", ()), capture_output=True, text=True,
                           timeout=300)
    assert plain.returncode != 0 and "without sm_90a" in plain.stderr  # the guard is real
