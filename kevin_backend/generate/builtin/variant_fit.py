"""What a plan allows each variant: the vector paths and their widths, the registers a cached row
takes, the tiles a transposed plan or a staged output goes through, and the shape facts the
ranking reads (rows across memory, passes over a row).

    can_vectorize(plan), pointwise_width(plan)        # pointwise: a vector path, its width
    cached_values(plan, variant, vector)              # rows: values per input a thread keeps (0: none)
"""

from __future__ import annotations

import torch

from kevin_backend.generate.builtin.codegen import VECTOR_DTYPES
from kevin_backend.generate.builtin.index_math import contiguous_strides, input_mode, layout_in_space, row_col_offsets
from kevin_backend.generate.builtin.plan import Kind, Plan, PlanInput
from kevin_backend.generate.builtin.variants import Variant

__all__ = ["MAX_CACHED", "STAGE", "can_vectorize", "same_along_row", "pointwise_width", "transposed_plane", "can_vectorize_rows",
           "row_width", "cached_values", "tile_slots", "staged_output", "strided_rows", "split_width", "row_reads"]

# Registers per thread a cached row may take (values per input).
MAX_CACHED = 32
# Columns a staged output tile spans (`staged_output`).
STAGE = 32


def can_vectorize(plan: Plan) -> bool:
    """Whether a pointwise plan's 4-wide variant has a vector path (else it is the scalar kernel):
    inputs read 4 at a time, or constant across each group of 4 (broadcast along the row). With
    only same-shape contiguous inputs (and scalars) any length goes: the last `numel % 4`
    elements are done one by one."""
    if plan.is_rows or plan.numel < 4 or any(i.dtype not in VECTOR_DTYPES for i in plan.inputs):
        return False
    modes = [input_mode(i, plan.shape) for i in plan.inputs]
    if all(m in ("linear", "scalar") for m in modes):
        return True
    return (plan.numel % 4 == 0 and plan.cols % 4 == 0
            and all(m in ("linear", "lastdim", "row", "scalar") or same_along_row(i, plan.shape) for m, i in zip(modes, plan.inputs)))


def same_along_row(inp: PlanInput, shape: tuple[int, ...]) -> bool:
    """Whether an input is broadcast along the last dimension (one value per row of the
    iteration space, however it is laid out: a per-channel vector viewed as [C, 1, 1])."""
    aligned = (1,) * (len(shape) - len(inp.read_shape)) + tuple(inp.read_shape)
    return bool(shape) and aligned[-1] == 1


def pointwise_width(plan: Plan) -> int:
    """Elements per access of a pointwise plan's vector path: 8 (16 bytes) when every input and
    output is a 16-bit type (and, with inputs read per row or broadcast, the row a multiple of 8
    long), else 4 (16 bytes of floats)."""
    halves = (torch.float16, torch.bfloat16)
    if not all(t.dtype in halves for t in (*plan.inputs, *plan.outputs)):
        return 4
    modes = [input_mode(i, plan.shape) for i in plan.inputs]
    if all(m in ("linear", "scalar") for m in modes):
        return 8
    return 8 if plan.numel % 8 == 0 and plan.cols % 8 == 0 else 4


def transposed_plane(plan: Plan) -> tuple[int, int] | None:
    """(d_in, d_out) when a pointwise plan reads some input across the output's rows: its
    contiguous dimension d_in is not the output's last one d_out (a transpose or permute), every
    such input sharing d_in, both at least a tile (32) long. None otherwise."""
    if plan.is_rows or len(plan.shape) < 2:
        return None
    d_out = len(plan.shape) - 1
    found = set()
    for inp in plan.inputs:
        strides = layout_in_space(inp, plan.shape)
        if strides[d_out] in (0, 1):  # along the output's rows, or the same all along them (a per-channel value)
            continue
        unit = [d for d in range(len(plan.shape)) if strides[d] == 1 and plan.shape[d] > 1]
        if unit:
            found.add(unit[0])
    if len(found) != 1:
        return None
    (d_in,) = found
    return (d_in, d_out) if plan.shape[d_in] >= 32 and plan.shape[d_out] >= 32 else None


