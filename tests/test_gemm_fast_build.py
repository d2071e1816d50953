"""The GEMM writer's programs through the judge's whole fast build, where a CUDA build of torch is at
hand (the running torch, or the one KEVIN_CUDA_TORCH_PYTHON names: docs/BUILD_NOTES.md) with nvcc
and CUTLASS's headers: each program's device part through nvcc, its host part (the host function
that packs rows, transposes a convolution's output and calls the kernel) through g++ against the
precompiled header, one link, and no `kevin_` symbol left undefined. On a machine without a GPU this
is what checks the host code before a GPU runs it."""

from __future__ import annotations

import concurrent.futures
import os
import subprocess
from pathlib import Path

import pytest

from direct_conv_tasks import DIRECT_TASKS
from test_fast_build_styles import _cuda_toolchain
from test_gemm_plan import task

F16, BF16 = "dtype=torch.float16", "dtype=torch.bfloat16"

# (task, the GPU the plan is for, the compute capability built for)
PROGRAMS = {
    # the sm80 kernel: rows of odd length packed first, the output stored one element at a time
    "packed-odd-k-bias-tanh-bf16": (task("torch.tanh(v[0] @ v[1].t() + v[2])",
                                         f"torch.randn(100, 513, {BF16}), torch.randn(4097, 513, {BF16}), torch.randn(4097, {BF16})"),
                                    "sm80", "8.0"),
    # a visitor tree on the sm80 kernel, and a batch of K x N matrices
    "sm80-tree-bf16": (task("F.relu(v[0] @ v[1].t() + v[2]) * v[3] + v[4]",
                            f"torch.randn(64, 128, {BF16}), torch.randn(96, 128, {BF16}), torch.randn(96, {BF16}), "
                            f"torch.randn(64, 96, {BF16}), torch.randn(64, 1, {BF16})"), "sm80", "8.0"),
    "sm80-bmm-f16": (task("torch.relu(torch.bmm(v[0], v[1]))", f"torch.randn(4, 64, 32, {F16}), torch.randn(4, 32, 48, {F16})"),
                     "sm80", "8.0"),
    # convolutions: a plain input (packed, the output transposed back; on Hopper its first tiling is
    # CUTLASS 3.x's convolution, with CUTLASS's utility headers), a channels-last one, a 1-D one
    "conv3x3-bias-relu-f16": (task("F.relu(F.conv2d(v[0], v[1], v[2], padding=1))",
                                   f"torch.randn(2, 6, 10, 12, {F16}), torch.randn(16, 6, 3, 3, {F16}), torch.randn(16, {F16})"),
                              "sm90", "9.0"),
    "conv3x3-channels-last-bf16": (task("F.hardswish(F.conv2d(v[0], v[1], stride=2, padding=1))",
                                        f"torch.randn(2, 16, 9, 7, {BF16}).contiguous(memory_format=torch.channels_last), "
                                        f"torch.randn(32, 16, 3, 3, {BF16})"), "sm80", "8.0"),
    "conv1d-gelu-f32": (task("F.gelu(F.conv1d(v[0], v[1], v[2], padding=1))", "torch.randn(2, 8, 20), torch.randn(12, 8, 3), torch.randn(12)"),
                        "sm80", "8.0"),
    # a 3-D convolution of a channels-last input; a transposed one (the strided gradient kernel)
    "conv3d-channels-last-bf16": (task("torch.relu(F.conv3d(v[0], v[1], v[2], padding=1))",
                                       f"torch.randn(2, 8, 4, 6, 6, {BF16}).contiguous(memory_format=torch.channels_last_3d), "
                                       f"torch.randn(16, 8, 3, 3, 3, {BF16}), torch.randn(16, {BF16})"), "sm80", "8.0"),
    # a tree after a convolution: the input added after SiLU (packed to channels-last by the program)
    "conv-tree-silu-residual-bf16": (task("F.silu(F.conv2d(v[0], v[1], v[2], padding=1)) + v[0]",
                                          f"torch.randn(2, 16, 6, 5, {BF16}), torch.randn(16, 16, 3, 3, {BF16}), torch.randn(16, {BF16})"),
                                     "sm90", "9.0"),
    # a ResNet block's end as a compiled channels-last model hands it on: the filter channels-last (read
    # in place), the batch norm's float32 mean and reciprocal deviation, its bf16 weight and bias, the input added back
    "conv-tree-bn-add-relu-bf16": (task("torch.relu(((F.conv2d(v[0], v[1], padding=1) - v[2]) * v[3] * v[4] + v[5]).to(torch.bfloat16) + v[0])",
                                        f"torch.randn(2, 16, 6, 5, {BF16}).contiguous(memory_format=torch.channels_last), "
                                        f"torch.randn(16, 16, 3, 3, {BF16}).contiguous(memory_format=torch.channels_last), "
                                        f"torch.randn(16, 1, 1), torch.rand(16, 1, 1), torch.randn(16, 1, 1, {BF16}), "
                                        f"torch.randn(16, 1, 1, {BF16})"), "sm90", "9.0"),
    # a backward pass's sum of the product with two gradients of its size: the first the source C,
    # the second loaded beside it
    "sm90-tree-two-outputs-size-bf16": (task("v[3] + (v[0] @ v[1] + v[2]) + v[4]",
                                             f"torch.randn(2, 16, 64, {BF16}), torch.randn(64, 48, {BF16}), "
                                             f"torch.randn(2, 16, 48, {BF16}), torch.randn(48, {BF16}), torch.randn(2, 16, 48, {BF16})"),
                                        "sm90", "9.0"),
    # a compiled GPT-2's MLP up projection in training: one kernel keeping the pre-activation beside its
    # GELU (`KeptEnd`, the first variant: its end staged through shared memory and TMA)
    "sm90-kept-pre-activation-gelu-bf16": (task("(y := F.linear(v[0], v[1], v[2]), F.gelu(y, approximate='tanh'))",
                                                f"torch.randn(64, 32, {BF16}), torch.randn(48, 32, {BF16}), torch.randn(48, {BF16})"),
                                           "sm90", "9.0"),
    # Llama's gate projection in training: kept beside its SiLU times the up projection's output (an
    # operand of the second function, loaded beside)
    "sm90-kept-gate-silu-up-bf16": (task("(g := v[0] @ v[1], F.silu(g.view(2, 8, 64).float()).to(torch.bfloat16) * v[2])",
                                         f"torch.randn(16, 32, {BF16}), torch.randn(32, 64, {BF16}), torch.randn(2, 8, 64, {BF16})"),
                                    "sm90", "9.0"),
    "conv-transpose2d-f32": (task("torch.sigmoid(F.conv_transpose2d(v[0], v[1], v[2], stride=2, padding=1))",
                                  "torch.randn(2, 16, 5, 6), torch.randn(16, 8, 4, 4), torch.randn(8)"), "sm80", "8.0"),
    # the direct convolutions of few input channels with their whole epilogues (`direct_conv.py`)
    **{f"direct-{name}": (source, "sm90", "9.0") for name, source in DIRECT_TASKS.items()},
}


