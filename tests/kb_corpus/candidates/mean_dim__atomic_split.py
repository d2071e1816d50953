"""Mean over one dimension by split partial sums merged with atomicAdd, then a scaling kernel.

Expect: ACCEPTED

The reduced dimension is cut into chunks of 128 (gridDim.z); each thread sums its chunk for one
(outer, inner) position and atomicAdd's the partial into a float buffer from torch::zeros; a
second kernel multiplies by 1 / reduce. The order of the atomic additions varies from run to
run, so results differ by float32 rounding between runs, never by more. Two kernels on the
current stream; forward calls self.ext with the dimension stored at init.
"""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_src = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <vector>

#define CHUNK 128

__global__ void partial_sum_kernel(const float* __restrict__ x, float* __restrict__ acc,
                                   int64_t reduce, int64_t inner) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;   // inner index
    const int64_t o = blockIdx.y;                                         // outer index
    const int64_t r0 = (int64_t)blockIdx.z * CHUNK;
    if (i >= inner) return;
    int64_t r1 = r0 + CHUNK;
    if (r1 > reduce) r1 = reduce;
    const float* p = x + o * reduce * inner + i;
    float s = 0.0f;
    for (int64_t r = r0; r < r1; ++r) {
        s += p[r * inner];
    }
    atomicAdd(acc + o * inner + i, s);
}

__global__ void scale_kernel(float* __restrict__ acc, int64_t n, float inv) {
    const int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (j < n) acc[j] *= inv;
}

torch::Tensor mean_dim_atomic(torch::Tensor x, int64_t dim) {
    TORCH_CHECK(x.is_cuda(), "x must be a CUDA tensor");
    auto xc = x.contiguous();
    const int64_t ndim = xc.dim();
    if (dim < 0) dim += ndim;
    int64_t outer = 1, inner = 1;
    for (int64_t d = 0; d < dim; ++d) outer *= xc.size(d);
    for (int64_t d = dim + 1; d < ndim; ++d) inner *= xc.size(d);
    const int64_t reduce = xc.size(dim);
    TORCH_CHECK(outer <= 65535, "outer size too large for gridDim.y");

    std::vector<int64_t> out_sizes;
    for (int64_t d = 0; d < ndim; ++d)
        if (d != dim) out_sizes.push_back(xc.size(d));
    auto acc = torch::zeros(out_sizes, xc.options());

    cudaStream_t stream = at::cuda::getCurrentCUDAStream();
    const int threads = 256;
    dim3 grid((unsigned int)((inner + threads - 1) / threads), (unsigned int)outer,
              (unsigned int)((reduce + CHUNK - 1) / CHUNK));
    partial_sum_kernel<<<grid, threads, 0, stream>>>(xc.data_ptr<float>(), acc.data_ptr<float>(), reduce, inner);

    const int64_t n = outer * inner;
    scale_kernel<<<(unsigned int)((n + threads - 1) / threads), threads, 0, stream>>>(
        acc.data_ptr<float>(), n, 1.0f / (float)reduce);
    return acc;
}
"""

cpp_src = "torch::Tensor mean_dim_atomic(torch::Tensor x, int64_t dim);"


class ModelNew(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.dim = dim
        self.ext = load_inline(
            name="kb_mean_dim_atomic_split",
            cpp_sources=cpp_src,
            cuda_sources=cuda_src,
            functions=["mean_dim_atomic"],
            verbose=False,
        )

    def forward(self, x):
        return self.ext.mean_dim_atomic(x, self.dim)
