"""RMSNorm: `constexpr int kThreads = 256;` inside the host function names the template argument,
`extern __shared__ float` holds warp partials, warp shuffles, rsqrtf."""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_src = r"""
#include <torch/extension.h>
#include <c10/cuda/CUDAGuard.h>
#include <ATen/cuda/CUDAContext.h>

__device__ __forceinline__ float warp_sum(float v) {
    #pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffff, v, offset);
    return v;
}

template <int THREADS>
__global__ void rmsnorm_kernel(const float* __restrict__ x, const float* __restrict__ w, float* __restrict__ y,
                               int hidden, float eps) {
    extern __shared__ float warp_partials[];
    const int row = blockIdx.x;
    const float* xr = x + (long long)row * hidden;
    float* yr = y + (long long)row * hidden;
    float acc = 0.f;
    for (int i = threadIdx.x; i < hidden; i += THREADS) {
        float v = xr[i];
        acc += v * v;
    }
    acc = warp_sum(acc);
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    if (lane == 0) warp_partials[warp] = acc;
    __syncthreads();
    if (warp == 0) {
        float t = lane < THREADS / 32 ? warp_partials[lane] : 0.f;
        t = warp_sum(t);
        if (lane == 0) warp_partials[0] = rsqrtf(t / hidden + eps);
    }
    __syncthreads();
    const float scale = warp_partials[0];
    for (int i = threadIdx.x; i < hidden; i += THREADS) yr[i] = xr[i] * scale * w[i];
}

torch::Tensor rmsnorm_forward(torch::Tensor x, torch::Tensor weight, double eps) {
    TORCH_CHECK(x.is_cuda() && weight.is_cuda(), "inputs must be on CUDA");
    TORCH_CHECK(x.scalar_type() == torch::kFloat32, "float32 only");
    const c10::cuda::CUDAGuard device_guard(x.device());
    auto xc = x.contiguous();
    const int hidden = xc.size(-1);
    const int rows = xc.numel() / hidden;
    auto y = torch::empty_like(xc);
    constexpr int kThreads = 256;
    const size_t smem = (kThreads / 32) * sizeof(float);
    rmsnorm_kernel<kThreads><<<rows, kThreads, smem, at::cuda::getCurrentCUDAStream()>>>(
        xc.data_ptr<float>(), weight.data_ptr<float>(), y.data_ptr<float>(), hidden, static_cast<float>(eps));
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return y;
}
"""

cpp_src = "torch::Tensor rmsnorm_forward(torch::Tensor x, torch::Tensor weight, double eps);"

rmsnorm_ext = load_inline(
    name="rmsnorm_constexpr",
    cpp_sources=cpp_src,
    cuda_sources=cuda_src,
    functions=["rmsnorm_forward"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self, num_features: int, eps: float = 1e-5):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(num_features))
        self.eps = eps

    def forward(self, x):
        return rmsnorm_ext.rmsnorm_forward(x, self.weight, self.eps)
