"""How close is close enough: a candidate's outputs against the reference, with error bounds
grounded in float64. One rule for the judge, the backend's load check and `kevin bench`.

Each output is compared with an *exact* run of the reference (the task's model on its inputs
upcast to float64; a dtype the model names, rounded to and kept wide: `exact_run.py`) and may
differ from it by what the problem's own eager computation, in the task's dtype, would suggest is
rounding:

    E = exact output (float64), W = eager output (task dtype), G = candidate output
    s = mean |E|                      the output's scale
    q = 99th percentile of |W - E|    how far eager itself lies from exact, on this output
    bound_i = rho * (|E_i| + s) + min(K * (|W_i - E_i| + q), cap * (|E_i| + s))
    pass when |G_i - E_i| <= bound_i for every element

16-bit outputs (float16, bfloat16) hold each element to its own precision instead:

    s_i = mean |E| of element i's group (GROUP consecutive elements in row-major order)
    q = 99th percentile of |W - round(E)|   eager's error beyond rounding to the dtype
    bound_i = rho * |E_i| + f * s_i + t + min(K * (|W_i - E_i| + q), cap * (|E_i| + s_i) + K * t)

with f = 2^-14 (float32 arithmetic's error at the group's scale, well under a 16-bit ulp) and t
the dtype's subnormal spacing. With rho * s, a bfloat16 output could be zeroed wherever
|E_i| < s / 128 and pass (and q, on a set of mixed scales, is eager's rounding of its largest
elements): now an element is wrong at any scale once it is off by more than about two of its
own ulps, beyond what float32 arithmetic explains at its neighbours' scale.

Why these terms:
- `rho * |E_i|`, a floor for ops eager computes exactly (relu, max, copies): a few hundred float32
  ulps (fast-math intrinsics such as `__expf` are that far off), two half-precision ulps.
- `rho * s`: an absolute floor on the output's scale, so elements near zero in an output of
  ordinary magnitude (a sum that cancels) are held to the output's precision, not their own.
- `K * (|W_i - E_i| + q)`: honest kernels sum in another order than eager. In float32 a
  one-thread-per-row sequential sum over 65,536 values lies up to ~70x eager's 99th-percentile
  error from exact, while the same sum through fp16 round-trips lies ~1,500x away; K = 200 keeps
  the first and rejects the second. In fp16 and bf16, eager and honest kernels alike accumulate in
  float32 and round to the dtype, so their errors are rounding, and K = 2.
- `cap`: where eager is itself coarse (float32 convolutions through TF32), the eager-derived
  term is capped at 2e-3 of the scale, so a coarse eager does not wave everything through.
- a second opinion: where a sum cancels, honest rounding is past both eager's error at that
  element (eager's order may happen to be lucky there) and the cap (a 27-term float32
  convolution of mixed scales, near zero before a sigmoid: eager's own output is off by up to 3.5
  times the capped bound, another summation order by up to 24 times; a bfloat16 ResNet block's
  end, batch norm of a convolution plus the block's input, where an explicit rounding to bfloat16
  flips with the summation order: 1 element in 25.7M on an H200, eager's own output failing on
  most draws). An output that fails may be compared again with `conditioned` (C): the exact run
  on its inputs each moved by the output dtype's unit roundoff of a random sign, the larger move
  of two draws at each element (the judge's `reference_sets.run_conditioned`). |C_i - E_i| is
  what rounding the inputs alone moves element i: its conditioning. The eager-derived term is
  then at least K * (|C_i - E_i| + q_C), uncapped, q_C the 99th percentile of |C - E| for
  float32 and 0 for 16-bit outputs (a percentile would hold small elements to the output's
  scale). On 200 mixed-scale draws of that convolution, eager's output, two other summation
  orders and numpy's einsum pass, and a float32 kernel fed 16-bit rounded inputs fails every draw
  at tens of thousands of elements; on 20 draws of the block, eager and a kernel keeping the
  convolution in float32 pass, and one rounding its partial sums to bfloat16 every 16 input
  channels fails every draw.

A float32 output that a 16-bit rounding went into on its way (a bfloat16 matmul's result converted
to float32 and scaled, in a mixed-precision backward) is only as precise as that rounding: eager's
own error there is up to 2^-8 of the element, past the float32 cap, and eager failed its own bound
at 3 to 53 of 512 elements on GPT-2's bfloat16 partitions. Given `precision` (per output, the
16-bit dtype the task's arithmetic leaves in it: `precision.py`), such an output is held to that
dtype's bound, its rounding of E to that dtype.

Non-finite values: where the exact value is NaN or +-inf the candidate must give the same; where
only eager overflows (the dtype's range, not the math), eager's value is accepted too.

Where the float64 run is not possible (an op without a float64 kernel, or memory the judge may not
take), the comparison falls back to eager with KernelBench's tolerances (1e-4 in float32, 1e-2 in
fp16/bf16) on |E_i| + s, and the verdict says so. Integer and boolean outputs must equal eager's.

Outputs are compared in chunks (`CHUNK` elements at a time), never upcast whole; on a GPU with
Triton, contiguous outputs take two fused passes of the same rule instead (`compare_fused.py`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, Iterator, Sequence

import torch

from kevin_backend.measure import compare_fused
from kevin_backend.measure.exact_run import ExactModel

__all__ = ["Bound", "BOUNDS", "FALLBACK_RTOL", "OutputCheck", "Mismatch", "compare_outputs", "exact_outputs", "output_list", "CHUNK"]

CHUNK = 1 << 22  # the most elements compared at a time (a sixteenth of the output at most: `_limit`)
SAMPLES = 1 << 20  # about this many elements sampled for eager's error percentile


@dataclass(frozen=True)
class Bound:
    rho: float  # relative floor, on |E_i|
    k: float  # multiple of eager's own error
    cap: float  # the eager-derived part at most cap * (|E_i| + scale)
    # 16-bit types: the absolute floor is `floor` x the mean |E| of the element's group of
    # GROUP elements (not rho x the whole output's mean), plus `tiny`, the dtype's subnormal
    # spacing; eager's percentile counts only its error beyond rounding to the dtype.
    floor: float | None = None  # None: rho x the whole output's mean |E|
    tiny: float = 0.0


BOUNDS: dict[torch.dtype, Bound] = {
    torch.float64: Bound(1e-12, 200.0, 1e-9),
    torch.float32: Bound(1e-5, 200.0, 2e-3),
    torch.float16: Bound(2.0 ** -10, 2.0, 2.0 ** -8, floor=2.0 ** -14, tiny=2.0 ** -24),
    torch.bfloat16: Bound(2.0 ** -7, 2.0, 2.0 ** -5, floor=2.0 ** -14, tiny=2.0 ** -133),
}
GROUP = compare_fused.GROUP  # elements (consecutive in row-major order) sharing one local scale
# Without a float64 run: KernelBench's tolerances, relative to |E_i| + scale.
FALLBACK_RTOL: dict[torch.dtype, float] = {torch.float64: 1e-8, torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 1e-2}


def _bound(dtype: torch.dtype) -> Bound:
    return BOUNDS.get(dtype, BOUNDS[torch.float32])


@dataclass(frozen=True)
class Mismatch:
    """How one output differs from the reference (all errors against the exact value)."""

    output: int
    reason: str  # MISMATCH, NAN_INF, SHAPE_MISMATCH, DTYPE_MISMATCH
    bad_elements: int = 0
    total_elements: int = 0
    first_bad_index: tuple[int, ...] = ()
    expected: float = math.nan
    got: float = math.nan
    allowed: float = math.nan  # the bound at the first bad element
    max_abs_error: float = math.nan
    max_rel_error: float = math.nan
    worst_ratio: float = math.nan  # the largest error / bound
    eager_error: float = math.nan  # how far eager is from exact at the first bad element
    message: str = ""


@dataclass
class OutputCheck:
    """The comparison of one output, accumulated chunk by chunk."""

    exact: str  # "float64", "float32" (the exact run's dtype) or "eager" (no exact run)
    worst_ratio: float = 0.0  # the largest |G - E| / bound seen (a pass has <= 1)
    stats: dict[str, float] = field(default_factory=dict)


def exact_outputs(model: torch.nn.Module, inputs: Sequence[Any], want: Sequence[Any], device: torch.device) -> list[Any] | None:
    """A task's outputs in float64 (a copy of the model with its floating parameters and buffers
    upcast, on upcast copies of the inputs, their layouts kept): the exact reference the judge
    compares with, for a benchmark's own check of a peer and the runtime's load check; None where
    the GPU has not the memory for it or an op has no float64 kernel (eager then stands in, with
    KernelBench's tolerances)."""
    import copy

    from kevin_backend.measure.inputs import clone_layout

    state = [t for t in (*model.parameters(), *model.buffers()) if t.is_floating_point()]
    floats = sum(t.numel() for t in [*inputs, *want, *state] if isinstance(t, torch.Tensor) and t.is_floating_point())
    if device.type == "cuda" and 8 * floats * 3 > 0.8 * torch.cuda.mem_get_info(device)[0]:
        return None  # no room for the inputs, outputs, state and a temporary the size of either, in float64
    wide = ExactModel(copy.deepcopy(model).double() if state else model, torch.float64)
    values = [clone_layout(v, dtype=torch.float64) if isinstance(v, torch.Tensor) and v.is_floating_point() else v for v in inputs]
    try:
        with torch.no_grad():
            return output_list(wide(*values))
    except (RuntimeError, NotImplementedError):  # (out of memory, an op without a float64 kernel)
        return None
    finally:
        del values, wide


def output_list(out: Any) -> list[Any]:
    """A model's output as a list (a tensor, a tuple or list of them, or anything else)."""
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (tuple, list)):
        return list(out)
    return [out]


