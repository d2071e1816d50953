//: `kevin_row_reduce_<op>` when a row's threads are one per `rpb` in the block (the columns
//: mapping): each writes its partial to shared memory, then each reads the row's all.
//: Holes: op, threads (a row's), rpb (rows a block), init, gather (the combine of v and a partial).
__device__ __forceinline__ float kevin_row_reduce_${op}(float v, float* smem, int row_in_block, int lane) {
    if (${threads} > 1) {
        __syncthreads();
        smem[lane * ${rpb} + row_in_block] = v;
        __syncthreads();
        v = ${init};
        for (int w = 0; w < ${threads}; ++w) v = ${gather};
    }
    return v;
}
