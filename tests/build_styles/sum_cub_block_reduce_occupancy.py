"""Total sum with cub::BlockReduce (`#include <cub/cub.cuh>`, `template <int BLOCK_THREADS>`), the
grid sized from cudaOccupancyMaxActiveBlocksPerMultiprocessor on the kernel, atomicAdd of block sums."""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cub_source = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <cub/cub.cuh>

template <int BLOCK_THREADS>
__global__ void block_sum_kernel(const float* __restrict__ x, float* __restrict__ out, int64_t n) {
    using BlockReduce = cub::BlockReduce<float, BLOCK_THREADS>;
    __shared__ typename BlockReduce::TempStorage temp;
    float s = 0.f;
    for (int64_t i = blockIdx.x * (int64_t)BLOCK_THREADS + threadIdx.x; i < n; i += (int64_t)gridDim.x * BLOCK_THREADS) {
        s += x[i];
    }
    const float block_total = BlockReduce(temp).Sum(s);
    if (threadIdx.x == 0) atomicAdd(out, block_total);
}

torch::Tensor total_sum(torch::Tensor x) {
    constexpr int kThreads = 256;
    auto xc = x.contiguous();
    auto out = torch::zeros({1}, xc.options());
    int per_sm = 0;
    cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, block_sum_kernel<kThreads>, kThreads, 0);
    const int sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
    const int64_t n = xc.numel();
    const int64_t needed = (n + kThreads - 1) / kThreads;
    const int blocks = (int)std::max<int64_t>(1, std::min<int64_t>(needed, (int64_t)per_sm * sms));
    block_sum_kernel<kThreads><<<blocks, kThreads, 0, at::cuda::getCurrentCUDAStream()>>>(xc.data_ptr<float>(), out.data_ptr<float>(), n);
    return out.squeeze(0);
}
"""

cub_ext = load_inline(name="cub_block_sum", cpp_sources="torch::Tensor total_sum(torch::Tensor x);", cuda_sources=cub_source,
                      functions=["total_sum"], verbose=False)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return cub_ext.total_sum(x)
