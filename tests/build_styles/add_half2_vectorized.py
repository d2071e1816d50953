"""fp16 add with `__half2` loads (__hadd2), the at::Half data pointers reinterpreted as __half2 and
__half, an odd tail handled by one thread; cuda_fp16.h intrinsics."""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

half_add_source = r"""
#include <torch/extension.h>
#include <cuda_fp16.h>
#include <ATen/cuda/CUDAContext.h>

__global__ void half2_add_kernel(const __half2* __restrict__ a, const __half2* __restrict__ b, __half2* __restrict__ c, int n2) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n2) {
        c[i] = __hadd2(a[i], b[i]);
    }
}

__global__ void half_tail_kernel(const __half* __restrict__ a, const __half* __restrict__ b, __half* __restrict__ c, int idx) {
    c[idx] = __float2half(__half2float(a[idx]) + __half2float(b[idx]));
}

torch::Tensor half_add(torch::Tensor a, torch::Tensor b) {
    TORCH_CHECK(a.scalar_type() == at::kHalf && b.scalar_type() == at::kHalf, "half tensors expected");
    auto ac = a.contiguous();
    auto bc = b.contiguous();
    auto c = torch::empty_like(ac);
    const int n = ac.numel();
    const int n2 = n / 2;
    auto stream = at::cuda::getCurrentCUDAStream();
    if (n2 > 0) {
        half2_add_kernel<<<(n2 + 255) / 256, 256, 0, stream>>>(
            reinterpret_cast<const __half2*>(ac.data_ptr<at::Half>()),
            reinterpret_cast<const __half2*>(bc.data_ptr<at::Half>()),
            reinterpret_cast<__half2*>(c.data_ptr<at::Half>()), n2);
    }
    if (n % 2) {
        half_tail_kernel<<<1, 1, 0, stream>>>(reinterpret_cast<const __half*>(ac.data_ptr<at::Half>()),
                                              reinterpret_cast<const __half*>(bc.data_ptr<at::Half>()),
                                              reinterpret_cast<__half*>(c.data_ptr<at::Half>()), n - 1);
    }
    return c;
}
"""

half_add_cpp = "torch::Tensor half_add(torch::Tensor a, torch::Tensor b);"

half_add_ext = load_inline(name="half2_add", cpp_sources=half_add_cpp, cuda_sources=half_add_source,
                           functions=["half_add"], verbose=False)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a, b):
        return half_add_ext.half_add(a, b)
