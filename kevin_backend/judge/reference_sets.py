"""The references a candidate is compared with, per input set: the eager reference in the task's
dtype (a set whose reference is not finite is made again without its zeros, -0 and subnormals,
or with narrower scales) and the exact reference, the same model in float64 (float32 for a
half-precision task) when that fits the memory the judge may take (`measure/memory.py`); for an
output that fails, the conditioning run of the comparison's second opinion (`measure/compare.py`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch

from kevin_backend.judge.judged_run import Run, scrub, sync
from kevin_backend.measure.compare import output_list
from kevin_backend.measure.inputs import MIXED_RANGES, InputSet, clone_layout, fingerprint, make_input_set, perturbed_copy, tensor_bytes

__all__ = ["ReferenceSet", "exact_bytes", "make_reference_set", "plan_exact", "run_conditioned", "run_eager", "run_exact"]

# The second opinion's conditioning run: each float input times 1 +- the output dtype's unit roundoff, two draws.
CONDITIONING_DRAWS = 2


def run_eager(run: Run, inputs: InputSet) -> list[Any]:
    """Eager's outputs; on a GPU it also measures what eager needs beyond its inputs and outputs
    (the exact run needs as much again, upcast)."""
    before = 0
    if run.ledger.cuda:
        run.ledger.observe()
        before = torch.cuda.memory_allocated(run.device)
        torch.cuda.reset_peak_memory_stats(run.device)
    with torch.no_grad():
        out = output_list(run.reference(*inputs.values))
    sync(run.device)
    if run.ledger.cuda:
        made = sum(v.numel() * v.element_size() for v in out if isinstance(v, torch.Tensor))
        run.reference_temps = max(run.reference_temps, torch.cuda.max_memory_allocated(run.device) - before - made)
        run.ledger.grow(torch.cuda.max_memory_allocated(run.device) - run.ledger.baseline)
    return out


def _finite(values: Sequence[Any]) -> bool:
    return all(bool(torch.isfinite(v).all()) for v in values if isinstance(v, torch.Tensor) and v.is_floating_point())


@dataclass
class ReferenceSet:
    """One input set and eager's outputs on it."""

    inputs: InputSet  # what the candidate runs on (as the reference first saw it)
    want: list[Any]  # eager's outputs
    after: tuple[int, ...]  # the inputs' fingerprints once the reference ran (a task may change its inputs)


def make_reference_set(run: Run, seed: int, mixed: bool, special: bool = False) -> ReferenceSet:
    """An input set and eager's outputs on it. A set whose reference is not finite is made again:
    a special set (zeros, -0 and subnormals among its inputs) without them (a task that divides by
    its inputs or takes their log; noted), a mixed set with a narrower range of scales, the
    problem's own values scaled down (with the specials, then without); if none is finite, the
    problem's own values (its non-finite outputs are then part of the task)."""
    grow = run.job.grow
    ranges = MIXED_RANGES if mixed else (0,)
    with_or_without = (True, False) if special else (False,)  # (a set with specials, then the same without)
    tries = [(r, 0, w) for w in with_or_without for r in ranges] + [(0, s, w) for s in (1, 2, 4) for w in with_or_without]
    chosen: tuple[InputSet, list[Any], tuple[int, ...]] | None = None
    for exponent_range, shrink, with_specials in tries:
        run.phase("inputs")
        inputs = make_input_set(run.task, seed, run.device, exponent_range, shrink, grow, special=with_specials)
        before = fingerprint(inputs.values)
        run.phase("reference")
        want = run_eager(run, inputs)
        if _finite(want):
            if chosen is not None:
                scrub(chosen[1])
            chosen = (inputs, want, before)
            break
        if chosen is None and exponent_range == 0 and shrink == 0 and not with_specials:
            chosen = (inputs, want, before)  # the problem's own values: kept if nothing else is finite
        else:
            scrub(want)
    assert chosen is not None
    inputs, want, before = chosen
    if special and not inputs.special:
        run.ledger.notes.append(f"the input set with zeros, -0 and subnormals (seed {seed}) is checked without them: "
                                "its reference is not finite with them")
    run.phase("inputs")
    after = fingerprint(inputs.values)
    if after != before:  # the task changes its own inputs: the candidate gets them as they were
        inputs = make_input_set(run.task, inputs.seed, run.device, inputs.exponent_range, inputs.shrink, grow,
                                special=inputs.special)
    return ReferenceSet(inputs, want, after)


def _float_inputs_bytes(values: Sequence[Any]) -> int:
    return sum(tensor_bytes(v) for v in values if isinstance(v, torch.Tensor) and v.is_floating_point())


def exact_bytes(run: Run, inputs: InputSet, want: Sequence[Any], reference_temps: int,
                dtype: torch.dtype) -> tuple[int, int] | None:
    """What an exact run in `dtype` adds to what is held: (at its peak: upcast copies of the float
    inputs, its outputs, eager's temporaries and the parameters, upcast; after it: its outputs,
    kept for the comparison), or None where `dtype` is not wider than the outputs'."""
    floats = [v for v in want if isinstance(v, torch.Tensor) and v.is_floating_point()]
    if not floats:
        return None
    factor = torch.empty((), dtype=dtype).element_size() / max(v.element_size() for v in floats)
    if factor <= 1:
        return None
    params = sum(p.numel() * p.element_size() for p in run.reference.parameters() if p.is_floating_point())
    outputs = sum(v.numel() * v.element_size() for v in floats)
    return int((_float_inputs_bytes(inputs.values) + outputs + reference_temps + params) * factor), int(outputs * factor)


