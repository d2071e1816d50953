"""The rows kernel's other mappings of threads to rows (rows_kernel.py holds the first: a row's
threads together in the block):

    ColumnsRowsWriter   rows across memory (a reduction over a middle dimension): a warp's 32
                        threads on 32 neighbouring rows, each load one contiguous stretch, a row's
                        threads combining through shared memory; outputs contiguous along the row
                        staged through shared-memory tiles
    ClusterRowsWriter   a row over a thread-block cluster (Hopper and later): rows too long for
                        one block's registers held in the cluster's, partial results combined
                        through distributed shared memory
    SpreadRowsWriter    rows across memory over a cluster: the cluster's blocks on the same
                        neighbouring rows, each holding its share of their columns

    code = rows_kernel(plan, variant, "kevin_rows", vector=False)
"""

from __future__ import annotations

import re

from kevin_backend.generate.builtin.codegen import closure, indented, references
from kevin_backend.generate.builtin.plan import Kind, Plan, PlanOutput
from kevin_backend.generate.builtin.rows_kernel import RowsWriter
from kevin_backend.generate.builtin.variant_fit import STAGE, staged_output, tile_slots
from kevin_backend.generate.builtin.variants import Variant

__all__ = ["rows_kernel", "spread_column", "ColumnsRowsWriter", "ClusterRowsWriter", "SpreadRowsWriter"]


def rows_kernel(plan: Plan, variant: Variant, name: str, vector: bool = False) -> str:
    """The rows kernel of `variant`'s mapping."""
    if variant.cluster > 1 and variant.columns:
        writer: RowsWriter = SpreadRowsWriter(plan, variant, name, vector)
    elif variant.cluster > 1:
        writer = ClusterRowsWriter(plan, variant, name, vector)
    elif variant.columns:
        writer = ColumnsRowsWriter(plan, variant, name, vector)
    else:
        writer = RowsWriter(plan, variant, name, vector)
    return writer.kernel()


def spread_column(variant: Variant, slot: str) -> str:
    """The column of register `slot` in a columns kernel spread over a cluster (rows across
    memory, each row's columns over the cluster's blocks): the row's columns go in tiles of 32,
    tile `t` to block `t % cluster`, whose threads of the row (`lane_in`, `variant.threads` of
    them) take every `variant.threads`-th column of it; so a block's columns come in whole tiles
    (its outputs staged through shared memory a tile at a time)."""
    q, t, k = tile_slots(variant), variant.threads, variant.cluster
    if q == 1:
        return f"(((long long)({slot}) * {k} + rank) * {STAGE} + lane_in)"
    return f"(((long long)(({slot}) / {q}) * {k} + rank) * {STAGE} + (({slot}) % {q}) * {t} + lane_in)"


