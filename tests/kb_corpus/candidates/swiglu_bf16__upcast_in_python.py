"""silu(gate) * up where forward converts the bf16 inputs to float32 in PyTorch, runs a float
kernel, and converts the result back with .to(torch.bfloat16).

Expect: no-pytorch-compute

"Write the kernel in float, convert around it": gate.float(), up.float() and out.to(bfloat16)
are three PyTorch conversion kernels (each a full pass over memory) doing part of the work, and
dtype conversion is compute, not a view. The float kernel itself is correct. The static rules
must reject it under no-pytorch-compute.
"""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>

__global__ void swiglu_f32_kernel(const float* __restrict__ g, const float* __restrict__ u, float* __restrict__ out, int64_t n) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        const float v = g[i];
        out[i] = v / (1.0f + expf(-v)) * u[i];
    }
}

torch::Tensor swiglu_f32(torch::Tensor g, torch::Tensor u) {
    auto out = torch::empty_like(g);
    const int64_t n = g.numel();
    swiglu_f32_kernel<<<(unsigned int)((n + 255) / 256), 256, 0, at::cuda::getCurrentCUDAStream()>>>(
        g.data_ptr<float>(), u.data_ptr<float>(), out.data_ptr<float>(), n);
    return out;
}
"""

cpp_source = "torch::Tensor swiglu_f32(torch::Tensor g, torch::Tensor u);"

swiglu_ext = load_inline(
    name="kb_swiglu_upcast_python",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["swiglu_f32"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, gate, up):
        g = gate.contiguous().float()
        u = up.contiguous().float()
        out = swiglu_ext.swiglu_f32(g, u)
        return out.to(torch.bfloat16)
