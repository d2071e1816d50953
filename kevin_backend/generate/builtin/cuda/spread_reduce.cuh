//: `kevin_row_reduce_<op>` for the columns mapping spread over a cluster (rows across memory, each
//: row's columns over the cluster's blocks): a block's partials of each of its rows combined through
//: shared memory into the block's value of the row; after a cluster barrier, `cluster` threads of
//: each row read one block's value each (distributed shared memory), and every thread of the row
//: combines them in rank order, so the row's threads across the cluster agree. Shared memory: the
//: partials (threads x rpb), the block's values (rpb), the cluster's (cluster x rpb).
//: Holes: op, threads (a row's in a block), rpb, cluster, own (threads x rpb), gathered
//: ((threads + 1) x rpb), init, add (the block's combine), join (the cluster's combine).
__device__ __forceinline__ float kevin_row_reduce_${op}(float v, float* smem, int row_in_block, int lane) {
    cooperative_groups::cluster_group cluster = cooperative_groups::this_cluster();
    const int lane_in = (int)threadIdx.x / ${rpb};
    cluster.sync();  // the cluster's reads of an earlier reduction are done
    smem[lane_in * ${rpb} + row_in_block] = v;
    __syncthreads();
    if (lane_in == 0) {
        float b = ${init};
        for (int w = 0; w < ${threads}; ++w) b = ${add};
        smem[${own} + row_in_block] = b;
    }
    cluster.sync();  // every block's values written
    for (int r = lane_in; r < ${cluster}; r += ${threads})  // (fewer threads a row than blocks: some read two)
        smem[${gathered} + r * ${rpb} + row_in_block] = cluster.map_shared_rank(smem, r)[${own} + row_in_block];
    __syncthreads();
    v = ${init};
    for (int r = 0; r < ${cluster}; ++r) v = ${join};
    return v;
}
