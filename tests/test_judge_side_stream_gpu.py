"""Work on a stream the timer does not watch still counts (GPU). A CUDA candidate that queues its
kernel on a side stream of its own and returns at once: the judge's time must include that work
(the candidate's process synchronises the whole device before it replies), and the outputs the
judge reads must be the finished ones.

The static rules refuse a stream of the program's own (`no-streams-threads`); these candidates are
run without them (`run_in_sandbox`), since this is the second line. A judge that timed only the
current stream measured these at a few microseconds a call.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from judge_cases import GATED_TASK
from kevin_backend.judge.sandbox import RunConfig, run_in_sandbox

pytestmark = pytest.mark.gpu

SPIN_CYCLES = 4_000_000  # 2.0 ms at the H200's top clock (1.98 GHz); at least 1.6 ms on any GPU up to 2.5 GHz

_SIDE_STREAM = r"""
#include <torch/extension.h>

__global__ void spin_kernel(long long cycles) {
    long long start = clock64();
    while (clock64() - start < cycles) { }
}

__global__ void gated_kernel(const float* __restrict__ x, const float* __restrict__ w, float* __restrict__ out, int64_t n) {
    int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i < n) out[i] = 1.0f / (1.0f + expf(-x[i])) * w[i] + 1.0f;
}

static cudaStream_t side() {
    static cudaStream_t stream = nullptr;
    if (stream == nullptr) cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
    return stream;
}

torch::Tensor gated(torch::Tensor x, torch::Tensor w) {
    auto out = torch::empty_like(x);
    int64_t n = x.numel();
    cudaStream_t s = side();
    spin_kernel<<<1, 1, 0, s>>>(SPIN);
    gated_kernel<<<(n + 255) / 256, 256, 0, s>>>(x.data_ptr<float>(), w.data_ptr<float>(), out.data_ptr<float>(), n);
    return out;  // no wait: the work is still queued on the side stream
}
"""


def side_stream_program(spin_cycles: int) -> str:
    cuda = _SIDE_STREAM.replace("SPIN", f"{spin_cycles}LL")
    return (
        '"""Queues its kernel behind a spin on a side stream of its own and returns at once."""\n'
        "import torch\nimport torch.nn as nn\nfrom torch.utils.cpp_extension import load_inline\n\n"
        f"cuda_source = r'''{cuda}'''\n\n"
        "cpp_source = 'torch::Tensor gated(torch::Tensor x, torch::Tensor w);'\n\n"
        "ext = load_inline(name='side_ext', cpp_sources=cpp_source, cuda_sources=cuda_source, functions=['gated'])\n\n\n"
        "class ModelNew(nn.Module):\n"
        "    def forward(self, x, w):\n"
        "        return ext.gated(x.contiguous(), w.contiguous())\n"
    )


def _judged(tmp_path: Path, source: str):
    import torch

    from kevin_backend.toolchain.build import Builder, BuildSpec
    from kevin_backend.toolchain.candidate import Candidate

    major, minor = torch.cuda.get_device_capability()
    arch = f"{major}.{minor}"
    builder = Builder(tmp_path / "builds")
    for result in builder.build_many([BuildSpec.of(ext, arch) for ext in Candidate.parse(source).extensions]):
        assert result.ok, result.error
    config = RunConfig(seeds=(1, 2), trials=32, warmup=1, timeout=300, inductor=False, build_root=str(builder.root),
                       arch=arch, device="cuda:0")
    return run_in_sandbox(GATED_TASK, source, config)


def test_work_left_on_a_side_stream_is_timed_and_its_outputs_are_finished(tmp_path: Path) -> None:
    out = _judged(tmp_path, side_stream_program(SPIN_CYCLES))
    print(out.reason, out.kernel_ms, out.feedback[:300])
    assert out.reason == "ACCEPTED", out.feedback
    # every call's spin is on the one side stream, one after another: each call costs its spin
    assert out.kernel_ms is not None and out.kernel_ms >= 1.6, out.kernel_ms