def compare_outputs(got: Sequence[Any], eager: Sequence[Any], exact: Sequence[Any] | None,
                    checks: list[OutputCheck] | None = None, conditioned: Sequence[Any] | None = None,
                    precision: Sequence[torch.dtype | None] | None = None) -> Mismatch | None:
    """None when every output of `got` is within the bound (module docstring) of `exact`
    (`exact` None, or an entry None: eager stands in, with the fallback tolerances). A failed
    comparison returns the first output's mismatch; `checks`, if given, collects each output's
    worst error/bound ratio and the bound's statistics. `conditioned`: the second opinion's
    conditioning run (module docstring), for outputs with an exact run. `precision`: per output,
    the 16-bit dtype whose rounding the task's own arithmetic leaves in it (`precision.py`), whose
    bound then applies, or None."""
    if len(got) != len(eager):
        return Mismatch(0, "SHAPE_MISMATCH", message=f"returns {len(got)} outputs, expected {len(eager)}")
    for i, (g, w) in enumerate(zip(got, eager)):
        e = exact[i] if exact is not None and i < len(exact) else None
        if not isinstance(w, torch.Tensor):
            if g != w:
                return Mismatch(i, "MISMATCH", message=f"output {i} is {g!r}, expected {w!r}")
            continue
        if not isinstance(g, torch.Tensor):
            return Mismatch(i, "SHAPE_MISMATCH", message=f"output {i} is a {type(g).__name__}, expected a tensor")
        if g.shape != w.shape:
            return Mismatch(i, "SHAPE_MISMATCH", message=f"output {i} has shape {list(g.shape)}, expected {list(w.shape)}")
        if g.dtype != w.dtype:
            return Mismatch(i, "DTYPE_MISMATCH", message=f"output {i} has dtype {g.dtype}, expected {w.dtype}")
        if g.device != w.device:
            return Mismatch(i, "SHAPE_MISMATCH", message=f"output {i} is on {g.device}, expected {w.device}")
        if not w.is_floating_point():
            bad = _exact_mismatch(i, g, w)
        else:
            check = OutputCheck("eager" if e is None else str(e.dtype).removeprefix("torch."))
            s = conditioned[i] if conditioned is not None and i < len(conditioned) else None
            s = s if isinstance(s, torch.Tensor) and s.shape == w.shape and e is not None else None
            carried = precision[i] if precision is not None and i < len(precision) else None
            bad = _float_mismatch(i, g, w, e, check, s, carried)
            if checks is not None:
                checks.append(check)
        if bad is not None:
            return bad
    return None


