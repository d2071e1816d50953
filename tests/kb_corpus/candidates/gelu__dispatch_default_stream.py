"""Exact GELU as a templated kernel under AT_DISPATCH_FLOATING_TYPES, launched on the default stream.

Expect: ACCEPTED

The textbook KernelBench answer (Kevin-32B and DeepSeek write it this way): one thread per element,
`template <typename scalar_t>`, erf in the kernel's own type, a plain `<<<blocks, threads>>>` launch
with no stream argument, and a module-level `gelu_ext = load_inline(...)` that forward calls.
The bounds check `idx < size` covers the odd element count.
"""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = """
#include <torch/extension.h>
#include <cuda.h>
#include <cuda_runtime.h>

template <typename scalar_t>
__global__ void gelu_kernel(const scalar_t* __restrict__ input, scalar_t* __restrict__ output, size_t size) {
    const size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx < size) {
        const scalar_t x = input[idx];
        const scalar_t kInvSqrt2 = static_cast<scalar_t>(0.70710678118654752440);
        output[idx] = static_cast<scalar_t>(0.5) * x * (static_cast<scalar_t>(1.0) + erf(x * kInvSqrt2));
    }
}

torch::Tensor gelu_cuda(torch::Tensor input) {
    TORCH_CHECK(input.is_cuda(), "input must be a CUDA tensor");
    auto x = input.contiguous();
    auto output = torch::empty_like(x);
    const size_t size = x.numel();
    const int threads = 1024;
    const int blocks = (int)((size + threads - 1) / threads);

    AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "gelu_cuda", ([&] {
        gelu_kernel<scalar_t><<<blocks, threads>>>(
            x.data_ptr<scalar_t>(),
            output.data_ptr<scalar_t>(),
            size);
    }));

    return output;
}
"""

cpp_source = "torch::Tensor gelu_cuda(torch::Tensor input);"

gelu_ext = load_inline(
    name="kb_gelu_dispatch",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["gelu_cuda"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self):
        super(ModelNew, self).__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return gelu_ext.gelu_cuda(x)
