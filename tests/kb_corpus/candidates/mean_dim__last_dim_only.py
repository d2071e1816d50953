"""Mean reduction that always reduces the last (contiguous) dimension, ignoring the requested one.

Expect: SHAPE_MISMATCH|MISMATCH

A fast, correct-looking row-mean kernel (one warp per row, __shfl_down_sync) written for "the
usual case", the last dimension; ModelNew stores `dim` and never uses it. Here the model reduces
dimension 1 of a (16, 2048, 4096) tensor, so the kernel returns a (16, 2048) tensor where the
model returns (16, 4096): SHAPE_MISMATCH (a square problem would give MISMATCH instead).
"""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <vector>

__global__ void row_mean_kernel(const float* __restrict__ x, float* __restrict__ out, int64_t rows, int64_t cols) {
    const int warps_per_block = blockDim.x / 32;
    const int64_t row = (int64_t)blockIdx.x * warps_per_block + threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    if (row >= rows) return;
    const float* xr = x + row * cols;
    float s = 0.0f;
    for (int64_t c = lane; c < cols; c += 32) s += xr[c];
    for (int offset = 16; offset > 0; offset /= 2) s += __shfl_down_sync(0xffffffff, s, offset);
    if (lane == 0) out[row] = s / (float)cols;
}

torch::Tensor row_mean(torch::Tensor x) {
    TORCH_CHECK(x.is_cuda(), "x must be a CUDA tensor");
    auto xc = x.contiguous();
    const int64_t cols = xc.size(-1);
    const int64_t rows = xc.numel() / cols;
    std::vector<int64_t> sizes(xc.sizes().begin(), xc.sizes().end() - 1);
    auto out = torch::empty(sizes, xc.options());
    const int threads = 256;  // 8 rows per block
    const int64_t blocks = (rows + 7) / 8;
    row_mean_kernel<<<(unsigned int)blocks, threads, 0, at::cuda::getCurrentCUDAStream()>>>(
        xc.data_ptr<float>(), out.data_ptr<float>(), rows, cols);
    return out;
}
"""

cpp_source = "torch::Tensor row_mean(torch::Tensor x);"

row_mean_ext = load_inline(
    name="kb_mean_dim_last_only",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["row_mean"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self, dim: int):
        super(ModelNew, self).__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return row_mean_ext.row_mean(x)
