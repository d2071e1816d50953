"""The comparison's rule (`compare.py`) in two fused passes on a GPU, with Triton.

`compare.py` states the rule once, in PyTorch, block by block in float64. On a GPU that is some
thirty kernel launches per block and sixteen blocks per output: the judge spends its time
launching, not comparing. Here each pass is one kernel over the whole output, computing in
float64 in registers (nothing of the output's size is allocated):

    statistics:  per program, the sum of |E| over finite elements and their count  -> the scale
                 (and, for 16-bit outputs, each program's block's own mean |E|: its local scale)
    judge:       per program, the bad elements, the non-finite ones among them, the largest
                 finite error, relative error and error/bound                     -> the totals

and the per-program partial results are reduced by PyTorch and read in one synchronisation.
The 99th percentile of eager's error is taken by PyTorch on a strided sample (no pass over the
whole output). The element rule is the same expression as `compare._judged_block`'s; the GPU
tests hold the two paths to the same verdicts and totals on outputs with NaN, infinities,
overflow in eager only, and values at the bound.

Used for contiguous floating-point outputs on a GPU where Triton imports; everything else takes
the PyTorch path.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

__all__ = ["available", "statistics", "totals", "percentile_rank", "GROUP"]

GROUP = 2048  # elements per program; also the group sharing one local scale (`compare.Bound.floor`)
_BLOCK = GROUP
_BIG = 1.7976931348623157e308  # the largest finite float64: |x| <= _BIG is "finite" (NaN compares false)


@functools.lru_cache(maxsize=1)
def _kernels() -> tuple[Any, Any] | None:
    """The two Triton kernels, or None where Triton does not import."""
    try:
        import triton
        import triton.language as tl
    except Exception:  # noqa: BLE001 - no Triton (a CPU build of torch): the PyTorch path
        return None

    @triton.jit
    def stats_kernel(e_ptr, n, sums_ptr, counts_ptr, BLOCK: tl.constexpr):
        pid = tl.program_id(0)
        offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        e = tl.load(e_ptr + offs, mask=mask, other=0.0).to(tl.float64)
        finite = (tl.abs(e) <= 1.7976931348623157e308) & mask
        tl.store(sums_ptr + pid, tl.sum(tl.where(finite, tl.abs(e), 0.0), axis=0))
        tl.store(counts_ptr + pid, tl.sum(finite.to(tl.int64), axis=0))

    @triton.jit
    def judge_kernel(g_ptr, w_ptr, e_ptr, params_ptr, n, out_ptr, scales_ptr, HAS_E: tl.constexpr,
                     LOCAL: tl.constexpr, BLOCK: tl.constexpr):
        pid = tl.program_id(0)
        offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        rho = tl.load(params_ptr + 0)
        floor = tl.load(params_ptr + 1)
        tiny_spacing = tl.load(params_ptr + 2)
        k = tl.load(params_ptr + 3)
        cap = tl.load(params_ptr + 4)
        scale = tl.load(params_ptr + 5)
        q = tl.load(params_ptr + 6)
        tiny = tl.load(params_ptr + 7)
        if LOCAL:  # this program's block is the group: its mean |E|, from the statistics pass
            scale = tl.load(scales_ptr + pid)
        big = 1.7976931348623157e308
        g = tl.load(g_ptr + offs, mask=mask, other=0.0).to(tl.float64)
        w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float64)
        if HAS_E:
            e = tl.load(e_ptr + offs, mask=mask, other=0.0).to(tl.float64)
        else:
            e = w
        finite_e = tl.abs(e) <= big
        finite_w = tl.abs(w) <= big
        finite_g = tl.abs(g) <= big
        # where the exact run is not finite but eager is, eager is the reference
        ref = tl.where(finite_e | (~finite_w), e, w)
        finite_ref = tl.abs(ref) <= big
        err = tl.abs(g - ref)
        allowed = rho * tl.abs(ref) + floor * scale + tiny_spacing
        if HAS_E:
            eager_error = tl.abs(w - ref)
            eager_error = tl.where(eager_error <= big, eager_error, 0.0)  # (NaN and infinities count as 0)
            allowed = allowed + tl.minimum(k * (eager_error + q), cap * (tl.abs(ref) + scale) + k * tiny_spacing)
        g_nan = g != g
        same_ref = (g == ref) | (g_nan & (ref != ref))
        same_eager = (g == w) | (g_nan & (w != w))
        good = (finite_ref & (err <= allowed)) | ((~finite_ref) & same_ref) | ((~finite_w) & same_eager)
        bad = (~good) & mask
        counted = finite_ref & mask
        finite_err = tl.where(counted & (err <= big), err, 0.0)
        rel = tl.where(counted, finite_err / tl.maximum(tl.abs(ref), tiny), 0.0)
        ratio = tl.where(counted, err / tl.maximum(allowed, 1e-300), 0.0)
        ratio = tl.where(ratio > big, big, ratio)  # (as torch's nan_to_num(inf): +inf the largest finite, NaN inf)
        ratio = tl.where(ratio != ratio, big * 2.0, ratio)
        base = out_ptr + pid * 5
        tl.store(base + 0, tl.sum(bad.to(tl.float64), axis=0))
        tl.store(base + 1, tl.sum((bad & (~finite_g) & finite_ref).to(tl.float64), axis=0))
        tl.store(base + 2, tl.max(finite_err, axis=0))
        tl.store(base + 3, tl.max(rel, axis=0))
        tl.store(base + 4, tl.max(ratio, axis=0))

    return stats_kernel, judge_kernel


def available(g: torch.Tensor, w: torch.Tensor, e: torch.Tensor | None) -> bool:
    """Whether this comparison takes the fused path: a GPU, Triton, contiguous outputs of one
    device, and more than nothing to compare."""
    tensors = [g, w] + ([e] if e is not None else [])
    return (w.device.type == "cuda" and w.numel() > 0 and all(t.is_contiguous() and t.device == w.device for t in tensors)
            and _kernels() is not None)


def percentile_rank(count: int) -> int:
    """The rank (1-based) of the 99th percentile among `count` values; 0 for none."""
    return max(1, -(-99 * count // 100)) if count else 0


def _grid(n: int) -> tuple[int]:
    return ((n + _BLOCK - 1) // _BLOCK,)


def statistics(w: torch.Tensor, e: torch.Tensor | None, samples: int,
               local: bool = False) -> tuple[float, float, torch.Tensor | None]:
    """As `compare._statistics`: (mean |E| over finite elements; 99th percentile of eager's error
    over every `step`-th element, step = max(1, n // samples), beyond rounding E to W's dtype with
    `local`; with `local`, the mean |E| of every group of GROUP elements, else None)."""
    stats_kernel, _ = _kernels()  # type: ignore[misc]
    n = w.numel()
    ref = (e if e is not None else w).reshape(-1)
    grid = _grid(n)
    sums = torch.empty(grid[0], dtype=torch.float64, device=w.device)
    counts = torch.empty(grid[0], dtype=torch.int64, device=w.device)
    stats_kernel[grid](ref, n, sums, counts, BLOCK=_BLOCK)
    parts = [sums.sum(), counts.sum().double()]
    if e is not None:
        step = max(1, n // samples)
        near = e.reshape(-1)[::step]
        near = near.to(w.dtype).double() if local else near.double()
        picked = (w.reshape(-1)[::step].double() - near).abs()
        picked = picked[torch.isfinite(picked)]
        k = percentile_rank(picked.numel())
        parts.append(picked.kthvalue(k).values.double() if k else torch.zeros((), dtype=torch.float64, device=w.device))
    values = torch.stack(parts).tolist()
    scale = values[0] / values[1] if values[1] else 0.0
    groups = torch.where(counts > 0, sums / counts.clamp_min(1).double(), 0.0) if local else None
    return scale, (values[2] if e is not None else 0.0), groups


def totals(g: torch.Tensor, w: torch.Tensor, e: torch.Tensor | None, params: list[float],
           groups: torch.Tensor | None) -> tuple[int, int, float, float, float]:
    """(bad elements, non-finite bad elements, largest finite error, largest relative error,
    largest error/bound) of `g` against the reference, by `compare._judged_block`'s rule;
    `params`: `compare.Rule.params`; `groups`: the local scales `statistics` made, or None."""
    _, judge_kernel = _kernels()  # type: ignore[misc]
    n = w.numel()
    grid = _grid(n)
    values = torch.tensor(params + [1e-30], dtype=torch.float64, device=w.device)
    out = torch.empty((grid[0], 5), dtype=torch.float64, device=w.device)
    flat_e = e.reshape(-1) if e is not None else w.reshape(-1)
    scales = groups if groups is not None else values  # (not read without LOCAL)
    judge_kernel[grid](g.reshape(-1), w.reshape(-1), flat_e, values, n, out, scales,
                       HAS_E=e is not None, LOCAL=groups is not None, BLOCK=_BLOCK)
    sums_out = out[:, :2].sum(dim=0)
    maxima = out[:, 2:].amax(dim=0)
    bad, nonfinite, max_abs, max_rel, worst = torch.cat([sums_out, maxima]).tolist()
    return int(bad), int(nonfinite), max_abs, max_rel, worst
