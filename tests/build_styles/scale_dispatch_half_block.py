"""Scale-and-shift, `template <typename scalar_t, int BLOCK_SIZE>` under
AT_DISPATCH_FLOATING_TYPES_AND_HALF, the block size a local `constexpr` declared before the dispatch."""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

source = """
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>

template <typename scalar_t, int BLOCK_SIZE>
__global__ void scale_shift_kernel(const scalar_t* __restrict__ in, scalar_t* __restrict__ out,
                                   float scale, float shift, int64_t numel) {
    const int64_t idx = static_cast<int64_t>(blockIdx.x) * BLOCK_SIZE + threadIdx.x;
    if (idx < numel) {
        out[idx] = static_cast<scalar_t>(static_cast<float>(in[idx]) * scale + shift);
    }
}

torch::Tensor scale_shift(torch::Tensor input, double scale, double shift) {
    TORCH_CHECK(input.is_cuda(), "input must be a CUDA tensor");
    TORCH_CHECK(input.is_contiguous(), "input must be contiguous");
    auto output = torch::empty_like(input);
    const int64_t numel = input.numel();
    constexpr int kBlockSize = 256;
    const int64_t grid = (numel + kBlockSize - 1) / kBlockSize;
    AT_DISPATCH_FLOATING_TYPES_AND_HALF(input.scalar_type(), "scale_shift", ([&] {
        scale_shift_kernel<scalar_t, kBlockSize><<<grid, kBlockSize, 0, at::cuda::getCurrentCUDAStream()>>>(
            input.data_ptr<scalar_t>(), output.data_ptr<scalar_t>(), (float)scale, (float)shift, numel);
    }));
    return output;
}
"""

cpp_source = "torch::Tensor scale_shift(torch::Tensor input, double scale, double shift);"

scale_shift_module = load_inline(
    name="scale_shift_half",
    cpp_sources=[cpp_source],
    cuda_sources=[source],
    functions=["scale_shift"],
    with_cuda=True,
    extra_cuda_cflags=["-O2"],
)


class ModelNew(nn.Module):
    def __init__(self, scale: float, shift: float):
        super().__init__()
        self.scale = scale
        self.shift = shift

    def forward(self, x):
        return scale_shift_module.scale_shift(x.contiguous(), self.scale, self.shift)