def _exact_mismatch(i: int, g: torch.Tensor, w: torch.Tensor) -> Mismatch | None:
    if torch.equal(g, w):
        return None
    count = 0
    first: tuple[int, ...] | None = None
    for index in _blocks(w.shape, _limit(w.numel())):
        differ = g[index] != w[index]
        n = int(differ.sum())
        if n and first is None:
            first = _global_index(index, tuple(int(x) for x in differ.nonzero()[0].tolist()))
        count += n
    assert first is not None
    return Mismatch(i, "MISMATCH", count, w.numel(), first, float(w[first]), float(g[first]), 0.0,
                    message=f"output {i}: {count} of {w.numel()} elements differ (exact equality is required for {w.dtype})")


@dataclass(frozen=True)
class Rule:
    """The bound's numbers for one output: allowed_i = rho |E_i| + floor S_i + tiny
    + min(k (|W_i - E_i| + q), cap (|E_i| + S_i) + k tiny), with S_i the whole output's mean |E| (`scale`)
    or, where `groups` is given, the mean |E| of element i's group of GROUP elements. With a
    conditioning run (`conditioned_q` set), the last term is at least k (|C_i - E_i| + conditioned_q)."""

    rho: float
    floor: float
    tiny: float
    k: float
    cap: float
    scale: float
    q: float
    exact: bool  # an exact run: the eager-derived term applies
    groups: torch.Tensor | None = None  # float64 mean |E| per group (local scales), or None
    conditioned_q: float | None = None  # the conditioning run's 99th-percentile deviation, when there is one

    @property
    def params(self) -> list[float]:
        return [self.rho, self.floor, self.tiny, self.k, self.cap, self.scale, self.q]


