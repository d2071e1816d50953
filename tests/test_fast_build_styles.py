"""The fast build takes what models write.

`tests/build_styles/` holds candidate programs written the way language models write them (each
file's docstring says which style it stands for): non-type kernel templates launched with literals,
local and namespace-scope constants, `#define`s, switches, if/else, launch macros and host function
templates; `scalar_t` kernels under AT_DISPATCH_*; static and `extern __shared__` memory;
`__constant__` data set with cudaMemcpyToSymbol; anonymous, named and nested namespaces; several
kernels; CUDA guards and streams from c10 and ATen; `__half2`/`__nv_bfloat162`/float4 types; warp
shuffles; cooperative groups; host helpers. With the KernelBench corpus' candidates
(`tests/kb_corpus/candidates/`) they are split by `fast_sources` (CPU only), their device parts
compiled by nvcc for sm_90 as the fast build compiles them (where nvcc is), and their whole fast
builds (device part, host part against the precompiled header, link) made where torch's CUDA
headers are at hand: the running torch when it is a CUDA build, or the torch of the Python named
by KEVIN_CUDA_TORCH_PYTHON (docs/BUILD_NOTES.md).
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from kevin_backend.toolchain.candidate import Candidate, InlineExtension
from kevin_backend.toolchain.fast_build import FastSources, Toolchain, build_fast, cuda_home_of, device_command, ensure_pch, fast_sources
from kevin_backend.toolchain.host_device import SplitError, split_cuda
from conftest import FULL

STYLES = Path(__file__).resolve().parent / "build_styles"
KB_CANDIDATES = Path(__file__).resolve().parent / "kb_corpus" / "candidates"
ARCH = "9.0"


@dataclass(frozen=True)
class Entry:
    name: str
    ext: InlineExtension


def _entries(folder: Path) -> list[Entry]:
    entries = []
    for path in sorted(folder.glob("*.py")):
        if path.name.startswith("_"):
            continue
        for i, ext in enumerate(Candidate.parse(path.read_text()).extensions):
            entries.append(Entry(f"{folder.name}/{path.stem}" + (f"#{i}" if i else ""), ext))
    return entries


STYLE_ENTRIES = _entries(STYLES)
KB_ENTRIES = _entries(KB_CANDIDATES)


def _split(entry: Entry) -> FastSources | str:
    """The fast build's sources, or why the candidate takes the whole build."""
    try:
        return fast_sources(entry.ext.cpp_sources, entry.ext.cuda_sources, entry.ext.functions, "styles")
    except SplitError as exc:
        return str(exc)


def test_the_corpus_holds_the_styles_models_write() -> None:
    assert len({e.name.split("#")[0] for e in STYLE_ENTRIES}) >= 30
    cuda = [e.ext.cuda_sources for e in STYLE_ENTRIES]

    def count(pattern: str) -> int:
        return sum(bool(re.search(pattern, text)) for text in cuda)

    assert count(r"template\s*<\s*(int|unsigned|bool|size_t)\b[^>]*>\s*__global__") >= 6
    assert count(r"template\s*<\s*(?:int|unsigned)\s+\w+[^>]*>\s*\n\s*__global__") >= 6
    assert count(r"AT_DISPATCH_\w+") >= 5
    assert count(r"extern\s+__shared__") >= 5
    assert count(r"__constant__") >= 3
    assert count(r"\bnamespace\b") >= 5
    assert count(r"__global__[\s\S]*__global__") >= 6  # several kernels
    assert count(r"__half2|__nv_bfloat162") >= 2 and count(r"\bfloat4\b") >= 2
    assert count(r"CUDAGuard") >= 5 and count(r"__shfl_\w+_sync") >= 5
    assert count(r"#\s*define\s+\w+\(") >= 2


def _fast_path_report(entries: list[Entry]) -> tuple[int, list[tuple[str, str]]]:
    fast, slow = 0, []
    for entry in entries:
        outcome = _split(entry)
        if isinstance(outcome, str):
            slow.append((entry.name, outcome))
        else:
            fast += 1
    return fast, slow


def test_nine_in_ten_candidates_take_the_fast_path() -> None:
    for label, entries in (("build_styles", STYLE_ENTRIES), ("kb_corpus", KB_ENTRIES)):
        fast, slow = _fast_path_report(entries)
        print(f"\n{label}: {fast} of {len(entries)} extensions take the fast build")
        for name, why in slow:
            print(f"  whole build: {name}: {why}")
        assert fast >= 0.9 * len(entries), slow
    everything = STYLE_ENTRIES + KB_ENTRIES
    fast, _ = _fast_path_report(everything)
    assert fast >= 0.9 * len(everything)


