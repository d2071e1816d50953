"""silu(gate) * up computed correctly in float, but returned as a float32 tensor for bf16 inputs.

Expect: DTYPE_MISMATCH

The writer keeps the float result "for accuracy": the output is allocated with
`gate.options().dtype(torch::kFloat32)` and written without rounding to bfloat16. The values are
right (better than the model's), but the model returns bfloat16 and a program that changes the
output dtype breaks whatever consumes it. It must be rejected as DTYPE_MISMATCH.
"""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>
#include <cuda_bf16.h>
#include <ATen/cuda/CUDAContext.h>

__global__ void swiglu_f32_out_kernel(const __nv_bfloat16* __restrict__ gate, const __nv_bfloat16* __restrict__ up,
                                      float* __restrict__ out, int64_t n) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        const float g = __bfloat162float(gate[i]);
        const float u = __bfloat162float(up[i]);
        out[i] = g / (1.0f + expf(-g)) * u;
    }
}

torch::Tensor swiglu_fp32_out(torch::Tensor gate, torch::Tensor up) {
    TORCH_CHECK(gate.is_cuda() && up.is_cuda(), "inputs must be CUDA tensors");
    auto g = gate.contiguous();
    auto u = up.contiguous();
    auto out = torch::empty(g.sizes(), g.options().dtype(torch::kFloat32));
    const int64_t n = g.numel();
    const int threads = 256;
    swiglu_f32_out_kernel<<<(unsigned int)((n + threads - 1) / threads), threads, 0, at::cuda::getCurrentCUDAStream()>>>(
        reinterpret_cast<const __nv_bfloat16*>(g.data_ptr<at::BFloat16>()),
        reinterpret_cast<const __nv_bfloat16*>(u.data_ptr<at::BFloat16>()),
        out.data_ptr<float>(), n);
    return out;
}
"""

cpp_source = "torch::Tensor swiglu_fp32_out(torch::Tensor gate, torch::Tensor up);"

swiglu_ext = load_inline(
    name="kb_swiglu_fp32_out",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["swiglu_fp32_out"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, gate, up):
        return swiglu_ext.swiglu_fp32_out(gate, up)
