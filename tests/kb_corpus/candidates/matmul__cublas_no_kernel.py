"""Matrix product handed to cublasSgemm from the extension: no kernel of its own.

Expect: launches-a-kernel

A common "optimisation": the C++ wrapper takes PyTorch's cuBLAS handle and calls cublasSgemm
(row-major C = A B computed as column-major C^T = B^T A^T). The result is right and fast, but it
is the library's kernel, not the candidate's: the program defines no __global__ function. The
static rules must reject it under launches-a-kernel.
"""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <cublas_v2.h>

torch::Tensor matmul_cublas(torch::Tensor A, torch::Tensor B) {
    TORCH_CHECK(A.is_cuda() && B.is_cuda(), "CUDA tensors required");
    auto a = A.contiguous();
    auto b = B.contiguous();
    const int M = a.size(0), K = a.size(1), N = b.size(1);
    auto C = torch::empty({M, N}, a.options());

    cublasHandle_t handle = at::cuda::getCurrentCUDABlasHandle();
    const float alpha = 1.0f, beta = 0.0f;
    // column-major view: C^T (N x M) = B^T (N x K) * A^T (K x M)
    cublasSgemm(handle, CUBLAS_OP_N, CUBLAS_OP_N, N, M, K, &alpha,
                b.data_ptr<float>(), N, a.data_ptr<float>(), K, &beta, C.data_ptr<float>(), N);
    return C;
}
"""

cpp_source = "torch::Tensor matmul_cublas(torch::Tensor A, torch::Tensor B);"

cublas_ext = load_inline(
    name="kb_matmul_cublas",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["matmul_cublas"],
    extra_ldflags=["-lcublas"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, A, B):
        return cublas_ext.matmul_cublas(A, B)
