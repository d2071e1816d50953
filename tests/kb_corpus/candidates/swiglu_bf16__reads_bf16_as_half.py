"""silu(gate) * up for bfloat16 tensors whose kernel reads and writes them as __half.

Expect: MISMATCH|NAN_INF

"16-bit float is 16-bit float": the host reinterprets the bfloat16 storage as __half
(data_ptr() cast to const __half*) and the kernel uses __half2float / __float2half. The two
formats split their bits differently (8 exponent bits against 5), so every value read is a
different number and every value written means something else again. The math in between is
right; the result is garbage on any input. It must be rejected.
"""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>
#include <cuda_fp16.h>
#include <ATen/cuda/CUDAContext.h>

__global__ void swiglu_half_kernel(const __half* __restrict__ gate, const __half* __restrict__ up,
                                   __half* __restrict__ out, int64_t n) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        const float g = __half2float(gate[i]);
        const float u = __half2float(up[i]);
        out[i] = __float2half(g / (1.0f + expf(-g)) * u);
    }
}

torch::Tensor swiglu_16bit(torch::Tensor gate, torch::Tensor up) {
    TORCH_CHECK(gate.is_cuda() && up.is_cuda(), "inputs must be CUDA tensors");
    TORCH_CHECK(gate.element_size() == 2, "expects a 16-bit float type");
    auto g = gate.contiguous();
    auto u = up.contiguous();
    auto out = torch::empty_like(g);
    const int64_t n = g.numel();
    const int threads = 256;
    swiglu_half_kernel<<<(unsigned int)((n + threads - 1) / threads), threads, 0, at::cuda::getCurrentCUDAStream()>>>(
        static_cast<const __half*>(g.data_ptr()), static_cast<const __half*>(u.data_ptr()),
        static_cast<__half*>(out.data_ptr()), n);
    return out;
}
"""

cpp_source = "torch::Tensor swiglu_16bit(torch::Tensor gate, torch::Tensor up);"

ext = load_inline(
    name="kb_swiglu_as_half",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["swiglu_16bit"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, gate, up):
        return ext.swiglu_16bit(gate, up)
