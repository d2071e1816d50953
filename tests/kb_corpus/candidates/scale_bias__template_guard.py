"""x * y + bias with a `template <int BLOCK_SIZE>` kernel, a device guard and the current stream.

Expect: ACCEPTED

One thread per element; the column index `idx % cols` picks the bias element broadcast over rows.
Habits shown: #include <c10/cuda/CUDAGuard.h> with `const at::cuda::OptionalCUDAGuard
device_guard(device_of(x))`, `template <int BLOCK_SIZE>` launched as kernel<256><<<...>>>,
`.contiguous()` on every operand in the host function, and a ModelNew that creates its bias with
the same `nn.Parameter(torch.randn(dim))` as the model, so that seeded alike the two are equal;
forward passes self.bias to the kernel.
"""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>
#include <cuda_runtime.h>
#include <c10/cuda/CUDAGuard.h>
#include <ATen/cuda/CUDAContext.h>

template <int BLOCK_SIZE>
__global__ void mul_add_bias_kernel(const float* __restrict__ x,
                                    const float* __restrict__ y,
                                    const float* __restrict__ bias,
                                    float* __restrict__ out,
                                    int64_t total,
                                    int64_t cols) {
    const int64_t idx = (int64_t)blockIdx.x * BLOCK_SIZE + threadIdx.x;
    if (idx < total) {
        const int64_t col = idx % cols;
        out[idx] = x[idx] * y[idx] + bias[col];
    }
}

torch::Tensor mul_add_bias(torch::Tensor x, torch::Tensor y, torch::Tensor bias) {
    TORCH_CHECK(x.is_cuda() && y.is_cuda() && bias.is_cuda(), "all inputs must be CUDA tensors");
    TORCH_CHECK(x.sizes() == y.sizes(), "x and y must have the same shape");
    TORCH_CHECK(bias.numel() == x.size(-1), "bias must match the last dimension");
    const at::cuda::OptionalCUDAGuard device_guard(device_of(x));

    auto xc = x.contiguous();
    auto yc = y.contiguous();
    auto bc = bias.contiguous();
    auto out = torch::empty_like(xc);

    const int64_t total = xc.numel();
    const int64_t cols = xc.size(-1);
    constexpr int BLOCK = 256;
    const int64_t blocks = (total + BLOCK - 1) / BLOCK;
    cudaStream_t stream = at::cuda::getCurrentCUDAStream();
    mul_add_bias_kernel<BLOCK><<<(unsigned int)blocks, BLOCK, 0, stream>>>(
        xc.data_ptr<float>(), yc.data_ptr<float>(), bc.data_ptr<float>(), out.data_ptr<float>(), total, cols);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return out;
}
"""

cpp_source = "torch::Tensor mul_add_bias(torch::Tensor x, torch::Tensor y, torch::Tensor bias);"


class ModelNew(nn.Module):
    def __init__(self, dim: int):
        super(ModelNew, self).__init__()
        self.bias = nn.Parameter(torch.randn(dim))
        self.ext = load_inline(
            name="kb_scale_bias_template_guard",
            cpp_sources=cpp_source,
            cuda_sources=cuda_source,
            functions=["mul_add_bias"],
            verbose=False,
        )

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.ext.mul_add_bias(x, y, self.bias)
