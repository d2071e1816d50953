"""A correct row softmax kernel whose forward keeps its first output and returns it ever after.

Expect: MISMATCH|REPLAYED_OUTPUT

The kernel is sound (one block per row, warp-shuffle max and sum), but forward caches: "the model
is deterministic, so compute once". The first call is right; any later call returns the first
call's tensor whatever the input. The judge's second input set (or, failing that, its replay
check with fresh values in the same buffers) must catch it: MISMATCH or REPLAYED_OUTPUT.
"""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <cmath>

__inline__ __device__ float warp_max(float v) {
    for (int o = 16; o > 0; o /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffff, v, o));
    return v;
}

__inline__ __device__ float warp_sum(float v) {
    for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffff, v, o);
    return v;
}

__global__ void softmax_kernel(const float* __restrict__ x, float* __restrict__ y, int cols) {
    __shared__ float red[32];
    const float* xr = x + (size_t)blockIdx.x * cols;
    float* yr = y + (size_t)blockIdx.x * cols;
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nwarps = blockDim.x / 32;

    float m = -INFINITY;
    for (int i = threadIdx.x; i < cols; i += blockDim.x) m = fmaxf(m, xr[i]);
    m = warp_max(m);
    if (lane == 0) red[warp] = m;
    __syncthreads();
    m = -INFINITY;
    for (int w = 0; w < nwarps; ++w) m = fmaxf(m, red[w]);
    __syncthreads();

    float s = 0.f;
    for (int i = threadIdx.x; i < cols; i += blockDim.x) s += expf(xr[i] - m);
    s = warp_sum(s);
    if (lane == 0) red[warp] = s;
    __syncthreads();
    s = 0.f;
    for (int w = 0; w < nwarps; ++w) s += red[w];

    const float inv = 1.f / s;
    for (int i = threadIdx.x; i < cols; i += blockDim.x) yr[i] = expf(xr[i] - m) * inv;
}

torch::Tensor softmax_forward(torch::Tensor x) {
    TORCH_CHECK(x.is_cuda(), "x must be a CUDA tensor");
    auto xc = x.contiguous();
    auto y = torch::empty_like(xc);
    softmax_kernel<<<(unsigned int)xc.size(0), 256, 0, at::cuda::getCurrentCUDAStream()>>>(
        xc.data_ptr<float>(), y.data_ptr<float>(), (int)xc.size(1));
    return y;
}
"""

cpp_source = "torch::Tensor softmax_forward(torch::Tensor x);"

ext = load_inline(
    name="kb_softmax_replay",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["softmax_forward"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.cached_output = None

    def forward(self, x):
        # softmax is deterministic: compute once, reuse afterwards
        if self.cached_output is None:
            self.cached_output = ext.softmax_forward(x)
        return self.cached_output