def plan_exact(run: Run, inputs: InputSet, want: Sequence[Any], reference_temps: int) -> torch.dtype | None:
    """The dtype of the exact reference: float64 when it fits the judge's memory, float32 for a
    half-precision task otherwise, else none (eager stands in, with KernelBench's tolerances).
    Within the judge's bound: the exact run, then its outputs beside the judge's copy of the
    candidate's. On the device besides: the candidate's copy of its inputs (memory of the judge's,
    shared with its process: apart from the bound, `memory.note_outside`) and its outputs in its
    process (this set's and, from the second set on, the last)."""
    outputs = sum(v.numel() * v.element_size() for v in want if isinstance(v, torch.Tensor))
    beside = sum(tensor_bytes(v) for v in inputs.tensors) + 2 * outputs
    for dtype in (torch.float64, torch.float32):
        sizes = exact_bytes(run, inputs, want, reference_temps, dtype)
        if sizes is None:
            continue
        need = max(sizes[0], sizes[1] + outputs)
        if run.ledger.fits(need, beside):
            return dtype
        run.ledger.notes.append(f"a {dtype} reference needs about {need / 2**30:.2f} GiB more, the candidate "
                                f"{beside / 2**30:.2f} GiB beside it "
                                f"(held {run.ledger.held() / 2**30:.2f} GiB, task {run.ledger.task_bytes / 2**30:.2f} GiB, "
                                f"available {run.ledger.available() / 2**30:.2f} GiB): not taken")
    return None


def run_exact(run: Run, inputs: InputSet, exact_model: list[torch.nn.Module]) -> list[Any] | None:
    """The reference in the exact dtype on upcast copies of the inputs (sizes and strides kept; no
    storage before them: an input the timing's check reads far into its slot's memory is copied
    alone, as `exact_bytes` counts it), or None when there is no exact run (an op without a kernel
    in that dtype falls back, noted)."""
    if run.exact_dtype is None or not exact_model:
        return None
    reference64 = exact_model[0]
    values = [clone_layout(v, dtype=run.exact_dtype, keep_offset=False) if isinstance(v, torch.Tensor) and v.is_floating_point() else v
              for v in inputs.values]
    try:
        with torch.no_grad():
            out = output_list(reference64(*values))
        sync(run.device)
    except torch.OutOfMemoryError:
        raise
    except (RuntimeError, NotImplementedError) as exc:
        run.ledger.notes.append(f"no {run.exact_dtype} run ({type(exc).__name__}: {str(exc).splitlines()[0][:200]})")
        run.exact_dtype = None
        run.ledger.exact = "eager"
        exact_model.clear()
        if run.state is not None:
            run.state.forget_exact()
        return None
    finally:
        del values
    return out


def run_conditioned(run: Run, inputs: InputSet, exact_model: list[torch.nn.Module], want: Sequence[Any],
                    exact: Sequence[Any], dtype: torch.dtype) -> list[Any] | None:
    """The second opinion's conditioning run for the outputs of `dtype` (`measure/compare.py`):
    the exact reference on copies of the inputs, each element moved by the unit roundoff of
    `dtype` (half its ulp) of a random sign (seeded by the set), twice; at each element of such
    an output, the draw farther from `exact` (None at other outputs). None where the exact run is
    no wider than `dtype`, or it would not fit the judge's memory (noted): the first comparison's
    verdict then stands."""
    outputs = [i for i, v in enumerate(want) if isinstance(v, torch.Tensor) and v.dtype == dtype]
    wider = run.exact_dtype is not None and torch.finfo(run.exact_dtype).eps < torch.finfo(dtype).eps
    if not wider or not exact_model or not outputs:
        return None
    assert run.exact_dtype is not None
    sizes = exact_bytes(run, inputs, want, max(0, run.reference_temps), run.exact_dtype)
    # (at its peak: an exact run on perturbed copies of the inputs, the farthest draw so far, and two
    # more outputs' worth while the draws are compared)
    if sizes is None or not run.ledger.fits(sizes[0] + 3 * sizes[1] + _float_inputs_bytes(inputs.values) * 2):
        run.ledger.notes.append("no second opinion on a failed output: its conditioning run would not fit the judge's memory")
        return None
    generator = torch.Generator(device=run.device).manual_seed(inputs.seed)
    farthest: list[Any] = [None] * len(want)
    for _ in range(CONDITIONING_DRAWS):
        values = [perturbed_copy(v, run.exact_dtype, torch.finfo(dtype).eps / 2, generator)
                  if isinstance(v, torch.Tensor) and v.is_floating_point() else v for v in inputs.values]
        try:
            with torch.no_grad():
                out = output_list(exact_model[0](*values))
            sync(run.device)
        except torch.OutOfMemoryError:
            raise
        except (RuntimeError, NotImplementedError) as exc:  # (the exact run itself succeeded on these inputs)
            run.ledger.notes.append(f"no second opinion: the conditioning run failed ({type(exc).__name__})")
            return None
        finally:
            del values
        for i in outputs:
            drawn, e = out[i], exact[i]
            keep = farthest[i]
            farthest[i] = drawn if keep is None else torch.where((drawn - e).abs() > (keep - e).abs(), drawn, keep)
        del out
    return farthest
