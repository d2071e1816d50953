"""Scale with float4 loads and stores, a `static inline` host helper for the grid size and an
alignment check on the data pointer; scalar fallback kernel for unaligned or short tensors."""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

source = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <cstdint>

__global__ void scale_vec4_kernel(const float4* __restrict__ in, float4* __restrict__ out, float s, int64_t n4) {
    int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i < n4) {
        float4 v = in[i];
        out[i] = make_float4(v.x * s, v.y * s, v.z * s, v.w * s);
    }
}

__global__ void scale_scalar_kernel(const float* __restrict__ in, float* __restrict__ out, float s, int64_t begin, int64_t n) {
    int64_t i = begin + blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i < n) out[i] = in[i] * s;
}

static inline unsigned int grid_for(int64_t work, int threads) {
    return static_cast<unsigned int>((work + threads - 1) / threads);
}

static inline bool aligned16(const void* p) {
    return reinterpret_cast<std::uintptr_t>(p) % 16 == 0;
}

torch::Tensor scale_forward(torch::Tensor x, double scale) {
    auto xc = x.contiguous();
    auto out = torch::empty_like(xc);
    const int64_t n = xc.numel();
    const float s = static_cast<float>(scale);
    auto stream = at::cuda::getCurrentCUDAStream();
    int64_t done = 0;
    if (aligned16(xc.data_ptr()) && aligned16(out.data_ptr()) && n >= 4) {
        const int64_t n4 = n / 4;
        scale_vec4_kernel<<<grid_for(n4, 256), 256, 0, stream>>>(
            reinterpret_cast<const float4*>(xc.data_ptr<float>()), reinterpret_cast<float4*>(out.data_ptr<float>()), s, n4);
        done = n4 * 4;
    }
    if (done < n) {
        scale_scalar_kernel<<<grid_for(n - done, 256), 256, 0, stream>>>(xc.data_ptr<float>(), out.data_ptr<float>(), s, done, n);
    }
    return out;
}
"""

cpp = "torch::Tensor scale_forward(torch::Tensor x, double scale);"

scale_ext = load_inline(name="scale_float4", cpp_sources=cpp, cuda_sources=source, functions=["scale_forward"],
                        extra_cuda_cflags=["-O3"])


class ModelNew(nn.Module):
    def __init__(self, scale):
        super().__init__()
        self.scale = scale

    def forward(self, x):
        return scale_ext.scale_forward(x, self.scale)
