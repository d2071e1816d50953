"""Exact GELU with float4 loads in a grid-stride loop and a scalar tail for the last n % 4 elements.

Expect: ACCEPTED

Written the way Claude and o3 write elementwise kernels: CHECK_CUDA / CHECK_CONTIGUOUS macros, a
`__device__ __forceinline__` helper computing 0.5 * x * (1 + erf(x / sqrt(2))) (the erf form the
model uses), float4 vectors for the bulk and a scalar loop for the remainder (8191 * 16383
elements leave one), launched on PyTorch's current stream. The extension is loaded in __init__
and kept as self.gelu; forward makes the input contiguous (a no-op here).
"""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

gelu_cuda_source = r"""
#include <torch/extension.h>
#include <cuda_runtime.h>
#include <ATen/cuda/CUDAContext.h>

#define CHECK_CUDA(x) TORCH_CHECK(x.device().is_cuda(), #x " must be a CUDA tensor")
#define CHECK_CONTIGUOUS(x) TORCH_CHECK(x.is_contiguous(), #x " must be contiguous")
#define CHECK_INPUT(x) CHECK_CUDA(x); CHECK_CONTIGUOUS(x)

__device__ __forceinline__ float gelu_erf(float x) {
    // 0.5 * x * (1 + erf(x / sqrt(2)))
    return 0.5f * x * (1.0f + erff(x * 0.70710678118654752440f));
}

__global__ void gelu_vec4_kernel(const float* __restrict__ x, float* __restrict__ y, int64_t n) {
    const int64_t n_vec = n / 4;
    const int64_t stride = (int64_t)blockDim.x * gridDim.x;
    const int64_t tid = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;

    const float4* __restrict__ x4 = reinterpret_cast<const float4*>(x);
    float4* __restrict__ y4 = reinterpret_cast<float4*>(y);
    for (int64_t i = tid; i < n_vec; i += stride) {
        float4 v = x4[i];
        v.x = gelu_erf(v.x);
        v.y = gelu_erf(v.y);
        v.z = gelu_erf(v.z);
        v.w = gelu_erf(v.w);
        y4[i] = v;
    }

    // scalar tail: the last n % 4 elements
    for (int64_t i = n_vec * 4 + tid; i < n; i += stride) {
        y[i] = gelu_erf(x[i]);
    }
}

torch::Tensor gelu_forward(torch::Tensor x) {
    CHECK_INPUT(x);
    TORCH_CHECK(x.scalar_type() == torch::kFloat32, "gelu_forward expects float32");
    auto y = torch::empty_like(x);
    const int64_t n = x.numel();
    if (n == 0) {
        return y;
    }
    const int threads = 256;
    int64_t blocks = (n / 4 + threads - 1) / threads;
    if (blocks < 1) blocks = 1;
    if (blocks > 65535) blocks = 65535;  // grid-stride loop covers the rest
    gelu_vec4_kernel<<<(unsigned int)blocks, threads, 0, at::cuda::getCurrentCUDAStream()>>>(
        x.data_ptr<float>(), y.data_ptr<float>(), n);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return y;
}
"""

gelu_cpp_source = "torch::Tensor gelu_forward(torch::Tensor x);"


class ModelNew(nn.Module):
    def __init__(self):
        super(ModelNew, self).__init__()
        self.gelu = load_inline(
            name="kb_gelu_float4_tail",
            cpp_sources=gelu_cpp_source,
            cuda_sources=gelu_cuda_source,
            functions=["gelu_forward"],
            extra_cuda_cflags=["-O3"],
            verbose=False,
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.gelu.gelu_forward(x.contiguous())
