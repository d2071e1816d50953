"""Written by kevin's built-in writer: row kernel, 128 threads, 4-wide vector loads, row kept in registers, variant 8."""
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


__device__ __forceinline__ float kevin_row_reduce_add(float v, float* smem, int row_in_block, int lane) {
    #pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = v + __shfl_xor_sync(0xffffffffu, v, o);
    if (4 > 1) {
        __syncthreads();
        if ((lane & 31) == 0) smem[row_in_block * 4 + (lane >> 5)] = v;
        __syncthreads();
        v = 0.0f;
        for (int w = 0; w < 4; ++w) v = v + smem[row_in_block * 4 + w];
    }
    return v;
}

__device__ __forceinline__ float kevin_row_reduce_max(float v, float* smem, int row_in_block, int lane) {
    #pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = kevin_maximum(v, __shfl_xor_sync(0xffffffffu, v, o));
    if (4 > 1) {
        __syncthreads();
        if ((lane & 31) == 0) smem[row_in_block * 4 + (lane >> 5)] = v;
        __syncthreads();
        v = -INFINITY;
        for (int w = 0; w < 4; ++w) v = kevin_maximum(v, smem[row_in_block * 4 + w]);
    }
    return v;
}

__device__ __forceinline__ float kevin_row_reduce_min(float v, float* smem, int row_in_block, int lane) {
    #pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = kevin_minimum(v, __shfl_xor_sync(0xffffffffu, v, o));
    if (4 > 1) {
        __syncthreads();
        if ((lane & 31) == 0) smem[row_in_block * 4 + (lane >> 5)] = v;
        __syncthreads();
        v = INFINITY;
        for (int w = 0; w < 4; ++w) v = kevin_minimum(v, smem[row_in_block * 4 + w]);
    }
    return v;
}


__global__ void __launch_bounds__(128) kevin_rows(const float* __restrict__ p_in0, const float* __restrict__ p_in1, const float* __restrict__ p_in2, const float* __restrict__ p_in3, float* __restrict__ p_out0) {
    __shared__ float smem[4];
    const int row_in_block = threadIdx.x / 128;
    const int lane = threadIdx.x % 128;
    const long long row = (long long)blockIdx.x * 1 + row_in_block;
    const bool valid = row < 4096LL;
    float in0_r[6];
    #pragma unroll
    for (int j = 0; j < 6; ++j) {
        const long long c = lane + (long long)j * 128;
        in0_r[j] = (valid && c < 768LL) ? kevin_ld(p_in0, row * 768LL + c) : 0.0f;
    }
    float in1_r[6];
    #pragma unroll
    for (int j = 0; j < 6; ++j) {
        const long long c = lane + (long long)j * 128;
        in1_r[j] = (valid && c < 768LL) ? kevin_ld(p_in1, row * 768LL + c) : 0.0f;
    }
    float in2_r[6];
    #pragma unroll
    for (int j = 0; j < 6; ++j) {
        const long long c = lane + (long long)j * 128;
        in2_r[j] = (valid && c < 768LL) ? kevin_ld(p_in2, c) : 0.0f;
    }
    float in3_r[6];
    #pragma unroll
    for (int j = 0; j < 6; ++j) {
        const long long c = lane + (long long)j * 128;
        in3_r[j] = (valid && c < 768LL) ? kevin_ld(p_in3, c) : 0.0f;
    }
    float v1_acc = 0.0f;
    #pragma unroll
    for (int j = 0; j < 6; ++j) {
        const long long c = lane + (long long)j * 128;
        if (valid && c < 768LL) {
            float in0 = in0_r[j];
            float in1 = in1_r[j];
            float v0 = in0 + in1;
            v1_acc = v1_acc + v0;
        }
    }
    v1_acc = kevin_row_reduce_add(v1_acc, smem, row_in_block, lane);
    const float v1_mean = v1_acc / 768.0f;
    float v1_m2 = 0.0f;
    #pragma unroll
    for (int j = 0; j < 6; ++j) {
        const long long c = lane + (long long)j * 128;
        if (valid && c < 768LL) {
            float in0 = in0_r[j];
            float in1 = in1_r[j];
            float v0 = in0 + in1;
            v1_m2 = v1_m2 + (v0 - v1_mean) * (v0 - v1_mean);
        }
    }
    v1_m2 = kevin_row_reduce_add(v1_m2, smem, row_in_block, lane);
    const float v1_0 = (v1_m2 / (768.0f - 0.0f));
    const float v1_1 = (v1_mean);
    const float v1 = v1_0;
    float v5 = v1_0 + 1e-05f;
    float v6 = kevin_rsqrt(v5);
    #pragma unroll
    for (int j = 0; j < 6; ++j) {
        const long long c = lane + (long long)j * 128;
        if (valid && c < 768LL) {
            float in0 = in0_r[j];
            float in1 = in1_r[j];
            float in2 = in2_r[j];
            float in3 = in3_r[j];
            float v0 = in0 + in1;
            float v4 = v0 - v1_1;
            float v7 = v4 * v6;
            float v8 = v7 * in2;
            float v9 = v8 + in3;
            kevin_st(p_out0, row * 768LL + c, v9);
        }
    }
}


