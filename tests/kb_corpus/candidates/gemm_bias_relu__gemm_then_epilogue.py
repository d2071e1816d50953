"""Linear + bias + ReLU as two kernels: a register-tiled x @ W^T, then a bias + ReLU epilogue kernel.

Expect: ACCEPTED

The GEMM kernel uses 64 x 64 block tiles, BK = 16 and 4 x 4 outputs per thread, reading W in its
stored (out_features, in_features) layout as W^T; it writes plain products into the output, and a
second elementwise kernel adds the bias and clamps at zero in place in that (its own) buffer.
Parameters are made as the model makes them and read, not called: `self.gemm.weight`,
`self.bias`. The extension lives on the module as self.kernels.
"""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_src = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>

constexpr int BM = 64;
constexpr int BN = 64;
constexpr int BK = 16;
constexpr int TM = 4;
constexpr int TN = 4;
constexpr int NTHREADS = (BM / TM) * (BN / TN);   // 256

// C[m][n] = sum_k X[m][k] * W[n][k]
__global__ void gemm_nt_kernel(const float* __restrict__ X, const float* __restrict__ W, float* __restrict__ C,
                               int M, int N, int K) {
    __shared__ float Xs[BK][BM];
    __shared__ float Ws[BK][BN];
    const int tid = threadIdx.x;
    const int tx = tid % (BN / TN);
    const int ty = tid / (BN / TN);
    const int m0 = blockIdx.y * BM;
    const int n0 = blockIdx.x * BN;

    float acc[TM][TN];
    for (int i = 0; i < TM; ++i)
        for (int j = 0; j < TN; ++j) acc[i][j] = 0.0f;

    for (int k0 = 0; k0 < K; k0 += BK) {
        for (int l = tid; l < BM * BK; l += NTHREADS) {
            const int m = l / BK, k = l % BK;
            Xs[k][m] = (m0 + m < M && k0 + k < K) ? X[(size_t)(m0 + m) * K + k0 + k] : 0.0f;
        }
        for (int l = tid; l < BN * BK; l += NTHREADS) {
            const int n = l / BK, k = l % BK;
            Ws[k][n] = (n0 + n < N && k0 + k < K) ? W[(size_t)(n0 + n) * K + k0 + k] : 0.0f;
        }
        __syncthreads();
        #pragma unroll
        for (int k = 0; k < BK; ++k) {
            float a[TM], b[TN];
            #pragma unroll
            for (int i = 0; i < TM; ++i) a[i] = Xs[k][ty * TM + i];
            #pragma unroll
            for (int j = 0; j < TN; ++j) b[j] = Ws[k][tx * TN + j];
            #pragma unroll
            for (int i = 0; i < TM; ++i)
                #pragma unroll
                for (int j = 0; j < TN; ++j) acc[i][j] += a[i] * b[j];
        }
        __syncthreads();
    }
    for (int i = 0; i < TM; ++i) {
        const int m = m0 + ty * TM + i;
        for (int j = 0; j < TN; ++j) {
            const int n = n0 + tx * TN + j;
            if (m < M && n < N) C[(size_t)m * N + n] = acc[i][j];
        }
    }
}

__global__ void bias_relu_kernel(float* __restrict__ C, const float* __restrict__ bias, int64_t total, int N) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < total) {
        const float v = C[i] + bias[i % N];
        C[i] = v > 0.0f ? v : 0.0f;
    }
}

torch::Tensor gemm_bias_relu(torch::Tensor x, torch::Tensor weight, torch::Tensor bias) {
    TORCH_CHECK(x.is_cuda(), "x must be a CUDA tensor");
    auto X = x.contiguous();
    auto W = weight.contiguous();
    auto b = bias.contiguous();
    const int M = X.size(0), K = X.size(1), N = W.size(0);
    TORCH_CHECK(W.size(1) == K, "weight shape mismatch");
    auto out = torch::empty({M, N}, X.options());
    cudaStream_t stream = at::cuda::getCurrentCUDAStream();

    dim3 grid((N + BN - 1) / BN, (M + BM - 1) / BM);
    gemm_nt_kernel<<<grid, NTHREADS, 0, stream>>>(X.data_ptr<float>(), W.data_ptr<float>(), out.data_ptr<float>(), M, N, K);

    const int64_t total = (int64_t)M * N;
    const int threads = 256;
    bias_relu_kernel<<<(unsigned int)((total + threads - 1) / threads), threads, 0, stream>>>(
        out.data_ptr<float>(), b.data_ptr<float>(), total, N);
    return out;
}
"""

cpp_src = "torch::Tensor gemm_bias_relu(torch::Tensor x, torch::Tensor weight, torch::Tensor bias);"


class ModelNew(nn.Module):
    def __init__(self, in_features, out_features, bias_shape):
        super().__init__()
        self.gemm = nn.Linear(in_features, out_features, bias=False)
        self.bias = nn.Parameter(torch.randn(bias_shape))
        self.kernels = load_inline(
            name="kb_gemm_then_epilogue",
            cpp_sources=cpp_src,
            cuda_sources=cuda_src,
            functions=["gemm_bias_relu"],
            extra_cuda_cflags=["-O3"],
            verbose=False,
        )

    def forward(self, x):
        return self.kernels.gemm_bias_relu(x, self.gemm.weight, self.bias)
