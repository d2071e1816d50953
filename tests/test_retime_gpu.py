"""The re-timing before a KERNEL decision, on a real GPU (`-m gpu`; skipped without one).

Hand-written CUDA kernels, each first judged (static rules, build, correctness: ACCEPTED), then
decided over and over through `decision.decide_entry` with the judge's `SandboxRetimer`:

  * a kernel that beats Inductor: the task's reference breaks its graph between eight
    elementwise steps (`torch._dynamo.graph_break`), so Inductor's code makes eight passes over a
    1 GiB tensor where the kernel makes one: kept, 3 of 3;
  * a kernel about a tenth faster: `x * 2 + 1` and the sum of its first third of rows, which
    Inductor compiles apart (a graph break: 2.33 passes of memory) and the kernel does in one
    (2 passes): kept, 10 of 10;
  * a kernel tied with Inductor: `x * 2 + 1` over a 4 GiB tensor, one pass each with vector loads,
    both bound by memory bandwidth (a scalar-load kernel is not a tie: it ran at 0.69x on an H200);
    the search's record claims it 2x Inductor's speed (a first pass that flattered it), the
    re-timing must find the tie: not kept, 10 of 10.

Every decision must carry the re-timing (at least 5 interleaved rounds of both sides): a decision
made without it fails the test. A decision took about 46 s on an H200 with one re-timing of two
runs, more when it stays open and re-times again (up to three); KEVIN_RETIME_DECISIONS=5 splits a
10-decision test over two device calls of 10 minutes.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

REPEATS = 5
DECISIONS = int(os.environ.get("KEVIN_RETIME_DECISIONS", "10"))  # the goal's count for the tie and the tenth faster
MARGIN = 0.03

SLOWED_TASK = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        # Inductor compiles each step alone (a graph break after each): eight passes over x
        x = x * 1.0001 + 0.0001
        torch._dynamo.graph_break()
        x = x * 1.0001 + 0.0001
        torch._dynamo.graph_break()
        x = x * 1.0001 + 0.0001
        torch._dynamo.graph_break()
        x = x * 1.0001 + 0.0001
        torch._dynamo.graph_break()
        x = x * 1.0001 + 0.0001
        torch._dynamo.graph_break()
        x = x * 1.0001 + 0.0001
        torch._dynamo.graph_break()
        x = x * 1.0001 + 0.0001
        torch._dynamo.graph_break()
        x = x * 1.0001 + 0.0001
        torch._dynamo.graph_break()
        return x


def get_inputs():
    return [torch.randn(16384, 16384, device="cuda")]


def get_init_inputs():
    return []
'''

SLOWED_KERNEL = '''"""Eight multiply-add steps per element in one pass (each step rounded as PyTorch rounds it)."""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>

__global__ void steps_kernel(const float* __restrict__ x, float* __restrict__ out, int64_t n) {
    int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i < n) {
        float v = x[i];
        for (int k = 0; k < 8; ++k) v = __fadd_rn(__fmul_rn(v, 1.0001f), 0.0001f);
        out[i] = v;
    }
}

torch::Tensor steps(torch::Tensor x) {
    auto out = torch::empty_like(x);
    int64_t n = x.numel();
    steps_kernel<<<(n + 255) / 256, 256, 0, at::cuda::getCurrentCUDAStream()>>>(x.data_ptr<float>(), out.data_ptr<float>(), n);
    return out;
}
"""

cpp_source = "torch::Tensor steps(torch::Tensor x);"

ext = load_inline(name="retime_steps_ext", cpp_sources=cpp_source, cuda_sources=cuda_source, functions=["steps"])


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return ext.steps(x.contiguous())
'''

TIED_TASK = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return x * 2.0 + 1.0


def get_inputs():
    # 4 GiB: a call takes about 2 ms, so the tens of microseconds by which calling Inductor's
    # compiled code costs more than calling the kernel are about 1% (at 1 GiB they made it 1.03-1.06x)
    return [torch.randn(32768, 32768, device="cuda")]


def get_init_inputs():
    return []
'''

