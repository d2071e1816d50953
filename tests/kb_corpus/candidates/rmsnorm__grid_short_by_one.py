"""RMSNorm, one warp per row, whose grid is one block short: the last 8 rows are never written.

Expect: MISMATCH|NAN_INF

The kernel itself is right, but the host computes the block count as `(rows - 1) / 8` (a garbled
ceil-divide): with 16 * 2048 = 32768 rows that is 4095 blocks covering 32760 rows. The last 8
rows of the output keep whatever the allocator handed out, which the judge fills with NaN first:
NAN_INF, or MISMATCH if stale values show instead. It must be rejected.
"""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>

constexpr int ROWS_PER_BLOCK = 8;

__global__ void rmsnorm_rows_kernel(const float* __restrict__ x, const float* __restrict__ w, float* __restrict__ y,
                                    int64_t rows, int cols, float eps) {
    const int64_t row = (int64_t)blockIdx.x * ROWS_PER_BLOCK + threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    if (row >= rows) return;
    const float* xr = x + row * cols;
    float* yr = y + row * cols;
    float ss = 0.0f;
    for (int i = lane; i < cols; i += 32) ss += xr[i] * xr[i];
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffff, ss, o);
    const float rstd = rsqrtf(ss / cols + eps);
    for (int i = lane; i < cols; i += 32) yr[i] = xr[i] * rstd * w[i];
}

torch::Tensor rmsnorm(torch::Tensor x, torch::Tensor w, double eps) {
    TORCH_CHECK(x.is_cuda() && x.is_contiguous(), "x must be a contiguous CUDA tensor");
    const int cols = x.size(-1);
    const int64_t rows = x.numel() / cols;
    auto y = torch::empty_like(x);
    const int64_t blocks = (rows - 1) / ROWS_PER_BLOCK;
    rmsnorm_rows_kernel<<<(unsigned int)blocks, ROWS_PER_BLOCK * 32, 0, at::cuda::getCurrentCUDAStream()>>>(
        x.data_ptr<float>(), w.data_ptr<float>(), y.data_ptr<float>(), rows, cols, (float)eps);
    return y;
}
"""

cpp_source = "torch::Tensor rmsnorm(torch::Tensor x, torch::Tensor w, double eps);"

rmsnorm_ext = load_inline(
    name="kb_rmsnorm_grid_short",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["rmsnorm"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self, hidden_size, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(self, x):
        return rmsnorm_ext.rmsnorm(x, self.weight, self.eps)