def can_vectorize_rows(plan: Plan) -> bool:
    """Whether a rows plan's vector variants have a vector path: rows a multiple of 4 long, and
    every per-element input and output contiguous along the row (else they are the scalar kernel)."""
    return (plan.is_rows and plan.cols % 4 == 0 and plan.over_last
            and all(input_mode(i, plan.shape) in ("linear", "lastdim") and i.dtype in VECTOR_DTYPES
                    for i in plan.inputs if i.kind is Kind.FULL)
            and all(o.dtype in VECTOR_DTYPES for o in plan.outputs if o.kind is Kind.FULL))


def row_width(plan: Plan) -> int:
    """Elements per access of a rows plan's vector path: 8 (16 bytes) when every per-element
    operand is a 16-bit type and the row a multiple of 8 long, else 4."""
    operands = [*(i.dtype for i in plan.inputs if i.kind is Kind.FULL), *(o.dtype for o in plan.outputs if o.kind is Kind.FULL)]
    return 8 if plan.cols % 8 == 0 and all(d in (torch.float16, torch.bfloat16) for d in operands) else 4


def cached_values(plan: Plan, variant: Variant, vector: bool) -> int:
    """Values per input a thread keeps in registers when the row is cached (0: it does not fit)."""
    if not variant.cache:
        return 0
    width = row_width(plan) if vector else 1
    per_thread = -(-plan.cols // (variant.threads * variant.cluster * width)) * width
    if variant.columns and variant.cluster > 1:  # whole tiles of 32 columns a block (`rows_mappings.spread_column`)
        per_thread = -(-per_thread // tile_slots(variant)) * tile_slots(variant)
    return per_thread if per_thread <= MAX_CACHED else 0


def tile_slots(variant: Variant) -> int:
    """Registers a thread gives one tile of 32 columns in a cluster-spread columns kernel."""
    return max(1, STAGE // variant.threads)


def staged_output(plan: Plan, variant: Variant) -> bool:
    """Whether a columns-mapping rows kernel writes its per-element outputs through shared-memory
    tiles: the outputs are contiguous along the row (a row's neighbouring columns are neighbours
    in memory, while the mapping puts neighbouring rows on neighbouring threads), and a row's
    threads divide a tile's 32 columns."""
    full = sum(o.kind is Kind.FULL for o in plan.outputs)
    if not variant.columns or STAGE % variant.threads or not full:
        return False
    if full * max(1, variant.rows_per_block) * (STAGE + 1) * 4 > 40 * 1024:  # the tiles in static shared memory
        return False
    strides = contiguous_strides(plan.shape)
    return strides[max(plan.reduced_dims)] == 1 and row_col_offsets(strides, plan)[1] == "c"


def strided_rows(plan: Plan) -> bool:
    """Whether a rows plan's rows lie across memory rather than along it: some per-element input
    steps through its innermost reduced dimension with a stride other than 1 while neighbouring
    rows are neighbours in memory (a sum over dim 1 of [N, C, L]; a softmax over the rows of a
    transposed input). Such rows are read best by the
    columns mapping (a warp's threads on 32 neighbouring rows)."""
    if plan.rows == 1:
        return False
    inner_reduced = max(plan.reduced_dims)
    inner_kept = max(plan.kept_dims)
    for i in plan.inputs:
        if i.kind is not Kind.FULL:
            continue
        strides = layout_in_space(i, plan.shape)
        if strides[inner_reduced] != 1 and strides[inner_kept] == 1:
            return True
    return False


def split_width(plan: Plan) -> int:
    """Elements per access of a split plan's kernels (0: one at a time): as a rows plan's vector
    path, when every per-element operand is contiguous along the row."""
    width = row_width(plan)
    full_outputs = [o for o in plan.outputs if o.kind is Kind.FULL]
    layouts = [layout_in_space(i, plan.shape) for i in plan.inputs if i.kind is Kind.FULL]
    layouts += [contiguous_strides(plan.shape)] if full_outputs else []
    if (plan.picks or plan.cols % width or any(i.dtype not in VECTOR_DTYPES for i in plan.inputs if i.kind is Kind.FULL)
            or any(o.dtype not in VECTOR_DTYPES for o in full_outputs)):
        return 0
    for strides in layouts:  # contiguous along the row (the reduced dimensions, merged), rows 16-byte apart
        if row_col_offsets(strides, plan)[1] != "c" or any(strides[d] % width for d in plan.kept_dims):
            return 0
    return width


def row_reads(plan: Plan) -> int:
    """Passes an uncached rows kernel makes over a row, at most: one a reduction, one for the
    per-element outputs."""
    return len(plan.reductions) + any(o.kind is Kind.FULL for o in plan.outputs)
