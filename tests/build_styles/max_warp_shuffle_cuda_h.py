"""Row max with one warp per row, `__shfl_xor_sync` butterfly, `#include <cuda.h>`, a
`__device__ __forceinline__` helper and the warp size from C10_WARP_SIZE."""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

src = r"""
#include <cuda.h>
#include <cuda_runtime.h>
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <cfloat>

__device__ __forceinline__ float warp_max(float v) {
    #pragma unroll
    for (int mask = C10_WARP_SIZE / 2; mask > 0; mask >>= 1) {
        v = fmaxf(v, __shfl_xor_sync(0xffffffff, v, mask));
    }
    return v;
}

__global__ void row_max_kernel(const float* __restrict__ x, float* __restrict__ out, int rows, int cols) {
    const int warps_per_block = blockDim.x / C10_WARP_SIZE;
    const int row = blockIdx.x * warps_per_block + threadIdx.x / C10_WARP_SIZE;
    const int lane = threadIdx.x % C10_WARP_SIZE;
    if (row >= rows) return;
    float m = -FLT_MAX;
    for (int c = lane; c < cols; c += C10_WARP_SIZE) m = fmaxf(m, x[(size_t)row * cols + c]);
    m = warp_max(m);
    if (lane == 0) out[row] = m;
}

torch::Tensor row_max(torch::Tensor x) {
    auto xc = x.contiguous();
    const int cols = xc.size(-1);
    const int rows = xc.numel() / cols;
    auto out = torch::empty({rows}, xc.options());
    const int threads = 256;
    const int rows_per_block = threads / 32;
    row_max_kernel<<<(rows + rows_per_block - 1) / rows_per_block, threads, 0, at::cuda::getCurrentCUDAStream()>>>(
        xc.data_ptr<float>(), out.data_ptr<float>(), rows, cols);
    auto sizes = xc.sizes().vec();
    sizes.pop_back();
    return out.view(sizes);
}
"""

row_max_ext = load_inline(name="row_max_warp", cpp_sources="torch::Tensor row_max(torch::Tensor x);", cuda_sources=src,
                          functions=["row_max"], verbose=False)


class ModelNew(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim

    def forward(self, x):
        return row_max_ext.row_max(x)
