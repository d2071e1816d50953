"""The order the built-in writer tries a plan's variants in (`preferred_order`), as data: tables of
rules, each with its condition and its reason. The measurements behind them are in
benchmarks/RESULTS.md ("The built-in writer's variant ranking: the measurements behind it").

    names = preferred_order(plan)     # every variant of the plan's family, by name, best bet first

Pointwise plans take the first order of `POINTWISE_ORDERS` whose condition holds. Rows plans sort
their variants by `ROW_GROUPS` (each variant by the key of the first group it belongs to: its
group's rank, then its distance from the threads a row the shape wants, then whether its row
fits in registers; ties keep the list's order), then apply each rule of `ROW_PLACEMENTS` whose
condition holds. (On the suites, rows of about a thousand went fastest with 128 to 256 threads a
row, the row in registers: an eighth of the row's length a thread, which the key aims at.)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

from kevin_backend.generate.builtin.gpu_properties import clusters_available, gpu_properties
from kevin_backend.generate.builtin.plan import INDEXED, Plan
from kevin_backend.generate.builtin.split_rows import split_count
from kevin_backend.generate.builtin.tiled_kernel import tiled_pairs
from kevin_backend.generate.builtin.variant_fit import (cached_values, can_vectorize, can_vectorize_rows, row_reads, row_width,
                                                        staged_output, strided_rows, transposed_plane)
from kevin_backend.generate.builtin.variants import VARIANTS_ROWS, Variant

__all__ = ["preferred_order", "RowShape", "PointwiseOrder", "RowGroup", "Placement", "POINTWISE_ORDERS", "ROW_GROUPS",
           "ROW_PLACEMENTS", "PLAIN"]

# The plain kernel: 256 threads, nothing else set (the first of both families' lists).
PLAIN = "t256"


@dataclass(frozen=True)
class PointwiseOrder:
    condition: str  # in words
    holds: Callable[[Plan], bool]
    order: tuple[str, ...]
    reason: str


POINTWISE_ORDERS = (
    PointwiseOrder(
        "an input transposed against the output, every value 16-bit, the plane's sides even (`tiled_pairs`)", tiled_pairs,
        ("t256-tiled-vector", "t256-tiled", "t256-tiled-items2", "t256", "t128-vector-items2", "t1024", "t256-vector-items4",
         "t128", "t256-vector", "t512-vector"),
        "the paired 64 x 64 tiles first: each access two 16-bit values, so a warp's loads and stores are the 128-byte "
        "stretches of the 32 x 32 float kernel (a float permute ran at 94% of the copy bandwidth on the H200, the same "
        "kernel on 16-bit values at 69%, Inductor's at 101%; the paired kernel itself not yet timed on a GPU), then the 32 x 32 "
        "tiles"),
    PointwiseOrder(
        "an input transposed against the output (`transposed_plane`)", lambda plan: transposed_plane(plan) is not None,
        ("t256-tiled", "t256-tiled-items2", "t256", "t128-vector-items2", "t1024", "t256-vector-items4", "t128", "t256-vector",
         "t512-vector", "t256-tiled-vector"),
        "tiles through shared memory first, 32 x 32 then 32 x 64 (the wider tile was the slower on an f16 permute), then "
        "more items per thread"),
    PointwiseOrder(
        "a vector path (`can_vectorize`)", can_vectorize,
        ("t256-vector", "t256-vector-items4", "t128-vector-items2", "t256", "t512-vector", "t1024", "t128", "t256-tiled",
         "t256-tiled-items2", "t256-tiled-vector"),
        "the 4-wide (8-wide for 16-bit) kernel first, then more vectors in flight per thread: the plain kernel lost to the "
        "vector one in nearly every large pointwise search on the H200, so a short search should not spend a turn on it"),
    PointwiseOrder(
        "any other pointwise plan", lambda plan: True,
        ("t256", "t128-vector-items2", "t1024", "t256-vector-items4", "t128", "t256-vector", "t512-vector", "t256-tiled",
         "t256-tiled-items2", "t256-tiled-vector"),
        "the plain kernel first, then more items per thread (without a vector path the vector variants are the scalar "
        "kernel again; without a transposed input the tiled ones are the plain kernel)"),
)


@dataclass(frozen=True)
class RowShape:
    """The facts of a rows plan the ranking reads."""

    plan: Plan
    across_memory: bool  # rows across memory: read best by the columns mapping (`strided_rows`)
    splitting: bool  # rows too few to fill the GPU, long enough to split (`split_count`)
    one_block: bool  # the row fits one 1024-thread block's registers
    clusters: bool  # the GPU here launches thread-block clusters
    vector_ok: bool  # the rows have a vector path (`can_vectorize_rows`)
    width: int  # elements per vector access (`row_width`)
    indexed: bool  # an index reduction
    reads: int  # passes an uncached kernel makes over a row (`row_reads`)
    staged: bool  # a columns kernel of 32 threads a row would stage its outputs (`staged_output`)

    @staticmethod
    def of(plan: Plan) -> RowShape:
        return RowShape(plan, strided_rows(plan), split_count(plan) > 1, cached_values(plan, Variant(1024, cache=True), False) > 0,
                        clusters_available(), can_vectorize_rows(plan), row_width(plan),
                        any(r.reduction in INDEXED for r in plan.reductions), row_reads(plan),
                        staged_output(plan, Variant(32, rows_per_block=32, columns=True)))

    def fits(self, v: Variant, vector: bool) -> bool:
        """Whether `v` keeps the row in registers (on its vector path, with `vector`)."""
        return cached_values(self.plan, v, vector) > 0

    def threads_wanted(self, v: Variant) -> int:
        """The threads a row the shape wants of a variant of `v`'s kind."""
        cols = self.plan.cols
        if v.columns:  # enough threads per row to fill the GPU when rows are few, one when they are many
            gpu = gpu_properties()
            return max(1, min(32, (gpu.multiprocessors * gpu.threads_per_multiprocessor) // max(1, self.plan.rows)))
        want = min(1024, max(16, cols // 8))  # an eighth of the row (half a warp for short rows, big blocks for long ones)
        if v.vector and self.vector_ok and self.width == 8:  # 16-bit rows, 8 values an access: two to four accesses a thread
            want = min(1024, max(8, cols // 32, min(128, cols // 16)))
        if v.vector and self.vector_ok and self.indexed:
            want = min(1024, max(8, cols // (4 * self.width)))
        return want


def _distance(v: Variant, shape: RowShape) -> float:
    return abs(math.log2(v.threads) - math.log2(shape.threads_wanted(v)))


@dataclass(frozen=True)
class RowGroup:
    kind: str  # the variants it holds, in words
    holds: Callable[[Variant], bool]
    key: Callable[[Variant, RowShape], tuple[float, ...]]  # ascending: best bet first
    reason: str


ROW_GROUPS = (
    RowGroup(
        "clusters (`Variant.cluster` > 1)", lambda v: v.cluster > 1,
        lambda v, s: (5, v.cluster, 0 if v.vector == s.vector_ok else 1),
        "last, the smallest cluster first: they build only for GPUs with clusters, and ranked early they lost to one "
        "block a row on most shapes (`ROW_PLACEMENTS` brings one forward where it pays)"),
    RowGroup(
        "split rows", lambda v: v.split,
        lambda v, s: (-1 if s.splitting else 4, abs(math.log2(v.threads) - 8), 0),
        "first where the rows are too few to fill the GPU and long enough to split, 256 threads a block first; else "
        "after every unsplit kernel"),
    RowGroup(
        "rows across a warp's threads (the columns mapping)", lambda v: v.columns,
        lambda v, s: (0 if s.across_memory else 3, _distance(v, s), 0 if not v.cache else 1),
        "first where the rows lie across memory, else after the other kernels; threads a row near what fills the GPU "
        "(one where rows are many), the row kept in registers after the rest at the same distance (ranked first for "
        "long rows read more than once, blocks of 1024 threads on 8 to 32 rows tied at best and lost at worst)"),
    RowGroup(
        "vector loads", lambda v: v.vector,
        lambda v, s: ((0 if s.vector_ok and s.fits(v, True) else 2) + s.across_memory, _distance(v, s), 0 if s.fits(v, True) else 1),
        "first where the row has a vector path and fits in registers (else last of the unsplit kernels: they are the "
        "scalar kernel again); threads a row near an eighth of the row, for 16-bit rows two to four 8-wide accesses a "
        "thread (128 threads for rows of 2048 and 4096), for index reductions four accesses a thread (their join "
        "across threads, a value and a position a shuffle, costs more)"),
    RowGroup(
        "scalar loads", lambda v: True,
        lambda v, s: (1 + s.across_memory, _distance(v, s), 0 if s.fits(v, False) else 1),
        "after the vector variants that have a vector path; threads a row near an eighth of the row, the row in "
        "registers where it fits"),
)


def _group_key(v: Variant, shape: RowShape) -> tuple[float, ...]:
    return next(g.key(v, shape) for g in ROW_GROUPS if g.holds(v))


@dataclass(frozen=True)
class Placement:
    rule: str  # in words
    holds: Callable[[RowShape], bool]
    place: Callable[[list[str], RowShape], list[str]]  # the order with the rule applied
    reason: str


def _plain_first(order: list[str], shape: RowShape) -> list[str]:
    return [PLAIN, *(n for n in order if n != PLAIN)]


def _cluster_fits(v: Variant, shape: RowShape) -> bool:
    return 1 < v.cluster <= 8 and shape.fits(v, v.vector) and (not v.vector or shape.vector_ok)


def _cluster_second(order: list[str], shape: RowShape) -> list[str]:
    by_name = {v.name: v for v in VARIANTS_ROWS}
    cluster = next((n for n in order if _cluster_fits(by_name[n], shape)), None)
    if cluster is None:
        return order
    rest = [n for n in order if n != cluster]
    return [*rest[:1], cluster, *rest[1:]]


def _spread_first(order: list[str], shape: RowShape) -> list[str]:
    if shape.fits(Variant(32, rows_per_block=32, columns=True, cache=True), False):  # one block holds the rows
        return order
    spread = [v for v in VARIANTS_ROWS if v.cluster > 1 and v.columns and shape.fits(v, False)]
    picks = [v.name for v in (next((v for v in spread if v.threads == t), None) for t in (16, 8, 32)) if v is not None][:2]
    if not picks:
        return order
    rest = [n for n in order if n not in picks]
    return [picks[0], *rest[:1], *picks[1:], *rest[1:]]


ROW_PLACEMENTS = (
    Placement(
        "the plain kernel first where a row is too long for one block's registers (not across memory, not split)",
        lambda s: not (s.across_memory or s.splitting or s.one_block), _plain_first,
        "there it won half the searches (long softmax, cross-entropy over many 16-bit classes, instance norm); where the "
        "row fits, the ranked kernel beat it in every search"),
    Placement(
        "on a GPU with clusters, the smallest cluster of 2 to 8 blocks that holds a row too long for one block comes second",
        lambda s: s.clusters and not s.across_memory and not s.one_block, _cluster_second,
        "second, not first, so a search of two turns measures both: a cluster read an L2 norm's long rows at two thirds "
        "of the copy bandwidth but a 16-bit cross-entropy at a tenth, and clusters of 16 blocks slower still (they stay "
        "last)"),
    Placement(
        "on a GPU with clusters, rows across memory written along memory (the input transposed against the output) that "
        "one block cannot hold and the other kernels read more than once: the smallest spread cluster that holds them "
        "first (blocks of 512 threads), then the ranked kernel, then blocks of 256 (1024 where neither holds the row)",
        lambda s: s.clusters and s.across_memory and not s.splitting and s.reads > 1 and s.staged, _spread_first,
        "a cluster of 8 blocks of 512 threads wrote a softmax of a transposed input in well under the ranked kernel's "
        "time; over rows whose outputs lie as the input (a softmax over a middle dim) it lost, and stays last there"),
)


def preferred_order(plan: Plan) -> list[str]:
    """The names of the plan's variants (VARIANTS_ROWS or VARIANTS_POINTWISE), every one once, in
    the order they are likely to pay for this shape."""
    if not plan.is_rows:
        return list(next(rule.order for rule in POINTWISE_ORDERS if rule.holds(plan)))
    shape = RowShape.of(plan)
    order = [v.name for v in sorted(VARIANTS_ROWS, key=lambda v: _group_key(v, shape))]
    for rule in ROW_PLACEMENTS:
        if rule.holds(shape):
            order = rule.place(order, shape)
    return order
