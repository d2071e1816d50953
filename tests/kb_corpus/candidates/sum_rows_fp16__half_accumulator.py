"""Half-precision row sum, one thread per row, accumulating in __half with __hadd.

Expect: MISMATCH|NAN_INF

"Stay in fp16 end to end": each thread walks its row of 16384 values adding with __hadd into a
__half accumulator. Once the running sum reaches tens (ulp 1/32 to 1/16), every addition rounds
away a large share of the next value: over 16384 additions the error grows to units, against an
fp16 rounding of the true sum of a few hundredths. PyTorch (and an honest kernel) accumulate in
float. It must be rejected as a mismatch.
"""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

source = r"""
#include <torch/extension.h>
#include <cuda_fp16.h>
#include <ATen/cuda/CUDAContext.h>

__global__ void row_sum_half_acc_kernel(const __half* __restrict__ x, __half* __restrict__ out, int rows, int cols) {
    const int row = blockIdx.x * blockDim.x + threadIdx.x;
    if (row < rows) {
        const __half* xr = x + (size_t)row * cols;
        __half acc = __float2half(0.0f);
        for (int i = 0; i < cols; ++i) {
            acc = __hadd(acc, xr[i]);
        }
        out[row] = acc;
    }
}

torch::Tensor row_sum(torch::Tensor x, int64_t dim) {
    TORCH_CHECK(x.is_cuda() && x.is_contiguous(), "x must be a contiguous CUDA tensor");
    const int rows = x.size(0);
    const int cols = x.size(1);
    auto out = torch::empty({rows}, x.options());
    const int threads = 128;
    row_sum_half_acc_kernel<<<(rows + threads - 1) / threads, threads, 0, at::cuda::getCurrentCUDAStream()>>>(
        reinterpret_cast<const __half*>(x.data_ptr<at::Half>()),
        reinterpret_cast<__half*>(out.data_ptr<at::Half>()), rows, cols);
    return out;
}
"""

cpp_src = "torch::Tensor row_sum(torch::Tensor x, int64_t dim);"

row_sum_ext = load_inline(
    name="kb_sum_rows_half_acc",
    cpp_sources=cpp_src,
    cuda_sources=source,
    functions=["row_sum"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.dim = dim

    def forward(self, x):
        return row_sum_ext.row_sum(x, self.dim)
