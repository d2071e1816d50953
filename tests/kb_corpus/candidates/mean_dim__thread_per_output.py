"""Mean over any one dimension, one thread per output element summing sequentially.

Expect: ACCEPTED

The input is seen as (outer, reduce, inner): the thread for output (o, i) walks the reduced
dimension with stride `inner` and divides by its length. For the middle dimension of a
(16, 2048, 4096) tensor, neighbouring threads read neighbouring addresses, so the loads are
coalesced. A sequential float sum of 2048 values lies further from the exact mean than PyTorch's
cascaded sum, but by float32 rounding only. The dimension comes from get_init_inputs and is
passed to the kernel wrapper (negative values wrapped); the output shape drops that dimension.
"""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

mean_cuda_src = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <vector>

__global__ void mean_dim_kernel(const float* __restrict__ x, float* __restrict__ out,
                                int64_t outer, int64_t reduce, int64_t inner) {
    const int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= outer * inner) return;
    const int64_t o = idx / inner;
    const int64_t i = idx % inner;
    const float* p = x + o * reduce * inner + i;
    float sum = 0.0f;
    for (int64_t r = 0; r < reduce; ++r) {
        sum += p[r * inner];
    }
    out[idx] = sum / (float)reduce;
}

torch::Tensor mean_dim_cuda(torch::Tensor x, int64_t dim) {
    TORCH_CHECK(x.is_cuda(), "x must be a CUDA tensor");
    TORCH_CHECK(x.scalar_type() == torch::kFloat32, "x must be float32");
    auto xc = x.contiguous();
    const int64_t ndim = xc.dim();
    if (dim < 0) dim += ndim;
    TORCH_CHECK(dim >= 0 && dim < ndim, "dim out of range");

    int64_t outer = 1, inner = 1;
    for (int64_t d = 0; d < dim; ++d) outer *= xc.size(d);
    for (int64_t d = dim + 1; d < ndim; ++d) inner *= xc.size(d);
    const int64_t reduce = xc.size(dim);

    std::vector<int64_t> out_sizes;
    for (int64_t d = 0; d < ndim; ++d) {
        if (d != dim) out_sizes.push_back(xc.size(d));
    }
    auto out = torch::empty(out_sizes, xc.options());

    const int64_t total = outer * inner;
    const int threads = 256;
    const int64_t blocks = (total + threads - 1) / threads;
    mean_dim_kernel<<<(unsigned int)blocks, threads, 0, at::cuda::getCurrentCUDAStream()>>>(
        xc.data_ptr<float>(), out.data_ptr<float>(), outer, reduce, inner);
    return out;
}
"""

mean_cpp_src = "torch::Tensor mean_dim_cuda(torch::Tensor x, int64_t dim);"

mean_ext = load_inline(
    name="kb_mean_dim_thread_per_output",
    cpp_sources=mean_cpp_src,
    cuda_sources=mean_cuda_src,
    functions=["mean_dim_cuda"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self, dim: int):
        super(ModelNew, self).__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return mean_ext.mean_dim_cuda(x, self.dim)
