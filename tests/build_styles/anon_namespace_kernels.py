"""Sigmoid-weighted sum with its kernel, device helpers and constants inside an anonymous
namespace, the host function outside it."""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>

namespace {

constexpr int kThreadsPerBlock = 256;

__device__ __forceinline__ float sigmoidf(float x) {
    return 1.0f / (1.0f + __expf(-x));
}

__global__ void gated_kernel(const float* __restrict__ x, const float* __restrict__ w, float* __restrict__ out, int64_t n) {
    const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i < n) out[i] = sigmoidf(x[i]) * w[i];
}

inline int64_t num_blocks(int64_t n) {
    return (n + kThreadsPerBlock - 1) / kThreadsPerBlock;
}

}  // namespace

torch::Tensor gated(torch::Tensor x, torch::Tensor w) {
    TORCH_CHECK(x.sizes() == w.sizes(), "x and w must match");
    auto xc = x.contiguous();
    auto wc = w.contiguous();
    auto out = torch::empty_like(xc);
    const int64_t n = xc.numel();
    gated_kernel<<<num_blocks(n), kThreadsPerBlock, 0, at::cuda::getCurrentCUDAStream()>>>(
        xc.data_ptr<float>(), wc.data_ptr<float>(), out.data_ptr<float>(), n);
    return out;
}
"""

cpp_source = "torch::Tensor gated(torch::Tensor x, torch::Tensor w);"

gated_ext = load_inline(name="gated_anon_ns", cpp_sources=cpp_source, cuda_sources=cuda_source, functions=["gated"])


class ModelNew(nn.Module):
    def __init__(self, size):
        super().__init__()
        self.w = nn.Parameter(torch.randn(size))

    def forward(self, x):
        return gated_ext.gated(x, self.w.expand_as(x))
