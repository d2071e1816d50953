"""LayerNorm kernel with eps hard-coded to 1e-3 where the model's nn.LayerNorm uses 1e-5.

Expect: MISMATCH

Sound structure (one block per row, two-pass mean and variance with warp shuffles, affine
applied), but `#define LN_EPS 1e-3f` is baked in ("a safer epsilon") and the model's eps is never
passed. On rows of randn values (variance about 1) rstd is off by about 5e-4 relative, so every
output of magnitude 1 or more is off by 5e-4 and beyond: far outside float32 rounding. It must be
rejected as a mismatch.
"""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_src = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>

#define LN_EPS 1e-3f

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffff, v, o);
    return v;
}

__device__ float block_sum(float v, float* red) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_sum(v);
    if (lane == 0) red[warp] = v;
    __syncthreads();
    float t = 0.0f;
    for (int w = 0; w < nw; ++w) t += red[w];
    __syncthreads();
    return t;
}

__global__ void layernorm_kernel(const float* __restrict__ x, const float* __restrict__ w,
                                 const float* __restrict__ b, float* __restrict__ y, int cols) {
    __shared__ float red[32];
    const float* xr = x + (size_t)blockIdx.x * cols;
    float* yr = y + (size_t)blockIdx.x * cols;

    float s = 0.0f;
    for (int i = threadIdx.x; i < cols; i += blockDim.x) s += xr[i];
    const float mean = block_sum(s, red) / cols;

    float sq = 0.0f;
    for (int i = threadIdx.x; i < cols; i += blockDim.x) {
        const float d = xr[i] - mean;
        sq += d * d;
    }
    const float var = block_sum(sq, red) / cols;
    const float rstd = rsqrtf(var + LN_EPS);

    for (int i = threadIdx.x; i < cols; i += blockDim.x) {
        yr[i] = (xr[i] - mean) * rstd * w[i] + b[i];
    }
}

torch::Tensor layernorm(torch::Tensor x, torch::Tensor w, torch::Tensor b) {
    TORCH_CHECK(x.is_cuda() && x.is_contiguous(), "x must be a contiguous CUDA tensor");
    const int cols = w.numel();
    const int64_t rows = x.numel() / cols;
    auto y = torch::empty_like(x);
    layernorm_kernel<<<(unsigned int)rows, 256, 0, at::cuda::getCurrentCUDAStream()>>>(
        x.data_ptr<float>(), w.data_ptr<float>(), b.data_ptr<float>(), y.data_ptr<float>(), cols);
    return y;
}
"""

cpp_src = "torch::Tensor layernorm(torch::Tensor x, torch::Tensor w, torch::Tensor b);"

layernorm_ext = load_inline(
    name="kb_layernorm_eps_1e3",
    cpp_sources=cpp_src,
    cuda_sources=cuda_src,
    functions=["layernorm"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self, normalized_shape):
        super().__init__()
        self.ln = nn.LayerNorm(normalized_shape)

    def forward(self, x):
        return layernorm_ext.layernorm(x, self.ln.weight, self.ln.bias)
