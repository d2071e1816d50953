"""Linear + bias + ReLU where forward does the matrix product with torch.matmul and only the
bias + ReLU epilogue in a custom kernel.

Expect: no-pytorch-compute

The most common partial answer: "cuBLAS is already optimal for the GEMM, so fuse the rest". The
epilogue kernel is correct, but forward calls torch.matmul (and .t() of the weight, a view, which
is fine): the expensive part of the work is PyTorch's. The static rules must reject it under
no-pytorch-compute.
"""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>

__global__ void bias_relu_kernel(const float* __restrict__ y, const float* __restrict__ bias,
                                 float* __restrict__ out, int64_t total, int64_t cols) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < total) {
        out[i] = fmaxf(y[i] + bias[i % cols], 0.0f);
    }
}

torch::Tensor bias_relu(torch::Tensor y, torch::Tensor bias) {
    auto yc = y.contiguous();
    auto out = torch::empty_like(yc);
    int64_t total = yc.numel();
    int64_t cols = yc.size(-1);
    int threads = 256;
    bias_relu_kernel<<<(unsigned int)((total + threads - 1) / threads), threads, 0, at::cuda::getCurrentCUDAStream()>>>(
        yc.data_ptr<float>(), bias.data_ptr<float>(), out.data_ptr<float>(), total, cols);
    return out;
}
"""

cpp_source = "torch::Tensor bias_relu(torch::Tensor y, torch::Tensor bias);"

epilogue = load_inline(
    name="kb_gemm_torch_matmul",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["bias_relu"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self, in_features, out_features, bias_shape):
        super(ModelNew, self).__init__()
        self.gemm = nn.Linear(in_features, out_features, bias=False)
        self.bias = nn.Parameter(torch.randn(bias_shape))

    def forward(self, x):
        y = torch.matmul(x, self.gemm.weight.t())  # cuBLAS for the GEMM
        return epilogue.bias_relu(y, self.bias)