def _rule(dtype: torch.dtype, e: torch.Tensor | None, scale: float, q: float, groups: torch.Tensor | None) -> Rule:
    bound = _bound(dtype)
    if e is None:  # KernelBench's tolerances on |E_i| + the output's mean |E|
        rho = FALLBACK_RTOL.get(dtype, 1e-4)
        return Rule(rho, rho, 0.0, 0.0, 0.0, scale, q, False)
    if bound.floor is None:
        return Rule(bound.rho, bound.rho, 0.0, bound.k, bound.cap, scale, q, True)
    return Rule(bound.rho, bound.floor, bound.tiny, bound.k, bound.cap, scale, q, True, groups)


def _float_mismatch(i: int, g: torch.Tensor, w: torch.Tensor, e: torch.Tensor | None, check: OutputCheck,
                    s: torch.Tensor | None = None, carried: torch.dtype | None = None) -> Mismatch | None:
    dtype = carried or w.dtype  # (a float32 output that a 16-bit rounding went into: that dtype's bound)
    local = e is not None and _bound(dtype).floor is not None
    # (the fused kernels know no conditioning run, and round to the output's own dtype)
    fused = compare_fused.available(g, w, e) and s is None and dtype == w.dtype
    scale, eager_q, groups = compare_fused.statistics(w, e, SAMPLES, local) if fused else _statistics(w, e, SAMPLES, local, dtype)
    check.stats = {"scale": scale, "eager_error_q99": eager_q}
    if dtype != w.dtype:
        check.stats["precision"] = str(dtype).removeprefix("torch.")
    rule = _rule(dtype, e, scale, eager_q, groups)
    if s is not None:
        # (16-bit outputs: each element's own move only; a percentile would hold small elements to the output's scale)
        rule = replace(rule, conditioned_q=0.0 if local else _statistics(s, e, SAMPLES)[1])
        check.stats["conditioned_q99"] = rule.conditioned_q
    if fused:  # one kernel over the output (compare_fused.py)
        n, n_nonfinite, max_abs_v, max_rel_v, worst_v = compare_fused.totals(g, w, e, rule.params, rule.groups)
    else:
        n, n_nonfinite, max_abs_v, max_rel_v, worst_v = _totals(g, w, e, rule, s)
    check.worst_ratio = worst_v
    if not n:
        return None
    first = None
    for start, index in _placed_blocks(w.shape, _limit(w.numel())):  # the first bad element (only for a failed comparison)
        gc, wc, ref, err, allowed, finite_ref, bad = _judged_block(g, w, e, index, start, rule, s)
        if bool(bad.any()):
            at = tuple(int(x) for x in bad.nonzero()[0].tolist())
            first = Mismatch(
                i, "MISMATCH", 0, w.numel(), _global_index(index, at), float(ref[at]), float(gc[at]),
                float(allowed[at]), eager_error=float((wc[at] - ref[at]).abs()) if e is not None else math.nan)
            break
    assert first is not None
    reason = "NAN_INF" if n_nonfinite else "MISMATCH"
    return Mismatch(i, reason, int(n), w.numel(), first.first_bad_index, first.expected, first.got, first.allowed,
                    max_abs_v, max_rel_v, worst_v, first.eager_error)


