"""Row L2 normalization that calls .contiguous() in forward, then runs a block-per-row kernel.

Expect: ACCEPTED

The simple, safe way with a non-contiguous input: forward makes a row-major copy (a layout
change, which the judge allows) and the kernel assumes row-major rows: a block of 256 threads per
row, a warp-shuffle plus shared-memory sum of squares, then every element divided by the norm,
as the model divides. The host function also checks contiguity, so the copy cannot be forgotten
silently.
"""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_src = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>

#define CHECK_CUDA(x) TORCH_CHECK(x.device().is_cuda(), #x " must be a CUDA tensor")
#define CHECK_CONTIGUOUS(x) TORCH_CHECK(x.is_contiguous(), #x " must be contiguous")
#define CHECK_INPUT(x) CHECK_CUDA(x); CHECK_CONTIGUOUS(x)

__device__ __forceinline__ float warp_reduce_sum(float v) {
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_down_sync(0xffffffff, v, offset);
    return v;
}

__global__ void l2norm_row_kernel(const float* __restrict__ x, float* __restrict__ y, int cols) {
    __shared__ float warp_sums[32];
    __shared__ float s_norm;
    const float* xr = x + (size_t)blockIdx.x * cols;
    float* yr = y + (size_t)blockIdx.x * cols;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < cols; i += blockDim.x) {
        const float v = xr[i];
        ss += v * v;
    }
    ss = warp_reduce_sum(ss);
    if ((threadIdx.x & 31) == 0) warp_sums[threadIdx.x >> 5] = ss;
    __syncthreads();
    if (threadIdx.x < 32) {
        float t = threadIdx.x < (blockDim.x >> 5) ? warp_sums[threadIdx.x] : 0.0f;
        t = warp_reduce_sum(t);
        if (threadIdx.x == 0) s_norm = sqrtf(t);
    }
    __syncthreads();
    const float norm = s_norm;
    for (int i = threadIdx.x; i < cols; i += blockDim.x) {
        yr[i] = xr[i] / norm;
    }
}

torch::Tensor l2norm(torch::Tensor x) {
    CHECK_INPUT(x);
    const int rows = x.size(0);
    const int cols = x.size(1);
    auto y = torch::empty_like(x);
    l2norm_row_kernel<<<rows, 256, 0, at::cuda::getCurrentCUDAStream()>>>(x.data_ptr<float>(), y.data_ptr<float>(), cols);
    return y;
}
"""

cpp_src = "torch::Tensor l2norm(torch::Tensor x);"


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.ext = load_inline(
            name="kb_l2norm_contiguous_first",
            cpp_sources=cpp_src,
            cuda_sources=cuda_src,
            functions=["l2norm"],
            verbose=False,
        )

    def forward(self, x):
        x = x.contiguous()
        return self.ext.l2norm(x)
