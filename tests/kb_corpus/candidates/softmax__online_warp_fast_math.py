"""Online softmax (running max and rescaled sum in one pass), warp shuffles, --use_fast_math.

Expect: ACCEPTED

Each thread keeps (m, d) over its strided elements, rescaling d whenever the max grows; warps
merge their pairs with __shfl_xor_sync, warp leaders meet in shared memory, and a final pass
writes exp(x - m) / d. Pairs with no elements yet (m = -inf, d = 0) are merged by a guard, never
through exp(-inf - -inf). Built with extra_cuda_cflags=["-O3", "--use_fast_math"], so expf
becomes __expf (a few ulps off for the arguments that matter: the judge allows that). Launch
on the current stream from a module-level extension.
"""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <cuda_runtime.h>
#include <cmath>

#define WARP_SIZE 32
#define FULL_MASK 0xffffffffu

__device__ __forceinline__ void merge_md(float& m, float& d, float m2, float d2) {
    // merge two partial (max, sum of exp(x - max)) pairs
    if (d2 == 0.0f) return;
    if (d == 0.0f) { m = m2; d = d2; return; }
    const float mn = fmaxf(m, m2);
    d = d * expf(m - mn) + d2 * expf(m2 - mn);
    m = mn;
}

__global__ void online_softmax_kernel(const float* __restrict__ input, float* __restrict__ output, int cols) {
    __shared__ float s_m[32];
    __shared__ float s_d[32];
    const int tid = threadIdx.x;
    const int lane = tid % WARP_SIZE;
    const int warp = tid / WARP_SIZE;
    const int num_warps = blockDim.x / WARP_SIZE;
    const float* x = input + (size_t)blockIdx.x * cols;
    float* y = output + (size_t)blockIdx.x * cols;

    float m = -INFINITY;
    float d = 0.0f;
    for (int i = tid; i < cols; i += blockDim.x) {
        const float v = x[i];
        if (v > m) {
            d = d * expf(m - v) + 1.0f;
            m = v;
        } else {
            d += expf(v - m);
        }
    }

    #pragma unroll
    for (int offset = WARP_SIZE / 2; offset > 0; offset >>= 1) {
        const float m2 = __shfl_xor_sync(FULL_MASK, m, offset);
        const float d2 = __shfl_xor_sync(FULL_MASK, d, offset);
        merge_md(m, d, m2, d2);
    }
    if (lane == 0) {
        s_m[warp] = m;
        s_d[warp] = d;
    }
    __syncthreads();
    if (warp == 0) {
        m = (lane < num_warps) ? s_m[lane] : -INFINITY;
        d = (lane < num_warps) ? s_d[lane] : 0.0f;
        #pragma unroll
        for (int offset = WARP_SIZE / 2; offset > 0; offset >>= 1) {
            const float m2 = __shfl_xor_sync(FULL_MASK, m, offset);
            const float d2 = __shfl_xor_sync(FULL_MASK, d, offset);
            merge_md(m, d, m2, d2);
        }
        if (lane == 0) {
            s_m[0] = m;
            s_d[0] = d;
        }
    }
    __syncthreads();
    const float row_max = s_m[0];
    const float inv_sum = 1.0f / s_d[0];
    for (int i = tid; i < cols; i += blockDim.x) {
        y[i] = expf(x[i] - row_max) * inv_sum;
    }
}

torch::Tensor online_softmax(torch::Tensor x) {
    TORCH_CHECK(x.is_cuda() && x.dim() == 2, "expected a 2D CUDA tensor");
    auto xc = x.contiguous();
    auto out = torch::empty_like(xc);
    const int rows = xc.size(0);
    const int cols = xc.size(1);
    const int threads = 512;
    online_softmax_kernel<<<rows, threads, 0, at::cuda::getCurrentCUDAStream()>>>(
        xc.data_ptr<float>(), out.data_ptr<float>(), cols);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return out;
}
"""

cpp_source = "torch::Tensor online_softmax(torch::Tensor x);"

softmax_ext = load_inline(
    name="kb_softmax_online_warp",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["online_softmax"],
    extra_cuda_cflags=["-O3", "--use_fast_math"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return softmax_ext.online_softmax(x)