class ColumnsRowsWriter(RowsWriter):
    """Rows across memory: neighbouring threads on neighbouring rows, a row's threads one per
    `rows_per_block` in the block."""

    def shared_slots(self) -> int:
        return self.rpb * self.tpr

    def mapping(self) -> str:
        return (f"const int row_in_block = threadIdx.x % {self.rpb};\n    const int lane = threadIdx.x / {self.rpb};"
                f"\n    const long long row = (long long)blockIdx.x * {self.rpb} + row_in_block;")

    def output_pass(self) -> None:
        full_outs = [(k, o) for k, o in enumerate(self.plan.outputs) if o.kind is Kind.FULL]
        if full_outs and staged_output(self.plan, self.variant):
            self.staged_outputs(full_outs)
        else:
            super().output_pass()

    def stage_tiles(self) -> tuple[int, int, str, str, str]:
        """(columns of a tile per thread, the block's tiles, the column of a thread's k-th column
        of tile t, tile t's first column, the block's first row)."""
        per = STAGE // self.tpr
        return (per, -(-self.plan.cols // STAGE), f"(long long)t * {STAGE} + lane + k * {self.tpr}", f"(long long)t * {STAGE}",
                f"(long long)blockIdx.x * {self.rpb}")

    def staged_outputs(self, full_outs: list[tuple[int, PlanOutput]]) -> None:
        """The outputs, contiguous along the row: 32 columns of the block's rows computed into
        shared memory, then written a row's 32 values at a time (one 128-byte stretch) instead of
        each thread's values a row apart."""
        plan, rpb = self.plan, self.rpb
        needed = closure(plan, [o.var for _, o in full_outs], self.available | set(self.kept))
        per, tiles, col, base, first_row = self.stage_tiles()
        row_part, col_part = self.offsets.parts["out"]
        store_row = re.sub(r"\brow\b", "r", row_part) if row_part != "0" else "0"
        store = re.sub(r"\bc\b", "cc", col_part)
        if self.cache:  # the row's registers: the tile's k-th column of a thread is slot t * per + k
            used = references(needed, [o.var for _, o in full_outs])
            fill = [f"float {v} = {v}_r[t * {per} + k];" for v in [*(i.var for i in self.full_inputs), *self.kept] if v in used]
        else:
            fill = self.loads(needed, [o.var for _, o in full_outs])
        body = indented([*fill, *(self.code(n) for n in needed), *(f"tile{k}[row_in_block][c - tile_c] = {o.var};" for k, o in full_outs)], 16)
        writes = " ".join(f"kevin_st(p_out{k}, {store_row} + {store}, tile{k}[i][j]);" for k, _ in full_outs)
        self.emit(
            "".join(f"__shared__ float tile{k}[{rpb}][{STAGE + 1}];\n    " for k, _ in full_outs)
            + ("#pragma unroll\n    " if self.cache else "")
            + f"for (int t = 0; t < {tiles}; ++t) {{\n"
            f"        const long long tile_c = {base};\n"
            f"        #pragma unroll\n        for (int k = 0; k < {per}; ++k) {{\n"
            f"            const long long c = {col};\n"
            f"            if (valid && c < {plan.cols}LL) {{\n                {body}\n            }}\n        }}\n"
            "        __syncthreads();\n"
            f"        for (int e = threadIdx.x; e < {rpb * STAGE}; e += {self.block_threads}) {{\n"
            f"            const int i = e / {STAGE}, j = e % {STAGE};\n"
            f"            const long long r = {first_row} + i, cc = tile_c + j;\n"
            f"            if (r < {plan.rows}LL && cc < {plan.cols}LL) {{ {writes} }}\n        }}\n"
            "        __syncthreads();\n    }")


class ClusterRowsWriter(RowsWriter):
    """A row per cluster: a thread's lane counts across the cluster's blocks, the grid is the rows'
    clusters."""

    def rows_per_block(self) -> int:
        return 1

    def mapping(self) -> str:
        return (f"const int row_in_block = 0;\n    const int lane = (int)(blockIdx.x % {self.variant.cluster}u) * {self.variant.threads}"
                f" + (int)threadIdx.x;\n    const long long row = (long long)(blockIdx.x / {self.variant.cluster}u);")

    def head(self) -> str:
        return f"__global__ void __cluster_dims__({self.variant.cluster}, 1, 1) __launch_bounds__({self.variant.threads})"

    def closing(self) -> str:
        # a block's shared memory is read by the others until the last reduction: none leaves before
        return "\n    cooperative_groups::this_cluster().sync();"


class SpreadRowsWriter(ColumnsRowsWriter):
    """Rows across memory over a cluster: a block's threads on `rows_per_block` neighbouring rows
    (the columns mapping), each row's columns spread over the cluster's blocks (`spread_column`)."""

    def column(self, slot: str) -> str:
        return spread_column(self.variant, slot)

    def register_sharers(self) -> int:
        # a spread cluster's blocks run 1024 threads to a multiprocessor at least (`head`)
        return max(self.block_threads, 1024)

    def shared_slots(self) -> int:
        # the block's partials of its rows, the block's value per row, the cluster's values
        return self.rpb * (self.variant.threads + 1 + self.variant.cluster)

    def mapping(self) -> str:
        v, rpb = self.variant, self.rpb
        return (f"const int row_in_block = threadIdx.x % {rpb};\n    const int rank = (int)(blockIdx.x % {v.cluster}u);\n"
                f"    const int lane_in = threadIdx.x / {rpb};\n    const int lane = rank * {v.threads} + lane_in;\n"
                f"    const long long row = (long long)(blockIdx.x / {v.cluster}u) * {rpb} + row_in_block;")

    def head(self) -> str:
        # (the blocks a multiprocessor holds named, 1024 threads' worth: one block's reads overlap
        # another's reductions and writes; given only a block's size of 1024, ptxas held a spread
        # softmax to 32 registers and spilled its row)
        bounds = f"{self.block_threads}, {max(1, 1024 // self.block_threads)}"
        return f"__global__ void __cluster_dims__({self.variant.cluster}, 1, 1) __launch_bounds__({bounds})"

    def closing(self) -> str:
        return "\n    cooperative_groups::this_cluster().sync();"

    def stage_tiles(self) -> tuple[int, int, str, str, str]:
        # the block's own tiles: tile t of the block is the row's tile t * cluster + rank
        cluster = self.variant.cluster
        per = tile_slots(self.variant)
        return (per, -(-self.plan.cols // (STAGE * cluster)), self.column(f"t * {per} + k"),
                f"((long long)t * {cluster} + rank) * {STAGE}", f"(long long)(blockIdx.x / {cluster}u) * {self.rpb}")
