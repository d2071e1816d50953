"""Half-precision row sum: one block per row, __half2 loads, float accumulation, shuffle reduction.

Expect: ACCEPTED

Each thread converts __half2 pairs with __half22float2 and accumulates in float (a scalar tail
covers an odd row length); warps reduce with __shfl_down_sync, warp leaders meet in shared memory,
and thread 0 rounds the total once with __float2half_rn, as PyTorch does (it also sums fp16 in
float). Pointers come from data_ptr<at::Half>() reinterpreted as __half. The reduced dimension
must be the last one, which is what the model asks for (dim=1 of a 2D input).
"""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>
#include <cuda_fp16.h>
#include <ATen/cuda/CUDAContext.h>
#include <vector>

#define THREADS 256

__global__ void row_sum_half2_kernel(const __half* __restrict__ x, __half* __restrict__ out, int cols) {
    __shared__ float warp_sums[THREADS / 32];
    const __half* xr = x + (size_t)blockIdx.x * cols;
    const int tid = threadIdx.x;

    float acc = 0.0f;
    const int n2 = (cols % 2 == 0) ? cols / 2 : 0;   // pairs only when every row start is 4-byte aligned
    const __half2* x2 = reinterpret_cast<const __half2*>(xr);
    for (int i = tid; i < n2; i += THREADS) {
        const float2 f = __half22float2(x2[i]);
        acc += f.x + f.y;
    }
    for (int i = n2 * 2 + tid; i < cols; i += THREADS) {
        acc += __half2float(xr[i]);
    }

    for (int offset = 16; offset > 0; offset >>= 1) {
        acc += __shfl_down_sync(0xffffffff, acc, offset);
    }
    if ((tid & 31) == 0) warp_sums[tid >> 5] = acc;
    __syncthreads();
    if (tid < 32) {
        float v = tid < THREADS / 32 ? warp_sums[tid] : 0.0f;
        for (int offset = 16; offset > 0; offset >>= 1) {
            v += __shfl_down_sync(0xffffffff, v, offset);
        }
        if (tid == 0) out[blockIdx.x] = __float2half_rn(v);
    }
}

torch::Tensor row_sum_half(torch::Tensor x, int64_t dim) {
    TORCH_CHECK(x.is_cuda(), "x must be a CUDA tensor");
    TORCH_CHECK(x.scalar_type() == torch::kHalf, "x must be float16");
    if (dim < 0) dim += x.dim();
    TORCH_CHECK(dim == x.dim() - 1, "this kernel reduces the last dimension");
    auto xc = x.contiguous();
    const int cols = xc.size(-1);
    const int64_t rows = xc.numel() / cols;
    std::vector<int64_t> sizes(xc.sizes().begin(), xc.sizes().end() - 1);
    auto out = torch::empty(sizes, xc.options());
    row_sum_half2_kernel<<<(unsigned int)rows, THREADS, 0, at::cuda::getCurrentCUDAStream()>>>(
        reinterpret_cast<const __half*>(xc.data_ptr<at::Half>()),
        reinterpret_cast<__half*>(out.data_ptr<at::Half>()),
        cols);
    return out;
}
"""

cpp_source = "torch::Tensor row_sum_half(torch::Tensor x, int64_t dim);"

sum_ext = load_inline(
    name="kb_sum_rows_half2_block",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["row_sum_half"],
    extra_cuda_cflags=["-O3"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self, dim: int):
        super(ModelNew, self).__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return sum_ext.row_sum_half(x, self.dim)
