"""Tiled matmul using more than 48 KB of dynamic shared memory: the host raises the kernel's limit
with cudaFuncSetAttribute(matmul_kernel<TILE>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes)."""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

matmul_source = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>

template <int TILE>
__global__ void matmul_kernel(const float* __restrict__ A, const float* __restrict__ B, float* __restrict__ C, int M, int N, int K) {
    extern __shared__ float smem[];
    float* As = smem;                 // TILE x K-chunk
    float* Bs = smem + TILE * TILE * 4;
    const int tx = threadIdx.x, ty = threadIdx.y;
    const int row = blockIdx.y * TILE + ty;
    const int col = blockIdx.x * TILE + tx;
    float acc = 0.f;
    for (int k0 = 0; k0 < K; k0 += TILE * 4) {
        for (int kk = tx; kk < TILE * 4; kk += TILE) {
            As[ty * TILE * 4 + kk] = (row < M && k0 + kk < K) ? A[(size_t)row * K + k0 + kk] : 0.f;
        }
        for (int kk = ty; kk < TILE * 4; kk += TILE) {
            Bs[kk * TILE + tx] = (col < N && k0 + kk < K) ? B[(size_t)(k0 + kk) * N + col] : 0.f;
        }
        __syncthreads();
        for (int kk = 0; kk < TILE * 4; ++kk) acc += As[ty * TILE * 4 + kk] * Bs[kk * TILE + tx];
        __syncthreads();
    }
    if (row < M && col < N) C[(size_t)row * N + col] = acc;
}

torch::Tensor matmul_big_smem(torch::Tensor A, torch::Tensor B) {
    constexpr int TILE = 32;
    auto a = A.contiguous();
    auto b = B.contiguous();
    const int M = a.size(0), K = a.size(1), N = b.size(1);
    auto C = torch::empty({M, N}, a.options());
    const size_t smem = 2 * TILE * TILE * 4 * sizeof(float);
    cudaFuncSetAttribute(matmul_kernel<TILE>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    dim3 block(TILE, TILE);
    dim3 grid((N + TILE - 1) / TILE, (M + TILE - 1) / TILE);
    matmul_kernel<TILE><<<grid, block, smem, at::cuda::getCurrentCUDAStream()>>>(a.data_ptr<float>(), b.data_ptr<float>(),
                                                                              C.data_ptr<float>(), M, N, K);
    return C;
}
"""

matmul_cpp = "torch::Tensor matmul_big_smem(torch::Tensor A, torch::Tensor B);"

matmul_ext = load_inline(name="matmul_big_smem", cpp_sources=matmul_cpp, cuda_sources=matmul_source,
                         functions=["matmul_big_smem"], verbose=False)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, A, B):
        return matmul_ext.matmul_big_smem(A, B)
