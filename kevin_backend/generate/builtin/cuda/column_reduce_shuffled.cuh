//: `kevin_row_reduce_<op>` for the columns mapping with fewer rows than a warp's 32 threads (a
//: row's threads several to a warp): the threads of a row within a warp first combine by shuffles
//: (offsets `rpb` and up keep the row), and each warp leaves one partial per row: a row of 128
//: threads, 8 rows a block, reads 32 partials, not 128.
//: Holes: op, rpb, step (the shuffle's combine), init, warps (the block's), gather.
__device__ __forceinline__ float kevin_row_reduce_${op}(float v, float* smem, int row_in_block, int lane) {
    #pragma unroll
    for (int o = 16; o >= ${rpb}; o >>= 1) v = ${step};
    __syncthreads();
    if ((threadIdx.x & 31) < ${rpb}) smem[(threadIdx.x >> 5) * ${rpb} + row_in_block] = v;
    __syncthreads();
    v = ${init};
    for (int w = 0; w < ${warps}; ++w) v = ${gather};
    return v;
}
