"""Row softmax as three kernels: row max, row sum of exp, then an elementwise normalize.

Expect: ACCEPTED

How DeepSeek and Kevin-32B often split the work: `row_max_kernel` and `row_sum_kernel` (one block
per row, each reducing with a `__device__` block_reduce helper built on __shfl_down_sync and a
32-slot shared array) write per-row statistics into small scratch tensors from torch::empty, and
`softmax_normalize_kernel` (a 2D grid: blockIdx.y is the row) writes exp(x - max) / sum. All
three go to the current stream, so they run in order.
"""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <cuda_runtime.h>
#include <cmath>

__device__ __forceinline__ float warp_reduce_max(float v) {
    for (int offset = 16; offset > 0; offset >>= 1)
        v = fmaxf(v, __shfl_down_sync(0xffffffff, v, offset));
    return v;
}

__device__ __forceinline__ float warp_reduce_sum(float v) {
    for (int offset = 16; offset > 0; offset >>= 1)
        v += __shfl_down_sync(0xffffffff, v, offset);
    return v;
}

// Block-wide reduction; the result is valid in every thread. blockDim.x must be a multiple of 32.
template <bool IS_MAX>
__device__ float block_reduce(float v) {
    __shared__ float shared[32];
    const int lane = threadIdx.x & 31;
    const int wid = threadIdx.x >> 5;
    v = IS_MAX ? warp_reduce_max(v) : warp_reduce_sum(v);
    if (lane == 0) shared[wid] = v;
    __syncthreads();
    const int num_warps = blockDim.x >> 5;
    const float identity = IS_MAX ? -INFINITY : 0.0f;
    v = (threadIdx.x < num_warps) ? shared[lane] : identity;
    if (wid == 0) v = IS_MAX ? warp_reduce_max(v) : warp_reduce_sum(v);
    if (threadIdx.x == 0) shared[0] = v;
    __syncthreads();
    v = shared[0];
    __syncthreads();
    return v;
}

__global__ void row_max_kernel(const float* __restrict__ x, float* __restrict__ row_max, int cols) {
    const float* xr = x + (size_t)blockIdx.x * cols;
    float m = -INFINITY;
    for (int i = threadIdx.x; i < cols; i += blockDim.x) m = fmaxf(m, xr[i]);
    m = block_reduce<true>(m);
    if (threadIdx.x == 0) row_max[blockIdx.x] = m;
}

__global__ void row_sum_kernel(const float* __restrict__ x, const float* __restrict__ row_max,
                               float* __restrict__ row_sum, int cols) {
    const float* xr = x + (size_t)blockIdx.x * cols;
    const float m = row_max[blockIdx.x];
    float s = 0.0f;
    for (int i = threadIdx.x; i < cols; i += blockDim.x) s += expf(xr[i] - m);
    s = block_reduce<false>(s);
    if (threadIdx.x == 0) row_sum[blockIdx.x] = s;
}

__global__ void softmax_normalize_kernel(const float* __restrict__ x, const float* __restrict__ row_max,
                                         const float* __restrict__ row_sum, float* __restrict__ y, int cols) {
    const int row = blockIdx.y;
    const int col = blockIdx.x * blockDim.x + threadIdx.x;
    if (col < cols) {
        const size_t idx = (size_t)row * cols + col;
        y[idx] = expf(x[idx] - row_max[row]) / row_sum[row];
    }
}

torch::Tensor softmax_3k(torch::Tensor x) {
    TORCH_CHECK(x.is_cuda(), "x must be a CUDA tensor");
    TORCH_CHECK(x.dim() == 2, "x must be 2D");
    TORCH_CHECK(x.size(0) <= 65535, "too many rows for gridDim.y");
    auto xc = x.contiguous();
    const int rows = xc.size(0);
    const int cols = xc.size(1);
    auto row_max = torch::empty({rows}, xc.options());
    auto row_sum = torch::empty({rows}, xc.options());
    auto y = torch::empty_like(xc);
    cudaStream_t stream = at::cuda::getCurrentCUDAStream();

    const int threads = 256;
    row_max_kernel<<<rows, threads, 0, stream>>>(xc.data_ptr<float>(), row_max.data_ptr<float>(), cols);
    row_sum_kernel<<<rows, threads, 0, stream>>>(xc.data_ptr<float>(), row_max.data_ptr<float>(),
                                                 row_sum.data_ptr<float>(), cols);
    dim3 grid((cols + threads - 1) / threads, rows);
    softmax_normalize_kernel<<<grid, threads, 0, stream>>>(xc.data_ptr<float>(), row_max.data_ptr<float>(),
                                                           row_sum.data_ptr<float>(), y.data_ptr<float>(), cols);
    return y;
}
"""

cpp_source = "torch::Tensor softmax_3k(torch::Tensor x);"

softmax_module = load_inline(
    name="kb_softmax_three_kernels",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["softmax_3k"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self):
        super(ModelNew, self).__init__()

    def forward(self, x):
        return softmax_module.softmax_3k(x)