TIED_KERNEL = '''"""x * 2 + 1 in one pass, four floats per thread (vector loads and stores): what Inductor's fused
elementwise kernel does too, so both run at the GPU's memory bandwidth."""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>

__device__ __forceinline__ float affine1(float v) { return __fadd_rn(__fmul_rn(v, 2.0f), 1.0f); }

__global__ void affine_kernel(const float* __restrict__ x, float* __restrict__ out, int64_t n) {
    int64_t i = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) * 4;
    if (i + 3 < n) {
        float4 v = *reinterpret_cast<const float4*>(x + i);
        v.x = affine1(v.x); v.y = affine1(v.y); v.z = affine1(v.z); v.w = affine1(v.w);
        *reinterpret_cast<float4*>(out + i) = v;
    } else {
        for (; i < n; ++i) out[i] = affine1(x[i]);
    }
}

torch::Tensor affine(torch::Tensor x) {
    auto out = torch::empty_like(x);
    int64_t n = x.numel();
    int64_t threads = (n + 3) / 4;
    affine_kernel<<<(threads + 255) / 256, 256, 0, at::cuda::getCurrentCUDAStream()>>>(x.data_ptr<float>(), out.data_ptr<float>(), n);
    return out;
}
"""

cpp_source = "torch::Tensor affine(torch::Tensor x);"

ext = load_inline(name="retime_affine_ext", cpp_sources=cpp_source, cuda_sources=cuda_source, functions=["affine"])


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return ext.affine(x.contiguous())
'''


FASTER_TASK = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        # Inductor compiles the two steps apart (a graph break): y written, then a third of it
        # read again for the sum; one pass does both, reading a third of a pass less of memory
        y = x * 2.0 + 1.0
        torch._dynamo.graph_break()
        return y, y[: x.shape[0] // 3].sum()


def get_inputs():
    return [torch.randn(16384, 16384, device="cuda")]


def get_init_inputs():
    return []
'''

FASTER_KERNEL = '''"""x * 2 + 1 and the sum of its first third of rows in one pass: vector loads and stores, a
float partial sum per thread, a block reduction and one double-precision atomic per block."""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>

__device__ __forceinline__ float affine1(float v) { return __fadd_rn(__fmul_rn(v, 2.0f), 1.0f); }

__global__ void affine_sum_kernel(const float* __restrict__ x, float* __restrict__ y, double* __restrict__ acc,
                                  int64_t n4, int64_t m4) {
    float part = 0.0f;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n4; i += (int64_t)gridDim.x * blockDim.x) {
        float4 v = reinterpret_cast<const float4*>(x)[i];
        v.x = affine1(v.x); v.y = affine1(v.y); v.z = affine1(v.z); v.w = affine1(v.w);
        reinterpret_cast<float4*>(y)[i] = v;
        if (i < m4) part += (v.x + v.y) + (v.z + v.w);
    }
    for (int o = 16; o > 0; o >>= 1) part += __shfl_down_sync(0xffffffff, part, o);
    __shared__ float warp_sums[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) warp_sums[warp] = part;
    __syncthreads();
    if (warp == 0) {
        float t = lane < (int)(blockDim.x >> 5) ? warp_sums[lane] : 0.0f;
        for (int o = 16; o > 0; o >>= 1) t += __shfl_down_sync(0xffffffff, t, o);
        if (lane == 0) atomicAdd(acc, (double)t);
    }
}

__global__ void to_float_kernel(const double* __restrict__ acc, float* __restrict__ out) { out[0] = (float)acc[0]; }

