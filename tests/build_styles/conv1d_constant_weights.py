"""Depthwise 1D convolution with its taps in `__constant__ float c_weight[MAX_K]`, uploaded by the
host function with cudaMemcpyToSymbol (device to device, from the weight tensor)."""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

conv_source = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>

#define MAX_K 64

__constant__ float c_weight[MAX_K];

__global__ void conv1d_const_kernel(const float* __restrict__ x, float* __restrict__ y, int length, int out_length, int k) {
    const int row = blockIdx.y;
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= out_length) return;
    const float* xr = x + (size_t)row * length;
    float acc = 0.f;
    #pragma unroll 8
    for (int t = 0; t < k; ++t) acc += xr[i + t] * c_weight[t];
    y[(size_t)row * out_length + i] = acc;
}

torch::Tensor conv1d_const(torch::Tensor x, torch::Tensor weight) {
    TORCH_CHECK(weight.numel() <= MAX_K, "kernel too long for constant memory");
    auto xc = x.contiguous();
    auto w = weight.contiguous().to(torch::kFloat32);
    const int k = w.numel();
    const int rows = xc.numel() / xc.size(-1);
    const int length = xc.size(-1);
    const int out_length = length - k + 1;
    auto y = torch::empty({rows, out_length}, xc.options());
    auto stream = at::cuda::getCurrentCUDAStream();
    cudaMemcpyToSymbolAsync(c_weight, w.data_ptr<float>(), k * sizeof(float), 0, cudaMemcpyDeviceToDevice, stream);
    dim3 block(256);
    dim3 grid((out_length + 255) / 256, rows);
    conv1d_const_kernel<<<grid, block, 0, stream>>>(xc.data_ptr<float>(), y.data_ptr<float>(), length, out_length, k);
    return y.view({x.size(0), x.size(1), out_length});
}
"""

conv_cpp = "torch::Tensor conv1d_const(torch::Tensor x, torch::Tensor weight);"

conv_ext = load_inline(name="conv1d_const", cpp_sources=conv_cpp, cuda_sources=conv_source,
                       functions=["conv1d_const"], verbose=False)


class ModelNew(nn.Module):
    def __init__(self, channels: int, kernel_size: int):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(kernel_size))

    def forward(self, x):
        return conv_ext.conv1d_const(x, self.weight)