@pytest.mark.slow
def test_the_gemm_writers_programs_compile_and_link_through_the_fast_build(tmp_path: Path) -> None:
    from kevin_backend.generate.builtin.gemm_plan import KeptEnd, plan_gemm, plan_tilings, write_gemm_program
    from kevin_backend.generate.builtin.plan import Declined
    from kevin_backend.toolchain.candidate import Candidate
    from kevin_backend.toolchain.cutlass_headers import find_cutlass
    from kevin_backend.toolchain.fast_build import build_fast, ensure_pch, fast_sources

    toolchain = _cuda_toolchain()
    headers = find_cutlass()
    if toolchain is None or headers is None:
        pytest.skip("needs nvcc, a CUDA build of torch (running, or KEVIN_CUDA_TORCH_PYTHON) and CUTLASS's headers")
    pch = ensure_pch(tmp_path / "cache", toolchain)
    jobs = []
    for name, (source, arch, capability) in PROGRAMS.items():
        plan = plan_gemm(source, arch=arch)
        assert not isinstance(plan, Declined), (name, plan)
        tilings = plan_tilings(plan)  # (a kept end's program: its one-kernel variant, `KeptEnd`)
        tiling = next(t for t in tilings if isinstance(t, KeptEnd)) if "-kept-" in name else tilings[0]
        (ext,) = Candidate.parse(write_gemm_program(plan, tiling, task_source=source)).extensions
        join = (lambda s: s if isinstance(s, str) else "\n".join(s))
        sources = fast_sources(join(ext.cpp_sources), join(ext.cuda_sources), ext.functions, "0123456789abcdef")
        assert not isinstance(sources, str), (name, sources)
        jobs.append((name, sources, ext, capability))

    def build(job):  # type: ignore[no-untyped-def]
        name, sources, ext, capability = job
        work = tmp_path / name
        join = (lambda s: s if isinstance(s, str) else "\n".join(s))
        outcome = build_fast(sources, work, work / "ext.so", capability, pch, ext.extra_cflags, ext.extra_cuda_cflags,
                             join(ext.cuda_sources), 900, toolchain, tuple(str(d) for d in headers.includes))
        if not outcome.ok:
            return name, f"{outcome.fallback}\n{outcome.log[-3000:]}"
        undefined = subprocess.run(["nm", "-C", "--undefined-only", str(work / "ext.so")], capture_output=True, text=True).stdout
        missing = [line.strip() for line in undefined.splitlines() if "kevin_" in line]
        return name, "undefined: " + ", ".join(missing) if missing else ""

    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, (os.cpu_count() or 2) // 2)) as pool:
        failed = [(name, log) for name, log in pool.map(build, jobs) if log]
    assert not failed, failed
