"""Classic parallel reduction (`template <unsigned int blockSize>` with warp unrolling through a
volatile pointer), the switch over block sizes inside a torch-free host function that launches it;
the torch wrapper finishes with a second pass."""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

reduce_cuda = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>

template <unsigned int blockSize>
__device__ void warpReduce(volatile float* sdata, unsigned int tid) {
    if (blockSize >= 64) sdata[tid] += sdata[tid + 32];
    if (blockSize >= 32) sdata[tid] += sdata[tid + 16];
    if (blockSize >= 16) sdata[tid] += sdata[tid + 8];
    if (blockSize >= 8) sdata[tid] += sdata[tid + 4];
    if (blockSize >= 4) sdata[tid] += sdata[tid + 2];
    if (blockSize >= 2) sdata[tid] += sdata[tid + 1];
}

template <unsigned int blockSize>
__global__ void reduce6(const float* g_idata, float* g_odata, unsigned int n) {
    extern __shared__ float sdata[];
    unsigned int tid = threadIdx.x;
    unsigned int i = blockIdx.x * (blockSize * 2) + tid;
    unsigned int gridSize = blockSize * 2 * gridDim.x;
    float sum = 0.0f;
    while (i < n) {
        sum += g_idata[i];
        if (i + blockSize < n) sum += g_idata[i + blockSize];
        i += gridSize;
    }
    sdata[tid] = sum;
    __syncthreads();
    if (blockSize >= 512) { if (tid < 256) { sdata[tid] += sdata[tid + 256]; } __syncthreads(); }
    if (blockSize >= 256) { if (tid < 128) { sdata[tid] += sdata[tid + 128]; } __syncthreads(); }
    if (blockSize >= 128) { if (tid < 64) { sdata[tid] += sdata[tid + 64]; } __syncthreads(); }
    if (tid < 32) warpReduce<blockSize>(sdata, tid);
    if (tid == 0) g_odata[blockIdx.x] = sdata[0];
}

void reduce_launch(int threads, int blocks, const float* in, float* out, unsigned int n, cudaStream_t stream) {
    size_t smem = threads * sizeof(float);
    switch (threads) {
        case 512: reduce6<512><<<blocks, 512, smem, stream>>>(in, out, n); break;
        case 256: reduce6<256><<<blocks, 256, smem, stream>>>(in, out, n); break;
        case 128: reduce6<128><<<blocks, 128, smem, stream>>>(in, out, n); break;
        case 64: reduce6<64><<<blocks, 64, smem, stream>>>(in, out, n); break;
    }
}

torch::Tensor total_sum(torch::Tensor x) {
    auto xc = x.contiguous().view(-1);
    const unsigned int n = xc.numel();
    const int threads = 256;
    const int blocks = 128;
    auto partial = torch::empty({blocks}, xc.options());
    auto out = torch::empty({1}, xc.options());
    cudaStream_t stream = at::cuda::getCurrentCUDAStream();
    reduce_launch(threads, blocks, xc.data_ptr<float>(), partial.data_ptr<float>(), n, stream);
    reduce_launch(64, 1, partial.data_ptr<float>(), out.data_ptr<float>(), blocks, stream);
    return out.squeeze();
}
"""

reduce_cpp = "torch::Tensor total_sum(torch::Tensor x);"

reduce_ext = load_inline(name="reduce6_sum", cpp_sources=reduce_cpp, cuda_sources=reduce_cuda, functions=["total_sum"])


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return reduce_ext.total_sum(x)
