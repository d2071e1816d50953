"""Exact GELU with float4 loads that assumes the element count is a multiple of 4 (no tail).

Expect: MISMATCH|NAN_INF

A habit seen in o3 and DeepSeek answers: the kernel walks n / 4 float4 vectors and stops, with a
comment that sizes are "always multiples of 4". This problem has 8191 * 16383 elements, so
n % 4 == 1: the last output element is never written. The judge fills unwritten output memory
with NaN, so the output holds a NaN (NAN_INF) or stale garbage (MISMATCH); it must be rejected.
"""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_src = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>

__device__ __forceinline__ float gelu_f(float x) {
    return 0.5f * x * (1.0f + erff(x * 0.70710678118654752440f));
}

// Vectorized: each thread handles 4 consecutive floats (sizes are always multiples of 4).
__global__ void gelu_float4_kernel(const float4* __restrict__ in, float4* __restrict__ out, int64_t n_vec) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n_vec) {
        float4 v = in[i];
        float4 r;
        r.x = gelu_f(v.x);
        r.y = gelu_f(v.y);
        r.z = gelu_f(v.z);
        r.w = gelu_f(v.w);
        out[i] = r;
    }
}

torch::Tensor gelu_vec(torch::Tensor x) {
    TORCH_CHECK(x.is_cuda(), "x must be CUDA");
    TORCH_CHECK(x.is_contiguous(), "x must be contiguous");
    auto out = torch::empty_like(x);
    int64_t n_vec = x.numel() / 4;
    const int threads = 256;
    const int64_t blocks = (n_vec + threads - 1) / threads;
    gelu_float4_kernel<<<(unsigned int)blocks, threads, 0, at::cuda::getCurrentCUDAStream()>>>(
        reinterpret_cast<const float4*>(x.data_ptr<float>()),
        reinterpret_cast<float4*>(out.data_ptr<float>()),
        n_vec);
    return out;
}
"""

cpp_src = "torch::Tensor gelu_vec(torch::Tensor x);"

gelu_module = load_inline(
    name="kb_gelu_float4_no_tail",
    cpp_sources=cpp_src,
    cuda_sources=cuda_src,
    functions=["gelu_vec"],
    extra_cuda_cflags=["-O3"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self):
        super(ModelNew, self).__init__()
        self.gelu_module = gelu_module

    def forward(self, x):
        return self.gelu_module.gelu_vec(x)
