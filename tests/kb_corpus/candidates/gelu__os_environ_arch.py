"""A correct GELU kernel whose program imports os to set TORCH_CUDA_ARCH_LIST before building.

Expect: allowed-imports

Many answers start with `import os; os.environ["TORCH_CUDA_ARCH_LIST"] = "9.0"` to speed up the
build. The kernel itself is fine (exact erf GELU, one thread per element), but a candidate may not
import os: files, processes and the environment all arrive through such imports, and the judge
chooses the architecture itself. The static rules must reject it under allowed-imports.
"""
import os

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

os.environ["TORCH_CUDA_ARCH_LIST"] = "9.0"

cuda_source = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>

__global__ void gelu_kernel(const float* __restrict__ x, float* __restrict__ y, int64_t n) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        float v = x[i];
        y[i] = 0.5f * v * (1.0f + erff(v * 0.70710678118654752440f));
    }
}

torch::Tensor gelu_forward(torch::Tensor x) {
    auto xc = x.contiguous();
    auto y = torch::empty_like(xc);
    int64_t n = xc.numel();
    int threads = 256;
    int64_t blocks = (n + threads - 1) / threads;
    gelu_kernel<<<(unsigned int)blocks, threads, 0, at::cuda::getCurrentCUDAStream()>>>(xc.data_ptr<float>(), y.data_ptr<float>(), n);
    return y;
}
"""

cpp_source = "torch::Tensor gelu_forward(torch::Tensor x);"

ext = load_inline(
    name="kb_gelu_os_environ",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["gelu_forward"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return ext.gelu_forward(x)
