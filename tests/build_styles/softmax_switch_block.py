"""Row softmax, `template <int BLOCK_SIZE>` with a switch over block sizes in the host function,
static shared memory sized by the template parameter."""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

softmax_source = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <cfloat>

template <int BLOCK_SIZE>
__global__ void softmax_kernel(const float* __restrict__ x, float* __restrict__ y, int cols) {
    __shared__ float sdata[BLOCK_SIZE];
    const int row = blockIdx.x;
    const int tid = threadIdx.x;
    const float* xr = x + (size_t)row * cols;
    float* yr = y + (size_t)row * cols;

    float local_max = -FLT_MAX;
    for (int i = tid; i < cols; i += BLOCK_SIZE) local_max = fmaxf(local_max, xr[i]);
    sdata[tid] = local_max;
    __syncthreads();
    #pragma unroll
    for (int s = BLOCK_SIZE / 2; s > 0; s >>= 1) {
        if (tid < s) sdata[tid] = fmaxf(sdata[tid], sdata[tid + s]);
        __syncthreads();
    }
    const float row_max = sdata[0];
    __syncthreads();

    float local_sum = 0.0f;
    for (int i = tid; i < cols; i += BLOCK_SIZE) local_sum += __expf(xr[i] - row_max);
    sdata[tid] = local_sum;
    __syncthreads();
    #pragma unroll
    for (int s = BLOCK_SIZE / 2; s > 0; s >>= 1) {
        if (tid < s) sdata[tid] += sdata[tid + s];
        __syncthreads();
    }
    const float inv = 1.0f / sdata[0];
    for (int i = tid; i < cols; i += BLOCK_SIZE) yr[i] = __expf(xr[i] - row_max) * inv;
}

torch::Tensor softmax_cuda(torch::Tensor x) {
    TORCH_CHECK(x.is_cuda(), "x must be a CUDA tensor");
    TORCH_CHECK(x.dim() == 2, "x must be 2D");
    auto xc = x.contiguous();
    auto y = torch::empty_like(xc);
    const int rows = xc.size(0);
    const int cols = xc.size(1);
    int threads = 32;
    while (threads < cols && threads < 1024) threads <<= 1;
    cudaStream_t stream = at::cuda::getCurrentCUDAStream();
    switch (threads) {
        case 1024: softmax_kernel<1024><<<rows, 1024, 0, stream>>>(xc.data_ptr<float>(), y.data_ptr<float>(), cols); break;
        case 512: softmax_kernel<512><<<rows, 512, 0, stream>>>(xc.data_ptr<float>(), y.data_ptr<float>(), cols); break;
        case 256: softmax_kernel<256><<<rows, 256, 0, stream>>>(xc.data_ptr<float>(), y.data_ptr<float>(), cols); break;
        case 128: softmax_kernel<128><<<rows, 128, 0, stream>>>(xc.data_ptr<float>(), y.data_ptr<float>(), cols); break;
        case 64: softmax_kernel<64><<<rows, 64, 0, stream>>>(xc.data_ptr<float>(), y.data_ptr<float>(), cols); break;
        default: softmax_kernel<32><<<rows, 32, 0, stream>>>(xc.data_ptr<float>(), y.data_ptr<float>(), cols); break;
    }
    return y;
}
"""

softmax_cpp = "torch::Tensor softmax_cuda(torch::Tensor x);"

softmax_module = load_inline(
    name="softmax_switch",
    cpp_sources=softmax_cpp,
    cuda_sources=softmax_source,
    functions=["softmax_cuda"],
    extra_cuda_cflags=["-O3", "--use_fast_math"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return softmax_module.softmax_cuda(x)