def test_the_split_keeps_torch_out_of_the_device_part_and_launches_out_of_the_host_part() -> None:
    for entry in STYLE_ENTRIES + KB_ENTRIES:
        outcome = _split(entry)
        if isinstance(outcome, str):
            continue
        device = re.sub(r'#include <c10/(?:util/(?:Half|BFloat16)|macros/Macros)\.h>', "", outcome.device)
        assert not re.search(r"#\s*include\s*<(torch|ATen)/", device), entry.name
        host_code = outcome.host.split('#line 1 "kevin_cpp_sources.cpp"')[0]
        assert "<<<" not in host_code, entry.name


@pytest.mark.parametrize(
    "cuda, why",
    [
        ("namespace a { __global__ void k() {} }\nvoid f() { a::k<<<1, 1>>>(); }\n", None),
        ("template <int N>\n__global__ void k(float* x) {}\nvoid f(float* x) { k<4><<<1, 1>>>(x); }\n", None),
        ("#include <torch/extension.h>\ntemplate <int N> __global__ void k(float* x) {}\n"
         "torch::Tensor f(torch::Tensor x, int64_t n) { k<n><<<1, 1>>>(x.data_ptr<float>()); return x; }\n",
         "template argument n of the launch of kernel k is neither a constant nor a dispatched type"),
        ("#include <torch/extension.h>\ntemplate <typename T> __global__ void k(T* x) {}\n"
         "torch::Tensor f(torch::Tensor x) { k<<<1, 1>>>(x.data_ptr<float>()); return x; }\n", None),
        ("#include <torch/extension.h>\ntemplate <typename T> __global__ void k(T* x) {}\n"
         "torch::Tensor f(torch::Tensor x) { float* p = x.data_ptr<float>(); k<<<1, 1>>>(p); return x; }\n",
         "leaves template arguments to be deduced"),
        ("#include <torch/extension.h>\n__global__ void k(at::PackedTensorAccessor32<float, 2> x) {}\n"
         "torch::Tensor f(torch::Tensor x) { k<<<1, 1>>>(x.packed_accessor32<float, 2>()); return x; }\n",
         "kernel k names at::PackedTensorAccessor32"),
        ("#include <torch/extension.h>\ntemplate <typename T> __global__ void k(T* x) {}\n"
         "torch::Tensor f(torch::Tensor x) { AT_DISPATCH_ALL_TYPES(x.scalar_type(), \"f\", [&] { k<scalar_t><<<1, 1>>>(x.data_ptr<scalar_t>()); }); return x; }\n",
         "AT_DISPATCH_ALL_TYPES dispatches types the fast build does not instantiate"),
        ('extern "C" {\n__global__ void k(float* x) {}\n}\nvoid f(float* x) { k<<<1, 1>>>(x); }\n', 'extern "C"'),
        ("#include <torch/extension.h>\n__managed__ int counter;\n__global__ void k() { counter++; }\n"
         "torch::Tensor f(torch::Tensor x) { counter = 0; k<<<1, 1>>>(); return x; }\n", "__managed__ variable counter"),
        ("#include <torch/extension.h>\ntemplate <int B> __global__ void k(float* x) {}\n"
         "template <int B> void go(float* x) { k<B><<<1, B>>>(x); }\n"
         "torch::Tensor f(torch::Tensor x) { return x; }\n", "host function template go is never called"),
        ("#define LAUNCH k<<<1, 1>>>(x)\n__global__ void k(float* x) {}\nvoid f(float* x) { LAUNCH; }\n",
         "macro LAUNCH hides a kernel launch"),
        ("#include <torch/extension.h>\ntemplate <typename T> __global__ void k(T* x) {}\n"
         "template <typename T> void go(T* x) { k<T><<<1, 1>>>(x); }\n"
         "torch::Tensor f(torch::Tensor x) { auto* p = x.data_ptr<float>(); go(p); return x; }\n",
         "host function template go is called with template arguments deduced from arguments the split cannot read"),
    ],
    ids=["namespace-taken", "non-type-template-taken", "runtime-template-argument", "deduced-from-data-ptr-taken",
         "deduced-from-a-variable",
         "torch-accessor-in-device-code", "integer-dispatch", "extern-c-block", "managed-variable",
         "uncalled-host-template", "object-like-launch-macro", "host-template-deduced-from-a-variable"],
)
def test_what_the_split_takes_and_what_it_says_it_cannot(cuda: str, why: str | None) -> None:
    if why is None:
        split_cuda(cuda)
        return
    with pytest.raises(SplitError, match=re.escape(why)):
        split_cuda(cuda)


