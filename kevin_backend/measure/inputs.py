"""The judge's input sets: a task's inputs placed on the GPU under test, with their true layouts.

Published KernelBench problems make their inputs on the CPU (`torch.randn(4096, 16384)`), and
KernelBench's harness moves model and inputs to the GPU before anything runs; the tasks the
backend makes hold CUDA inputs with the exact strides a graph passes (broadcasts with stride 0,
transposes, slices). The judge treats both alike:

    with placed_on(device):            # factories make their tensors on `device`, whatever
        values = task.get_inputs()     #   device the program names ("cpu", "cuda", none)
    values = [to_device(v, device) for v in values]    # anything made elsewhere: moved, layout kept

Every input keeps its sizes, strides and storage offset: a copy is made of the memory the tensor
spans (`span`), never of its values alone (`clone()` and `.to()` make broadcast and transposed
inputs dense, and a kernel checked on dense copies reads the wrong memory on the real layout).
Memory before a tensor's offset is filled with NaN, so a kernel that ignores the offset reads NaN.

An input set (`make_input_set`) also changes values the way the judge needs them: no zeros (they
hide unwritten outputs and wrong indexing), and on "mixed" sets a random power of two per element
(2^-R .. 2^R), so that values span orders of magnitude. A "special" set then puts back a few
zeros on purpose, one element in 64 spread over every floating input: +0.0, -0.0 and subnormals of
the input's dtype, a third each, so that a kernel that branches wrongly at zero (`x > 0` for
`x >= 0`), loses the sign of zero or flushes subnormals where the result depends on them is seen.
Inputs that share memory (one tensor and a view of it) are changed once, through their shared
storage.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

import torch

from kevin_backend.placement import placed_on

__all__ = [
    "to_device", "span", "same_layout_empty", "clone_layout", "copy_values", "fingerprint",
    "layout_text", "make_input_set", "InputSet", "MIXED_RANGES", "SPECIAL_DTYPES", "tensor_bytes", "work_chunk",
]

def tensor_bytes(t: torch.Tensor) -> int:
    """Bytes of the memory a tensor spans (a broadcast input counts once)."""
    return span(t)[1] * t.element_size()


def span(t: torch.Tensor) -> tuple[int, int]:
    """(first element, number of elements) of the storage region `t` addresses."""
    if t.numel() == 0:
        return t.storage_offset(), 0
    extent = 1 + sum((n - 1) * abs(s) for n, s in zip(t.shape, t.stride()))
    return t.storage_offset(), extent


def _region(t: torch.Tensor) -> torch.Tensor:
    """A flat view of the storage region `t` spans (its first element to its last)."""
    offset, extent = span(t)
    return torch.as_strided(t, (extent,), (1,), offset)


def same_layout_empty(t: torch.Tensor, device: torch.device | str | None = None, dtype: torch.dtype | None = None,
                      pad: float = float("nan"), keep_offset: bool = True) -> torch.Tensor:
    """An uninitialised tensor with `t`'s sizes, strides and storage offset (on `device`, in
    `dtype`); the storage before the offset is filled with `pad`. Without `keep_offset`, the same
    sizes and strides from the start of a storage of its own (a view far into a larger buffer then
    takes only the memory it spans)."""
    offset, extent = span(t)
    offset = offset if keep_offset else 0
    base = torch.empty(offset + extent, dtype=dtype or t.dtype, device=device or t.device)
    if offset:
        base[:offset].fill_(pad if base.is_floating_point() else 0)
    return torch.as_strided(base, t.shape, t.stride(), offset)


def clone_layout(t: torch.Tensor, device: torch.device | str | None = None, dtype: torch.dtype | None = None,
                 keep_offset: bool = True) -> torch.Tensor:
    """A copy of `t` with its sizes, strides and storage offset (on `device`, in `dtype`): the
    whole region it spans is copied, so a stride-0 broadcast stays one row of memory. Without
    `keep_offset`, no storage before the region (`same_layout_empty`)."""
    out = same_layout_empty(t, device, dtype, keep_offset=keep_offset)
    _region(out).copy_(_region(t))
    return out


def perturbed_copy(t: torch.Tensor, dtype: torch.dtype, relative: float, generator: torch.Generator) -> torch.Tensor:
    """`clone_layout(t)` in `dtype` (no storage before it), each element of the region it spans
    times 1 + relative or 1 - relative, the sign drawn from `generator` (one draw per element of
    memory: a stride-0 broadcast stays one row, perturbed once)."""
    out = clone_layout(t, dtype=dtype, keep_offset=False)
    region = _region(out)
    factor = torch.empty_like(region).bernoulli_(0.5, generator=generator)
    region.mul_(factor.mul_(2 * relative).add_(1 - relative))
    return out


def to_device(value: Any, device: torch.device | str) -> Any:
    """`value` on `device` with its layout; non-tensors and tensors already there as they are."""
    if not isinstance(value, torch.Tensor) or value.device == torch.device(device):
        return value
    return clone_layout(value, device)


def copy_values(dst: torch.Tensor, src: torch.Tensor) -> None:
    """Write `src`'s values into `dst`'s memory, region for region (same layout)."""
    _region(dst).copy_(_region(src))


def layout_text(t: torch.Tensor) -> str:
    """`shape [4096, 1024], strides (1, 4096)` (+ `, offset 3` where there is one)."""
    text = f"shape {list(t.shape)}, strides {tuple(t.stride())}"
    if t.storage_offset():
        text += f", offset {t.storage_offset()}"
    if not t.is_contiguous():
        kinds = []
        if any(s == 0 and n > 1 for n, s in zip(t.shape, t.stride())):
            kinds.append("a stride-0 broadcast")
        if not kinds:
            kinds.append("not contiguous")
        text += f" ({', '.join(kinds)})"
    return text


_MIX = 0x9E3779B97F4A7C15


def work_chunk(elements: int) -> int:
    """Elements handled at a time by the judge's passes over a tensor (hashing, changing values,
    comparing): a sixteenth of it, between 2^16 and 2^22, so their temporary memory stays a small
    share of the task's, whatever its size."""
    return max(1 << 16, min(1 << 22, elements // 16))


def fingerprint(values: Sequence[Any]) -> tuple[int, ...]:
    """One 64-bit hash per tensor of the bits of the memory it spans, in chunks (no copy of the
    inputs is kept to see whether a candidate changed them). The hashes are kept on the tensors'
    device until the end: one synchronisation per call, however many tensors and chunks."""
    out: list[Any] = []
    for v in values:
        if not isinstance(v, torch.Tensor):
            out.append(hash(repr(v)) & 0xFFFFFFFFFFFFFFFF)
            continue
        region = _region(v.detach())
        bits = _as_int(region)
        mixed = torch.zeros((), dtype=torch.int64, device=bits.device)
        folded = torch.zeros((), dtype=torch.int64, device=bits.device)
        chunk = work_chunk(bits.numel())
        for start in range(0, bits.numel(), chunk):
            part = bits[start:start + chunk].to(torch.int64)
            weights = torch.arange(start, start + part.numel(), device=part.device, dtype=torch.int64)
            weights = weights * _MIX_SIGNED + 1  # (int64 arithmetic wraps: a hash modulo 2^64)
            mixed = mixed * 1_000_003 + (part * weights).sum()
            folded = folded ^ (part ^ (weights >> 7)).sum()
        out.append(torch.stack([mixed, folded]))
    for k, h in enumerate(out):
        if isinstance(h, torch.Tensor):  # (the first read waits for all the work queued above)
            m, f = h.tolist()
            out[k] = ((m & 0xFFFFFFFFFFFFFFFF) * 0x100000001B3 ^ (f & 0xFFFFFFFFFFFFFFFF)) & 0xFFFFFFFFFFFFFFFF
    return tuple(out)


_MIX_SIGNED = _MIX - (1 << 64)


def _as_int(region: torch.Tensor) -> torch.Tensor:
    kinds = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
    if region.dtype == torch.bool:
        return region.to(torch.uint8)
    if region.is_complex():
        region = torch.view_as_real(region).reshape(-1)
    return region.view(kinds[region.element_size()])


# The exponent ranges tried for a mixed-scale input set, widest first: a set whose reference
# overflows (inf or NaN where the plain set is finite) is made again with the next one.
MIXED_RANGES = (6, 3, 1, 0)


@dataclass
class InputSet:
    """One input set: its values (in the task's order) and how they were made."""

    values: list[Any]
    seed: int
    exponent_range: int  # 0: the problem's own distribution; R: values times 2^U(-R, R)
    shrink: int = 0  # values also divided by 2^shrink (a plain set whose reference overflows)
    special: bool = False  # one element in 64 of every floating input: +0.0, -0.0 or a subnormal

    @property
    def tensors(self) -> list[torch.Tensor]:
        return [v for v in self.values if isinstance(v, torch.Tensor)]

    def describe(self) -> str:
        how = "the problem's own values" if not self.exponent_range else f"values scaled by 2^-{self.exponent_range}..2^{self.exponent_range}"
        how += f", divided by 2^{self.shrink}" if self.shrink else ""
        return how + (", with zeros, -0 and subnormals" if self.special else "")


def make_input_set(task: Any, seed: int, device: torch.device | str, exponent_range: int = 0, shrink: int = 0,
                   grow: int = 1, special: bool = False) -> InputSet:
    """The task's `get_inputs()` under `seed`, on `device` with true layouts, no zeros, and with
    values scaled per element by 2^U(-R, R) (R = `exponent_range`) and by 2^-`shrink`.
    `grow` > 1 makes inputs that many times larger along the batch dimension all tensor inputs
    share (a re-check on larger inputs), when they share one. `special`: then one element in 64
    of every floating input becomes +0.0, -0.0 or a subnormal (`_put_specials`); the other
    elements are those of the same set without them."""
    device = torch.device(device)
    torch.manual_seed(seed)
    with placed_on(device):
        values = list(task.get_inputs())
    values = [to_device(v, device) for v in values]
    if grow > 1:
        values = _grown(values, grow)
    generator = torch.Generator(device=device)
    generator.manual_seed(seed * 7919 + exponent_range)
    for region, dtype in _shared_regions(values):
        if not dtype.is_floating_point:
            continue
        chunk = 1 << 22  # (a mask of a byte per element: a quarter of a float32 tensor at most)
        for start in range(0, region.numel(), chunk):
            part = region[start:start + chunk]
            part.masked_fill_(part == 0, 0.5)  # never zeros: they hide unwritten outputs and wrong indexing
            if exponent_range:
                exps = torch.randint(-exponent_range, exponent_range + 1, part.shape, device=device, generator=generator)
                part.mul_(torch.exp2(exps.to(torch.float32)).to(dtype))
            if shrink:
                part.mul_(2.0 ** -shrink)
    if special:  # (after every region's scales are drawn: the other values stay the plain set's)
        for region, dtype in _shared_regions(values):
            if dtype in SPECIAL_DTYPES:
                _put_specials(region, dtype, generator)
    return InputSet(values, seed, exponent_range, shrink, special)


# The dtypes a special set puts zeros, -0 and subnormals into (IEEE formats with both; the
# float8 formats have few ops to run a task with).
SPECIAL_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
_SPECIAL_SPACING = 64  # one element in this many


def _put_specials(region: torch.Tensor, dtype: torch.dtype, generator: torch.Generator) -> None:
    """Set one element in each run of 64 of `region` (at a random place in it; in a last, shorter
    run with the matching chance) to +0.0, -0.0 or a subnormal of `dtype` of either sign, a third
    each. A subnormal is m times the smallest one, m drawn log-uniform in [1, 2^p) (p the mantissa's
    bits), so it is exact in `dtype` and below its smallest normal. One place per run: spread over
    the whole region and never twice the same element (the values do not depend on which of two
    writes to one element wins)."""
    finfo = torch.finfo(dtype)
    smallest = finfo.tiny * finfo.eps  # the smallest subnormal: 2^-149 in float32, 2^-24 in float16
    bits = round(-math.log2(finfo.eps))  # mantissa bits
    chunk = 1 << 22  # (a multiple of the spacing: the runs are the same whatever the chunking)
    for start in range(0, region.numel(), chunk):
        part = region[start:start + chunk]
        runs = -(-part.numel() // _SPECIAL_SPACING)
        places = torch.randint(0, _SPECIAL_SPACING, (runs,), device=part.device, generator=generator)
        kinds = torch.randint(0, 3, (runs,), device=part.device, generator=generator)  # 0: +0, 1: -0, 2: subnormal
        signs = torch.randint(0, 2, (runs,), device=part.device, generator=generator)
        scales = torch.rand(runs, device=part.device, generator=generator, dtype=torch.float64)
        places += torch.arange(0, runs * _SPECIAL_SPACING, _SPECIAL_SPACING, device=part.device)
        mantissas = torch.exp2(scales * bits).floor().clamp_(1, 2 ** bits - 1)
        magnitudes = torch.where(kinds == 2, mantissas * smallest, 0.0)
        negative = (kinds == 1) | ((kinds == 2) & (signs == 1))
        specials = torch.copysign(magnitudes, torch.where(negative, -1.0, 1.0).to(torch.float64))
        # the last run may be shorter than the spacing: a place past its end rewrites the run's
        # last element with its own value (no mask to count on the host, no synchronisation)
        kept = places < part.numel()
        places.clamp_(max=part.numel() - 1)
        part[places] = torch.where(kept, specials.to(dtype), part[places])


def _shared_regions(values: Sequence[Any]) -> Iterator[tuple[torch.Tensor, torch.dtype]]:
    """Flat views of the memory the tensor inputs span, one per storage (inputs that are views
    of one another share one), each with its dtype."""
    groups: dict[tuple[int, torch.dtype], list[torch.Tensor]] = {}
    for v in values:
        if isinstance(v, torch.Tensor) and v.numel():
            groups.setdefault((v.untyped_storage().data_ptr(), v.dtype), []).append(v)
    for (_, dtype), tensors in groups.items():
        start = min(span(t)[0] for t in tensors)
        end = max(span(t)[0] + span(t)[1] for t in tensors)
        yield torch.as_strided(tensors[0], (end - start,), (1,), start), dtype


def _grown(values: list[Any], grow: int) -> list[Any]:
    tensors = [v for v in values if isinstance(v, torch.Tensor)]
    if not tensors or any(t.dim() == 0 for t in tensors) or len({t.shape[0] for t in tensors}) != 1:
        return values
    out = []
    for v in values:
        if isinstance(v, torch.Tensor):
            shape = (v.shape[0] * grow, *v.shape[1:])
            if v.is_floating_point():
                v = torch.randn(shape, device=v.device).to(v.dtype)
            else:
                v = v.repeat(grow, *([1] * (v.dim() - 1)))
        out.append(v)
    return out
