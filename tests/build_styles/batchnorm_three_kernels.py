"""Training-mode BatchNorm2d in three kernels (per-channel sums with atomicAdd, mean/invstd,
normalize), cudaMemsetAsync of the accumulators, launch errors checked with cudaGetLastError."""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

bn_source = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>

__global__ void channel_sums_kernel(const float* __restrict__ x, float* __restrict__ sum, float* __restrict__ sumsq,
                                    int N, int C, int HW) {
    const int c = blockIdx.y;
    float s = 0.f, q = 0.f;
    for (int idx = blockIdx.x * blockDim.x + threadIdx.x; idx < N * HW; idx += gridDim.x * blockDim.x) {
        const int n = idx / HW, p = idx % HW;
        const float v = x[((size_t)n * C + c) * HW + p];
        s += v;
        q += v * v;
    }
    for (int o = 16; o > 0; o >>= 1) {
        s += __shfl_down_sync(0xffffffffu, s, o);
        q += __shfl_down_sync(0xffffffffu, q, o);
    }
    if ((threadIdx.x & 31) == 0) {
        atomicAdd(&sum[c], s);
        atomicAdd(&sumsq[c], q);
    }
}

__global__ void stats_kernel(const float* __restrict__ sum, const float* __restrict__ sumsq, float* __restrict__ mean,
                             float* __restrict__ invstd, int C, float count, float eps) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c < C) {
        const float m = sum[c] / count;
        const float var = fmaxf(sumsq[c] / count - m * m, 0.f);
        mean[c] = m;
        invstd[c] = rsqrtf(var + eps);
    }
}

__global__ void normalize_kernel(const float* __restrict__ x, const float* __restrict__ mean, const float* __restrict__ invstd,
                                 const float* __restrict__ gamma, const float* __restrict__ beta, float* __restrict__ y,
                                 int C, int HW, size_t total) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
        const int c = (i / HW) % C;
        y[i] = (x[i] - mean[c]) * invstd[c] * gamma[c] + beta[c];
    }
}

torch::Tensor batchnorm_forward(torch::Tensor x, torch::Tensor gamma, torch::Tensor beta, double eps) {
    TORCH_CHECK(x.dim() == 4, "NCHW input expected");
    auto xc = x.contiguous();
    const int N = xc.size(0), C = xc.size(1), HW = xc.size(2) * xc.size(3);
    auto opts = xc.options();
    auto sum = torch::empty({C}, opts);
    auto sumsq = torch::empty({C}, opts);
    auto mean = torch::empty({C}, opts);
    auto invstd = torch::empty({C}, opts);
    auto y = torch::empty_like(xc);
    cudaStream_t stream = at::cuda::getCurrentCUDAStream();
    cudaMemsetAsync(sum.data_ptr<float>(), 0, C * sizeof(float), stream);
    cudaMemsetAsync(sumsq.data_ptr<float>(), 0, C * sizeof(float), stream);
    dim3 grid1(64, C);
    channel_sums_kernel<<<grid1, 256, 0, stream>>>(xc.data_ptr<float>(), sum.data_ptr<float>(), sumsq.data_ptr<float>(), N, C, HW);
    stats_kernel<<<(C + 127) / 128, 128, 0, stream>>>(sum.data_ptr<float>(), sumsq.data_ptr<float>(), mean.data_ptr<float>(),
                                                     invstd.data_ptr<float>(), C, (float)N * HW, (float)eps);
    const size_t total = xc.numel();
    normalize_kernel<<<1024, 256, 0, stream>>>(xc.data_ptr<float>(), mean.data_ptr<float>(), invstd.data_ptr<float>(),
                                               gamma.data_ptr<float>(), beta.data_ptr<float>(), y.data_ptr<float>(), C, HW, total);
    cudaError_t err = cudaGetLastError();
    TORCH_CHECK(err == cudaSuccess, "batchnorm kernels failed: ", cudaGetErrorString(err));
    return y;
}
"""

bn_cpp = "torch::Tensor batchnorm_forward(torch::Tensor x, torch::Tensor gamma, torch::Tensor beta, double eps);"

bn_ext = load_inline(name="bn_three_kernels", cpp_sources=bn_cpp, cuda_sources=bn_source,
                     functions=["batchnorm_forward"], extra_cuda_cflags=["-O3", "--use_fast_math"], verbose=False)


class ModelNew(nn.Module):
    def __init__(self, num_features):
        super().__init__()
        self.bn = nn.BatchNorm2d(num_features)

    def forward(self, x):
        return bn_ext.batchnorm_forward(x, self.bn.weight, self.bn.bias, self.bn.eps)
