"""Correctness on one input set: the references (`reference_sets.py`), the candidate in its own
process on memory poisoned with NaN under the audit (`audit.py`), its inputs (the judge's shared
copies) fingerprinted after, and
the comparison (`measure/compare.py`); an output that fails is compared once more with its
conditioning (the second opinion: honest rounding where a sum cancels is past eager's error and
the cap there); a candidate wrong on non-contiguous inputs is run once more on
contiguous copies, to say whether it ignores their strides.
"""

from __future__ import annotations

import copy
from typing import Any

import torch

from kevin_backend.judge.attribution import Verdict
from kevin_backend.judge.audit import candidate_forward
from kevin_backend.judge.judged_run import Run, scrub
from kevin_backend.judge.reference_sets import ReferenceSet, make_reference_set, plan_exact, run_conditioned, run_exact
from kevin_backend.judge.shared_values import arena_bytes
from kevin_backend.measure.compare import Mismatch, compare_outputs
from kevin_backend.measure.exact_run import ExactModel
from kevin_backend.measure.inputs import InputSet, layout_text, tensor_bytes
from kevin_backend.measure.precision import output_precision

__all__ = ["SPECIAL_SET", "check_input_set"]

# The input set with zeros, -0 and subnormals: the third, after the problem's own values and a
# mixed-scale set, so that a candidate wrong everywhere is told so on plain values first (the
# judge's default has five sets; a job of fewer than three has none).
SPECIAL_SET = 2


def check_input_set(run: Run, index: int, seed: int, exact_model: list[torch.nn.Module]) -> dict[str, Any] | None:
    """Check the candidate on input set `index`: an outcome when it fails, else None. Odd sets
    have mixed scales; the third (index 2) has zeros, -0 and subnormals among its inputs."""
    ref = make_reference_set(run, seed, mixed=index % 2 == 1, special=index == SPECIAL_SET)
    if index == 0:
        _size_the_task(run, ref, exact_model)
    run.ledger.observe()
    run.phase("exact")
    exact = run_exact(run, ref.inputs, exact_model)
    run.ledger.observe()

    # the candidate, on the inputs as the reference saw them, on poisoned memory
    got = candidate_forward(run, ref.inputs.values, after=ref.after)
    run.ledger.observe()
    run.phase("compare")
    bad = compare_outputs(got, ref.want, exact, precision=run.precision)
    run.compare_bytes = run.ledger.taken()  # (a comparison of the same outputs again takes as much)
    if bad is not None and bad.reason == "MISMATCH" and bad.total_elements and exact is not None:
        bad = _second_opinion(run, index, ref, got, exact, exact_model, bad)
    if bad is not None:
        return _mismatch_outcome(run, bad, index, ref.inputs, ref.want, exact)
    scrub(ref.want)
    scrub(exact or [])
    return None


def _second_opinion(run: Run, index: int, ref: ReferenceSet, got: list[Any], exact: list[Any],
                    exact_model: list[torch.nn.Module], bad: Mismatch) -> Mismatch | None:
    """The comparison again with the failed output's conditioning (`run_conditioned`): None where
    the failure was rounding where a sum cancels (noted), else the mismatch that stands."""
    failed = ref.want[bad.output] if bad.output < len(ref.want) else None
    if not isinstance(failed, torch.Tensor) or not failed.is_floating_point():
        return bad
    run.phase("exact")
    carried = run.precision[bad.output] if run.precision is not None and bad.output < len(run.precision) else None
    conditioned = run_conditioned(run, ref.inputs, exact_model, ref.want, exact, carried or failed.dtype)
    run.ledger.observe()
    if conditioned is None:
        return bad
    run.phase("compare")
    again = compare_outputs(got, ref.want, exact, conditioned=conditioned, precision=run.precision)
    scrub(conditioned)
    if again is None:
        run.ledger.notes.append(
            f"input set {index}: output {bad.output} passed on the second opinion ({bad.bad_elements} of "
            f"{bad.total_elements} elements past the first bound, at most {bad.worst_ratio:.2f} times it, "
            "within rounding of the output's conditioning)")
    return again


