"""RMSNorm with one warp per row (8 rows per block), float4 loads and __shfl_xor_sync all-reduce.

Expect: ACCEPTED

Each lane reads its float4 slices of the row (when the row length is a multiple of 4, so every row
start is 16-byte aligned) plus a scalar tail, sums squares in float, and a butterfly
__shfl_xor_sync leaves the total in every lane; rstd = rsqrtf(sum / cols + eps), then
y = x * rstd * weight with float4 stores. The grid is rounded up and surplus warps return as a
whole, so no shuffle runs with missing lanes. ModelNew creates its weight exactly as the model
does (nn.Parameter(torch.ones(hidden_size))) and passes it with eps.
"""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

rmsnorm_source = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>

#define WARPS_PER_BLOCK 8

__global__ void rmsnorm_warp_kernel(const float* __restrict__ x, const float* __restrict__ weight,
                                    float* __restrict__ y, int64_t rows, int cols, float eps) {
    const int lane = threadIdx.x & 31;
    const int64_t row = (int64_t)blockIdx.x * WARPS_PER_BLOCK + (threadIdx.x >> 5);
    if (row >= rows) return;   // the whole warp leaves together

    const float* xr = x + row * cols;
    float* yr = y + row * cols;
    const int n_vec = (cols % 4 == 0) ? cols / 4 : 0;
    const float4* x4 = reinterpret_cast<const float4*>(xr);

    float ss = 0.0f;
    for (int i = lane; i < n_vec; i += 32) {
        const float4 v = x4[i];
        ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
    }
    for (int i = n_vec * 4 + lane; i < cols; i += 32) {
        const float v = xr[i];
        ss += v * v;
    }
    #pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) {
        ss += __shfl_xor_sync(0xffffffff, ss, offset);
    }
    const float rstd = rsqrtf(ss / (float)cols + eps);

    const float4* w4 = reinterpret_cast<const float4*>(weight);
    float4* y4 = reinterpret_cast<float4*>(yr);
    for (int i = lane; i < n_vec; i += 32) {
        const float4 v = x4[i];
        const float4 w = w4[i];
        float4 o;
        o.x = v.x * rstd * w.x;
        o.y = v.y * rstd * w.y;
        o.z = v.z * rstd * w.z;
        o.w = v.w * rstd * w.w;
        y4[i] = o;
    }
    for (int i = n_vec * 4 + lane; i < cols; i += 32) {
        yr[i] = xr[i] * rstd * weight[i];
    }
}

torch::Tensor rmsnorm_forward(torch::Tensor x, torch::Tensor weight, double eps) {
    TORCH_CHECK(x.is_cuda() && weight.is_cuda(), "CUDA tensors required");
    auto xc = x.contiguous();
    auto wc = weight.contiguous();
    const int cols = xc.size(-1);
    TORCH_CHECK(wc.numel() == cols, "weight must match the last dimension");
    const int64_t rows = xc.numel() / cols;
    auto y = torch::empty_like(xc);
    const int64_t blocks = (rows + WARPS_PER_BLOCK - 1) / WARPS_PER_BLOCK;
    rmsnorm_warp_kernel<<<(unsigned int)blocks, WARPS_PER_BLOCK * 32, 0, at::cuda::getCurrentCUDAStream()>>>(
        xc.data_ptr<float>(), wc.data_ptr<float>(), y.data_ptr<float>(), rows, cols, static_cast<float>(eps));
    return y;
}
"""

rmsnorm_cpp = "torch::Tensor rmsnorm_forward(torch::Tensor x, torch::Tensor weight, double eps);"

rmsnorm_ext = load_inline(
    name="kb_rmsnorm_warp_float4",
    cpp_sources=rmsnorm_cpp,
    cuda_sources=rmsnorm_source,
    functions=["rmsnorm_forward"],
    extra_cuda_cflags=["-O3"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self, hidden_size: int, eps: float = 1e-6):
        super(ModelNew, self).__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(self, x):
        return rmsnorm_ext.rmsnorm_forward(x, self.weight, self.eps)
