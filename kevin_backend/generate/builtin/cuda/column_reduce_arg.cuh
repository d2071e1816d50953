//: `kevin_row_reduce_arg<op>` for the columns mapping: shared memory across the row's threads.
//: Holes: op (max, min), threads (a row's), rpb (rows a block).
__device__ __forceinline__ void kevin_row_reduce_arg${op}(float& v, int64_t& i, float* smem, int64_t* smem_i, int row_in_block, int lane) {
    if (${threads} > 1) {
        __syncthreads();
        smem[lane * ${rpb} + row_in_block] = v; smem_i[lane * ${rpb} + row_in_block] = i;
        __syncthreads();
        for (int w = 0; w < ${threads}; ++w) kevin_arg_join_${op}(v, i, smem[w * ${rpb} + row_in_block], smem_i[w * ${rpb} + row_in_block]);
    }
}
