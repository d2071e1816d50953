//: `kevin_row_reduce_<op>`: a row's value from its threads: shuffles within each warp (or within
//: the row's lanes when a row has fewer than 32: the first offset is half the row's threads, at most
//: 16), then shared memory across the row's warps (every thread of the block must call it).
//: Holes: op (add, max, min), first_offset, step (the combine of v and its shuffled partner),
//: warps (a row's warps), init (the combine's identity), gather (the combine of v and a warp's value).
__device__ __forceinline__ float kevin_row_reduce_${op}(float v, float* smem, int row_in_block, int lane) {
    #pragma unroll
    for (int o = ${first_offset}; o > 0; o >>= 1) v = ${step};
    if (${warps} > 1) {
        __syncthreads();
        if ((lane & 31) == 0) smem[row_in_block * ${warps} + (lane >> 5)] = v;
        __syncthreads();
        v = ${init};
        for (int w = 0; w < ${warps}; ++w) v = ${gather};
    }
    return v;
}