std::vector<torch::Tensor> affine_sum(torch::Tensor x, int64_t rows) {
    TORCH_CHECK(x.is_cuda() && x.dim() == 2 && x.scalar_type() == torch::kFloat32, "a 2-D float32 CUDA tensor");
    const int64_t n = x.numel(), m = rows * x.size(1);
    TORCH_CHECK(n % 4 == 0 && m % 4 == 0, "whole float4 vectors");
    auto y = torch::empty_like(x);
    auto acc = torch::zeros({1}, x.options().dtype(torch::kFloat64));
    auto s = torch::empty({}, x.options());
    const int blocks = at::cuda::getCurrentDeviceProperties()->multiProcessorCount * 8;
    auto stream = at::cuda::getCurrentCUDAStream();
    affine_sum_kernel<<<blocks, 256, 0, stream>>>(x.data_ptr<float>(), y.data_ptr<float>(), acc.data_ptr<double>(), n / 4, m / 4);
    to_float_kernel<<<1, 1, 0, stream>>>(acc.data_ptr<double>(), s.data_ptr<float>());
    return {y, s};
}
"""

cpp_source = "std::vector<torch::Tensor> affine_sum(torch::Tensor x, int64_t rows);"

ext = load_inline(name="retime_affine_sum_ext", cpp_sources=cpp_source, cuda_sources=cuda_source, functions=["affine_sum"])


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        x = x.contiguous()
        y, s = ext.affine_sum(x, x.shape[0] // 3)
        return y, s
'''


def _decisions(tmp_path: Path, name: str, task_source: str, kernel_source: str, flatter: bool,
               repeats: int = REPEATS) -> list:  # type: ignore[type-arg]
    from kevin_backend.cache.key import make_key
    from kevin_backend.generate.decision import decide_entry
    from kevin_backend.generate.engine import SearchResult, TurnRecord
    from kevin_backend.generate.policy import Reply
    from kevin_backend.generate.prompts import Turn
    from kevin_backend.judge.decide import SandboxRetimer
    from kevin_backend.judge.judge import Judge
    from kevin_backend.judge.result import JudgeTimings, Reason
    from kevin_backend.judge.sandbox import RunConfig
    from kevin_backend.judge.static_judge import judge_static
    from kevin_backend.types import KernelTask

    assert judge_static(kernel_source).reason is Reason.STATIC_OK
    judge = Judge(tmp_path / "builds", RunConfig(trials=30))
    try:
        verdict = judge.judge(task_source, kernel_source)
        assert verdict.reason is Reason.ACCEPTED, verdict.feedback
        print(name, "judged:", verdict.timings)
        if flatter:  # a first pass that made the kernel look twice as fast as Inductor
            t = verdict.timings
            verdict = dataclasses.replace(verdict, timings=JudgeTimings(t.inductor_ms / 2, t.eager_ms, t.inductor_ms, t.trials))
        step = Turn(Reply("scripted"), kernel_source, "", verdict, "")
        result = SearchResult(name, (TurnRecord(0, 0, None, (), step, verdict.score, 0.0, 0.0),), "all turns", 0, 0, 0, "test")
        task = KernelTask.from_program(name, task_source)
        key = make_key(task)
        retimer = SandboxRetimer(judge)
        entries = []
        for repeat in range(repeats):
            entry = decide_entry(result, key, task, MARGIN, retime=retimer)
            r = entry.retiming
            assert r is not None, f"{name}, repeat {repeat}: decided without re-timing ({entry.reason})"
            assert len(r.kernel_ms) >= 5 and len(r.inductor_ms) >= 5 and r.rounds >= 5
            # (a round's calls are as many as the input sets that fit the timing's slot memory: two
            # to four of this task's 1 GiB sets, each call cold on values of its own)
            assert r.device.startswith("cuda") and f"{r.trials} calls back to back" in r.protocol
            assert "the judge's clock" in r.protocol
            print(name, repeat, entry.kind.value, f"ratio {r.ratio:.3f} bound {r.bound:.3f}",
                  [round(v, 4) for v in r.kernel_ms], [round(v, 4) for v in r.inductor_ms])
            entries.append(entry)
        return entries
    finally:
        close = getattr(judge, "close", None)
        if close is not None:
            close()


def test_a_kernel_that_beats_inductor_is_kept_3_of_3(tmp_path: Path) -> None:
    from kevin_backend.cache.format import EntryKind

    entries = _decisions(tmp_path, "slowed", SLOWED_TASK, SLOWED_KERNEL, flatter=False, repeats=3)
    assert [e.kind for e in entries] == [EntryKind.KERNEL] * 3, [e.reason for e in entries]
    for e in entries:
        assert e.retiming.keep and e.retiming.bound > 1 + MARGIN and e.kernel_source == SLOWED_KERNEL
        assert e.retiming.ratio > 2.0  # one pass against eight


def test_a_kernel_about_10_percent_faster_is_kept_10_of_10(tmp_path: Path) -> None:
    from kevin_backend.cache.format import EntryKind

    entries = _decisions(tmp_path, "faster", FASTER_TASK, FASTER_KERNEL, flatter=False, repeats=DECISIONS)
    assert [e.kind for e in entries] == [EntryKind.KERNEL] * DECISIONS, [e.reason for e in entries]
    for e in entries:
        assert e.retiming.keep and e.retiming.bound > 1 + MARGIN and e.kernel_source == FASTER_KERNEL
        # about a tenth faster: 2.33 passes of memory against 2 (a quarter's 2.25 measured 1.02-1.09x on an H200)
        assert 1.04 < e.retiming.ratio < 1.3


def test_a_kernel_tied_with_inductor_is_not_kept_10_of_10(tmp_path: Path) -> None:
    from kevin_backend.cache.format import EntryKind

    entries = _decisions(tmp_path, "tied", TIED_TASK, TIED_KERNEL, flatter=True, repeats=DECISIONS)
    assert [e.kind for e in entries] == [EntryKind.INDUCTOR] * DECISIONS, [e.reason for e in entries]
    for e in entries:
        assert not e.retiming.keep and e.retiming.bound <= 1 + MARGIN and "not kept" in e.reason
        assert 0.7 < e.retiming.ratio < 1.3  # a tie, not a measurement of something else
