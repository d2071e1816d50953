"""Elementwise add with the launch hidden in a macro, `#define LAUNCH_ADD(BS) add_kernel<BS><<<...>>>(...)`,
used in a switch over block sizes."""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

elementwise_add_source = """
#include <torch/extension.h>
#include <cuda_runtime.h>

template <int BS>
__global__ void add_kernel(const float* a, const float* b, float* out, int size) {
    int idx = blockIdx.x * BS + threadIdx.x;
    if (idx < size) {
        out[idx] = a[idx] + b[idx];
    }
}

#define LAUNCH_ADD(BS) \\
    add_kernel<BS><<<(size + BS - 1) / BS, BS>>>(a.data_ptr<float>(), b.data_ptr<float>(), out.data_ptr<float>(), size)

torch::Tensor elementwise_add_cuda(torch::Tensor a, torch::Tensor b) {
    auto size = a.numel();
    auto out = torch::zeros_like(a);
    int block_size = size >= (1 << 20) ? 512 : 256;
    switch (block_size) {
        case 512:
            LAUNCH_ADD(512);
            break;
        default:
            LAUNCH_ADD(256);
            break;
    }
    return out;
}
"""

elementwise_add_cpp_source = "torch::Tensor elementwise_add_cuda(torch::Tensor a, torch::Tensor b);"

elementwise_add = load_inline(
    name="elementwise_add",
    cpp_sources=elementwise_add_cpp_source,
    cuda_sources=elementwise_add_source,
    functions=["elementwise_add_cuda"],
    verbose=True,
    extra_cflags=[""],
    extra_ldflags=[""],
)


class ModelNew(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.elementwise_add = elementwise_add

    def forward(self, a, b):
        return self.elementwise_add.elementwise_add_cuda(a, b)
