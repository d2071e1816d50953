"""RMSNorm with one block per row, `template <int BLOCK_SIZE>`, and a shared-memory tree reduction.

Expect: ACCEPTED

`rmsnorm_kernel<256><<<rows, 256, 0, stream>>>`: a static `__shared__ float partial[BLOCK_SIZE]`
holds per-thread sums of squares, halved in a loop unrolled at compile time; thread 0 turns the
total into rstd (rsqrtf(mean + eps)) in shared memory, and every thread writes x * rstd * weight
for its strided elements. The extension is loaded once at module level as `rms_ext`.
"""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_src = r"""
#include <torch/extension.h>
#include <cuda_runtime.h>
#include <ATen/cuda/CUDAContext.h>

template <int BLOCK_SIZE>
__global__ void rmsnorm_kernel(const float* __restrict__ x, const float* __restrict__ w, float* __restrict__ y,
                               int cols, float eps) {
    __shared__ float partial[BLOCK_SIZE];
    __shared__ float s_rstd;
    const int tid = threadIdx.x;
    const float* xr = x + (size_t)blockIdx.x * cols;
    float* yr = y + (size_t)blockIdx.x * cols;

    float acc = 0.0f;
    for (int i = tid; i < cols; i += BLOCK_SIZE) {
        const float v = xr[i];
        acc += v * v;
    }
    partial[tid] = acc;
    __syncthreads();

    #pragma unroll
    for (int s = BLOCK_SIZE / 2; s > 0; s >>= 1) {
        if (tid < s) partial[tid] += partial[tid + s];
        __syncthreads();
    }
    if (tid == 0) {
        s_rstd = rsqrtf(partial[0] / (float)cols + eps);
    }
    __syncthreads();
    const float rstd = s_rstd;
    for (int i = tid; i < cols; i += BLOCK_SIZE) {
        yr[i] = w[i] * (xr[i] * rstd);
    }
}

torch::Tensor rms_norm(torch::Tensor x, torch::Tensor weight, double eps) {
    TORCH_CHECK(x.is_cuda(), "x must be a CUDA tensor");
    auto xc = x.contiguous();
    const int cols = xc.size(-1);
    const int64_t rows = xc.numel() / cols;
    auto y = torch::empty_like(xc);
    constexpr int kBlock = 256;
    rmsnorm_kernel<kBlock><<<(unsigned int)rows, kBlock, 0, at::cuda::getCurrentCUDAStream()>>>(
        xc.data_ptr<float>(), weight.data_ptr<float>(), y.data_ptr<float>(), cols, (float)eps);
    return y;
}
"""

cpp_src = "torch::Tensor rms_norm(torch::Tensor x, torch::Tensor weight, double eps);"

rms_ext = load_inline(
    name="kb_rmsnorm_block_template",
    cpp_sources=cpp_src,
    cuda_sources=cuda_src,
    functions=["rms_norm"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self, hidden_size, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(self, x):
        return rms_ext.rms_norm(x, self.weight, self.eps)
