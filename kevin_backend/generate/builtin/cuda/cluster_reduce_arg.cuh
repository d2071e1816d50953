//: `kevin_row_reduce_arg<op>` over a cluster's blocks (as cluster_reduce.cuh; a lane past the
//: values joins lane 0's again, which changes nothing).
//: Holes: op (max, min), warps (a block's), cluster (blocks).
__device__ __forceinline__ void kevin_row_reduce_arg${op}(float& v, int64_t& i, float* smem, int64_t* smem_i, int row_in_block, int lane) {
    #pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float x = __shfl_xor_sync(0xffffffffu, v, o);
        const int64_t j = __shfl_xor_sync(0xffffffffu, i, o);
        kevin_arg_join_${op}(v, i, x, j);
    }
    cooperative_groups::cluster_group cluster = cooperative_groups::this_cluster();
    cluster.sync();
    if ((threadIdx.x & 31) == 0) { smem[threadIdx.x >> 5] = v; smem_i[threadIdx.x >> 5] = i; }
    __syncthreads();
    const int w = (int)(threadIdx.x & 31) < ${warps} ? (int)(threadIdx.x & 31) : 0;
    v = smem[w]; i = smem_i[w];
    #pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float x = __shfl_xor_sync(0xffffffffu, v, o);
        const int64_t j = __shfl_xor_sync(0xffffffffu, i, o);
        kevin_arg_join_${op}(v, i, x, j);
    }
    __syncthreads();
    if (threadIdx.x == 0) { smem[0] = v; smem_i[0] = i; }
    cluster.sync();
    const int b = (int)(threadIdx.x & 31) < ${cluster} ? (int)(threadIdx.x & 31) : 0;
    v = cluster.map_shared_rank(smem, b)[0]; i = cluster.map_shared_rank(smem_i, b)[0];
    #pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float x = __shfl_xor_sync(0xffffffffu, v, o);
        const int64_t j = __shfl_xor_sync(0xffffffffu, i, o);
        kevin_arg_join_${op}(v, i, x, j);
    }
}
