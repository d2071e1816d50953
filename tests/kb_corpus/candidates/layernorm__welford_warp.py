"""LayerNorm over the last dimension: one block per row, Welford statistics merged with warp shuffles.

Expect: ACCEPTED

Each of 256 threads runs Welford's update over its strided elements (count, mean, M2); partial
results merge pairwise with Chan's formula through __shfl_down_sync, warp leaders meet in shared
memory, and warp 0 merges those (empty partials are skipped by the helper, never divided by
zero). The biased variance M2 / n with eps inside rsqrtf, then y = (x - mean) * rstd * gamma +
beta. ModelNew keeps `self.ln = nn.LayerNorm(...)` for its parameters and passes
self.ln.weight, self.ln.bias and self.ln.eps to the kernel; it never calls self.ln.
"""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

layernorm_cuda = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#define CHECK_CUDA(x) TORCH_CHECK(x.device().is_cuda(), #x " must be a CUDA tensor")
#define CHECK_CONTIGUOUS(x) TORCH_CHECK(x.is_contiguous(), #x " must be contiguous")
#define CHECK_INPUT(x) CHECK_CUDA(x); CHECK_CONTIGUOUS(x)

__device__ __forceinline__ void welford_merge(float& mean, float& m2, float& count,
                                              float b_mean, float b_m2, float b_count) {
    if (b_count == 0.0f) return;
    const float n = count + b_count;
    const float delta = b_mean - mean;
    const float w = b_count / n;
    mean += delta * w;
    m2 += b_m2 + delta * delta * count * w;
    count = n;
}

__device__ __forceinline__ void warp_welford(float& mean, float& m2, float& count) {
    #pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) {
        const float b_mean = __shfl_down_sync(0xffffffff, mean, offset);
        const float b_m2 = __shfl_down_sync(0xffffffff, m2, offset);
        const float b_count = __shfl_down_sync(0xffffffff, count, offset);
        welford_merge(mean, m2, count, b_mean, b_m2, b_count);
    }
}

__global__ void layernorm_welford_kernel(const float* __restrict__ x, const float* __restrict__ gamma,
                                         const float* __restrict__ beta, float* __restrict__ y,
                                         int cols, float eps) {
    __shared__ float s_mean[32];
    __shared__ float s_m2[32];
    __shared__ float s_count[32];
    __shared__ float s_stats[2];

    const float* xr = x + (size_t)blockIdx.x * cols;
    float* yr = y + (size_t)blockIdx.x * cols;
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int num_warps = blockDim.x >> 5;

    float mean = 0.0f, m2 = 0.0f, count = 0.0f;
    for (int i = threadIdx.x; i < cols; i += blockDim.x) {
        const float v = xr[i];
        count += 1.0f;
        const float delta = v - mean;
        mean += delta / count;
        m2 += delta * (v - mean);
    }
    warp_welford(mean, m2, count);
    if (lane == 0) {
        s_mean[warp] = mean;
        s_m2[warp] = m2;
        s_count[warp] = count;
    }
    __syncthreads();
    if (warp == 0) {
        mean = lane < num_warps ? s_mean[lane] : 0.0f;
        m2 = lane < num_warps ? s_m2[lane] : 0.0f;
        count = lane < num_warps ? s_count[lane] : 0.0f;
        warp_welford(mean, m2, count);
        if (lane == 0) {
            s_stats[0] = mean;
            s_stats[1] = rsqrtf(m2 / count + eps);
        }
    }
    __syncthreads();
    const float mu = s_stats[0];
    const float rstd = s_stats[1];
    for (int i = threadIdx.x; i < cols; i += blockDim.x) {
        yr[i] = (xr[i] - mu) * rstd * gamma[i] + beta[i];
    }
}

torch::Tensor layernorm_forward(torch::Tensor x, torch::Tensor weight, torch::Tensor bias, double eps) {
    CHECK_INPUT(x); CHECK_INPUT(weight); CHECK_INPUT(bias);
    const at::cuda::OptionalCUDAGuard device_guard(device_of(x));
    const int cols = weight.numel();
    TORCH_CHECK(x.size(-1) == cols, "normalized shape mismatch");
    const int64_t rows = x.numel() / cols;
    auto y = torch::empty_like(x);
    const int threads = 256;
    layernorm_welford_kernel<<<(unsigned int)rows, threads, 0, at::cuda::getCurrentCUDAStream()>>>(
        x.data_ptr<float>(), weight.data_ptr<float>(), bias.data_ptr<float>(), y.data_ptr<float>(),
        cols, static_cast<float>(eps));
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return y;
}
"""

layernorm_cpp = "torch::Tensor layernorm_forward(torch::Tensor x, torch::Tensor weight, torch::Tensor bias, double eps);"


class ModelNew(nn.Module):
    def __init__(self, normalized_shape: tuple):
        super(ModelNew, self).__init__()
        self.ln = nn.LayerNorm(normalized_shape=normalized_shape)
        self.ext = load_inline(
            name="kb_layernorm_welford_warp",
            cpp_sources=layernorm_cpp,
            cuda_sources=layernorm_cuda,
            functions=["layernorm_forward"],
            extra_cuda_cflags=["-O3"],
            verbose=False,
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.ext.layernorm_forward(x.contiguous(), self.ln.weight, self.ln.bias, self.ln.eps)