__global__ void __launch_bounds__(128) kevin_rows_vec(const float* __restrict__ p_in0, const float* __restrict__ p_in1, const float* __restrict__ p_in2, const float* __restrict__ p_in3, float* __restrict__ p_out0) {
    __shared__ float smem[4];
    const int row_in_block = threadIdx.x / 128;
    const int lane = threadIdx.x % 128;
    const long long row = (long long)blockIdx.x * 1 + row_in_block;
    const bool valid = row < 4096LL;
    float in0_r[8];
    #pragma unroll
    for (int j = 0; j < 2; ++j) {
        const long long c0 = (lane + (long long)j * 128) * 4;
        if (valid && c0 < 768LL) kevin_ld4(p_in0, row * 768LL + c0, in0_r + j * 4);
        else { in0_r[j * 4] = in0_r[j * 4 + 1] = in0_r[j * 4 + 2] = in0_r[j * 4 + 3] = 0.0f; }
    }
    float in1_r[8];
    #pragma unroll
    for (int j = 0; j < 2; ++j) {
        const long long c0 = (lane + (long long)j * 128) * 4;
        if (valid && c0 < 768LL) kevin_ld4(p_in1, row * 768LL + c0, in1_r + j * 4);
        else { in1_r[j * 4] = in1_r[j * 4 + 1] = in1_r[j * 4 + 2] = in1_r[j * 4 + 3] = 0.0f; }
    }
    float in2_r[8];
    #pragma unroll
    for (int j = 0; j < 2; ++j) {
        const long long c0 = (lane + (long long)j * 128) * 4;
        if (valid && c0 < 768LL) kevin_ld4(p_in2, c0, in2_r + j * 4);
        else { in2_r[j * 4] = in2_r[j * 4 + 1] = in2_r[j * 4 + 2] = in2_r[j * 4 + 3] = 0.0f; }
    }
    float in3_r[8];
    #pragma unroll
    for (int j = 0; j < 2; ++j) {
        const long long c0 = (lane + (long long)j * 128) * 4;
        if (valid && c0 < 768LL) kevin_ld4(p_in3, c0, in3_r + j * 4);
        else { in3_r[j * 4] = in3_r[j * 4 + 1] = in3_r[j * 4 + 2] = in3_r[j * 4 + 3] = 0.0f; }
    }
    float v1_acc = 0.0f;
    #pragma unroll
    for (int j = 0; j < 2; ++j) {
        const long long c0 = (lane + (long long)j * 128) * 4;
        if (valid && c0 < 768LL) {
        
        #pragma unroll
        for (int k = 0; k < 4; ++k) {
            const long long c = c0 + k;
            float in0 = in0_r[j * 4 + k];
            float in1 = in1_r[j * 4 + k];
            float v0 = in0 + in1;
            v1_acc = v1_acc + v0;
        }
        
        }
    }
    v1_acc = kevin_row_reduce_add(v1_acc, smem, row_in_block, lane);
    const float v1_mean = v1_acc / 768.0f;
    float v1_m2 = 0.0f;
    #pragma unroll
    for (int j = 0; j < 2; ++j) {
        const long long c0 = (lane + (long long)j * 128) * 4;
        if (valid && c0 < 768LL) {
        
        #pragma unroll
        for (int k = 0; k < 4; ++k) {
            const long long c = c0 + k;
            float in0 = in0_r[j * 4 + k];
            float in1 = in1_r[j * 4 + k];
            float v0 = in0 + in1;
            v1_m2 = v1_m2 + (v0 - v1_mean) * (v0 - v1_mean);
        }
        
        }
    }
    v1_m2 = kevin_row_reduce_add(v1_m2, smem, row_in_block, lane);
    const float v1_0 = (v1_m2 / (768.0f - 0.0f));
    const float v1_1 = (v1_mean);
    const float v1 = v1_0;
    float v5 = v1_0 + 1e-05f;
    float v6 = kevin_rsqrt(v5);
    #pragma unroll
    for (int j = 0; j < 2; ++j) {
        const long long c0 = (lane + (long long)j * 128) * 4;
        if (valid && c0 < 768LL) {
        float o0_v[4];
        #pragma unroll
        for (int k = 0; k < 4; ++k) {
            const long long c = c0 + k;
            float in0 = in0_r[j * 4 + k];
            float in1 = in1_r[j * 4 + k];
            float in2 = in2_r[j * 4 + k];
            float in3 = in3_r[j * 4 + k];
            float v0 = in0 + in1;
            float v4 = v0 - v1_1;
            float v7 = v4 * v6;
            float v8 = v7 * in2;
            float v9 = v8 + in3;
            o0_v[k] = v9;
        }
        kevin_st4(p_out0, row * 768LL + c0, o0_v);
        }
    }
}

