"""GELU through the tanh approximation, for a model that computes the exact (erf) GELU.

Expect: MISMATCH

A frequent slip: the writer reaches for the GPT-2 formula 0.5 * x * (1 + tanh(sqrt(2/pi) *
(x + 0.044715 x^3))) because it is "the fast GELU", but the model calls F.gelu(x) with its default
approximate='none'. The two differ by up to 4.7e-4 (near |x| = 2.7) and by more than 1e-4 over a
wide band of ordinary inputs: on randn values many elements are off by far more than float32
rounding. It must be rejected as a mismatch.
"""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

gelu_source = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <math.h>

__device__ __forceinline__ float gelu_tanh(float x) {
    const float kBeta = 0.7978845608028654f;   // sqrt(2 / pi)
    const float kKappa = 0.044715f;
    float inner = kBeta * (x + kKappa * x * x * x);
    return 0.5f * x * (1.0f + tanhf(inner));
}

__global__ void gelu_kernel(const float* __restrict__ x, float* __restrict__ out, int64_t n) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)blockDim.x * gridDim.x) {
        out[i] = gelu_tanh(x[i]);
    }
}

torch::Tensor gelu_forward(torch::Tensor x) {
    TORCH_CHECK(x.is_cuda() && x.is_contiguous(), "x must be a contiguous CUDA tensor");
    auto out = torch::empty_like(x);
    const int64_t n = x.numel();
    const int threads = 256;
    const int blocks = 132 * 16;
    gelu_kernel<<<blocks, threads, 0, at::cuda::getCurrentCUDAStream()>>>(x.data_ptr<float>(), out.data_ptr<float>(), n);
    return out;
}
"""

gelu_cpp = "torch::Tensor gelu_forward(torch::Tensor x);"

gelu_ext = load_inline(
    name="kb_gelu_tanh_approx",
    cpp_sources=gelu_cpp,
    cuda_sources=gelu_source,
    functions=["gelu_forward"],
    extra_cuda_cflags=["-O3"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self):
        super(ModelNew, self).__init__()

    def forward(self, x):
        return gelu_ext.gelu_forward(x)
