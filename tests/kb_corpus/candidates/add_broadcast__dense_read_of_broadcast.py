"""relu(x + y) that reads the stride-0 broadcast y as a dense batch x dim array.

Expect: MISMATCH|NAN_INF|ILLEGAL_ADDRESS

The flat kernel takes y.data_ptr() and reads y[i] for every i < batch * dim, as if y were laid
out like x. But y is one row of 16384 floats seen through a stride of 0: its memory ends after
the first row, and everything past it belongs to other allocations or to nothing. Depending on
what lies there the result is garbage (MISMATCH), NaN from the judge's poisoned memory (NAN_INF),
or a fault (ILLEGAL_ADDRESS). Only a judge that keeps the input's real layout catches it; a
judge that hands the kernel a dense copy of y would wrongly accept it.
"""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>

__global__ void add_relu_kernel(const float* __restrict__ x, const float* __restrict__ y, float* __restrict__ out, int64_t n) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        out[i] = fmaxf(x[i] + y[i], 0.0f);
    }
}

torch::Tensor add_relu(torch::Tensor x, torch::Tensor y) {
    TORCH_CHECK(x.is_cuda() && y.is_cuda(), "inputs must be CUDA tensors");
    TORCH_CHECK(x.numel() == y.numel(), "x and y must have the same number of elements");
    auto out = torch::empty_like(x);
    const int64_t n = x.numel();
    const int threads = 256;
    add_relu_kernel<<<(unsigned int)((n + threads - 1) / threads), threads, 0, at::cuda::getCurrentCUDAStream()>>>(
        x.data_ptr<float>(), y.data_ptr<float>(), out.data_ptr<float>(), n);
    return out;
}
"""

cpp_source = "torch::Tensor add_relu(torch::Tensor x, torch::Tensor y);"

add_ext = load_inline(
    name="kb_add_broadcast_dense_read",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["add_relu"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x, y):
        return add_ext.add_relu(x, y)
