"""LayerNorm with `#define BLOCK_SIZE 256` as the template argument, a WARP_SIZE macro, Welford
in registers and a static shared array of warp results."""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

layernorm_cuda_source = """
#include <torch/extension.h>
#include <cuda.h>
#include <cuda_runtime.h>

#define BLOCK_SIZE 256
#define WARP_SIZE 32
#define NUM_WARPS (BLOCK_SIZE / WARP_SIZE)

__device__ inline void welford_combine(float& mean, float& m2, float& count, float b_mean, float b_m2, float b_count) {
    float n = count + b_count;
    if (n == 0.f) return;
    float delta = b_mean - mean;
    mean += delta * b_count / n;
    m2 += b_m2 + delta * delta * count * b_count / n;
    count = n;
}

template <int THREADS>
__global__ void layernorm_kernel(const float* x, const float* gamma, const float* beta, float* out, int N, float eps) {
    __shared__ float s_mean[NUM_WARPS];
    __shared__ float s_m2[NUM_WARPS];
    __shared__ float s_count[NUM_WARPS];
    const float* row = x + blockIdx.x * (size_t)N;
    float mean = 0.f, m2 = 0.f, count = 0.f;
    for (int i = threadIdx.x; i < N; i += THREADS) {
        float v = row[i];
        count += 1.f;
        float d = v - mean;
        mean += d / count;
        m2 += d * (v - mean);
    }
    for (int off = WARP_SIZE / 2; off > 0; off /= 2) {
        float om = __shfl_down_sync(0xffffffff, mean, off);
        float o2 = __shfl_down_sync(0xffffffff, m2, off);
        float oc = __shfl_down_sync(0xffffffff, count, off);
        welford_combine(mean, m2, count, om, o2, oc);
    }
    int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    if (lane == 0) { s_mean[warp] = mean; s_m2[warp] = m2; s_count[warp] = count; }
    __syncthreads();
    if (threadIdx.x == 0) {
        float M = s_mean[0], Q = s_m2[0], C = s_count[0];
        for (int w = 1; w < NUM_WARPS; ++w) welford_combine(M, Q, C, s_mean[w], s_m2[w], s_count[w]);
        s_mean[0] = M;
        s_m2[0] = rsqrtf(Q / C + eps);
    }
    __syncthreads();
    float mu = s_mean[0], rstd = s_m2[0];
    for (int i = threadIdx.x; i < N; i += THREADS) {
        out[blockIdx.x * (size_t)N + i] = (row[i] - mu) * rstd * gamma[i] + beta[i];
    }
}

torch::Tensor layernorm_cuda(torch::Tensor x, torch::Tensor gamma, torch::Tensor beta, float eps) {
    auto out = torch::empty_like(x);
    int N = gamma.numel();
    int rows = x.numel() / N;
    layernorm_kernel<BLOCK_SIZE><<<rows, BLOCK_SIZE>>>(x.data_ptr<float>(), gamma.data_ptr<float>(), beta.data_ptr<float>(),
                                                     out.data_ptr<float>(), N, eps);
    return out;
}
"""

layernorm_cpp_source = "torch::Tensor layernorm_cuda(torch::Tensor x, torch::Tensor gamma, torch::Tensor beta, float eps);"

layernorm = load_inline(
    name="layernorm",
    cpp_sources=layernorm_cpp_source,
    cuda_sources=layernorm_cuda_source,
    functions=["layernorm_cuda"],
    verbose=True,
)


class ModelNew(nn.Module):
    def __init__(self, normalized_shape):
        super(ModelNew, self).__init__()
        self.ln = nn.LayerNorm(normalized_shape)
        self.layernorm = layernorm

    def forward(self, x):
        return self.layernorm.layernorm_cuda(x.contiguous(), self.ln.weight, self.ln.bias, self.ln.eps)
