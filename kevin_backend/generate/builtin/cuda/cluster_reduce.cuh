//: `kevin_row_reduce_<op>` for a row over a cluster of blocks: shuffles within each warp; every
//: warp combines the block's warp values (shared memory) into the block's; after a cluster barrier,
//: every warp reads the cluster's blocks' values (distributed shared memory, one per lane) and
//: combines them by shuffles in the same order everywhere, so every thread of the cluster gets the
//: same value. A block makes one remote read per lane < cluster of each warp (every thread reading
//: every warp's value of the cluster made 512 reads a thread with 16 blocks of 1024 threads: the
//: H200 took 103 ms for a 13 GB softmax).
//: Holes: op, step (the shuffle's combine), warps (a block's), init, cluster (blocks).
__device__ __forceinline__ float kevin_row_reduce_${op}(float v, float* smem, int row_in_block, int lane) {
    #pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = ${step};
    cooperative_groups::cluster_group cluster = cooperative_groups::this_cluster();
    cluster.sync();  // the cluster's reads of an earlier reduction are done
    if ((threadIdx.x & 31) == 0) smem[threadIdx.x >> 5] = v;
    __syncthreads();
    v = (int)(threadIdx.x & 31) < ${warps} ? smem[(int)(threadIdx.x & 31)] : ${init};  // the block's value, in every warp
    #pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = ${step};
    __syncthreads();  // every warp has read the warps' values
    if (threadIdx.x == 0) smem[0] = v;
    cluster.sync();  // every block's value written
    v = (int)(threadIdx.x & 31) < ${cluster} ? cluster.map_shared_rank(smem, (int)(threadIdx.x & 31))[0] : ${init};
    #pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = ${step};
    return v;
}