def _totals(g: torch.Tensor, w: torch.Tensor, e: torch.Tensor | None, rule: Rule,
            s: torch.Tensor | None = None) -> tuple[int, int, float, float, float]:
    """(bad elements, non-finite bad elements, largest finite error, largest relative error,
    largest error/bound), block by block; the totals stay on the device until every block is
    queued: one synchronisation per output."""
    zero = torch.zeros((), dtype=torch.float64, device=w.device)
    count, nonfinite, max_abs, max_rel, worst = zero, zero, zero, zero, zero
    for start, index in _placed_blocks(w.shape, _limit(w.numel())):
        gc, wc, ref, err, allowed, finite_ref, bad = _judged_block(g, w, e, index, start, rule, s)
        count = count + bad.sum()
        nonfinite = nonfinite + (bad & ~torch.isfinite(gc) & finite_ref).sum()
        finite_err = torch.where(finite_ref & torch.isfinite(err), err, torch.zeros_like(err))
        if finite_err.numel():
            max_abs = torch.maximum(max_abs, finite_err.max())
            rel = torch.where(finite_ref, finite_err / ref.abs().clamp_min(1e-30), torch.zeros_like(err))
            max_rel = torch.maximum(max_rel, rel.max())
            ratio = torch.where(finite_ref, err / allowed.clamp_min(1e-300), torch.zeros_like(err)).nan_to_num(math.inf)
            worst = torch.maximum(worst, ratio.max())
    n, n_nonfinite, max_abs_v, max_rel_v, worst_v = torch.stack([count, nonfinite, max_abs, max_rel, worst]).tolist()
    return int(n), int(n_nonfinite), max_abs_v, max_rel_v, worst_v


def _judged_block(g: torch.Tensor, w: torch.Tensor, e: torch.Tensor | None, index: tuple[slice, ...], start: int,
                  rule: Rule, s: torch.Tensor | None = None) -> tuple[torch.Tensor, ...]:
    """One block of the comparison (its first element `start`-th in row-major order): (got,
    eager, reference, |error|, allowed error, reference finite, bad), all float64 but the masks;
    `s`, the conditioning run, where the rule has one."""
    gc, wc = g[index].double(), w[index].double()
    ec = e[index].double() if e is not None else wc
    # where the exact run is not finite but eager is, eager is the reference
    ref = torch.where(torch.isfinite(ec) | ~torch.isfinite(wc), ec, wc)
    err = (gc - ref).abs()
    scale: Any = rule.scale
    if rule.groups is not None:  # each element's group's mean |E|
        at = torch.arange(start, start + gc.numel(), device=gc.device) // GROUP
        scale = rule.groups[at].reshape(gc.shape)
    allowed = rule.rho * ref.abs() + rule.floor * scale + rule.tiny
    if rule.exact:
        eager_part = rule.k * ((wc - ref).abs().nan_to_num(0.0, 0.0, 0.0) + rule.q)
        eager_part = torch.minimum(eager_part, rule.cap * (ref.abs() + scale) + rule.k * rule.tiny)
        if s is not None and rule.conditioned_q is not None:  # the second opinion: the output's conditioning, uncapped
            moved = rule.k * ((s[index].double() - ref).abs().nan_to_num(0.0, 0.0, 0.0) + rule.conditioned_q)
            eager_part = torch.maximum(eager_part, moved)
        allowed = allowed + eager_part
    finite_ref = torch.isfinite(ref)
    # non-finite references: the same value (NaN where NaN, the same infinity); where eager
    # overflowed or made NaN and exact did not, eager's value is accepted too
    same_ref = (gc == ref) | (torch.isnan(gc) & torch.isnan(ref))
    same_eager = (gc == wc) | (torch.isnan(gc) & torch.isnan(wc))
    bad = ~((finite_ref & (err <= allowed)) | (~finite_ref & same_ref) | (~torch.isfinite(wc) & same_eager))
    return gc, wc, ref, err, allowed, finite_ref, bad


