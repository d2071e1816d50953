//: The functions the op table's expressions call (ops.py): NaN-propagating maximum and
//: minimum, roundings to float16 and bfloat16, the activations; under KEVIN_FAST_MATH (every output
//: 16-bit) exp, log and division by the device's intrinsics.
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
// KEVIN_SILU_FORM: silu(x) = x e / (1 + e) below zero, x / (1 + e) above, with e = e^-|x| <= 1: the
// exponent never overflows and the divisor stays in [1, 2]. x / (1 + e^-x) is -0 from x = -88.7 down
// (e^-x overflows), and with the device's fast division from x = -87.3 down (0 for divisors above 2^126),
// where x e^x is still a normal float32 and bfloat16 down to x = -91.
#if defined(KEVIN_FAST_MATH)
// Every output of the kernel is 16-bit: exp, log and division by the device's intrinsics (a few
// float32 ulps, far below one float16 or bfloat16 rounding); on the host (tests) the same
// formulas over the precise functions.
#if defined(__CUDA_ARCH__)
#define KEVIN_EXPF(x) __expf(x)
#define KEVIN_LOGF(x) __logf(x)
#define KEVIN_DIVF(a, b) __fdividef(a, b)
#else
#define KEVIN_EXPF(x) expf(x)
#define KEVIN_LOGF(x) logf(x)
#define KEVIN_DIVF(a, b) ((a) / (b))
#endif
// Chains of these are bound by the multi-function unit (exp2, log2, reciprocal, tanh: 16 results
// a clock a multiprocessor against 128 fused multiply-adds), so each takes as few of its
// instructions as it can: tanh one (tanh.approx, a relative error near 2^-11, half a float16
// rounding), sigmoid one (through tanh), log(1 + e^x) one (an exp, then a polynomial).
__host__ __device__ __forceinline__ float kevin_tanh(float x) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 750
    float y;
    asm("tanh.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
#else
    return tanhf(x);
#endif
}
// sigmoid(x) = (1 + tanh(x / 2)) / 2: an absolute error near 2^-12 (below x = -16 it is 0, not e^x)
__host__ __device__ __forceinline__ float kevin_sigmoid(float x) { return fmaf(0.5f, kevin_tanh(0.5f * x), 0.5f); }
__host__ __device__ __forceinline__ float kevin_silu(float x) {  // (`KEVIN_SILU_FORM`)
    float e = KEVIN_EXPF(-fabsf(x));
    return KEVIN_DIVF(x < 0.0f ? x * e : x, 1.0f + e);
}
// log(1 + t) for t in [0, 1]: t q(t), q of degree 7 fitted to log(1 + t) / t (relative error
// below 7e-7 in float32)
__host__ __device__ __forceinline__ float kevin_log1p_unit(float t) {
    float q = -0.008466244675219059f;
    q = fmaf(q, t, 0.04365847259759903f);
    q = fmaf(q, t, -0.10679779201745987f);
    q = fmaf(q, t, 0.1765972524881363f);
    q = fmaf(q, t, -0.2445332109928131f);
    q = fmaf(q, t, 0.33265239000320435f);
    q = fmaf(q, t, -0.49996355175971985f);
    q = fmaf(q, t, 0.9999995231628418f);
    return t * q;
}
// log(1 + e^x) = max(x, 0) + log(1 + e^-|x|): one exp, no overflow, NaN stays NaN
__host__ __device__ __forceinline__ float kevin_log1p_exp(float x) {
    return x != x ? x : fmaxf(x, 0.0f) + kevin_log1p_unit(KEVIN_EXPF(-fabsf(x)));
}
#if defined(__CUDA_ARCH__)
// and the exp and log the kernels below call (softmax's, cross-entropy's)
#define expf(x) __expf(x)
#define logf(x) __logf(x)
#endif
#else
__host__ __device__ __forceinline__ float kevin_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }
__host__ __device__ __forceinline__ float kevin_silu(float x) {  // (`KEVIN_SILU_FORM`)
    float e = expf(-fabsf(x));
    return (x < 0.0f ? x * e : x) / (1.0f + e);
}
__host__ __device__ __forceinline__ float kevin_tanh(float x) { return tanhf(x); }
__host__ __device__ __forceinline__ float kevin_log1p_exp(float x) { return log1pf(expf(x)); }
#endif
// sign(NaN) is 0 in PyTorch, which is what (0 < x) - (x < 0) gives.
__host__ __device__ __forceinline__ float kevin_sign(float x) { return (float)((0.0f < x) - (x < 0.0f)); }
__host__ __device__ __forceinline__ float kevin_isnan(float x) { return x != x ? 1.0f : 0.0f; }
__host__ __device__ __forceinline__ float kevin_isinf(float x) { return fabsf(x) == INFINITY ? 1.0f : 0.0f; }
// torch.xlogy: 0 where x is 0 (even where log(y) is infinite), NaN where y is NaN
__host__ __device__ __forceinline__ float kevin_xlogy(float x, float y) { return y != y ? y : (x == 0.0f ? 0.0f : x * logf(y)); }
__host__ __device__ __forceinline__ float kevin_gelu_erf(float x) {
    return x * 0.5f * (1.0f + erff(x * 0.70710678118654752440f));  // x * Phi(x)
}
__host__ __device__ __forceinline__ float kevin_gelu_tanh(float x) {
    const float beta = 0.79788456080286535588f;  // sqrt(2 / pi)
    const float kappa = 0.044715f;
    return 0.5f * x * (1.0f + kevin_tanh(beta * (x + kappa * x * x * x)));
}
// PyTorch's softplus: linear above the threshold (where log1p(exp(b x)) / b is x in float anyway).
__host__ __device__ __forceinline__ float kevin_softplus(float x, float beta, float threshold) {
    return x * beta > threshold ? x : kevin_log1p_exp(x * beta) / beta;
}
__host__ __device__ __forceinline__ float kevin_mish(float x) { return x * kevin_tanh(kevin_log1p_exp(x)); }
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
