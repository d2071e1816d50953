"""GELU for float, double and half: `template <typename scalar_t, int VEC>` launched as
gelu_kernel<scalar_t, 4> under AT_DISPATCH_FLOATING_TYPES_AND_HALF, math in float."""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

gelu_source = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <cuda_fp16.h>
#include <cmath>

template <typename scalar_t, int VEC>
__global__ void gelu_kernel(const scalar_t* __restrict__ x, scalar_t* __restrict__ y, int64_t n) {
    const int64_t base = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) * VEC;
    #pragma unroll
    for (int v = 0; v < VEC; ++v) {
        const int64_t i = base + v;
        if (i < n) {
            const float xf = static_cast<float>(x[i]);
            const float out = 0.5f * xf * (1.0f + erff(xf * 0.70710678118654752f));
            y[i] = static_cast<scalar_t>(out);
        }
    }
}

torch::Tensor gelu_forward(torch::Tensor x) {
    auto input = x.contiguous();
    auto output = torch::empty_like(input);
    const int64_t n = input.numel();
    const int threads = 256;
    const int64_t blocks = (n + threads * 4 - 1) / (threads * 4);
    AT_DISPATCH_FLOATING_TYPES_AND_HALF(input.scalar_type(), "gelu_forward", [&] {
        gelu_kernel<scalar_t, 4><<<blocks, threads, 0, at::cuda::getCurrentCUDAStream()>>>(
            input.data_ptr<scalar_t>(), output.data_ptr<scalar_t>(), n);
    });
    return output;
}
"""

gelu_cpp = "torch::Tensor gelu_forward(torch::Tensor x);"

gelu_ext = load_inline(name="gelu_vec", cpp_sources=gelu_cpp, cuda_sources=gelu_source, functions=["gelu_forward"],
                       extra_cuda_cflags=["-O3", "--use_fast_math"], verbose=False)


class ModelNew(nn.Module):
    def __init__(self):
        super(ModelNew, self).__init__()

    def forward(self, x):
        return gelu_ext.gelu_forward(x)