def _statistics(w: torch.Tensor, e: torch.Tensor | None, samples: int = SAMPLES,
                local: bool = False, rounded: torch.dtype | None = None) -> tuple[float, float, torch.Tensor | None]:
    """(mean |E| over finite elements; 99th percentile of eager's error over every `step`-th
    element in row-major order, step = max(1, n // samples); with `local`, the mean |E| of every
    group of GROUP elements, else None). Eager's error is |W - E|, or with `local` (16-bit
    outputs) its error beyond rounding E to `rounded` (default: W's dtype)."""
    total = torch.zeros((), dtype=torch.float64, device=w.device)
    count = torch.zeros((), dtype=torch.float64, device=w.device)
    picked: list[torch.Tensor] = []
    n = w.numel()
    step = max(1, n // samples)
    groups = -(-n // GROUP)
    sums = torch.zeros(groups, dtype=torch.float64, device=w.device) if local else None
    counts = torch.zeros(groups, dtype=torch.float64, device=w.device) if local else None
    for start, index in _placed_blocks(w.shape, _limit(n)):  # blocks cover the output in row-major order
        wc = w[index].double()
        ec = e[index].double() if e is not None else wc
        finite = torch.isfinite(ec)
        magnitude = torch.where(finite, ec.abs(), torch.zeros_like(ec))
        total = total + magnitude.sum()
        count = count + finite.sum()
        if sums is not None and counts is not None:
            at = torch.arange(start, start + wc.numel(), device=w.device) // GROUP
            sums.index_add_(0, at, magnitude.reshape(-1))
            counts.index_add_(0, at, finite.reshape(-1).double())
        if e is not None:
            near = e[index].to(rounded or w.dtype).double() if local else ec  # (E rounded to the output's precision)
            picked.append((wc - near).abs().reshape(-1)[(-start) % step::step])
    total_v, count_v = torch.stack([total, count]).tolist()
    scale = total_v / count_v if count_v else 0.0
    local_scales = None if sums is None or counts is None else torch.where(counts > 0, sums / counts.clamp_min(1.0), 0.0)
    if not picked:
        return scale, 0.0, local_scales
    values = torch.cat(picked)
    values = values[torch.isfinite(values)]
    k = compare_fused.percentile_rank(values.numel())
    return scale, float(values.kthvalue(k).values) if k else 0.0, local_scales


def _limit(elements: int) -> int:
    """Elements per block: a sixteenth of the output (a block's float64 temporaries then stay well
    under the output's own size), between 2^16 and CHUNK."""
    return max(1 << 16, min(CHUNK, elements // 16))


def _blocks(shape: Sequence[int], limit: int = CHUNK) -> Iterator[tuple[slice, ...]]:
    """Index tuples that cover a tensor of `shape` in pieces of at most `limit` elements (whole
    rows of the leading dimensions where they fit)."""
    shape = tuple(shape)
    if not shape:
        yield ()
        return
    inner = math.prod(shape[1:])
    if inner <= limit:
        rows = max(1, limit // max(inner, 1))
        for start in range(0, shape[0], rows):
            yield (slice(start, min(start + rows, shape[0])),)
        return
    for row in range(shape[0]):
        for rest in _blocks(shape[1:], limit):
            yield (slice(row, row + 1), *rest)


def _placed_blocks(shape: Sequence[int], limit: int) -> Iterator[tuple[int, tuple[slice, ...]]]:
    """`_blocks` with each block's first element's position in row-major order (a block is a
    run of consecutive positions)."""
    start = 0
    for index in _blocks(shape, limit):
        yield start, index
        start += math.prod(s.stop - s.start for s in index) * math.prod(shape[len(index):])


def _global_index(index: tuple[slice, ...], local: tuple[int, ...]) -> tuple[int, ...]:
    """The index in the whole tensor of `local` inside the block `index`."""
    out = list(local)
    for d, s in enumerate(index):
        out[d] += s.start or 0
    return tuple(out)
