"""Row softmax whose max and sum see only the first blockDim.x (1024) elements of each row.

Expect: MISMATCH

The writer assumed "a row fits in one block": each of 1024 threads loads x[tid] once into shared
memory for the max and sum reductions, and only the final write loop strides over the whole row.
The rows here have 16384 elements, so the max and the normalizer come from the first 1024 alone:
every output is finite but scaled by roughly 16x (and exp(x - max) can exceed 1). It must be
rejected as a mismatch on the very first random input.
"""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

source = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>

#define MAX_THREADS 1024

__global__ void softmax_row_kernel(const float* __restrict__ x, float* __restrict__ y, int cols) {
    __shared__ float buf[MAX_THREADS];
    const int tid = threadIdx.x;
    const float* xr = x + (size_t)blockIdx.x * cols;
    float* yr = y + (size_t)blockIdx.x * cols;

    // one element per thread
    const float v = xr[tid];
    buf[tid] = v;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (tid < s) buf[tid] = fmaxf(buf[tid], buf[tid + s]);
        __syncthreads();
    }
    const float mx = buf[0];
    __syncthreads();

    buf[tid] = expf(v - mx);
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (tid < s) buf[tid] += buf[tid + s];
        __syncthreads();
    }
    const float sum = buf[0];

    for (int i = tid; i < cols; i += blockDim.x) {
        yr[i] = expf(xr[i] - mx) / sum;
    }
}

torch::Tensor softmax_cuda(torch::Tensor x) {
    TORCH_CHECK(x.is_cuda() && x.is_contiguous(), "x must be a contiguous CUDA tensor");
    auto y = torch::empty_like(x);
    const int rows = x.size(0);
    const int cols = x.size(1);
    const int threads = cols < MAX_THREADS ? cols : MAX_THREADS;
    softmax_row_kernel<<<rows, threads, 0, at::cuda::getCurrentCUDAStream()>>>(
        x.data_ptr<float>(), y.data_ptr<float>(), cols);
    return y;
}
"""

cpp_src = "torch::Tensor softmax_cuda(torch::Tensor x);"

softmax_ext = load_inline(
    name="kb_softmax_first_1024",
    cpp_sources=cpp_src,
    cuda_sources=source,
    functions=["softmax_cuda"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return softmax_ext.softmax_cuda(x)
