"""Row softmax, one block per row, max and sum by a tree reduction in dynamic shared memory.

Expect: ACCEPTED

The classic three-phase answer: each of 256 threads strides over the row for its local max, an
`extern __shared__ float sdata[]` tree reduction (size given at launch as threads * sizeof(float))
gives the row max, the same for the sum of exp(x - max), then every element is written as
exp(x - max) * (1 / sum). A __syncthreads() after reading sdata[0] keeps the second reduction from
overwriting it early. Launched on the current stream; forward uses self.ext.
"""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

softmax_source = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <cmath>

__global__ void softmax_kernel(const float* __restrict__ input, float* __restrict__ output, int cols) {
    extern __shared__ float sdata[];
    const int tid = threadIdx.x;
    const float* x = input + (size_t)blockIdx.x * cols;
    float* y = output + (size_t)blockIdx.x * cols;

    // 1. row max
    float local_max = -INFINITY;
    for (int i = tid; i < cols; i += blockDim.x) {
        local_max = fmaxf(local_max, x[i]);
    }
    sdata[tid] = local_max;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (tid < s) {
            sdata[tid] = fmaxf(sdata[tid], sdata[tid + s]);
        }
        __syncthreads();
    }
    const float row_max = sdata[0];
    __syncthreads();

    // 2. sum of exp(x - max)
    float local_sum = 0.0f;
    for (int i = tid; i < cols; i += blockDim.x) {
        local_sum += expf(x[i] - row_max);
    }
    sdata[tid] = local_sum;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (tid < s) {
            sdata[tid] += sdata[tid + s];
        }
        __syncthreads();
    }
    const float inv_sum = 1.0f / sdata[0];

    // 3. normalize
    for (int i = tid; i < cols; i += blockDim.x) {
        y[i] = expf(x[i] - row_max) * inv_sum;
    }
}

torch::Tensor softmax_forward(torch::Tensor x) {
    TORCH_CHECK(x.is_cuda(), "x must be a CUDA tensor");
    TORCH_CHECK(x.dim() == 2, "x must be 2D");
    auto xc = x.contiguous();
    auto out = torch::empty_like(xc);
    const int rows = xc.size(0);
    const int cols = xc.size(1);
    const int threads = 256;  // a power of two: the tree reduction halves it
    const size_t smem = threads * sizeof(float);
    softmax_kernel<<<rows, threads, smem, at::cuda::getCurrentCUDAStream()>>>(
        xc.data_ptr<float>(), out.data_ptr<float>(), cols);
    return out;
}
"""

softmax_cpp = "torch::Tensor softmax_forward(torch::Tensor x);"


class ModelNew(nn.Module):
    def __init__(self):
        super(ModelNew, self).__init__()
        self.ext = load_inline(
            name="kb_softmax_smem_tree",
            cpp_sources=softmax_cpp,
            cuda_sources=softmax_source,
            functions=["softmax_forward"],
            extra_cuda_cflags=["-O3"],
            verbose=False,
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.ext.softmax_forward(x)
