"""LayerNorm in two passes (mean, then the variance of x - mean) under AT_DISPATCH_FLOATING_TYPES.

Expect: ACCEPTED

`template <typename scalar_t>` with an `at::acc_type<scalar_t, true>` accumulator (float for
float, double for double), a tree reduction in dynamic shared memory declared as
`extern __shared__ unsigned char smem[]` (one raw buffer reinterpreted per instantiation, the
usual workaround for templated extern shared arrays), a CUDAGuard, a default-stream launch. Two
passes over the row keep the variance accurate however large the mean. Weight and bias come from
ModelNew's own nn.LayerNorm, read not called.
"""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>
#include <ATen/AccumulateType.h>
#include <c10/cuda/CUDAGuard.h>

template <typename acc_t>
__device__ acc_t block_sum(acc_t v, acc_t* sdata) {
    const int tid = threadIdx.x;
    sdata[tid] = v;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (tid < s) sdata[tid] += sdata[tid + s];
        __syncthreads();
    }
    const acc_t total = sdata[0];
    __syncthreads();
    return total;
}

template <typename scalar_t>
__global__ void layernorm_two_pass_kernel(const scalar_t* __restrict__ x, const scalar_t* __restrict__ gamma,
                                          const scalar_t* __restrict__ beta, scalar_t* __restrict__ y,
                                          int64_t cols, double eps) {
    using acc_t = at::acc_type<scalar_t, true>;
    extern __shared__ __align__(sizeof(double)) unsigned char smem[];
    acc_t* sdata = reinterpret_cast<acc_t*>(smem);

    const scalar_t* xr = x + blockIdx.x * cols;
    scalar_t* yr = y + blockIdx.x * cols;

    acc_t sum = 0;
    for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) sum += static_cast<acc_t>(xr[i]);
    const acc_t mean = block_sum<acc_t>(sum, sdata) / static_cast<acc_t>(cols);

    acc_t sq = 0;
    for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) {
        const acc_t d = static_cast<acc_t>(xr[i]) - mean;
        sq += d * d;
    }
    const acc_t var = block_sum<acc_t>(sq, sdata) / static_cast<acc_t>(cols);
    const acc_t rstd = static_cast<acc_t>(1) / sqrt(var + static_cast<acc_t>(eps));

    for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) {
        const acc_t v = (static_cast<acc_t>(xr[i]) - mean) * rstd;
        yr[i] = static_cast<scalar_t>(v * static_cast<acc_t>(gamma[i]) + static_cast<acc_t>(beta[i]));
    }
}

torch::Tensor layer_norm_cuda(torch::Tensor input, torch::Tensor weight, torch::Tensor bias, double eps) {
    TORCH_CHECK(input.is_cuda(), "input must be a CUDA tensor");
    const at::cuda::CUDAGuard device_guard(input.device());
    auto x = input.contiguous();
    auto w = weight.contiguous();
    auto b = bias.contiguous();
    const int64_t cols = w.numel();
    const int64_t rows = x.numel() / cols;
    auto y = torch::empty_like(x);
    const int threads = 512;

    AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "layer_norm_cuda", ([&] {
        using acc_t = at::acc_type<scalar_t, true>;
        const size_t smem_bytes = threads * sizeof(acc_t);
        layernorm_two_pass_kernel<scalar_t><<<rows, threads, smem_bytes>>>(
            x.data_ptr<scalar_t>(), w.data_ptr<scalar_t>(), b.data_ptr<scalar_t>(), y.data_ptr<scalar_t>(),
            cols, eps);
    }));
    return y;
}
"""

cpp_source = "torch::Tensor layer_norm_cuda(torch::Tensor input, torch::Tensor weight, torch::Tensor bias, double eps);"

ln_ext = load_inline(
    name="kb_layernorm_two_pass",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["layer_norm_cuda"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self, normalized_shape: tuple):
        super().__init__()
        self.ln = nn.LayerNorm(normalized_shape=normalized_shape)

    def forward(self, x):
        return ln_ext.layer_norm_cuda(x, self.ln.weight, self.ln.bias, self.ln.eps)