def test_template_arguments_are_read_from_the_source() -> None:
    cuda = """
#include <torch/extension.h>
#define BLOCK 128
namespace cfg { constexpr int kWarps = 4; }
template <typename scalar_t, int THREADS, bool FLAG>
__global__ void k(const scalar_t* x, scalar_t* y) {}
template <int B> void go(const torch::Tensor& x, torch::Tensor& y) {
    constexpr int kThreads = B * 2;
    k<float, kThreads, true><<<1, kThreads>>>(x.data_ptr<float>(), y.data_ptr<float>());
}
torch::Tensor f(torch::Tensor x) {
    auto y = torch::empty_like(x);
    switch (x.size(0)) { case 1: go<64>(x, y); break; default: go<BLOCK>(x, y); }
    AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "f", [&] {
        k<scalar_t, cfg::kWarps * 32, false><<<1, 128>>>(x.data_ptr<scalar_t>(), y.data_ptr<scalar_t>());
    });
    return y;
}
"""
    split = split_cuda(cuda)
    device = split.device
    assert split.templated
    # go<64> and go<BLOCK>, each through its own constants; the dispatch for float and double
    assert device.count("void kevin_instances_") == 4
    assert "constexpr int kThreads = B * 2;" in device and "constexpr auto kevin_bind_0_B = (64);" in device
    assert "constexpr auto kevin_bind_0_B = (BLOCK);" in device
    assert "using scalar_t = double;" in device and "&kevin_launch_k<scalar_t, cfg::kWarps * 32, false>" in device
    assert "kevin_launch_k<float, kThreads, true>(1, kThreads, 0, 0," in split.host


def test_device_variables_and_kernel_addresses_reach_host_code() -> None:
    cuda = """
#include <torch/extension.h>
__constant__ float c_w[16];
template <int T> __global__ void k(float* y) { y[threadIdx.x] = c_w[threadIdx.x % 16]; }
torch::Tensor f(torch::Tensor w, torch::Tensor y) {
    cudaMemcpyToSymbol(c_w, w.data_ptr<float>(), 16 * sizeof(float));
    cudaFuncSetAttribute(k<256>, cudaFuncAttributeMaxDynamicSharedMemorySize, 65536);
    k<256><<<1, 256, 65536>>>(y.data_ptr<float>());
    return y;
}
"""
    split = split_cuda(cuda)
    assert "void* kevin_symbol_c_w() { return (void*)&c_w; }" in split.device
    assert "typedef float kevin_type_c_w[16];" in split.host and "kevin_type_c_w& c_w = " in split.host
    assert "cudaFuncSetAttribute(kevin_kernel_k<256>(), " in split.host
    assert "&kevin_kernel_k<256>" in split.device and "&kevin_launch_k<256>" in split.device


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
def test_device_parts_compile_with_nvcc(tmp_path: Path) -> None:
    """The device parts compile as the fast build compiles them (sm_90, torch-free but for c10's
    light headers), two at a time: every templated KernelBench candidate's, a quarter of the styles'
    and a twelfth of the plain candidates' (the plain split path again: each part is five seconds
    of nvcc on a CI core); all 89 in the full tier (KEVIN_TESTS_FULL=1 or KEVIN_TESTS_EVERY_NVCC=1)."""
    toolchain = Toolchain.detect()
    every = FULL or os.environ.get("KEVIN_TESTS_EVERY_NVCC") == "1"
    jobs = []
    plain = 0
    for i, entry in enumerate(STYLE_ENTRIES + KB_ENTRIES):
        outcome = _split(entry)
        if isinstance(outcome, str):
            continue
        if i < len(STYLE_ENTRIES) and i % 4 and not every:
            continue
        if i >= len(STYLE_ENTRIES) and not outcome.templated and not every:
            plain += 1
            if plain % 12 != 1:
                continue
        folder = tmp_path / f"{i:03d}"
        folder.mkdir()
        (folder / "device.cu").write_text(outcome.device)
        jobs.append((entry.name, device_command(toolchain, folder / "device.cu", folder / "device.o", ARCH,
                                                entry.ext.extra_cuda_cflags)))

    def run(job: tuple[str, list[str]]) -> tuple[str, int, str]:
        out = subprocess.run(job[1], capture_output=True, text=True, timeout=600)
        return job[0], out.returncode, (out.stdout + out.stderr)[-3000:]

    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(run, jobs))
    failed = [(name, log) for name, code, log in results if code != 0]
    print(f"\nnvcc compiled {len(results) - len(failed)} of {len(results)} device parts")
    assert not failed, failed


