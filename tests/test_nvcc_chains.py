"""The fast build's device part through nvcc's own steps as two chains at once (`nvcc_chains`,
`compile_parts`): the same object as nvcc's, the same errors, nvcc itself where its steps take
another form; and builds ahead of their turn at a lower priority (`niced`, `Builder.build`)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kevin_backend.toolchain.fast_build import FastOutcome, compile_parts, niced, nvcc_chains

needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")

KERNEL = """
#include <cuda_runtime.h>
template <int BLOCK>
__global__ void kevin_scale(float* x, float a, int n) {
    int i = blockIdx.x * BLOCK + threadIdx.x;
    if (i < n) x[i] *= a;
}
extern "C" int kevin_launch(float* x, float a, int n, cudaStream_t stream) {
    kevin_scale<256><<<(n + 255) / 256, 256, 0, stream>>>(x, a, n);
    return static_cast<int>(cudaGetLastError());
}
"""


def _nvcc(source: Path, output: Path, *flags: str) -> list[str]:
    return ["nvcc", "-std=c++17", "-O3", "-Xcompiler", "-fPIC", "-gencode=arch=compute_90,code=sm_90", *flags,
            "-c", str(source), "-o", str(output)]


def _defined(obj: Path) -> set[str]:
    listed = subprocess.run(["nm", "--defined-only", str(obj)], capture_output=True, text=True, check=True).stdout
    # (a name made from the module id differs by design: nvcc's id against the build's own)
    return {line.split()[-1] for line in listed.splitlines() if "GLOBAL__N_" not in line}


@needs_nvcc
def test_the_two_chains_make_nvccs_object(tmp_path: Path) -> None:
    source = tmp_path / "device.cu"
    source.write_text(KERNEL)
    chains = nvcc_chains(_nvcc(source, tmp_path / "chained.o"), tmp_path / "keep", "_kevin_0123456789abcdef")
    assert chains is not None
    # the host pass ends at cudafe++, the device pass at fatbinary; the id written before either runs
    assert "cudafe++" in chains.first[0][-1] and "cicc" in chains.first[1][-1] and "fatbinary" in chains.first[1][-1]
    assert "--gen_module_id_file" not in chains.first[0][-1]
    assert [p.read_text() for p in (tmp_path / "keep").glob("*.module_id")] == ["_kevin_0123456789abcdef"]
    results, timed_out = compile_parts(_nvcc(source, tmp_path / "chained.o"), ["true"], tmp_path / "keep2",
                                       "_kevin_0123456789abcdef", 300)
    assert not timed_out and [code for _, code in results] == [0, 0], results
    assert (tmp_path / "keep2" / "device.cudafe1.cpp").exists()  # (nvcc's steps, run here: not nvcc itself)
    subprocess.run(_nvcc(source, tmp_path / "plain.o"), check=True, capture_output=True)
    defined = _defined(tmp_path / "chained.o")
    assert defined == _defined(tmp_path / "plain.o") and "kevin_launch" in defined, defined


@needs_nvcc
@pytest.mark.parametrize("broken, where", [
    ("    int i = blockIdx.x * BLOCK + threadIdx.x;", "    int i = blockIdx.x * BLOCK + threadIdx.x + undeclared_offset;"),
    ("    return static_cast<int>(cudaGetLastError());", "    return static_cast<int>(cudaGetLastError()) + no_such_host_name;"),
])
def test_a_candidates_error_reads_as_nvccs(tmp_path: Path, broken: str, where: str) -> None:
    # an error in the kernel (the device pass sees it) or in the host code (the host pass): the
    # chains' output names the same line and message as nvcc's
    source = tmp_path / "device.cu"
    source.write_text(KERNEL.replace(broken, where))
    results, timed_out = compile_parts(_nvcc(source, tmp_path / "chained.o"), ["true"], tmp_path / "keep", "_kevin_0", 300)
    (out, code), _ = results
    plain = subprocess.run(_nvcc(source, tmp_path / "plain.o"), capture_output=True, text=True)
    assert not timed_out and code != 0 and plain.returncode != 0
    errors = sorted({line for line in out.splitlines() if "error" in line})
    assert errors and errors == sorted({line for line in (plain.stdout + plain.stderr).splitlines() if "error" in line}), (out, plain.stderr)


@needs_nvcc
def test_steps_of_another_form_stay_nvccs(tmp_path: Path) -> None:
    # two architectures (two device passes): nvcc runs its steps itself, and the object is still made
    source = tmp_path / "device.cu"
    source.write_text(KERNEL)
    command = _nvcc(source, tmp_path / "two.o", "-gencode=arch=compute_80,code=sm_80")
    assert nvcc_chains(command, tmp_path / "keep", "_kevin_0") is None
    results, _ = compile_parts(command, ["true"], tmp_path / "keep", "_kevin_0", 300)
    assert [code for _, code in results] == [0, 0] and (tmp_path / "two.o").exists()
    assert nvcc_chains(["nvcc-that-is-not-there", "-c", str(source)], tmp_path / "keep3", "_kevin_0") is None


@pytest.mark.skipif(shutil.which("nice") is None, reason="needs nice")
def test_a_build_ahead_runs_its_compilers_at_a_lower_priority(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from kevin_backend.toolchain import build as build_module
    from kevin_backend.toolchain.fast_build import run_group

    probe = [sys.executable, "-c", "import os; print(os.nice(0))"]
    lowered = str(min(19, os.nice(0) + 10))  # (19: the lowest priority there is)
    assert run_group([niced(probe, 10)], 60)[0].strip() == lowered
    assert run_group([probe], 60, niceness=10)[0].strip() == lowered
    assert niced(probe, 0) == probe
    # the builder's fast path hands the niceness to the compilers: a build ahead at BACKGROUND_NICENESS, a turn's at 0
    seen: list[int] = []

    def fake_build_fast(*args, niceness: int = 0, **kwargs) -> FastOutcome:  # type: ignore[no-untyped-def]
        seen.append(niceness)
        return FastOutcome(False, True, "stopped here", "")  # (final: no whole build after it)

    monkeypatch.setattr(build_module, "build_fast", fake_build_fast)
    monkeypatch.setattr(build_module, "ensure_pch", lambda root, toolchain: tmp_path / "pch.h")
    monkeypatch.setattr(build_module, "pch_built", lambda root, toolchain: True)
    monkeypatch.setattr(build_module, "pch_header", lambda root, toolchain: tmp_path / "pch.h")
    monkeypatch.setattr(build_module.Toolchain, "detect", staticmethod(lambda: None))
    cuda = "__global__ void k(float* x) { x[0] = 1.0f; }\ntorch::Tensor f(torch::Tensor x) { k<<<1, 1>>>(x.data_ptr<float>()); return x; }\n"
    specs = [build_module.BuildSpec("kevin_probe", "torch::Tensor f(torch::Tensor x);", f"#include <torch/extension.h>\n{cuda}// {i}\n",
                                    ("f",), arch="9.0") for i in range(2)]
    builder = build_module.Builder(tmp_path / "builds")
    builder.build_many([specs[0]], background=True)
    builder.build(specs[1])
    assert seen == [build_module.BACKGROUND_NICENESS, 0], seen


def test_a_failed_host_pass_stops_the_device_pass() -> None:
    # nvcc stops at the host pass's error; the chains' device pass, its output no longer wanted, is killed then
    import time

    from kevin_backend.toolchain.fast_build import _run_each

    start = time.monotonic()
    results, timed_out = _run_each([[sys.executable, "-c", "raise SystemExit(2)"], ["sleep", "60"], ["true"]], 120, stops={0: 1})
    assert not timed_out and [code for _, code in results] == [2, -9, 0] and time.monotonic() - start < 30, results
    results, _ = _run_each([["true"], ["sleep", "0.2"]], 120, stops={0: 1})
    assert [code for _, code in results] == [0, 0]


@needs_nvcc
def test_the_device_part_compiles_while_the_host_part_waits_for_its_header(tmp_path: Path) -> None:
    # a first build of a cache: the host part includes the precompiled header being made, the
    # device part does not; so the device part's steps run while the host part waits
    import time

    source = tmp_path / "device.cu"
    source.write_text(KERNEL)
    keep = tmp_path / "keep"
    seen: list[str] = []

    def header_made(seconds: float) -> None:  # (the header "ready" once the device pass has made its PTX)
        deadline = time.monotonic() + min(seconds, 120)
        while not list(keep.glob("*.ptx")) and time.monotonic() < deadline:
            time.sleep(0.05)
        seen.append("ptx before the host part" if list(keep.glob("*.ptx")) else "no ptx")

    marker = tmp_path / "host_ran"
    host = [sys.executable, "-c", f"open({str(marker)!r}, 'w').write('ran')"]
    results, timed_out = compile_parts(_nvcc(source, tmp_path / "chained.o"), host, keep, "_kevin_0", 300, host_ready=header_made)
    assert not timed_out and [code for _, code in results] == [0, 0], results
    assert seen == ["ptx before the host part"] and marker.read_text() == "ran"
    assert "kevin_launch" in _defined(tmp_path / "chained.o")

    def no_header(seconds: float) -> None:
        raise RuntimeError("the precompiled header could not be made")

    def header_late(seconds: float) -> None:
        import concurrent.futures

        raise concurrent.futures.TimeoutError()

    marker.unlink()
    results, timed_out = compile_parts(_nvcc(source, tmp_path / "late.o"), host, tmp_path / "keep3", "_kevin_0", 300,
                                       host_ready=header_late)
    assert timed_out and "not made within 300 s" in results[-1][0] and not marker.exists(), results
    with pytest.raises(RuntimeError, match="could not be made"):
        compile_parts(_nvcc(source, tmp_path / "again.o"), host, tmp_path / "keep2", "_kevin_0", 300, host_ready=no_header)
    assert not marker.exists()  # (the host part never ran without its header)


def test_a_first_build_makes_the_header_beside_its_device_part(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # the builder starts the header's build and hands the build a wait for it: the build itself
    # (its device part) starts before the header is made; with the header made, no wait
    import threading

    from kevin_backend.toolchain import build as build_module

    made = threading.Event()
    release = threading.Event()
    calls: list[tuple[bool, object]] = []

    def slow_header(root: Path, toolchain: object) -> Path:
        release.wait(30)
        made.set()
        return tmp_path / "pch.h"

    def fake_build_fast(*args, pch_ready=None, **kwargs) -> FastOutcome:  # type: ignore[no-untyped-def]
        calls.append((made.is_set(), pch_ready))
        release.set()
        if pch_ready is not None:
            pch_ready(30)  # (as the host part does)
            calls.append((made.is_set(), "waited"))
        return FastOutcome(False, True, "stopped here", "")

    built = {"done": False}
    monkeypatch.setattr(build_module, "build_fast", fake_build_fast)
    monkeypatch.setattr(build_module, "ensure_pch", slow_header)
    monkeypatch.setattr(build_module, "pch_built", lambda root, toolchain: built["done"])
    monkeypatch.setattr(build_module, "pch_header", lambda root, toolchain: tmp_path / "pch.h")
    monkeypatch.setattr(build_module.Toolchain, "detect", staticmethod(lambda: None))
    cuda = "__global__ void k(float* x) { x[0] = 1.0f; }\ntorch::Tensor f(torch::Tensor x) { k<<<1, 1>>>(x.data_ptr<float>()); return x; }\n"
    specs = [build_module.BuildSpec("kevin_probe", "torch::Tensor f(torch::Tensor x);", f"#include <torch/extension.h>\n{cuda}// {i}\n",
                                    ("f",), arch="9.0") for i in range(2)]
    builder = build_module.Builder(tmp_path / "builds")
    builder.build(specs[0])
    assert calls[0][0] is False and callable(calls[0][1]) and calls[1] == (True, "waited"), calls
    built["done"], calls[:] = True, []
    builder.build(specs[1])
    assert calls == [(True, None)], calls