torch::Tensor kevin_run(torch::Tensor in0, torch::Tensor in1, torch::Tensor in2, torch::Tensor in3) {
    TORCH_CHECK(in0.is_cuda() && in0.scalar_type() == torch::kFloat32 && in0.sizes() == torch::IntArrayRef({8, 512, 768}) && in0.strides() == torch::IntArrayRef({393216, 768, 1}), "kevin kernel: input 0 must be float32 of sizes [8, 512, 768] and strides [393216, 768, 1]");
    TORCH_CHECK(in1.is_cuda() && in1.scalar_type() == torch::kFloat32 && in1.sizes() == torch::IntArrayRef({8, 512, 768}) && in1.strides() == torch::IntArrayRef({393216, 768, 1}), "kevin kernel: input 1 must be float32 of sizes [8, 512, 768] and strides [393216, 768, 1]");
    TORCH_CHECK(in2.is_cuda() && in2.scalar_type() == torch::kFloat32 && in2.sizes() == torch::IntArrayRef({768}) && in2.strides() == torch::IntArrayRef({1}), "kevin kernel: input 2 must be float32 of sizes [768] and strides [1]");
    TORCH_CHECK(in3.is_cuda() && in3.scalar_type() == torch::kFloat32 && in3.sizes() == torch::IntArrayRef({768}) && in3.strides() == torch::IntArrayRef({1}), "kevin kernel: input 3 must be float32 of sizes [768] and strides [1]");
    const c10::cuda::CUDAGuard guard(in0.device());
    cudaStream_t stream = c10::cuda::getCurrentCUDAStream(in0.get_device()).stream();
    auto out0 = torch::empty({8, 512, 768}, in0.options().dtype(torch::kFloat32));
    const long long blocks = (4096LL + 1 - 1) / 1;
    if (reinterpret_cast<uintptr_t>(in0.data_ptr()) % 16 == 0 && reinterpret_cast<uintptr_t>(in1.data_ptr()) % 16 == 0 && reinterpret_cast<uintptr_t>(in2.data_ptr()) % 16 == 0 && reinterpret_cast<uintptr_t>(in3.data_ptr()) % 16 == 0 && reinterpret_cast<uintptr_t>(out0.data_ptr()) % 16 == 0) {
        kevin_rows_vec<<<(unsigned)blocks, 128, 0, stream>>>(reinterpret_cast<const float*>(in0.data_ptr()), reinterpret_cast<const float*>(in1.data_ptr()), reinterpret_cast<const float*>(in2.data_ptr()), reinterpret_cast<const float*>(in3.data_ptr()), reinterpret_cast<float*>(out0.data_ptr()));
    } else {
        kevin_rows<<<(unsigned)blocks, 128, 0, stream>>>(reinterpret_cast<const float*>(in0.data_ptr()), reinterpret_cast<const float*>(in1.data_ptr()), reinterpret_cast<const float*>(in2.data_ptr()), reinterpret_cast<const float*>(in3.data_ptr()), reinterpret_cast<float*>(out0.data_ptr()));
    }
    return out0;
}
'''

cpp_source = 'torch::Tensor kevin_run(torch::Tensor in0, torch::Tensor in1, torch::Tensor in2, torch::Tensor in3);'

ext = load_inline(name='kevin_builtin_f29fd46dd4_8', cpp_sources=cpp_source, cuda_sources=cuda_source, functions=['kevin_run'],
                  extra_cuda_cflags=['-O3'])


class ModelNew(nn.Module):
    def __init__(self, *init_inputs):
        super().__init__()

    def forward(self, in0, in1, in2, in3):
        return ext.kevin_run(in0, in1, in2, in3)