def _cuda_toolchain() -> Toolchain | None:
    """A toolchain for a CUDA build of torch: the running one, or the one KEVIN_CUDA_TORCH_PYTHON's
    Python imports (its headers and libraries; the compilers of this machine)."""
    import torch

    if shutil.which("nvcc") is None:
        return None
    if torch.version.cuda:
        return Toolchain.detect()
    python = os.environ.get("KEVIN_CUDA_TORCH_PYTHON", "")
    if not python:
        return None
    probe = (
        "import json, torch, torch.utils.cpp_extension as c\n"
        "print(json.dumps([torch.__version__, torch.version.cuda, c.include_paths('cuda'), c.library_paths('cuda'),"
        " int(torch.compiled_with_cxx11_abi()), c.COMMON_NVCC_FLAGS, '-std=c++20' in open(c.__file__).read()]))\n"
    )
    out = subprocess.run([python, "-c", probe], capture_output=True, text=True, timeout=300)
    if out.returncode != 0:
        return None
    version, cuda, includes, libraries, abi, nvcc_flags, cxx20 = json.loads(out.stdout.strip().splitlines()[-1])
    if not cuda:
        return None
    site = Path(includes[0]).parents[1]
    # CUDA headers and libraries of the wheels that torch depends on (cuBLAS, cuSPARSE, ...)
    wheels = sorted(p for p in (site / "nvidia").glob("*/include") if (p / "cublas_v2.h").exists())
    cuda_home = Path(cuda_home_of(shutil.which("nvcc") or ""))
    return Toolchain(
        cxx=shutil.which("c++") or "c++",
        nvcc=str(cuda_home / "bin" / "nvcc"),
        include_dirs=(*includes[:2], str(cuda_home / "include"), *map(str, wheels)),
        library_dirs=(*libraries[:1], *(str(p.parent / "lib") for p in wheels), str(cuda_home / "lib64")),
        cxx_flags=("-std=c++20" if cxx20 else "-std=c++17", "-fPIC", "-O2", f"-D_GLIBCXX_USE_CXX11_ABI={abi}"),
        nvcc_flags=("-std=c++17", "-O3", "-Xcompiler", "-fPIC", *nvcc_flags),
        version=f"{version} cuda {cuda} (tests)",
    )


@pytest.mark.slow
def test_whole_fast_builds_compile_and_link(tmp_path: Path) -> None:
    """Each build-style candidate's fast build: the device part through nvcc, the host part through
    g++ against the precompiled header, one link; the library asks for no launcher or instantiation
    it does not define (every template argument read from the source was the one the host uses)."""
    toolchain = _cuda_toolchain()
    if toolchain is None:
        pytest.skip("needs nvcc and a CUDA build of torch (running, or KEVIN_CUDA_TORCH_PYTHON)")
    pch = ensure_pch(tmp_path / "cache", toolchain)
    if not pch.with_name("kevin_pch.h.gch").exists() or "ATen/cuda/CUDAContext.h" not in pch.read_text():
        # with a toolchain at hand, a header that does not build is the fast build broken, not a reason to skip
        pytest.fail(f"the precompiled header with the CUDA context could not be built: {(pch.parent / 'pch.log').read_text()[-2000:]}")
    entries = [(i, e, s) for i, e in enumerate(STYLE_ENTRIES) if not isinstance(s := _split(e), str)]

    def build(job: tuple[int, Entry, FastSources]) -> tuple[str, bool, str]:
        i, entry, sources = job
        work = tmp_path / f"{i:03d}"
        outcome = build_fast(sources, work, work / "ext.so", ARCH, pch, entry.ext.extra_cflags, entry.ext.extra_cuda_cflags,
                             entry.ext.cuda_sources, 600, toolchain)
        if not outcome.ok:
            return entry.name, False, outcome.fallback + "\n" + outcome.log[-3000:]
        undefined = subprocess.run(["nm", "-C", "--undefined-only", str(work / "ext.so")], capture_output=True, text=True).stdout
        missing = [line.strip() for line in undefined.splitlines() if "kevin_" in line]
        return entry.name, not missing, "undefined: " + ", ".join(missing)

    with concurrent.futures.ThreadPoolExecutor(max_workers=max(2, min(8, (os.cpu_count() or 2) // 2))) as pool:
        results = list(pool.map(build, entries))
    failed = [(name, log) for name, ok, log in results if not ok]
    print(f"\nfast builds compiled and linked: {len(results) - len(failed)} of {len(results)}")
    assert not failed, failed


if __name__ == "__main__":  # pragma: no cover - a report: python tests/test_fast_build_styles.py
    for label, group in (("build_styles", STYLE_ENTRIES), ("kb_corpus", KB_ENTRIES)):
        n, rest = _fast_path_report(group)
        print(f"{label}: {n}/{len(group)} fast")
        for name, why in rest:
            print(f"  {name}: {why}")
    sys.exit(0)
