"""Cross entropy with the class count in `__constant__ int c_num_classes`, set by a torch-free
helper `set_num_classes` with cudaMemcpyToSymbol; a per-row log-softmax kernel and a mean kernel."""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

ce_source = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <cfloat>

__constant__ int c_num_classes;

__global__ void row_nll_kernel(const float* __restrict__ logits, const int64_t* __restrict__ targets, float* __restrict__ losses, int rows) {
    const int row = blockIdx.x * blockDim.x + threadIdx.x;
    if (row >= rows) return;
    const float* l = logits + (size_t)row * c_num_classes;
    float m = -FLT_MAX;
    for (int c = 0; c < c_num_classes; ++c) m = fmaxf(m, l[c]);
    float s = 0.f;
    for (int c = 0; c < c_num_classes; ++c) s += expf(l[c] - m);
    losses[row] = logf(s) + m - l[targets[row]];
}

__global__ void mean_kernel(const float* __restrict__ v, float* __restrict__ out, int n) {
    __shared__ float acc[256];
    float s = 0.f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) s += v[i];
    acc[threadIdx.x] = s;
    __syncthreads();
    for (int k = 128; k > 0; k >>= 1) {
        if (threadIdx.x < k) acc[threadIdx.x] += acc[threadIdx.x + k];
        __syncthreads();
    }
    if (threadIdx.x == 0) out[0] = acc[0] / n;
}

void set_num_classes(int classes) {
    cudaMemcpyToSymbol(c_num_classes, &classes, sizeof(int));
}

torch::Tensor cross_entropy(torch::Tensor logits, torch::Tensor targets) {
    auto l = logits.contiguous();
    auto t = targets.contiguous();
    const int rows = l.size(0);
    set_num_classes(l.size(1));
    auto losses = torch::empty({rows}, l.options());
    auto out = torch::empty({}, l.options());
    auto stream = at::cuda::getCurrentCUDAStream();
    row_nll_kernel<<<(rows + 127) / 128, 128, 0, stream>>>(l.data_ptr<float>(), t.data_ptr<int64_t>(), losses.data_ptr<float>(), rows);
    mean_kernel<<<1, 256, 0, stream>>>(losses.data_ptr<float>(), out.data_ptr<float>(), rows);
    return out;
}
"""

ce_ext = load_inline(name="ce_constant", cpp_sources="torch::Tensor cross_entropy(torch::Tensor logits, torch::Tensor targets);",
                     cuda_sources=ce_source, functions=["cross_entropy"], verbose=False)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, predictions, targets):
        return ce_ext.cross_entropy(predictions, targets)
