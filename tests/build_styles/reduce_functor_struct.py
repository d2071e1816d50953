"""Generic row reduction with functor structs (`struct SumOp { __device__ float operator()(...) }`,
MaxOp) passed to `template <typename Op> __global__` kernels by value and launched as k<SumOp>."""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

reduce_source = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <cfloat>

struct SumOp {
    __device__ __forceinline__ float operator()(float a, float b) const { return a + b; }
    static constexpr float identity = 0.0f;
};

struct MaxOp {
    __device__ __forceinline__ float operator()(float a, float b) const { return fmaxf(a, b); }
    static constexpr float identity = -FLT_MAX;
};

template <typename Op>
__device__ float block_reduce(float v, Op op) {
    __shared__ float warp_vals[32];
    for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_down_sync(0xffffffff, v, o));
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) warp_vals[warp] = v;
    __syncthreads();
    v = threadIdx.x < (blockDim.x + 31) / 32 ? warp_vals[lane] : Op::identity;
    if (warp == 0) {
        for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_down_sync(0xffffffff, v, o));
    }
    return v;
}

template <typename Op>
__global__ void row_reduce_kernel(const float* __restrict__ x, float* __restrict__ out, int cols, Op op) {
    const float* r = x + (size_t)blockIdx.x * cols;
    float acc = Op::identity;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) acc = op(acc, r[c]);
    acc = block_reduce(acc, op);
    if (threadIdx.x == 0) out[blockIdx.x] = acc;
}

torch::Tensor row_reduce(torch::Tensor x, int64_t mode) {
    auto xc = x.contiguous();
    const int cols = xc.size(-1);
    const int rows = xc.numel() / cols;
    auto out = torch::empty({rows}, xc.options());
    auto stream = at::cuda::getCurrentCUDAStream();
    if (mode == 0) {
        row_reduce_kernel<SumOp><<<rows, 256, 0, stream>>>(xc.data_ptr<float>(), out.data_ptr<float>(), cols, SumOp{});
    } else {
        row_reduce_kernel<MaxOp><<<rows, 256, 0, stream>>>(xc.data_ptr<float>(), out.data_ptr<float>(), cols, MaxOp{});
    }
    return out;
}
"""

reduce_cpp = "torch::Tensor row_reduce(torch::Tensor x, int64_t mode);"

reduce_ext = load_inline(name="row_reduce_functor", cpp_sources=reduce_cpp, cuda_sources=reduce_source,
                         functions=["row_reduce"], verbose=False)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return reduce_ext.row_reduce(x, 0) - reduce_ext.row_reduce(x, 1)
