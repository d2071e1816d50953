"""Row sums with cooperative groups: `#include <cooperative_groups.h>`, `namespace cg =
cooperative_groups;`, thread_block_tile<32> shuffles (cg::reduce), atomicAdd of warp results."""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cg_source = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <cooperative_groups.h>
#include <cooperative_groups/reduce.h>

namespace cg = cooperative_groups;

__global__ void row_sum_cg_kernel(const float* __restrict__ x, float* __restrict__ out, int cols) {
    cg::thread_block block = cg::this_thread_block();
    cg::thread_block_tile<32> warp = cg::tiled_partition<32>(block);
    const float* r = x + (size_t)blockIdx.x * cols;
    float s = 0.f;
    for (int c = block.thread_rank(); c < cols; c += block.size()) s += r[c];
    s = cg::reduce(warp, s, cg::plus<float>());
    if (warp.thread_rank() == 0) atomicAdd(&out[blockIdx.x], s);
}

torch::Tensor row_sum_cg(torch::Tensor x) {
    auto xc = x.contiguous();
    const int cols = xc.size(-1);
    const int rows = xc.numel() / cols;
    auto out = torch::zeros({rows}, xc.options());
    row_sum_cg_kernel<<<rows, 256, 0, at::cuda::getCurrentCUDAStream()>>>(xc.data_ptr<float>(), out.data_ptr<float>(), cols);
    return out;
}
"""

cg_ext = load_inline(name="row_sum_cg", cpp_sources="torch::Tensor row_sum_cg(torch::Tensor x);", cuda_sources=cg_source,
                     functions=["row_sum_cg"], verbose=False)


class ModelNew(nn.Module):
    def __init__(self, dim):
        super().__init__()

    def forward(self, x):
        return cg_ext.row_sum_cg(x)
