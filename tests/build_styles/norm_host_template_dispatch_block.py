"""L2 row normalization: a host function template `launch_l2norm<scalar_t, BLOCK>` called under
AT_DISPATCH_FLOATING_TYPES_AND_HALF with the block size chosen by a switch; the kernel is
`template <typename scalar_t, int BLOCK>` with a static shared array of floats."""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

l2norm_source = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

template <typename scalar_t, int BLOCK>
__global__ void l2norm_kernel(const scalar_t* __restrict__ x, scalar_t* __restrict__ y, int64_t cols, float eps) {
    __shared__ float partial[BLOCK];
    const scalar_t* xr = x + blockIdx.x * cols;
    scalar_t* yr = y + blockIdx.x * cols;
    float s = 0.f;
    for (int64_t i = threadIdx.x; i < cols; i += BLOCK) {
        const float v = static_cast<float>(xr[i]);
        s += v * v;
    }
    partial[threadIdx.x] = s;
    __syncthreads();
    for (int k = BLOCK / 2; k > 0; k >>= 1) {
        if (threadIdx.x < k) partial[threadIdx.x] += partial[threadIdx.x + k];
        __syncthreads();
    }
    const float inv = 1.f / fmaxf(sqrtf(partial[0]), eps);
    for (int64_t i = threadIdx.x; i < cols; i += BLOCK) yr[i] = static_cast<scalar_t>(static_cast<float>(xr[i]) * inv);
}

template <typename scalar_t, int BLOCK>
void launch_l2norm(const torch::Tensor& x, torch::Tensor& y, float eps) {
    const int64_t cols = x.size(-1);
    const int64_t rows = x.numel() / cols;
    l2norm_kernel<scalar_t, BLOCK><<<rows, BLOCK, 0, at::cuda::getCurrentCUDAStream()>>>(
        x.data_ptr<scalar_t>(), y.data_ptr<scalar_t>(), cols, eps);
}

torch::Tensor l2_normalize(torch::Tensor x, double eps) {
    const at::cuda::CUDAGuard guard(x.device());
    auto xc = x.contiguous();
    auto y = torch::empty_like(xc);
    const int64_t cols = xc.size(-1);
    const int block = cols >= 2048 ? 512 : (cols >= 512 ? 256 : 128);
    AT_DISPATCH_FLOATING_TYPES_AND_HALF(xc.scalar_type(), "l2_normalize", [&] {
        switch (block) {
            case 512: launch_l2norm<scalar_t, 512>(xc, y, (float)eps); break;
            case 256: launch_l2norm<scalar_t, 256>(xc, y, (float)eps); break;
            default: launch_l2norm<scalar_t, 128>(xc, y, (float)eps); break;
        }
    });
    return y;
}
"""

l2norm_cpp = "torch::Tensor l2_normalize(torch::Tensor x, double eps);"

l2norm_ext = load_inline(name="l2norm_tmpl", cpp_sources=l2norm_cpp, cuda_sources=l2norm_source,
                         functions=["l2_normalize"], verbose=False)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return l2norm_ext.l2_normalize(x, 1e-12)
