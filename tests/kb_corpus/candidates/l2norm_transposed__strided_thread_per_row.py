"""Row L2 normalization that reads the input through its strides, one thread per row.

Expect: ACCEPTED

The input is a transposed view (strides (1, batch)), so the host passes x.stride(0) and
x.stride(1) and never copies it. One thread per row sums the squares sequentially and then
writes x / norm; neighbouring threads handle neighbouring rows, which are neighbouring addresses
in this layout, so every load is coalesced. The output is allocated with the input's own strides
(torch::empty_strided), which keeps the stores coalesced too and is what the model returns.
A sequential float sum of 16384 squares is slightly further from exact than PyTorch's, within
float32 rounding.
"""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>

__global__ void l2norm_strided_kernel(const float* __restrict__ x, float* __restrict__ y,
                                      int64_t rows, int64_t cols,
                                      int64_t xs0, int64_t xs1, int64_t ys0, int64_t ys1) {
    const int64_t row = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (row >= rows) return;
    const float* xr = x + row * xs0;
    float ss = 0.0f;
    for (int64_t j = 0; j < cols; ++j) {
        const float v = xr[j * xs1];
        ss += v * v;
    }
    const float norm = sqrtf(ss);
    float* yr = y + row * ys0;
    for (int64_t j = 0; j < cols; ++j) {
        yr[j * ys1] = xr[j * xs1] / norm;
    }
}

torch::Tensor l2norm_rows(torch::Tensor x) {
    TORCH_CHECK(x.is_cuda(), "x must be a CUDA tensor");
    TORCH_CHECK(x.dim() == 2, "x must be 2D");
    TORCH_CHECK(x.scalar_type() == torch::kFloat32, "x must be float32");
    const int64_t rows = x.size(0);
    const int64_t cols = x.size(1);
    auto y = torch::empty_strided(x.sizes(), x.strides(), x.options());
    const int threads = 128;
    const int64_t blocks = (rows + threads - 1) / threads;
    const float* xp = x.data_ptr<float>();   // data_ptr includes the storage offset
    l2norm_strided_kernel<<<(unsigned int)blocks, threads, 0, at::cuda::getCurrentCUDAStream()>>>(
        xp, y.data_ptr<float>(), rows, cols, x.stride(0), x.stride(1), y.stride(0), y.stride(1));
    return y;
}
"""

cpp_source = "torch::Tensor l2norm_rows(torch::Tensor x);"

l2norm_ext = load_inline(
    name="kb_l2norm_strided",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["l2norm_rows"],
    extra_cuda_cflags=["-O3"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self):
        super(ModelNew, self).__init__()

    def forward(self, x):
        return l2norm_ext.l2norm_rows(x)
