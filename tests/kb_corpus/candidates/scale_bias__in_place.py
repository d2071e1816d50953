"""x * y + bias computed in place into x, which forward then returns.

Expect: INPUT_MUTATED

"Avoid an allocation": the kernel writes x[i] = x[i] * y[i] + bias[col] and the host function
returns x itself. The values returned are right, but the caller's input is destroyed (a model
that reuses x afterwards, or a second call on the same inputs, sees garbage). The judge
fingerprints the inputs before and after the forward and must reject it as INPUT_MUTATED.
"""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_src = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>

__global__ void fma_bias_inplace_kernel(float* __restrict__ x, const float* __restrict__ y,
                                        const float* __restrict__ bias, int64_t n, int64_t cols) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        x[i] = x[i] * y[i] + bias[i % cols];
    }
}

torch::Tensor fma_bias_inplace(torch::Tensor x, torch::Tensor y, torch::Tensor bias) {
    TORCH_CHECK(x.is_cuda() && x.is_contiguous(), "x must be a contiguous CUDA tensor");
    TORCH_CHECK(y.is_cuda() && y.is_contiguous(), "y must be a contiguous CUDA tensor");
    int64_t n = x.numel();
    int64_t cols = x.size(-1);
    const int threads = 256;
    const int64_t blocks = (n + threads - 1) / threads;
    fma_bias_inplace_kernel<<<(unsigned int)blocks, threads, 0, at::cuda::getCurrentCUDAStream()>>>(
        x.data_ptr<float>(), y.data_ptr<float>(), bias.data_ptr<float>(), n, cols);
    return x;  // reuse the input buffer, no extra allocation
}
"""

cpp_src = "torch::Tensor fma_bias_inplace(torch::Tensor x, torch::Tensor y, torch::Tensor bias);"

inplace_ext = load_inline(
    name="kb_scale_bias_in_place",
    cpp_sources=cpp_src,
    cuda_sources=cuda_src,
    functions=["fma_bias_inplace"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.bias = nn.Parameter(torch.randn(dim))

    def forward(self, x, y):
        return inplace_ext.fma_bias_inplace(x, y, self.bias)
