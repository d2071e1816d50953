"""Row sums through a host function template `template <int BLOCK> void launch_row_sum(...)` that
launches `row_sum_kernel<BLOCK>`; the host picks the instantiation in a switch."""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

source = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

template <int BLOCK>
__global__ void row_sum_kernel(const float* __restrict__ in, float* __restrict__ out, int64_t cols) {
    __shared__ float buf[BLOCK];
    const float* r = in + blockIdx.x * cols;
    float s = 0.f;
    for (int64_t c = threadIdx.x; c < cols; c += BLOCK) s += r[c];
    buf[threadIdx.x] = s;
    __syncthreads();
    for (int stride = BLOCK / 2; stride > 0; stride >>= 1) {
        if (threadIdx.x < stride) buf[threadIdx.x] += buf[threadIdx.x + stride];
        __syncthreads();
    }
    if (threadIdx.x == 0) out[blockIdx.x] = buf[0];
}

template <int BLOCK>
void launch_row_sum(const torch::Tensor& in, torch::Tensor& out, int64_t rows, int64_t cols) {
    auto stream = at::cuda::getCurrentCUDAStream();
    row_sum_kernel<BLOCK><<<rows, BLOCK, 0, stream>>>(in.data_ptr<float>(), out.data_ptr<float>(), cols);
    TORCH_CHECK(cudaGetLastError() == cudaSuccess, "row_sum_kernel launch failed");
}

torch::Tensor row_sum(torch::Tensor x) {
    TORCH_CHECK(x.is_cuda(), "x must be CUDA");
    at::cuda::CUDAGuard guard(x.device());
    auto in = x.contiguous().view({-1, x.size(-1)});
    const int64_t rows = in.size(0), cols = in.size(1);
    auto out = torch::empty({rows}, in.options());
    if (cols >= 4096) {
        launch_row_sum<1024>(in, out, rows, cols);
    } else if (cols >= 1024) {
        launch_row_sum<512>(in, out, rows, cols);
    } else {
        launch_row_sum<128>(in, out, rows, cols);
    }
    auto sizes = x.sizes().vec();
    sizes.pop_back();
    return out.view(sizes);
}
"""

cpp = "torch::Tensor row_sum(torch::Tensor x);"

row_sum_ext = load_inline(name="row_sum_tmpl", cpp_sources=cpp, cuda_sources=source, functions=["row_sum"], verbose=False)


class ModelNew(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim

    def forward(self, x):
        return row_sum_ext.row_sum(x)
