"""Kernels and the implementation in `namespace fused_ops`, exposed through a global wrapper that
calls fused_ops::forward_impl; `using namespace fused_ops;` style is not used, qualified calls are."""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

source = r"""
#include <torch/extension.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

namespace fused_ops {

struct EpilogueParams {
    float alpha;
    float beta;
    int64_t n;
    int64_t cols;
};

__global__ void axpby_bias_kernel(const float* __restrict__ x, const float* __restrict__ y, const float* __restrict__ bias,
                                  float* __restrict__ out, EpilogueParams p) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < p.n; i += (int64_t)gridDim.x * blockDim.x) {
        out[i] = p.alpha * x[i] + p.beta * y[i] + bias[i % p.cols];
    }
}

torch::Tensor forward_impl(const torch::Tensor& x, const torch::Tensor& y, const torch::Tensor& bias, double alpha, double beta) {
    c10::cuda::CUDAGuard guard(x.device());
    auto out = torch::empty_like(x);
    EpilogueParams p{static_cast<float>(alpha), static_cast<float>(beta), x.numel(), x.size(-1)};
    const int threads = 256;
    const int blocks = static_cast<int>(std::min<int64_t>((p.n + threads - 1) / threads, 4096));
    axpby_bias_kernel<<<blocks, threads, 0, c10::cuda::getCurrentCUDAStream()>>>(
        x.data_ptr<float>(), y.data_ptr<float>(), bias.data_ptr<float>(), out.data_ptr<float>(), p);
    return out;
}

}  // namespace fused_ops

torch::Tensor fused_axpby_bias(torch::Tensor x, torch::Tensor y, torch::Tensor bias, double alpha, double beta) {
    TORCH_CHECK(x.is_contiguous() && y.is_contiguous(), "contiguous inputs expected");
    return fused_ops::forward_impl(x, y, bias, alpha, beta);
}
"""

cpp = "torch::Tensor fused_axpby_bias(torch::Tensor x, torch::Tensor y, torch::Tensor bias, double alpha, double beta);"

fused = load_inline(name="fused_axpby_ns", cpp_sources=cpp, cuda_sources=source, functions=["fused_axpby_bias"])


class ModelNew(nn.Module):
    def __init__(self, features, alpha=0.5, beta=2.0):
        super().__init__()
        self.bias = nn.Parameter(torch.zeros(features))
        self.alpha, self.beta = alpha, beta

    def forward(self, x, y):
        return fused.fused_axpby_bias(x.contiguous(), y.contiguous(), self.bias, self.alpha, self.beta)
