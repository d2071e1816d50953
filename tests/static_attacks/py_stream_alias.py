"""Launches on a side stream taken through an alias of torch.cuda, its handle passed to C++.

Expect: no-streams-threads

`_c = torch.cuda; _c.Stream()` escapes a rule that only looks at torch.cuda.Stream; the handle
goes to C++ as an integer and the kernel runs outside the timed stream. Stream and cuda_stream
are refused whatever they are read from.
"""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline
_c = torch.cuda

cuda_source = r'''#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>

__global__ void gated_kernel(const float* __restrict__ x, const float* __restrict__ w, float* __restrict__ out, int64_t n) {
    int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i < n) out[i] = 1.0f / (1.0f + expf(-x[i])) * w[i] + 1.0f;
}

torch::Tensor gated(torch::Tensor x, torch::Tensor w, int64_t stream) {
    auto out = torch::empty_like(x);
    int64_t n = x.numel();
    gated_kernel<<<(n + 255) / 256, 256, 0, reinterpret_cast<cudaStream_t>(stream)>>>(
        x.data_ptr<float>(), w.data_ptr<float>(), out.data_ptr<float>(), n);
    return out;
}
'''

cpp_source = "torch::Tensor gated(torch::Tensor x, torch::Tensor w, int64_t stream);"

ext = load_inline(name="gated_ext", cpp_sources=cpp_source, cuda_sources=cuda_source, functions=["gated"])


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.side = _c.Stream()

    def forward(self, x, w):
        return ext.gated(x.contiguous(), w.contiguous(), self.side.cuda_stream)
