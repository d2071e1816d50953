"""silu(gate) * up for float, double, half and bfloat16 under AT_DISPATCH_FLOATING_TYPES_AND2.

Expect: ACCEPTED

`AT_DISPATCH_FLOATING_TYPES_AND2(at::ScalarType::Half, at::ScalarType::BFloat16, ...)` around a
`template <typename scalar_t>` kernel that widens both operands to float (at::opmath_type),
computes g / (1 + exp(-g)) * u there and rounds once to scalar_t. PyTorch rounds twice (after
silu, after the product), so the two differ by about one bf16 ulp at most: within the judge's
bf16 bound. For very negative g, expf(-g) overflows to inf and the quotient is -0: right.
"""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>
#include <ATen/OpMathType.h>
#include <ATen/cuda/CUDAContext.h>

template <typename scalar_t>
__global__ void swiglu_kernel(const scalar_t* __restrict__ gate, const scalar_t* __restrict__ up,
                              scalar_t* __restrict__ out, int64_t n) {
    using opmath_t = at::opmath_type<scalar_t>;
    const int64_t stride = (int64_t)blockDim.x * gridDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        const opmath_t g = static_cast<opmath_t>(gate[i]);
        const opmath_t u = static_cast<opmath_t>(up[i]);
        const opmath_t silu = g / (opmath_t(1) + exp(-g));
        out[i] = static_cast<scalar_t>(silu * u);
    }
}

torch::Tensor swiglu(torch::Tensor gate, torch::Tensor up) {
    TORCH_CHECK(gate.is_cuda() && up.is_cuda(), "inputs must be CUDA tensors");
    TORCH_CHECK(gate.sizes() == up.sizes(), "gate and up must have the same shape");
    TORCH_CHECK(gate.scalar_type() == up.scalar_type(), "gate and up must have the same dtype");
    auto g = gate.contiguous();
    auto u = up.contiguous();
    auto out = torch::empty_like(g);
    const int64_t n = g.numel();
    const int threads = 256;
    int64_t blocks = (n + threads - 1) / threads;
    if (blocks > 65535) blocks = 65535;
    AT_DISPATCH_FLOATING_TYPES_AND2(at::ScalarType::Half, at::ScalarType::BFloat16, g.scalar_type(), "swiglu", ([&] {
        swiglu_kernel<scalar_t><<<(unsigned int)blocks, threads, 0, at::cuda::getCurrentCUDAStream()>>>(
            g.data_ptr<scalar_t>(), u.data_ptr<scalar_t>(), out.data_ptr<scalar_t>(), n);
    }));
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return out;
}
"""

cpp_source = "torch::Tensor swiglu(torch::Tensor gate, torch::Tensor up);"

swiglu_ext = load_inline(
    name="kb_swiglu_dispatch_and2",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["swiglu"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self):
        super(ModelNew, self).__init__()

    def forward(self, gate, up):
        return swiglu_ext.swiglu(gate, up)
