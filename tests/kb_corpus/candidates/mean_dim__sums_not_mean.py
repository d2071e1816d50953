"""Reduction over the requested dimension that returns the sum and forgets to divide by its length.

Expect: MISMATCH

Coalesced one-thread-per-output kernel, right dimension, right shape, but the final `/ reduce`
is missing (the writer adapted a sum-reduction kernel from an earlier problem). Every output is
2048 times too large. It must be rejected as a mismatch.
"""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <vector>

__global__ void reduce_dim_kernel(const float* __restrict__ input, float* __restrict__ output,
                                  int64_t outer, int64_t reduce, int64_t inner) {
    const int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx < outer * inner) {
        const int64_t o = idx / inner;
        const int64_t i = idx - o * inner;
        float acc = 0.0f;
        for (int64_t r = 0; r < reduce; ++r) {
            acc += input[(o * reduce + r) * inner + i];
        }
        output[idx] = acc;
    }
}

torch::Tensor reduce_dim(torch::Tensor x, int64_t dim) {
    TORCH_CHECK(x.is_cuda(), "x must be a CUDA tensor");
    auto xc = x.contiguous();
    if (dim < 0) dim += xc.dim();
    int64_t outer = 1, inner = 1;
    for (int64_t d = 0; d < dim; ++d) outer *= xc.size(d);
    for (int64_t d = dim + 1; d < xc.dim(); ++d) inner *= xc.size(d);
    std::vector<int64_t> sizes;
    for (int64_t d = 0; d < xc.dim(); ++d)
        if (d != dim) sizes.push_back(xc.size(d));
    auto out = torch::empty(sizes, xc.options());
    const int threads = 256;
    const int64_t total = outer * inner;
    reduce_dim_kernel<<<(unsigned int)((total + threads - 1) / threads), threads, 0, at::cuda::getCurrentCUDAStream()>>>(
        xc.data_ptr<float>(), out.data_ptr<float>(), outer, xc.size(dim), inner);
    return out;
}
"""

cpp_source = "torch::Tensor reduce_dim(torch::Tensor x, int64_t dim);"

reduce_ext = load_inline(
    name="kb_mean_dim_sums",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["reduce_dim"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim

    def forward(self, x):
        return reduce_ext.reduce_dim(x, self.dim)
