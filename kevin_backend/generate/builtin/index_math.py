"""Index math of the built-in writer's kernels: how an input is read in the iteration space, and
the C expressions of element offsets (dimensions that step through memory as one merged first,
so a contiguous run costs one multiplication and no division).

    row_part, col_part = row_col_offsets(strides, plan)     # a rows plan's offset, split
    offset = element_offset(inp, shape, "base", row, col)   # a pointwise kernel's, by linear index
"""

from __future__ import annotations

from typing import Sequence

from kevin_backend.generate.builtin.plan import Plan, PlanInput

__all__ = ["input_mode", "layout_in_space", "index_terms", "row_col_offsets", "contiguous_strides", "element_offset"]


def input_mode(inp: PlanInput, shape: tuple[int, ...]) -> str:
    """How an input is read in the iteration space: `linear` (same shape, contiguous: index i),
    `lastdim` (a contiguous vector along the last dimension, broadcast over rows), `row` (one
    value per row, contiguous), `scalar` (one value), or `general` (strides and broadcasting)."""
    numel = 1
    for s in inp.read_shape:
        numel *= s
    contiguous = inp.read_stride == contiguous_strides(inp.read_shape)
    squeezed = tuple(s for s in inp.read_shape)
    if numel == 1:
        return "scalar"
    if squeezed == shape and contiguous:
        return "linear"
    lead = tuple(s for s in inp.read_shape[:-1])
    if inp.read_shape and inp.read_shape[-1] == shape[-1] and all(s == 1 for s in lead) and inp.read_stride[-1] == 1:
        return "lastdim"
    rows = 1
    for s in shape[:-1]:
        rows *= s
    aligned = (1,) * (len(shape) - len(inp.read_shape)) + inp.read_shape
    if numel == rows and aligned[:-1] == shape[:-1] and aligned[-1] == 1 and contiguous:
        return "row"
    return "general"


def layout_in_space(inp: PlanInput, shape: tuple[int, ...]) -> tuple[int, ...]:
    """An input's strides in the iteration space (0 along the dimensions it is broadcast over)."""
    lead = len(shape) - len(inp.read_shape)
    sizes = (1,) * lead + tuple(inp.read_shape)
    strides = (0,) * lead + tuple(inp.read_stride)
    return tuple(0 if size == 1 and full != 1 else st for size, st, full in zip(sizes, strides, shape))


def index_terms(index: str, dims: Sequence[tuple[int, int]]) -> str:
    """C expression: the offset of position `index` of the dimensions `dims` ((size, stride),
    outermost first) enumerated in order. Neighbouring dimensions that step through memory as one
    are merged first, so a contiguous run costs one multiplication and no division."""
    merged: list[tuple[int, int]] = []
    for size, stride in dims:
        if size == 1:
            continue
        if merged and merged[-1][1] == stride * size:
            merged[-1] = (merged[-1][0] * size, stride)
        else:
            merged.append((size, stride))
    terms, div = [], 1
    for k in range(len(merged) - 1, -1, -1):
        size, stride = merged[k]
        if stride:
            idx = index if div == 1 else f"({index} / {div}LL)"
            if k > 0:  # the outermost dimension's position needs no modulo
                idx = f"({idx} % {size}LL)"
            terms.append(idx if stride == 1 else f"{idx} * {stride}LL")
        div *= size
    return " + ".join(reversed(terms)) or "0"


def row_col_offsets(strides: Sequence[int], plan: Plan, row: str = "row", col: str = "c") -> tuple[str, str]:
    """(row part, column part) of the offset of element (row, col) of a rows plan for a tensor
    with `strides` in the iteration space: the row part once per row, the column part per element."""
    shape = plan.shape
    kept = [(shape[d], strides[d]) for d in plan.kept_dims]
    reduced = [(shape[d], strides[d]) for d in plan.reduced_dims]
    return index_terms(row, kept), index_terms(col, reduced)


def contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    """The strides of a contiguous tensor of `shape`."""
    out, acc = [], 1
    for s in reversed(shape):
        out.append(acc)
        acc *= max(s, 1)
    return tuple(reversed(out))


def element_offset(inp: PlanInput, shape: tuple[int, ...], index: str, row: str, col: str) -> str:
    """C expression: the element of `inp` at linear position `index` (= row * cols + col)."""
    mode = input_mode(inp, shape)
    if mode == "scalar":
        return "0"
    if mode == "linear":
        return index
    if mode == "lastdim":
        return col
    if mode == "row":
        return row
    # general: decompose the linear index over the iteration space, dot with broadcast strides
    aligned_shape = (1,) * (len(shape) - len(inp.read_shape)) + inp.read_shape
    aligned_stride = (0,) * (len(shape) - len(inp.read_stride)) + inp.read_stride
    terms, div = [], 1
    for d in reversed(range(len(shape))):
        size = shape[d]
        stride = 0 if aligned_shape[d] == 1 else aligned_stride[d]
        if stride and size > 1:
            term = f"(({index}) / {div}LL % {size}LL)" if div > 1 else f"(({index}) % {size}LL)"
            terms.append(f"{term} * {stride}LL")
        div *= size
    return " + ".join(terms) or "0"
