"""relu(x + y) where forward calls .contiguous() on both inputs and a flat kernel does the rest.

Expect: ACCEPTED

The broadcast y (strides (0, 1)) becomes a dense copy of batch x dim floats in forward (a
layout change the judge allows; it costs a 256 MB copy, which the timing will show), and the
kernel is the simplest one possible: one thread per element over the flat arrays, launched on the
default stream with `<<<blocks, threads>>>`. Correct for any layout, because nothing reaches the
kernel that is not contiguous.
"""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_src = r"""
#include <torch/extension.h>

__global__ void add_relu_kernel(const float* a, const float* b, float* out, int64_t n) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        float v = a[i] + b[i];
        out[i] = fmaxf(v, 0.0f);
    }
}

torch::Tensor add_relu_flat(torch::Tensor a, torch::Tensor b) {
    TORCH_CHECK(a.is_contiguous() && b.is_contiguous(), "inputs must be contiguous");
    auto out = torch::empty_like(a);
    int64_t n = a.numel();
    int threads = 256;
    unsigned int blocks = (unsigned int)((n + threads - 1) / threads);
    add_relu_kernel<<<blocks, threads>>>(a.data_ptr<float>(), b.data_ptr<float>(), out.data_ptr<float>(), n);
    return out;
}
"""

cpp_src = "torch::Tensor add_relu_flat(torch::Tensor a, torch::Tensor b);"

ext = load_inline(
    name="kb_add_broadcast_contiguous",
    cpp_sources=cpp_src,
    cuda_sources=cuda_src,
    functions=["add_relu_flat"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x, y):
        x = x.contiguous()
        y = y.contiguous()
        return ext.add_relu_flat(x, y)
