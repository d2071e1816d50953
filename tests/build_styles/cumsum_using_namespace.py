"""Row cumulative sum (Hillis-Steele scan in shared memory for rows up to 1024, a sequential carry
across chunks) with kernels in `namespace scan_ops` brought in by `using namespace scan_ops;`."""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

scan_source = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>

namespace scan_ops {

constexpr int CHUNK = 1024;

__global__ void row_scan_kernel(const float* __restrict__ x, float* __restrict__ y, int cols) {
    __shared__ float buf[CHUNK];
    __shared__ float carry;
    const float* xr = x + (size_t)blockIdx.x * cols;
    float* yr = y + (size_t)blockIdx.x * cols;
    if (threadIdx.x == 0) carry = 0.f;
    __syncthreads();
    for (int start = 0; start < cols; start += CHUNK) {
        const int i = start + threadIdx.x;
        buf[threadIdx.x] = i < cols ? xr[i] : 0.f;
        __syncthreads();
        for (int off = 1; off < CHUNK; off <<= 1) {
            float add = threadIdx.x >= off ? buf[threadIdx.x - off] : 0.f;
            __syncthreads();
            buf[threadIdx.x] += add;
            __syncthreads();
        }
        if (i < cols) yr[i] = buf[threadIdx.x] + carry;
        __syncthreads();
        if (threadIdx.x == CHUNK - 1) carry += buf[CHUNK - 1];
        __syncthreads();
    }
}

}  // namespace scan_ops

using namespace scan_ops;

torch::Tensor cumsum_rows(torch::Tensor x) {
    auto xc = x.contiguous();
    auto y = torch::empty_like(xc);
    const int cols = xc.size(-1);
    const int rows = xc.numel() / cols;
    row_scan_kernel<<<rows, CHUNK, 0, at::cuda::getCurrentCUDAStream()>>>(xc.data_ptr<float>(), y.data_ptr<float>(), cols);
    return y;
}
"""

scan_ext = load_inline(name="cumsum_ns", cpp_sources="torch::Tensor cumsum_rows(torch::Tensor x);", cuda_sources=scan_source,
                       functions=["cumsum_rows"], verbose=False)


class ModelNew(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.dim = dim

    def forward(self, x):
        return scan_ext.cumsum_rows(x)
