"""A hand-written CUDA kernel in the KernelBench candidate format, standing in for a generated one.

It computes `sigmoid(x) * y + 1` for contiguous float32 tensors: the partition the GPU tests and
the overhead benchmark build around. The CUDA part includes no torch headers (it builds in well
under a second); the host wrapper takes torch's current stream, so it runs inside CUDA graphs and
on user streams.
"""

GATED_KERNEL = r'''
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = """
#include <cstdint>
#include <cuda_runtime.h>

__global__ void gated_kernel(const float* __restrict__ x, const float* __restrict__ y,
                             float* __restrict__ out, int64_t n) {
    int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    int64_t step = (int64_t)gridDim.x * blockDim.x;
    for (; i < n; i += step) {
        float s = 1.0f / (1.0f + expf(-x[i]));
        out[i] = s * y[i] + 1.0f;
    }
}

void launch_gated(const float* x, const float* y, float* out, int64_t n, cudaStream_t stream) {
    int threads = 256;
    int64_t blocks = (n + threads - 1) / threads;
    if (blocks > 65535) blocks = 65535;
    gated_kernel<<<(unsigned)blocks, threads, 0, stream>>>(x, y, out, n);
}
"""

cpp_source = """
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>

void launch_gated(const float* x, const float* y, float* out, int64_t n, cudaStream_t stream);

torch::Tensor gated(torch::Tensor x, torch::Tensor y) {
    TORCH_CHECK(x.is_cuda() && y.is_cuda(), "gated: CUDA tensors expected");
    TORCH_CHECK(x.is_contiguous() && y.is_contiguous(), "gated: contiguous tensors expected");
    TORCH_CHECK(x.scalar_type() == at::kFloat && y.scalar_type() == at::kFloat, "gated: float32 expected");
    auto out = torch::empty_like(x);
    launch_gated(x.data_ptr<float>(), y.data_ptr<float>(), out.data_ptr<float>(), x.numel(),
                 at::cuda::getCurrentCUDAStream());
    return out;
}
"""

gated_ext = load_inline(
    name="kevin_test_gated",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["gated"],
    extra_cuda_cflags=["-O3"],
)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x, y):
        return gated_ext.gated(x, y)
'''


def gated_model():
    """The model the kernel is for: a pointwise partition, then an op no writer declares."""
    import torch

    class Gated(torch.nn.Module):
        def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            h = torch.sigmoid(x) * y + 1.0
            return torch.cumsum(h, dim=-1)

    return Gated()


GATED_OPS = ("aten.sigmoid.default", "aten.mul.Tensor", "aten.add.Tensor")


def compile_with_gated_kernel(kevin_dir, x, y, **options):  # type: ignore[no-untyped-def]
    """The gated model compiled with GATED_KERNEL for its partition: a first compile records the
    partition as pending, the kernel enters the cache for that key, and a second compile (Dynamo
    reset) hits it. Returns (model, compiled model, the kernel's digest); the compiled model has
    not been called yet."""
    import torch

    from kevin_backend.runtime.counters import counters
    from kevin_backend.cache.format import CacheEntry, EntryKind, Timings
    from kevin_backend.cache.store import KernelCache

    model = gated_model()
    options = {"cache_dir": str(kevin_dir), **options}
    torch.compile(model, backend="kevin", options=options)(x, y)
    cache = KernelCache(kevin_dir, None)
    (pending,) = [p for p in cache.pending() if p.task.ops == GATED_OPS]
    cache.put(CacheEntry(key=pending.key, kind=EntryKind.KERNEL, task=pending.task, kernel_source=GATED_KERNEL,
                         timings=Timings(eager_ms=None, inductor_ms=None, kernel_ms=None), policy="hand-written (test)"))
    torch._dynamo.reset()
    counters.reset()
    return model, torch.compile(model, backend="kevin", options=options), pending.key.digest
