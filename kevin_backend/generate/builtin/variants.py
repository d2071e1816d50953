"""The built-in writer's variants: the tuning knobs of its kernels, each set a named `Variant`.

    variants = variants_for(plan)                     # VARIANTS_ROWS or VARIANTS_POINTWISE
    variant = variant_named(plan, "t128-vector-cache")
    variant_number(plan, variant.name)                # its position: the "variant N" of program text

A variant is named by its knobs (`Variant.name`); code that ranks or picks variants uses names.
Its position in its list is the number the programs' docstrings and kernel names carry.
"""

from __future__ import annotations

from dataclasses import dataclass

from kevin_backend.generate.builtin.plan import Plan

__all__ = ["Variant", "VARIANTS_POINTWISE", "VARIANTS_ROWS", "variants_for", "variant_named", "variant_number"]


@dataclass(frozen=True)
class Variant:
    """One setting of a kernel family's tuning knobs (the family itself follows from the plan and
    from `split` and `tiled`)."""

    threads: int = 256  # threads per block (pointwise) or per row (rows; 32 = a warp per row)
    vector: bool = False  # 16-byte accesses when aligned (4 floats; 8 halves for rows of 16-bit values)
    items: int = 1  # elements (or vectors) per thread per step (pointwise)
    rows_per_block: int = 1  # rows kernel with a warp per row: rows sharing one block
    cache: bool = False  # rows kernel: keep the row's inputs in registers across passes (one read)
    columns: bool = False  # rows kernel: neighbouring threads take neighbouring rows (a row strided in memory)
    split: bool = False  # rows plan: each row over several blocks, a launch per reduction (`split_rows.py`)
    tiled: bool = False  # pointwise plan: 32 x 32 tiles through shared memory (an input transposed against the output)
    # rows kernel: each row over a thread-block cluster of this many blocks (Hopper and later),
    # the row held in the cluster's registers, partial results combined through distributed shared memory
    cluster: int = 1

    @property
    def name(self) -> str:
        """The variant's name, from its knobs: threads (x rows a block), then each knob it sets, in a
        fixed order (`t256-vector`, `t32x8-vector-cache`, `t16x32-columns-cache-cluster4`)."""
        flags = [flag for flag, on in (("tiled", self.tiled), ("split", self.split), ("columns", self.columns),
                                       ("vector", self.vector), ("cache", self.cache)) if on]
        counts = [*([f"items{self.items}"] if self.items != 1 else []), *([f"cluster{self.cluster}"] if self.cluster != 1 else [])]
        rows = f"x{self.rows_per_block}" if self.rows_per_block != 1 else ""
        return "-".join([f"t{self.threads}{rows}", *flags, *counts])

    def describe(self) -> str:
        """The variant in words, for the program's docstring and the policy's replies."""
        parts = [f"{self.threads} threads" + (" per row" if self.rows_per_block != 1 or self.threads == 32 else "")]
        if self.columns:
            parts.append("rows across a warp's threads")
        if self.split:
            parts = [f"{self.threads} threads per block", "each row split over several blocks"]
        if self.tiled:
            parts = [f"32 x {32 * max(1, self.items)} tiles through shared memory", f"{self.threads} threads"]
        if self.tiled and self.vector:  # (`tiled_kernel.tiled_pairs`; other plans get the 32 x 32 tiles again)
            return f"64 x 64 tiles through shared memory where every value is 16-bit (two an access), {self.threads} threads"
        if self.cluster > 1 and self.columns:
            parts = [f"a cluster of {self.cluster} blocks of {self.threads * self.rows_per_block} threads on "
                     f"{self.rows_per_block} rows across memory, each row's columns over the blocks (distributed shared memory)"]
        elif self.cluster > 1:
            parts = [f"a cluster of {self.cluster} blocks of {self.threads} threads per row (distributed shared memory)"]
        if self.rows_per_block > 1 and not (self.cluster > 1 and self.columns):
            parts.append(f"{self.rows_per_block} rows per block")
        if self.vector:
            parts.append("vector loads")
        if self.items > 1:
            parts.append(f"{self.items} items per thread")
        if self.cache:
            parts.append("row kept in registers")
        return ", ".join(parts)


