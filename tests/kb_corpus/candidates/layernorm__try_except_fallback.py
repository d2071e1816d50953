"""A LayerNorm kernel called inside try, with F.layer_norm as the fallback in except.

Expect: no-try-except

"Robustness": if the extension raises (unsupported shape, build trouble), forward quietly returns
PyTorch's layer_norm instead. Whether or not the kernel works, the program scores as correct, so
the judge forbids try/except outright; the fallback is PyTorch compute as well. The static rules
must reject it under no-try-except.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>

__global__ void ln_kernel(const float* __restrict__ x, const float* __restrict__ g, const float* __restrict__ b,
                          float* __restrict__ y, int cols, float eps) {
    __shared__ float red[256];
    const float* xr = x + (size_t)blockIdx.x * cols;
    float* yr = y + (size_t)blockIdx.x * cols;
    float s = 0.f;
    for (int i = threadIdx.x; i < cols; i += blockDim.x) s += xr[i];
    red[threadIdx.x] = s;
    __syncthreads();
    for (int k = blockDim.x / 2; k > 0; k >>= 1) {
        if (threadIdx.x < k) red[threadIdx.x] += red[threadIdx.x + k];
        __syncthreads();
    }
    const float mean = red[0] / cols;
    __syncthreads();
    float q = 0.f;
    for (int i = threadIdx.x; i < cols; i += blockDim.x) { float d = xr[i] - mean; q += d * d; }
    red[threadIdx.x] = q;
    __syncthreads();
    for (int k = blockDim.x / 2; k > 0; k >>= 1) {
        if (threadIdx.x < k) red[threadIdx.x] += red[threadIdx.x + k];
        __syncthreads();
    }
    const float rstd = rsqrtf(red[0] / cols + eps);
    for (int i = threadIdx.x; i < cols; i += blockDim.x) yr[i] = (xr[i] - mean) * rstd * g[i] + b[i];
}

torch::Tensor ln_forward(torch::Tensor x, torch::Tensor g, torch::Tensor b, double eps) {
    auto y = torch::empty_like(x);
    const int cols = g.numel();
    ln_kernel<<<(unsigned int)(x.numel() / cols), 256, 0, at::cuda::getCurrentCUDAStream()>>>(
        x.data_ptr<float>(), g.data_ptr<float>(), b.data_ptr<float>(), y.data_ptr<float>(), cols, (float)eps);
    return y;
}
"""

cpp_source = "torch::Tensor ln_forward(torch::Tensor x, torch::Tensor g, torch::Tensor b, double eps);"

ln_ext = load_inline(
    name="kb_layernorm_try_except",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["ln_forward"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self, normalized_shape):
        super().__init__()
        self.ln = nn.LayerNorm(normalized_shape)

    def forward(self, x):
        try:
            return ln_ext.ln_forward(x.contiguous(), self.ln.weight, self.ln.bias, self.ln.eps)
        except Exception:
            return F.layer_norm(x, self.ln.normalized_shape, self.ln.weight, self.ln.bias, self.ln.eps)
