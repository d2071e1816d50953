"""ELU whose kernel has defaulted template parameters, `template <int BLOCK = 256, int UNROLL = 2>`,
launched without template arguments (elu_kernel<<<...>>>) and once with <128> for short inputs."""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

elu_src = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>

template <int BLOCK = 256, int UNROLL = 2>
__global__ void elu_kernel(const float* __restrict__ x, float* __restrict__ y, float alpha, int n) {
    const int base = blockIdx.x * BLOCK * UNROLL + threadIdx.x;
    #pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
        const int i = base + u * BLOCK;
        if (i < n) {
            const float v = x[i];
            y[i] = v > 0.f ? v : alpha * (expf(v) - 1.f);
        }
    }
}

torch::Tensor elu_forward(torch::Tensor x, double alpha) {
    auto xc = x.contiguous();
    auto y = torch::empty_like(xc);
    const int n = xc.numel();
    auto stream = at::cuda::getCurrentCUDAStream();
    if (n < 4096) {
        elu_kernel<128><<<(n + 255) / 256, 128, 0, stream>>>(xc.data_ptr<float>(), y.data_ptr<float>(), (float)alpha, n);
    } else {
        elu_kernel<<<(n + 511) / 512, 256, 0, stream>>>(xc.data_ptr<float>(), y.data_ptr<float>(), (float)alpha, n);
    }
    return y;
}
"""

elu_ext = load_inline(name="elu_defaults", cpp_sources="torch::Tensor elu_forward(torch::Tensor x, double alpha);",
                      cuda_sources=elu_src, functions=["elu_forward"], verbose=False)


class ModelNew(nn.Module):
    def __init__(self, alpha: float = 1.0):
        super().__init__()
        self.alpha = alpha

    def forward(self, x):
        return elu_ext.elu_forward(x, self.alpha)
