"""The replay check after the timing: fresh values written into the candidate's input buffers
(the same buffers it was timed on), its output checked again; a candidate that returns stored
results fails it. Passed, it gives the accepted verdict with its times and roofline facts.
"""

from __future__ import annotations

from typing import Any

import torch

from kevin_backend.judge.attribution import error
from kevin_backend.judge.audit import candidate_forward
from kevin_backend.judge.judged_run import Run
from kevin_backend.judge.reference_sets import run_eager, run_exact
from kevin_backend.judge.roofline_phase import roofline_facts
from kevin_backend.judge.timing_phase import CandidateTimes
from kevin_backend.measure.compare import Mismatch, compare_outputs
from kevin_backend.measure.inputs import copy_values, make_input_set

__all__ = ["STALE_FRACTION", "STALE_RATIO", "check_replay", "mismatch_text", "stale"]

# The replay check looks for stored results, not for precision (the correctness sets judged that,
# with the exact reference): an output computed from the old values differs from the new one
# almost everywhere and by the values' own size. A few elements just past the bound, as rounding
# in another order gives on a set without the exact run, are not stale.
STALE_FRACTION = 1e-3  # more than this share of the elements outside the bound
STALE_RATIO = 8.0  # or an error more than this many times the bound


def stale(bad: Mismatch) -> bool:
    """Whether a failed replay comparison shows a stale output (see STALE_FRACTION)."""
    if bad.reason != "MISMATCH" or not bad.total_elements:
        return True  # NaN, infinities, a shape or dtype that changed: never rounding
    return bad.bad_elements > STALE_FRACTION * bad.total_elements or not bad.worst_ratio <= STALE_RATIO


def mismatch_text(bad: Mismatch) -> str:
    """The comparison's finding in words: its message, else its numbers."""
    if bad.message:
        return bad.message
    return (f"output {bad.output}: {bad.bad_elements} of {bad.total_elements} elements outside the bound, first at "
            f"{list(bad.first_bad_index)}: expected {bad.expected:.6g}, got {bad.got:.6g}, allowed error {bad.allowed:.3g}; "
            f"max abs error {bad.max_abs_error:.3g}, worst error/bound {bad.worst_ratio:.3g}, eager's error there "
            f"{bad.eager_error:.3g}")


def check_replay(run: Run, times: CandidateTimes, exact_model: list[torch.nn.Module]) -> dict[str, Any]:
    """The replay check after the timing (the same buffers, new values: a candidate that returns
    stored results fails it), then the accepted verdict with its times and roofline facts."""
    inputs = times.inputs
    values = inputs.values
    run.phase("inputs")
    fresh = make_input_set(run.task, run.job.seeds[-1] + 1000, run.device)
    for k, buf in enumerate(values):
        if isinstance(buf, torch.Tensor):
            copy_values(buf, fresh.values[k])
    del fresh  # (no name may keep one of its tensors alive: the replay needs that memory)
    # the references first, as for every input set: the exact run was planned without the
    # candidate's outputs held beside it
    run.phase("reference")
    want = run_eager(run, inputs)
    run.phase("exact")
    exact = run_exact(run, inputs, exact_model)
    again = candidate_forward(run, values, "replay")
    run.phase("compare")
    replayed = compare_outputs(again, want, exact)
    if replayed is not None and stale(replayed):  # (the comparison's numbers kept: which output, how many, how far)
        return error("REPLAYED_OUTPUT", "timing", "after new values were written into its input buffers, the output "
                     f"no longer matched: it returns stored results instead of computing ({mismatch_text(replayed)})")
    if replayed is not None:
        run.ledger.notes.append(f"replay check: computed afresh, within rounding of the bound ({mismatch_text(replayed)})")
    outcome = {"stage": "timing", "reason": "ACCEPTED", "kernel_ms": times.kernel_ms, "eager_ms": times.eager_ms,
               "inductor_ms": times.inductor_ms}
    facts = roofline_facts(run, values, want, times.copy_gbps)
    if facts is not None:
        outcome["roofline"] = facts
    return outcome
