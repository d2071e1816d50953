"""Abs through a typed host function template: `template <typename scalar_t> void abs_launcher(...)`
launches abs_kernel<scalar_t> and is called as abs_launcher<scalar_t>(...) under AT_DISPATCH_FLOATING_TYPES."""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

abs_source = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>

template <typename scalar_t>
__global__ void abs_kernel(const scalar_t* __restrict__ in, scalar_t* __restrict__ out, int64_t n) {
    const int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i < n) out[i] = in[i] < scalar_t(0) ? -in[i] : in[i];
}

template <typename scalar_t>
void abs_launcher(const torch::Tensor& in, torch::Tensor& out) {
    const int64_t n = in.numel();
    const int threads = 512;
    abs_kernel<scalar_t><<<(n + threads - 1) / threads, threads, 0, at::cuda::getCurrentCUDAStream()>>>(
        in.data_ptr<scalar_t>(), out.data_ptr<scalar_t>(), n);
}

torch::Tensor abs_forward(torch::Tensor x) {
    auto in = x.contiguous();
    auto out = torch::empty_like(in);
    AT_DISPATCH_FLOATING_TYPES(in.scalar_type(), "abs_forward", [&] { abs_launcher<scalar_t>(in, out); });
    return out;
}
"""

abs_ext = load_inline(name="abs_typed_launcher", cpp_sources="torch::Tensor abs_forward(torch::Tensor x);",
                      cuda_sources=abs_source, functions=["abs_forward"], verbose=False)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return abs_ext.abs_forward(x)