def _size_the_task(run: Run, ref: ReferenceSet, exact_model: list[torch.nn.Module]) -> None:
    """The first set fixes the task's size (its inputs and outputs), hence the judge's memory
    bound, and whether an exact run fits in it."""
    output_bytes = [v.numel() * v.element_size() for v in ref.want if isinstance(v, torch.Tensor)]
    run.output_bytes = tuple(output_bytes)
    run.ledger.output_bytes = sum(output_bytes)
    run.ledger.task_bytes = sum(tensor_bytes(v) for v in ref.inputs.tensors) + sum(output_bytes)
    run.exact_dtype = plan_exact(run, ref.inputs, ref.want, max(0, run.reference_temps))
    run.precision = output_precision(run.reference, ref.inputs.values)
    if run.exact_dtype is not None and (not exact_model or getattr(exact_model[0], "kevin_dtype", None) != run.exact_dtype):
        run.phase("exact")
        exact_model.clear()
        model = ExactModel(copy.deepcopy(run.reference).to(run.exact_dtype), run.exact_dtype)
        model.kevin_dtype = run.exact_dtype  # a worker keeps it for the task's next candidates
        exact_model.append(model)
        if run.state is not None:
            run.state.mark()
    run.ledger.exact = "eager" if run.exact_dtype is None else str(run.exact_dtype).removeprefix("torch.")


def _mismatch_outcome(run: Run, bad: Mismatch, index: int, inputs: InputSet, want: list[Any],
                      exact: list[Any] | None) -> dict[str, Any]:
    details = {k: v for k, v in bad.__dict__.items() if k not in ("reason", "message")}
    details["first_bad_index"] = list(bad.first_bad_index)
    details["trial"] = index
    details["exact"] = run.ledger.exact
    if bad.reason in ("SHAPE_MISMATCH", "DTYPE_MISMATCH") or (bad.reason == "MISMATCH" and bad.message and not bad.total_elements):
        return {"stage": "correctness", "reason": bad.reason, "feedback": bad.message}
    feedback = ""
    strided = [(k, v) for k, v in enumerate(inputs.values)
               if isinstance(v, torch.Tensor) and (not v.is_contiguous() or v.storage_offset())]
    if strided:
        feedback = _layout_diagnosis(run, inputs, strided, want, exact)
    if inputs.special:
        feedback = "\n".join(filter(None, [_SPECIALS_TEXT.format(index=index), feedback]))
    outcome = {"stage": "correctness", "reason": bad.reason, "mismatch": details, "set": inputs.describe()}
    if feedback:
        outcome["feedback"] = feedback
    return outcome


_SPECIALS_TEXT = ("Input set {index} has zeros, negative zeros and subnormals among its values (one element in 64): "
                  "check comparisons at zero (`x > 0` against `x >= 0`), the sign of zero, and subnormals flushed to zero.")


def _dense_rerun_bytes(run: Run, inputs: InputSet, strided: list[tuple[int, torch.Tensor]]) -> tuple[int, int]:
    """What running the candidate again on contiguous copies adds: (to what the judge holds: the
    copies, its copy of the outputs again and what comparing them took the first time; beside, on
    the device: a larger arena for the
    candidate's copy of them where the one its process maps is too small (that one stays mapped),
    and its outputs in its process)."""
    dense = sum(v.numel() * v.element_size() for _, v in strided)
    arena = arena_bytes([v for k, v in enumerate(inputs.values) if k not in dict(strided)]) + dense
    scratch = getattr(run.model, "scratch", None)
    grown = arena if scratch is None or scratch.nbytes < arena else 0
    return dense + sum(run.output_bytes) + run.compare_bytes, grown + sum(run.output_bytes)


def _layout_diagnosis(run: Run, inputs: InputSet, strided: list[tuple[int, torch.Tensor]], want: list[Any],
                      exact: list[Any] | None) -> str:
    """Run the candidate once more on contiguous copies of the inputs: if it is right there, it
    ignores the task's layouts; say which inputs and their strides."""
    names = "; ".join(f"input {k}: {layout_text(v)}" for k, v in strided)
    if not run.ledger.fits(*_dense_rerun_bytes(run, inputs, strided)):
        run.ledger.notes.append("the candidate was not run again on contiguous inputs: their copies would not fit the judge's memory")
        return f"Some inputs are not contiguous ({names}); a kernel must address them by their strides."
    try:
        dense = [v.contiguous() if isinstance(v, torch.Tensor) else v for v in inputs.values]
        again = candidate_forward(run, dense, "candidate")
    except Verdict:
        return ""
    run.phase("compare")
    if compare_outputs(again, want, exact, precision=run.precision) is None:
        return (f"The kernel is right when every input is contiguous and wrong on the task's own layouts ({names}). "
                "Read each input through its strides (and storage offset), or make it contiguous first.")
    return f"Some inputs are not contiguous ({names}); a kernel must address them by their strides."
