"""The judge's worker pool on a GPU: a candidate with an illegal address, an out-of-bounds write,
or a search for the reference the worker keeps (to write into it) does its damage in its own
process only: the worker stays (no candidate's verdict retires it), the references it keeps are
intact, and the next candidate's verdict is unaffected. Runs go straight to the pool (the static
rules, which would refuse the `gc` lookup below, are not what is tested here); the extension is
built first, as the judge builds it (a candidate's process cannot start a compiler)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from kevin_backend.judge.pool import WorkerPool
from kevin_backend.judge.sandbox import RunConfig

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

TASK = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(4096))

    def forward(self, x, w):
        return x * self.scale + w


def get_inputs():
    return [torch.randn(4096, 4096), torch.randn(4096, 4096)]


def get_init_inputs():
    return []
'''

_CUDA = r'''
#include <torch/extension.h>

__global__ void fma_rows(const float* x, const float* s, const float* w, float* out, long n, long cols) {
    long i = blockIdx.x * (long)blockDim.x + threadIdx.x;
    if (i < n) out[i] = x[i] * s[i % cols] + w[i];
}

__global__ void fill(float* p, long n, float value) {
    long i = blockIdx.x * (long)blockDim.x + threadIdx.x;
    if (i < n) p[i] = value;
}

torch::Tensor scaled_add(torch::Tensor x, torch::Tensor s, torch::Tensor w) {
    auto out = torch::empty_like(x);
    long n = x.numel();
    fma_rows<<<(n + 255) / 256, 256>>>(x.data_ptr<float>(), s.data_ptr<float>(), w.data_ptr<float>(),
                                      out.data_ptr<float>(), n, x.size(-1));
    return out;
}

// writes `count` floats starting `offset` floats past the start of `t` (out of its bounds when
// offset + count > t.numel(), or at an unmapped address when `wild`)
void poke(torch::Tensor t, long offset, long count, bool wild) {
    float* p = wild ? reinterpret_cast<float*>(0x10) : t.data_ptr<float>() + offset;
    fill<<<(count + 255) / 256, 256>>>(p, count, 7.0f);
}
'''


def _candidate(forward: str) -> str:
    return (
        "import gc\nimport torch\nimport torch.nn as nn\nfrom torch.utils.cpp_extension import load_inline\n\n"
        f"cuda_source = r'''{_CUDA}'''\n"
        "cpp_source = 'torch::Tensor scaled_add(torch::Tensor x, torch::Tensor s, torch::Tensor w);\\n"
        "void poke(torch::Tensor t, long offset, long count, bool wild);'\n"
        "ext = load_inline(name='pool_probe_ext', cpp_sources=cpp_source, cuda_sources=cuda_source, "
        "functions=['scaled_add', 'poke'])\n\n\n"
        "class ModelNew(nn.Module):\n"
        "    def __init__(self):\n        super().__init__()\n        self.scale = nn.Parameter(torch.ones(4096))\n\n"
        "    def forward(self, x, w):\n"
        f"{forward}"
    )


HONEST = _candidate("        return ext.scaled_add(x, self.scale, w)\n")
ILLEGAL = _candidate("        ext.poke(x, 0, 1 << 20, True)\n        return ext.scaled_add(x, self.scale, w)\n")
# 64 MiB of 7.0 written past the end of its own output, into whatever the allocator put there
OUT_OF_BOUNDS = _candidate("        out = ext.scaled_add(x, self.scale, w)\n"
                           "        ext.poke(out, out.numel(), 16 << 20, False)\n        return out\n")
# the write lands in the reference the worker keeps for the task's next candidates
INTO_REFERENCE = _candidate(
    "        out = ext.scaled_add(x, self.scale, w)\n"
    "        for m in gc.get_objects():\n"
    "            if type(m).__name__ == 'Model' and getattr(m, 'scale', None) is not None:\n"
    "                if m.scale.dtype == torch.float32:  # the reference, not its float64 copy\n"
    "                    ext.poke(m.scale, 0, m.scale.numel(), False)\n"
    "        return out\n"
)


@pytest.fixture(scope="module")
def config(tmp_path_factory: pytest.TempPathFactory) -> RunConfig:
    from kevin_backend.toolchain.build import Builder, BuildSpec
    from kevin_backend.toolchain.candidate import Candidate

    major, minor = torch.cuda.get_device_capability()
    arch = f"{major}.{minor}"
    builder = Builder(Path(tmp_path_factory.mktemp("builds")))
    for result in builder.build_many([BuildSpec.of(ext, arch) for ext in Candidate.parse(HONEST).extensions]):
        assert result.ok, result.error
    return RunConfig(seeds=(11, 12, 13), trials=10, warmup=2, timeout=240, inductor=False, build_root=str(builder.root),
                     arch=arch)


@pytest.mark.parametrize("bad", ["ILLEGAL", "OUT_OF_BOUNDS", "INTO_REFERENCE"])
def test_a_corrupting_candidate_leaves_the_worker_and_the_next_verdict_stands(config: RunConfig, bad: str) -> None:
    source = {"ILLEGAL": ILLEGAL, "OUT_OF_BOUNDS": OUT_OF_BOUNDS, "INTO_REFERENCE": INTO_REFERENCE}[bad]
    with WorkerPool(size=1) as pool:
        first = pool.run(TASK, HONEST, config)
        assert first.reason == "ACCEPTED", first.feedback
        out = pool.run(TASK, source, config)
        print(bad, out.reason, out.feedback[:200], pool.retired)
        if bad == "ILLEGAL":
            assert out.reason == "ILLEGAL_ADDRESS", out.feedback
        if bad == "OUT_OF_BOUNDS":  # (on an H200 the write landed in the judge's copy of the inputs: INPUT_MUTATED)
            assert out.reason != "ACCEPTED", "a kernel writing 64 MiB past its output was accepted"
        if bad == "INTO_REFERENCE":  # its process holds no reference: there is nothing to write into
            assert out.reason == "ACCEPTED", out.feedback
        again = pool.run(TASK, HONEST, config)
        assert again.reason == "ACCEPTED", again.feedback
        assert pool.started == 1 and pool.retired == [], (pool.started, pool.retired)


def test_one_worker_serves_many_candidates_and_keeps_its_references(config: RunConfig) -> None:
    with WorkerPool(size=1) as pool:
        reasons = [pool.run(TASK, HONEST, config).reason for _ in range(4)]
    assert reasons == ["ACCEPTED"] * 4 and pool.started == 1 and pool.retired == []
