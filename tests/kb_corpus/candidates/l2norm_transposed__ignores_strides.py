"""Row L2 normalization that indexes the transposed input as if it were row-major.

Expect: MISMATCH

The kernel computes row r from x.data_ptr() + r * cols, i.e. it assumes strides (cols, 1), and
forward passes the input as it comes. The problem's input is a transposed view with strides
(1, batch): "row r" of memory is a mix of 16384 different rows' elements, so each output row is
some other vector normalized. On contiguous copies the kernel is right (the judge's layout
diagnosis shows exactly that); on the problem's layout it must be rejected as a mismatch.
"""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

source = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>

__global__ void l2norm_kernel(const float* __restrict__ x, float* __restrict__ y, int cols) {
    __shared__ float buf[256];
    const float* xr = x + (size_t)blockIdx.x * cols;
    float* yr = y + (size_t)blockIdx.x * cols;
    float s = 0.0f;
    for (int i = threadIdx.x; i < cols; i += blockDim.x) s += xr[i] * xr[i];
    buf[threadIdx.x] = s;
    __syncthreads();
    for (int k = blockDim.x / 2; k > 0; k >>= 1) {
        if (threadIdx.x < k) buf[threadIdx.x] += buf[threadIdx.x + k];
        __syncthreads();
    }
    const float norm = sqrtf(buf[0]);
    for (int i = threadIdx.x; i < cols; i += blockDim.x) yr[i] = xr[i] / norm;
}

torch::Tensor l2norm(torch::Tensor x) {
    TORCH_CHECK(x.is_cuda(), "x must be a CUDA tensor");
    const int rows = x.size(0);
    const int cols = x.size(1);
    auto y = torch::empty({rows, cols}, x.options());
    l2norm_kernel<<<rows, 256, 0, at::cuda::getCurrentCUDAStream()>>>(x.data_ptr<float>(), y.data_ptr<float>(), cols);
    return y;
}
"""

cpp_src = "torch::Tensor l2norm(torch::Tensor x);"

l2_ext = load_inline(
    name="kb_l2norm_ignores_strides",
    cpp_sources=cpp_src,
    cuda_sources=source,
    functions=["l2norm"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return l2_ext.l2norm(x)
