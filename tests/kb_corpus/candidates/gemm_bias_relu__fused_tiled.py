"""Linear (x @ W^T) + bias + ReLU fused in one shared-memory tiled kernel.

Expect: ACCEPTED

A level-2 answer in the usual shape: ModelNew creates `self.gemm = nn.Linear(in, out, bias=False)`
and `self.bias = nn.Parameter(torch.randn(bias_shape))` in the model's order (seeded alike, the
weights are equal) and forward passes `self.gemm.weight` and `self.bias` to the kernel, never
calling the module. The kernel tiles x (row-major, M x K) and W (row-major, N x K, read as W^T
through a transposed, padded shared tile), accumulates in float, then applies
max(acc + bias[col], 0) in the epilogue. Module-level extension, current stream.
"""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

fused_source = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>

#define TILE 32

// out[m][n] = relu(sum_k x[m][k] * w[n][k] + bias[n])
__global__ void linear_bias_relu_kernel(const float* __restrict__ x, const float* __restrict__ w,
                                        const float* __restrict__ bias, float* __restrict__ out,
                                        int M, int N, int K) {
    __shared__ float xs[TILE][TILE];
    __shared__ float wt[TILE][TILE + 1];   // wt[k][n], padded against bank conflicts

    const int tx = threadIdx.x;
    const int ty = threadIdx.y;
    const int row = blockIdx.y * TILE + ty;     // m
    const int col = blockIdx.x * TILE + tx;     // n
    const int w_row = blockIdx.x * TILE + ty;   // the W row (an output column) this thread loads

    float acc = 0.0f;
    for (int k0 = 0; k0 < K; k0 += TILE) {
        xs[ty][tx] = (row < M && k0 + tx < K) ? x[(size_t)row * K + k0 + tx] : 0.0f;
        wt[tx][ty] = (w_row < N && k0 + tx < K) ? w[(size_t)w_row * K + k0 + tx] : 0.0f;
        __syncthreads();
        #pragma unroll
        for (int k = 0; k < TILE; ++k) {
            acc += xs[ty][k] * wt[k][tx];
        }
        __syncthreads();
    }
    if (row < M && col < N) {
        out[(size_t)row * N + col] = fmaxf(acc + bias[col], 0.0f);
    }
}

torch::Tensor linear_bias_relu(torch::Tensor x, torch::Tensor weight, torch::Tensor bias) {
    TORCH_CHECK(x.is_cuda() && weight.is_cuda() && bias.is_cuda(), "all tensors must be on CUDA");
    TORCH_CHECK(x.size(1) == weight.size(1), "in_features mismatch");
    auto xc = x.contiguous();
    auto wc = weight.contiguous();
    auto bc = bias.contiguous();
    const int M = xc.size(0);
    const int K = xc.size(1);
    const int N = wc.size(0);
    auto out = torch::empty({M, N}, xc.options());
    dim3 block(TILE, TILE);
    dim3 grid((N + TILE - 1) / TILE, (M + TILE - 1) / TILE);
    linear_bias_relu_kernel<<<grid, block, 0, at::cuda::getCurrentCUDAStream()>>>(
        xc.data_ptr<float>(), wc.data_ptr<float>(), bc.data_ptr<float>(), out.data_ptr<float>(), M, N, K);
    return out;
}
"""

fused_cpp = "torch::Tensor linear_bias_relu(torch::Tensor x, torch::Tensor weight, torch::Tensor bias);"

fused_ext = load_inline(
    name="kb_gemm_bias_relu_fused",
    cpp_sources=fused_cpp,
    cuda_sources=fused_source,
    functions=["linear_bias_relu"],
    extra_cuda_cflags=["-O3"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self, in_features, out_features, bias_shape):
        super(ModelNew, self).__init__()
        self.gemm = nn.Linear(in_features, out_features, bias=False)
        self.bias = nn.Parameter(torch.randn(bias_shape))

    def forward(self, x):
        return fused_ext.linear_bias_relu(x, self.gemm.weight, self.bias)
