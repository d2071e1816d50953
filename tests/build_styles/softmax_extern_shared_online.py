"""Online softmax (running max and sum) with `extern __shared__ float sdata[]` sized at launch as
2 * threads floats; one block per row; the default stream."""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

softmax_cuda_source = """
#include <torch/extension.h>
#include <cuda_runtime.h>
#include <math.h>

__global__ void online_softmax_kernel(const float* input, float* output, int dim) {
    extern __shared__ float sdata[];
    float* smax = sdata;
    float* ssum = sdata + blockDim.x;
    int row = blockIdx.x;
    int tid = threadIdx.x;
    const float* in_row = input + row * dim;
    float* out_row = output + row * dim;

    float m = -INFINITY;
    float s = 0.0f;
    for (int i = tid; i < dim; i += blockDim.x) {
        float v = in_row[i];
        if (v > m) {
            s = s * expf(m - v) + 1.0f;
            m = v;
        } else {
            s += expf(v - m);
        }
    }
    smax[tid] = m;
    ssum[tid] = s;
    __syncthreads();
    for (int stride = blockDim.x / 2; stride > 0; stride /= 2) {
        if (tid < stride) {
            float m1 = smax[tid], m2 = smax[tid + stride];
            float s1 = ssum[tid], s2 = ssum[tid + stride];
            float mm = fmaxf(m1, m2);
            ssum[tid] = (m1 == -INFINITY ? 0.0f : s1 * expf(m1 - mm)) + (m2 == -INFINITY ? 0.0f : s2 * expf(m2 - mm));
            smax[tid] = mm;
        }
        __syncthreads();
    }
    float row_max = smax[0];
    float row_sum = ssum[0];
    for (int i = tid; i < dim; i += blockDim.x) {
        out_row[i] = expf(in_row[i] - row_max) / row_sum;
    }
}

torch::Tensor softmax_cuda(torch::Tensor input) {
    auto output = torch::empty_like(input);
    int batch_size = input.size(0);
    int dim = input.size(1);
    int threads = 256;
    size_t shared_mem = 2 * threads * sizeof(float);
    online_softmax_kernel<<<batch_size, threads, shared_mem>>>(input.data_ptr<float>(), output.data_ptr<float>(), dim);
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) {
        printf("CUDA error: %s\\n", cudaGetErrorString(err));
    }
    return output;
}
"""

softmax_cpp_source = "torch::Tensor softmax_cuda(torch::Tensor input);"

softmax = load_inline(
    name="softmax",
    cpp_sources=softmax_cpp_source,
    cuda_sources=softmax_cuda_source,
    functions=["softmax_cuda"],
    verbose=True,
    extra_cflags=[""],
    extra_ldflags=[""],
)


class ModelNew(nn.Module):
    def __init__(self):
        super(ModelNew, self).__init__()
        self.softmax = softmax

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.softmax.softmax_cuda(x)
