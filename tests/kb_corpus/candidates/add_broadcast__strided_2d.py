"""relu(x + y) with both operands read through their strides (y is a stride-0 broadcast row).

Expect: ACCEPTED

A 2D grid (blockIdx.y is the row, blockIdx.x strides over columns) and a kernel that addresses
every operand as base + r * stride0 + c * stride1, with the strides passed from the host
(x.stride(0), x.stride(1), y.stride(0), y.stride(1)). For the broadcast y the row stride is 0,
so every row reads the same 16384 floats: no copy, no out-of-bounds reads. The output is a fresh
contiguous tensor. `template <int BLOCK_SIZE>` kernel on the current stream.
"""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>

template <int BLOCK_SIZE>
__global__ void add_relu_strided_kernel(const float* __restrict__ x, const float* __restrict__ y,
                                        float* __restrict__ out, int64_t cols,
                                        int64_t xs0, int64_t xs1, int64_t ys0, int64_t ys1) {
    const int64_t r = blockIdx.y;
    for (int64_t c = (int64_t)blockIdx.x * BLOCK_SIZE + threadIdx.x; c < cols; c += (int64_t)gridDim.x * BLOCK_SIZE) {
        const float v = x[r * xs0 + c * xs1] + y[r * ys0 + c * ys1];
        out[r * cols + c] = v > 0.0f ? v : 0.0f;
    }
}

torch::Tensor add_relu(torch::Tensor x, torch::Tensor y) {
    TORCH_CHECK(x.is_cuda() && y.is_cuda(), "inputs must be CUDA tensors");
    TORCH_CHECK(x.dim() == 2 && y.dim() == 2, "inputs must be 2D");
    TORCH_CHECK(x.sizes() == y.sizes(), "x and y must have the same shape");
    TORCH_CHECK(x.size(0) <= 65535, "too many rows for gridDim.y");
    const int64_t rows = x.size(0);
    const int64_t cols = x.size(1);
    auto out = torch::empty({rows, cols}, x.options());
    constexpr int BLOCK = 256;
    int64_t col_blocks = (cols + BLOCK - 1) / BLOCK;
    if (col_blocks > 64) col_blocks = 64;
    dim3 grid((unsigned int)col_blocks, (unsigned int)rows);
    add_relu_strided_kernel<BLOCK><<<grid, BLOCK, 0, at::cuda::getCurrentCUDAStream()>>>(
        x.data_ptr<float>(), y.data_ptr<float>(), out.data_ptr<float>(), cols,
        x.stride(0), x.stride(1), y.stride(0), y.stride(1));
    return out;
}
"""

cpp_source = "torch::Tensor add_relu(torch::Tensor x, torch::Tensor y);"

add_relu_ext = load_inline(
    name="kb_add_broadcast_strided",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["add_relu"],
    extra_cuda_cflags=["-O3"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self):
        super(ModelNew, self).__init__()

    def forward(self, x, y):
        return add_relu_ext.add_relu(x, y)
