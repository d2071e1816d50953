//: `kevin_row_reduce_arg<op>`: a row's (value, position) from its threads' (every thread of the
//: block calls it): shuffles within a warp, then shared memory across the row's warps.
//: Holes: op (max, min), first_offset (half the row's threads, at most 16), warps (a row's warps).
__device__ __forceinline__ void kevin_row_reduce_arg${op}(float& v, int64_t& i, float* smem, int64_t* smem_i, int row_in_block, int lane) {
    #pragma unroll
    for (int o = ${first_offset}; o > 0; o >>= 1) {
        const float x = __shfl_xor_sync(0xffffffffu, v, o);
        const int64_t j = __shfl_xor_sync(0xffffffffu, i, o);
        kevin_arg_join_${op}(v, i, x, j);
    }
    if (${warps} > 1) {
        __syncthreads();
        if ((lane & 31) == 0) { smem[row_in_block * ${warps} + (lane >> 5)] = v; smem_i[row_in_block * ${warps} + (lane >> 5)] = i; }
        __syncthreads();
        for (int w = 0; w < ${warps}; ++w) kevin_arg_join_${op}(v, i, smem[row_in_block * ${warps} + w], smem_i[row_in_block * ${warps} + w]);
    }
}
