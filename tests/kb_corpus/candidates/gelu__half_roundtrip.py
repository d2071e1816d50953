"""Exact GELU on a float32 problem, with the input and the result passed through __half.

Expect: MISMATCH

The writer "halves the register and bandwidth cost" by converting each element to __half, doing
the math on the rounded value and rounding the result to __half before widening it back to float.
Half precision keeps 11 significant bits: inputs and outputs are off by up to 2^-11 relative
(about 5e-4), far outside what float32 rounding explains, on every random input. It must be
rejected as a mismatch.
"""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

source = r"""
#include <torch/extension.h>
#include <cuda_fp16.h>
#include <ATen/cuda/CUDAContext.h>

__global__ void gelu_half_kernel(const float* __restrict__ x, float* __restrict__ y, int64_t n) {
    int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx < n) {
        __half hx = __float2half(x[idx]);          // compact intermediate
        float v = __half2float(hx);
        float g = 0.5f * v * (1.0f + erff(v * 0.7071067811865475f));
        __half hg = __float2half(g);
        y[idx] = __half2float(hg);
    }
}

torch::Tensor gelu_half(torch::Tensor x) {
    TORCH_CHECK(x.is_cuda(), "x must be a CUDA tensor");
    auto xc = x.contiguous();
    auto y = torch::empty_like(xc);
    int64_t n = xc.numel();
    int threads = 512;
    int64_t blocks = (n + threads - 1) / threads;
    gelu_half_kernel<<<(unsigned int)blocks, threads, 0, at::cuda::getCurrentCUDAStream()>>>(
        xc.data_ptr<float>(), y.data_ptr<float>(), n);
    return y;
}
"""

cpp_decl = "torch::Tensor gelu_half(torch::Tensor x);"

ext = load_inline(
    name="kb_gelu_half_roundtrip",
    cpp_sources=cpp_decl,
    cuda_sources=source,
    functions=["gelu_half"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return ext.gelu_half(x)
