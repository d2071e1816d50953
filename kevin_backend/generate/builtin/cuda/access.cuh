//: Loads and stores of every element type as float (int64 targets as float, positions as int64),
//: 2-, 4- and 8-wide loads and stores, and the online softmax's steps (a running max and a running sum of
//: exp(x - max), a value or a chunk at a time, and the rescale of a sum to a larger max).
__device__ __forceinline__ float kevin_ld(const float* p, long long i) { return p[i]; }
__device__ __forceinline__ float kevin_ld(const __half* p, long long i) { return __half2float(p[i]); }
__device__ __forceinline__ float kevin_ld(const __nv_bfloat16* p, long long i) { return __bfloat162float(p[i]); }
__device__ __forceinline__ float kevin_ld(const bool* p, long long i) { return p[i] ? 1.0f : 0.0f; }
__device__ __forceinline__ float kevin_ld(const int64_t* p, long long i) { return (float)p[i]; }  // class targets (< 2^24)
__device__ __forceinline__ void kevin_st(float* p, long long i, float v) { p[i] = v; }
__device__ __forceinline__ void kevin_st(__half* p, long long i, float v) { p[i] = __float2half_rn(v); }
__device__ __forceinline__ void kevin_st(__nv_bfloat16* p, long long i, float v) { p[i] = __float2bfloat16_rn(v); }
__device__ __forceinline__ void kevin_st(int64_t* p, long long i, int64_t v) { p[i] = v; }
// online softmax: a running max `m` and a running sum `s` of exp(x - m), rescaled when the max
// grows; -inf adds nothing, a NaN makes the max NaN (as torch's amax)
__device__ __forceinline__ void kevin_online_step(float& m, float& s, float x) {
    if (x == -INFINITY) return;
    if (x > m) { s = s * expf(m - x) + 1.0f; m = x; } else { s = s + expf(x - m); if (x != x) m = x; }
}
// the same over `n` values at once (-inf for a column outside the row): their max, the sum
// rescaled once if it grew, then each value's exp added; a NaN among them makes the max NaN
__device__ __forceinline__ void kevin_online_chunk(float& m, float& s, const float* x, int n) {
    float top = -INFINITY; bool nan = false;
    #pragma unroll
    for (int u = 0; u < n; ++u) { top = fmaxf(top, x[u]); nan = nan || x[u] != x[u]; }
    if (top > m) { s = s * expf(m - top); m = top; }
    if (m != -INFINITY) {
        #pragma unroll
        for (int u = 0; u < n; ++u) s += expf(x[u] - m);
    }
    if (nan) m = NAN;
}
// a running sum of exp(x - m) rescaled to the larger max `to` (an empty sum stays 0)
__device__ __forceinline__ float kevin_online_rescale(float s, float m, float to) { return s == 0.0f ? 0.0f : s * expf(m - to); }
// two neighbouring 16-bit values in one 4-byte access (the offset even, the pointer 4-byte aligned)
__device__ __forceinline__ void kevin_ld2(const __half* p, long long i, float& a, float& b) {
    const __half2 t = *reinterpret_cast<const __half2*>(p + i); a = __low2float(t); b = __high2float(t);
}
__device__ __forceinline__ void kevin_ld2(const __nv_bfloat16* p, long long i, float& a, float& b) {
    const __nv_bfloat162 t = *reinterpret_cast<const __nv_bfloat162*>(p + i); a = __low2float(t); b = __high2float(t);
}
__device__ __forceinline__ void kevin_st2(__half* p, long long i, float a, float b) {
    *reinterpret_cast<__half2*>(p + i) = __halves2half2(__float2half_rn(a), __float2half_rn(b));
}
__device__ __forceinline__ void kevin_st2(__nv_bfloat16* p, long long i, float a, float b) {
    *reinterpret_cast<__nv_bfloat162*>(p + i) = __halves2bfloat162(__float2bfloat16_rn(a), __float2bfloat16_rn(b));
}
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
__device__ __forceinline__ void kevin_ld8(const __half* p, long long i, float* v) {
    uint4 t = *reinterpret_cast<const uint4*>(p + i); const __half* h = reinterpret_cast<const __half*>(&t);
    for (int e = 0; e < 8; ++e) v[e] = __half2float(h[e]);
}
__device__ __forceinline__ void kevin_ld8(const __nv_bfloat16* p, long long i, float* v) {
    uint4 t = *reinterpret_cast<const uint4*>(p + i); const __nv_bfloat16* h = reinterpret_cast<const __nv_bfloat16*>(&t);
    for (int e = 0; e < 8; ++e) v[e] = __bfloat162float(h[e]);
}
__device__ __forceinline__ void kevin_st8(__half* p, long long i, const float* v) {
    uint4 t; __half* h = reinterpret_cast<__half*>(&t);
    for (int e = 0; e < 8; ++e) h[e] = __float2half_rn(v[e]);
    *reinterpret_cast<uint4*>(p + i) = t;
}
__device__ __forceinline__ void kevin_st8(__nv_bfloat16* p, long long i, const float* v) {
    uint4 t; __nv_bfloat16* h = reinterpret_cast<__nv_bfloat16*>(&t);
    for (int e = 0; e < 8; ++e) h[e] = __float2bfloat16_rn(v[e]);
    *reinterpret_cast<uint4*>(p + i) = t;
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
