"""x * y + bias with float4 loads of x, y and the bias row, a scalar tail, built with --use_fast_math.

Expect: ACCEPTED

A bandwidth-minded answer: when the row length is a multiple of 4 every float4 of the flat tensor
lies inside one row, so the matching 4 bias values are one aligned float4 at `(4 * i) % cols`; a
second kernel handles what the vectors leave (the n % 4 tail, or everything when cols % 4 != 0).
Habits shown: a module-level `fused = load_inline(...)` called as `fused.scale_bias(x, y,
self.bias)`, extra_cuda_cflags=["-O3", "--use_fast_math"] (harmless here: multiply-add only).
"""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

scale_bias_source = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>

#define CHECK_CUDA(x) TORCH_CHECK(x.device().is_cuda(), #x " must be a CUDA tensor")
#define CHECK_CONTIGUOUS(x) TORCH_CHECK(x.is_contiguous(), #x " must be contiguous")

__global__ void scale_bias_vec4_kernel(const float4* __restrict__ x,
                                       const float4* __restrict__ y,
                                       const float* __restrict__ bias,
                                       float4* __restrict__ out,
                                       int64_t n_vec,
                                       int64_t cols) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n_vec) {
        const int64_t col = (i * 4) % cols;   // cols % 4 == 0: the 4 lanes share one row
        const float4 a = x[i];
        const float4 b = y[i];
        const float4 c = *reinterpret_cast<const float4*>(bias + col);
        float4 r;
        r.x = a.x * b.x + c.x;
        r.y = a.y * b.y + c.y;
        r.z = a.z * b.z + c.z;
        r.w = a.w * b.w + c.w;
        out[i] = r;
    }
}

__global__ void scale_bias_scalar_kernel(const float* __restrict__ x,
                                         const float* __restrict__ y,
                                         const float* __restrict__ bias,
                                         float* __restrict__ out,
                                         int64_t start,
                                         int64_t n,
                                         int64_t cols) {
    const int64_t i = start + (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        out[i] = x[i] * y[i] + bias[i % cols];
    }
}

torch::Tensor scale_bias(torch::Tensor x, torch::Tensor y, torch::Tensor bias) {
    CHECK_CUDA(x); CHECK_CUDA(y); CHECK_CUDA(bias);
    auto xc = x.contiguous();
    auto yc = y.contiguous();
    auto bc = bias.contiguous();
    CHECK_CONTIGUOUS(xc); CHECK_CONTIGUOUS(yc); CHECK_CONTIGUOUS(bc);
    auto out = torch::empty_like(xc);

    const int64_t n = xc.numel();
    const int64_t cols = xc.size(-1);
    const int threads = 256;
    cudaStream_t stream = at::cuda::getCurrentCUDAStream();

    int64_t n_vec = (cols % 4 == 0) ? n / 4 : 0;
    if (n_vec > 0) {
        const int64_t blocks = (n_vec + threads - 1) / threads;
        scale_bias_vec4_kernel<<<(unsigned int)blocks, threads, 0, stream>>>(
            reinterpret_cast<const float4*>(xc.data_ptr<float>()),
            reinterpret_cast<const float4*>(yc.data_ptr<float>()),
            bc.data_ptr<float>(),
            reinterpret_cast<float4*>(out.data_ptr<float>()),
            n_vec, cols);
    }
    const int64_t start = n_vec * 4;
    const int64_t rest = n - start;
    if (rest > 0) {
        const int64_t blocks = (rest + threads - 1) / threads;
        scale_bias_scalar_kernel<<<(unsigned int)blocks, threads, 0, stream>>>(
            xc.data_ptr<float>(), yc.data_ptr<float>(), bc.data_ptr<float>(), out.data_ptr<float>(),
            start, n, cols);
    }
    return out;
}
"""

scale_bias_cpp = "torch::Tensor scale_bias(torch::Tensor x, torch::Tensor y, torch::Tensor bias);"

fused = load_inline(
    name="kb_scale_bias_float4",
    cpp_sources=scale_bias_cpp,
    cuda_sources=scale_bias_source,
    functions=["scale_bias"],
    extra_cuda_cflags=["-O3", "--use_fast_math"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self, dim):
        super(ModelNew, self).__init__()
        self.bias = nn.Parameter(torch.randn(dim))

    def forward(self, x, y):
        return fused.scale_bias(x, y, self.bias)
