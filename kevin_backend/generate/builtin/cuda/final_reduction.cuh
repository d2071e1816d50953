//: `kevin_final`: one block reduces the rows kernel's per-row values (`p_rows`) in a fixed order:
//: their sum (compensated), over the count of rows whose target is not ignored for a mean (NaN when
//: every target is, as PyTorch's); the count stored in `p_cnt` where the task returns it.
//: Holes: ctype (the result's C type), rows, count (the count step, else nothing), result, count_param and
//: store_count (the returned count's parameter and store, else nothing).
__global__ void __launch_bounds__(1024) kevin_final(const float* __restrict__ p_rows, const int64_t* __restrict__ p_t,
                                                    ${ctype}* __restrict__ p_res${count_param}) {
    __shared__ float s_acc[32]; __shared__ float s_cnt[32];
    float acc = 0.0f, comp = 0.0f, cnt = 0.0f;
    for (long long r = threadIdx.x; r < ${rows}LL; r += 1024) {
        const float y = p_rows[r] - comp; const float t = acc + y; comp = isfinite(t) ? (t - acc) - y : 0.0f; acc = t;
        ${count}
    }
    for (int o = 16; o > 0; o >>= 1) { acc += __shfl_xor_sync(0xffffffffu, acc, o); cnt += __shfl_xor_sync(0xffffffffu, cnt, o); }
    if ((threadIdx.x & 31) == 0) { s_acc[threadIdx.x >> 5] = acc; s_cnt[threadIdx.x >> 5] = cnt; }
    __syncthreads();
    acc = s_acc[threadIdx.x & 31]; cnt = s_cnt[threadIdx.x & 31];  // every warp the same: the shuffles need all threads
    for (int o = 16; o > 0; o >>= 1) { acc += __shfl_xor_sync(0xffffffffu, acc, o); cnt += __shfl_xor_sync(0xffffffffu, cnt, o); }
    if (threadIdx.x == 0) { kevin_st(p_res, 0, ${result});${store_count} }
}