VARIANTS_POINTWISE = (
    Variant(256), Variant(256, vector=True), Variant(128, vector=True, items=2), Variant(512, vector=True),
    Variant(256, vector=True, items=4), Variant(1024), Variant(128),
    # an input transposed against the output: tiles read along the input's contiguous dimension
    # into shared memory, written along the output's (`transposed_plane`)
    Variant(256, tiled=True),
    # tiles twice as long along the output's dimension: twice the loads in flight per thread
    Variant(256, tiled=True, items=2),
    # 16-bit values: 64 x 64 tiles, two neighbouring values an access (`tiled_kernel.tiled_pairs`)
    Variant(256, tiled=True, vector=True),
)
VARIANTS_ROWS = (
    Variant(256), Variant(256, cache=True), Variant(128, cache=True), Variant(32, rows_per_block=8, cache=True),
    Variant(512, cache=True), Variant(1024, cache=True), Variant(64, rows_per_block=4, cache=True), Variant(128),
    Variant(128, vector=True, cache=True), Variant(256, vector=True, cache=True), Variant(64, rows_per_block=4, vector=True, cache=True),
    Variant(32, rows_per_block=8, vector=True, cache=True), Variant(16, rows_per_block=16, vector=True, cache=True),
    Variant(512, vector=True, cache=True), Variant(1024, vector=True, cache=True),
    # rows whose elements lie apart in memory (a reduction over a dimension that is not the
    # innermost): a warp's 32 threads take 32 neighbouring rows, so each of its loads is one
    # contiguous stretch; a row's threads (one per warp) combine through shared memory
    Variant(1, rows_per_block=256, columns=True), Variant(4, rows_per_block=64, columns=True),
    Variant(8, rows_per_block=32, columns=True), Variant(16, rows_per_block=32, columns=True),
    Variant(32, rows_per_block=32, columns=True), Variant(8, rows_per_block=32, columns=True, cache=True),
    # rows too few to fill the GPU: each over several blocks (`split_rows.py`)
    Variant(256, split=True), Variant(512, split=True), Variant(1024, split=True),
    # short rows of 16-bit values: 8 threads a row, 8 values an access (a row of 64 is one access each)
    Variant(8, rows_per_block=32, vector=True, cache=True),
    # rows too long for one block's registers: a thread-block cluster's (read once, reduced through
    # distributed shared memory, written once; Hopper and later)
    Variant(1024, cache=True, cluster=2), Variant(1024, cache=True, cluster=4), Variant(1024, cache=True, cluster=8),
    Variant(1024, vector=True, cache=True, cluster=2), Variant(1024, vector=True, cache=True, cluster=4),
    Variant(1024, vector=True, cache=True, cluster=8),
    # 16 blocks: beyond the portable 8, allowed per kernel (cudaFuncAttributeNonPortableClusterSizeAllowed; H100, H200)
    Variant(1024, cache=True, cluster=16), Variant(1024, vector=True, cache=True, cluster=16),
    # rows across memory long enough to need many threads to keep: a block of 1024 threads on 32,
    # 16 or 8 neighbouring rows (a warp's load one stretch of 128, 64 or 32 bytes of floats), the
    # row in registers (up to 1024, 2048 or 4096 values), read once
    Variant(32, rows_per_block=32, columns=True, cache=True), Variant(64, rows_per_block=16, columns=True, cache=True),
    Variant(128, rows_per_block=8, columns=True, cache=True),
    # rows across memory read more than once, too long for one block's registers: a cluster's
    # blocks on the same 32 neighbouring rows (a warp's load one stretch of 32 values), each block
    # holding its share of the rows' columns in registers, partial results combined through
    # distributed shared memory; read once, written once. Blocks of 512 threads (two to a
    # multiprocessor: one's reads overlap the other's reductions), of 1024, and of 256 (four)
    Variant(16, rows_per_block=32, columns=True, cache=True, cluster=4),
    Variant(16, rows_per_block=32, columns=True, cache=True, cluster=8),
    Variant(16, rows_per_block=32, columns=True, cache=True, cluster=16),
    Variant(32, rows_per_block=32, columns=True, cache=True, cluster=2),
    Variant(32, rows_per_block=32, columns=True, cache=True, cluster=4),
    Variant(32, rows_per_block=32, columns=True, cache=True, cluster=8),
    Variant(32, rows_per_block=32, columns=True, cache=True, cluster=16),
    Variant(8, rows_per_block=32, columns=True, cache=True, cluster=8),
    Variant(8, rows_per_block=32, columns=True, cache=True, cluster=16),
    # rows across memory of 16-bit values: 256 neighbouring rows a block, so a memory row's 512
    # contiguous bytes are read by one block (32 rows, 64 bytes, by one warp), 4 or 2 threads a row
    Variant(4, rows_per_block=256, columns=True), Variant(2, rows_per_block=256, columns=True),
)


def variants_for(plan: Plan) -> tuple[Variant, ...]:
    """The variants of the plan's kernel family: rows or pointwise."""
    return VARIANTS_ROWS if plan.is_rows else VARIANTS_POINTWISE


def variant_named(plan: Plan, name: str) -> Variant:
    """The plan's variant of that name (KeyError for a name its family does not have)."""
    return variants_for(plan)[variant_number(plan, name)]


def variant_number(plan: Plan, name: str) -> int:
    """The position of the named variant in its family's list: the number programs carry in their
    docstring ("variant N") and kernel name (`kevin_builtin_<digest>_<N>`)."""
    numbers = _NUMBERS_ROWS if plan.is_rows else _NUMBERS_POINTWISE
    if name not in numbers:
        raise KeyError(f"no {'row' if plan.is_rows else 'pointwise'} variant named {name!r}")
    return numbers[name]


_NUMBERS_POINTWISE = {v.name: i for i, v in enumerate(VARIANTS_POINTWISE)}
_NUMBERS_ROWS = {v.name: i for i, v in enumerate(VARIANTS_ROWS)}
