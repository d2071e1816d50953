"""An RMSNorm kernel program that pastes the reference Model and subclasses it for ModelNew.

Expect: no-reference-model

Models often repeat the problem's `class Model` above their answer and write
`class ModelNew(Model)` to inherit __init__ (the weight and eps). The kernel is a plain one block
per row RMSNorm, but inheriting (or calling) the reference is how a program returns the right
answer with no kernel at all, so any use of the name Model is forbidden. The static rules must
reject it under no-reference-model.
"""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>

__global__ void rmsnorm_kernel(const float* __restrict__ x, const float* __restrict__ w, float* __restrict__ y,
                               int cols, float eps) {
    __shared__ float buf[256];
    const float* xr = x + (size_t)blockIdx.x * cols;
    float* yr = y + (size_t)blockIdx.x * cols;
    float s = 0.f;
    for (int i = threadIdx.x; i < cols; i += blockDim.x) s += xr[i] * xr[i];
    buf[threadIdx.x] = s;
    __syncthreads();
    for (int k = blockDim.x / 2; k > 0; k >>= 1) {
        if (threadIdx.x < k) buf[threadIdx.x] += buf[threadIdx.x + k];
        __syncthreads();
    }
    const float rstd = rsqrtf(buf[0] / cols + eps);
    for (int i = threadIdx.x; i < cols; i += blockDim.x) yr[i] = w[i] * (xr[i] * rstd);
}

torch::Tensor rmsnorm_cuda(torch::Tensor x, torch::Tensor w, double eps) {
    auto xc = x.contiguous();
    auto y = torch::empty_like(xc);
    const int cols = xc.size(-1);
    rmsnorm_kernel<<<(unsigned int)(xc.numel() / cols), 256, 0, at::cuda::getCurrentCUDAStream()>>>(
        xc.data_ptr<float>(), w.data_ptr<float>(), y.data_ptr<float>(), cols, (float)eps);
    return y;
}
"""

cpp_source = "torch::Tensor rmsnorm_cuda(torch::Tensor x, torch::Tensor w, double eps);"

rmsnorm_ext = load_inline(
    name="kb_rmsnorm_subclass",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["rmsnorm_cuda"],
    verbose=False,
)


class Model(nn.Module):
    def __init__(self, hidden_size: int, eps: float = 1e-6):
        super(Model, self).__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        variance = x.pow(2).mean(-1, keepdim=True)
        x = x * torch.rsqrt(variance + self.eps)
        return self.weight * x


class ModelNew(Model):
    def forward(self, x):
        return rmsnorm_ext.rmsnorm_cuda(x, self.weight, self.eps)
