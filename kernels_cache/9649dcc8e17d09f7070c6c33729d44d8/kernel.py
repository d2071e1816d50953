"""Written by kevin's built-in writer: pointwise kernel, 256 threads, 4-wide vector loads, variant 1."""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r'''
#include <torch/extension.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <vector>


#ifndef KEVIN_BUILTIN_OPS_HELPERS
#define KEVIN_BUILTIN_OPS_HELPERS
#include <math.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>

// torch.maximum / minimum / clamp / relu propagate NaN from either side; fmaxf/fminf return the number.
__host__ __device__ __forceinline__ float kevin_maximum(float a, float b) { return (a != a || a > b) ? a : b; }
__host__ __device__ __forceinline__ float kevin_minimum(float a, float b) { return (a != a || a < b) ? a : b; }
__host__ __device__ __forceinline__ float kevin_square(float x) { return x * x; }
__host__ __device__ __forceinline__ float kevin_cube(float x) { return x * x * x; }
// IEEE division: rsqrtf is a 2-ulp approximation on the device and does not exist on the host.
__host__ __device__ __forceinline__ float kevin_rsqrt(float x) { return 1.0f / sqrtf(x); }
__host__ __device__ __forceinline__ float kevin_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }
__host__ __device__ __forceinline__ float kevin_silu(float x) { return x / (1.0f + expf(-x)); }
// sign(NaN) is 0 in PyTorch, which is what (0 < x) - (x < 0) gives.
__host__ __device__ __forceinline__ float kevin_sign(float x) { return (float)((0.0f < x) - (x < 0.0f)); }
__host__ __device__ __forceinline__ float kevin_isnan(float x) { return x != x ? 1.0f : 0.0f; }
__host__ __device__ __forceinline__ float kevin_isinf(float x) { return fabsf(x) == INFINITY ? 1.0f : 0.0f; }
__host__ __device__ __forceinline__ float kevin_gelu_erf(float x) {
    return x * 0.5f * (1.0f + erff(x * 0.70710678118654752440f));  // x * Phi(x)
}
__host__ __device__ __forceinline__ float kevin_gelu_tanh(float x) {
    const float beta = 0.79788456080286535588f;  // sqrt(2 / pi)
    const float kappa = 0.044715f;
    return 0.5f * x * (1.0f + tanhf(beta * (x + kappa * x * x * x)));
}
// PyTorch's softplus: linear above the threshold (where log1p(exp(b x)) / b is x in float anyway).
__host__ __device__ __forceinline__ float kevin_softplus(float x, float beta, float threshold) {
    return x * beta > threshold ? x : log1pf(expf(x * beta)) / beta;
}
__host__ __device__ __forceinline__ float kevin_mish(float x) { return x * tanhf(log1pf(expf(x))); }
__host__ __device__ __forceinline__ float kevin_hardsigmoid(float x) {
    return kevin_minimum(kevin_maximum(x + 3.0f, 0.0f), 6.0f) / 6.0f;
}
__host__ __device__ __forceinline__ float kevin_hardswish(float x) {
    return x * kevin_minimum(kevin_maximum(x + 3.0f, 0.0f), 6.0f) / 6.0f;
}
// expm1, not exp - 1: elu(-1e-7) must be -1e-7, not the -1.19e-7 of exp's rounding.
__host__ __device__ __forceinline__ float kevin_elu(float x, float alpha, float scale, float input_scale) {
    return x <= 0.0f ? expm1f(x * input_scale) * (alpha * scale) : x * scale;
}
__host__ __device__ __forceinline__ float kevin_leaky_relu(float x, float slope) { return x > 0.0f ? x : x * slope; }
// A float rounded (to nearest even) to float16 / bfloat16 and widened back: what a cast does.
__host__ __device__ __forceinline__ float kevin_round_half(float x) { return __half2float(__float2half_rn(x)); }
__host__ __device__ __forceinline__ float kevin_round_bf16(float x) { return __bfloat162float(__float2bfloat16_rn(x)); }
#endif  // KEVIN_BUILTIN_OPS_HELPERS


__device__ __forceinline__ float kevin_ld(const float* p, long long i) { return p[i]; }
__device__ __forceinline__ float kevin_ld(const __half* p, long long i) { return __half2float(p[i]); }
__device__ __forceinline__ float kevin_ld(const __nv_bfloat16* p, long long i) { return __bfloat162float(p[i]); }
__device__ __forceinline__ float kevin_ld(const bool* p, long long i) { return p[i] ? 1.0f : 0.0f; }
__device__ __forceinline__ void kevin_st(float* p, long long i, float v) { p[i] = v; }
__device__ __forceinline__ void kevin_st(__half* p, long long i, float v) { p[i] = __float2half_rn(v); }
__device__ __forceinline__ void kevin_st(__nv_bfloat16* p, long long i, float v) { p[i] = __float2bfloat16_rn(v); }
__device__ __forceinline__ void kevin_ld4(const float* p, long long i, float* v) {
    float4 t = *reinterpret_cast<const float4*>(p + i); v[0] = t.x; v[1] = t.y; v[2] = t.z; v[3] = t.w;
}
__device__ __forceinline__ void kevin_ld4(const __half* p, long long i, float* v) {
    uint2 t = *reinterpret_cast<const uint2*>(p + i); const __half* h = reinterpret_cast<const __half*>(&t);
    v[0] = __half2float(h[0]); v[1] = __half2float(h[1]); v[2] = __half2float(h[2]); v[3] = __half2float(h[3]);
}
__device__ __forceinline__ void kevin_ld4(const __nv_bfloat16* p, long long i, float* v) {
    uint2 t = *reinterpret_cast<const uint2*>(p + i); const __nv_bfloat16* h = reinterpret_cast<const __nv_bfloat16*>(&t);
    v[0] = __bfloat162float(h[0]); v[1] = __bfloat162float(h[1]); v[2] = __bfloat162float(h[2]); v[3] = __bfloat162float(h[3]);
}
__device__ __forceinline__ void kevin_st4(float* p, long long i, const float* v) {
    *reinterpret_cast<float4*>(p + i) = make_float4(v[0], v[1], v[2], v[3]);
}
__device__ __forceinline__ void kevin_st4(__half* p, long long i, const float* v) {
    uint2 t; __half* h = reinterpret_cast<__half*>(&t);
    h[0] = __float2half_rn(v[0]); h[1] = __float2half_rn(v[1]); h[2] = __float2half_rn(v[2]); h[3] = __float2half_rn(v[3]);
    *reinterpret_cast<uint2*>(p + i) = t;
}
__device__ __forceinline__ void kevin_st4(__nv_bfloat16* p, long long i, const float* v) {
    uint2 t; __nv_bfloat16* h = reinterpret_cast<__nv_bfloat16*>(&t);
    h[0] = __float2bfloat16_rn(v[0]); h[1] = __float2bfloat16_rn(v[1]); h[2] = __float2bfloat16_rn(v[2]); h[3] = __float2bfloat16_rn(v[3]);
    *reinterpret_cast<uint2*>(p + i) = t;
}


__global__ void __launch_bounds__(256) kevin_pointwise(const float* __restrict__ p_in0, float* __restrict__ p_out0) {
    const long long n = 12582912LL / 1;
    const long long step = (long long)gridDim.x * blockDim.x;
    for (long long t = blockIdx.x * (long long)blockDim.x + threadIdx.x; t < n; t += step) {
        const long long base = t * 1;
        float in0 = kevin_ld(p_in0, base);
        float v0 = in0 * 0.5f;
        float v1 = kevin_cube(in0);
        float v2 = v1 * 0.044715f;
        float v3 = in0 + v2;
        float v4 = v3 * 0.7978846f;
        float v5 = tanhf(v4);
        float v6 = v5 + 1.0f;
        float v7 = v0 * v6;
        kevin_st(p_out0, base, v7);
    }
}


__global__ void __launch_bounds__(256) kevin_pointwise_vec(const float* __restrict__ p_in0, float* __restrict__ p_out0) {
    const long long n = 12582912LL / 4;
    const long long step = (long long)gridDim.x * blockDim.x;
    for (long long t = blockIdx.x * (long long)blockDim.x + threadIdx.x; t < n; t += step) {
        const long long base = t * 4;
        float in0_v[4]; kevin_ld4(p_in0, base, in0_v);
        float o_v[1][4];
        #pragma unroll
        for (int e = 0; e < 4; ++e) {
            float in0 = in0_v[e];
            float v0 = in0 * 0.5f;
            float v1 = kevin_cube(in0);
            float v2 = v1 * 0.044715f;
            float v3 = in0 + v2;
            float v4 = v3 * 0.7978846f;
            float v5 = tanhf(v4);
            float v6 = v5 + 1.0f;
            float v7 = v0 * v6;
            o_v[0][e] = v7;
        }
        kevin_st4(p_out0, base, o_v[0]);
    }
}

torch::Tensor kevin_run(torch::Tensor in0) {
    TORCH_CHECK(in0.is_cuda() && in0.scalar_type() == torch::kFloat32 && in0.sizes() == torch::IntArrayRef({8, 512, 3072}) && in0.strides() == torch::IntArrayRef({1572864, 3072, 1}), "kevin kernel: input 0 must be float32 of sizes [8, 512, 3072] and strides [1572864, 3072, 1]");
    const c10::cuda::CUDAGuard guard(in0.device());
    cudaStream_t stream = c10::cuda::getCurrentCUDAStream(in0.get_device()).stream();
    auto out0 = torch::empty({8, 512, 3072}, in0.options().dtype(torch::kFloat32));
    if (reinterpret_cast<uintptr_t>(in0.data_ptr()) % 16 == 0 && reinterpret_cast<uintptr_t>(out0.data_ptr()) % 16 == 0) {
        const long long blocks = std::min<long long>((3145728LL + 256 - 1) / 256, 1LL << 30);
        kevin_pointwise_vec<<<(unsigned)blocks, 256, 0, stream>>>(reinterpret_cast<const float*>(in0.data_ptr()), reinterpret_cast<float*>(out0.data_ptr()));
    } else {
        const long long blocks = std::min<long long>((12582912LL + 256 - 1) / 256, 1LL << 30);
        kevin_pointwise<<<(unsigned)blocks, 256, 0, stream>>>(reinterpret_cast<const float*>(in0.data_ptr()), reinterpret_cast<float*>(out0.data_ptr()));
    }
    return out0;
}
'''

cpp_source = 'torch::Tensor kevin_run(torch::Tensor in0);'

ext = load_inline(name='kevin_builtin_a09881762d_1', cpp_sources=cpp_source, cuda_sources=cuda_source, functions=['kevin_run'],
                  extra_cuda_cflags=['-O3'])


class ModelNew(nn.Module):
    def __init__(self, *init_inputs):
        super().__init__()

    def forward(self, in0):
        return ext.kevin_run(in0)
