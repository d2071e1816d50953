//: `kevin_row_reduce_arg<op>` for the columns mapping spread over a cluster (as
//: spread_reduce.cuh, each value with its position; ties go to the lower position whatever the order).
//: Holes: op (max, min), threads, rpb, cluster, own, gathered.
__device__ __forceinline__ void kevin_row_reduce_arg${op}(float& v, int64_t& i, float* smem, int64_t* smem_i, int row_in_block, int lane) {
    cooperative_groups::cluster_group cluster = cooperative_groups::this_cluster();
    const int lane_in = (int)threadIdx.x / ${rpb};
    cluster.sync();
    smem[lane_in * ${rpb} + row_in_block] = v; smem_i[lane_in * ${rpb} + row_in_block] = i;
    __syncthreads();
    if (lane_in == 0) {
        for (int w = 1; w < ${threads}; ++w) kevin_arg_join_${op}(v, i, smem[w * ${rpb} + row_in_block], smem_i[w * ${rpb} + row_in_block]);
        smem[${own} + row_in_block] = v; smem_i[${own} + row_in_block] = i;
    }
    cluster.sync();
    for (int r = lane_in; r < ${cluster}; r += ${threads}) {
        smem[${gathered} + r * ${rpb} + row_in_block] = cluster.map_shared_rank(smem, r)[${own} + row_in_block];
        smem_i[${gathered} + r * ${rpb} + row_in_block] = cluster.map_shared_rank(smem_i, r)[${own} + row_in_block];
    }
    __syncthreads();
    v = smem[${gathered} + row_in_block]; i = smem_i[${gathered} + row_in_block];
    for (int r = 1; r < ${cluster}; ++r) kevin_arg_join_${op}(v, i, smem[${gathered} + r * ${rpb} + row_in_block], smem_i[${gathered} + r * ${rpb} + row_in_block]);
}
