"""Stale outputs: how a timed call's wrong output is told from rounding (`stale`), and the
accepted verdict once the timing's checks passed (`accepted`). Every timed round of the
candidate runs on fresh values, and a random call's output is checked (`timing_phase.py`): a
candidate that returns stored results fails there.
"""

from __future__ import annotations

from typing import Any

from kevin_backend.judge.judged_run import Run
from kevin_backend.judge.reference_sets import run_eager
from kevin_backend.judge.roofline_phase import roofline_facts
from kevin_backend.measure.compare import Mismatch
from kevin_backend.measure.inputs import make_input_set

__all__ = ["STALE_FRACTION", "STALE_FRACTION_STAND_IN", "STALE_RATIO", "STALE_RATIO_STAND_IN", "accepted", "mismatch_text", "stale"]

# The replay check looks for stored results, not for precision (the correctness sets judged that,
# with the exact reference): an output computed from the old values differs from the new one
# almost everywhere and by the values' own size. A few elements just past the bound, as rounding
# in another order gives on a set without the exact run, are not stale.
STALE_FRACTION = 1e-3  # more than this share of the elements outside the bound
STALE_RATIO = 8.0  # or an error more than this many times the bound
# Against a stand-in (no exact run: eager's or Inductor's own float32 output, the bound the float32
# fallback's), the stand-in's own error counts too: under torch's defaults a float32 convolution is
# TF32's (10 bits), and a float32-exact kernel was 12.6 times past that bound on 25 of 115200
# elements of a KernelBench convolution's min and tanh on the H100, against Inductor's output, and
# on another draw past it on 157 of 115200 (0.14%, at most 39 times the bound). A stale output is
# wrong almost everywhere: against a stand-in, more than half a percent of the elements are stale.
STALE_RATIO_STAND_IN = 64.0
STALE_FRACTION_STAND_IN = 5e-3


def stale(bad: Mismatch, stand_in: bool = False) -> bool:
    """Whether a failed replay comparison shows a stale output (see STALE_FRACTION); `stand_in`:
    compared with a stand-in for the exact reference (see STALE_RATIO_STAND_IN)."""
    if bad.reason != "MISMATCH" or not bad.total_elements:
        return True  # NaN, infinities, a shape or dtype that changed: never rounding
    ratio, share = (STALE_RATIO_STAND_IN, STALE_FRACTION_STAND_IN) if stand_in else (STALE_RATIO, STALE_FRACTION)
    return bad.bad_elements > share * bad.total_elements or not bad.worst_ratio <= ratio


def mismatch_text(bad: Mismatch) -> str:
    """The comparison's finding in words: its message, else its numbers."""
    if bad.message:
        return bad.message
    return (f"output {bad.output}: {bad.bad_elements} of {bad.total_elements} elements outside the bound, first at "
            f"{list(bad.first_bad_index)}: expected {bad.expected:.6g}, got {bad.got:.6g}, allowed error {bad.allowed:.3g}; "
            f"max abs error {bad.max_abs_error:.3g}, worst error/bound {bad.worst_ratio:.3g}, eager's error there "
            f"{bad.eager_error:.3g}")


def accepted(run: Run, times: Any) -> dict[str, Any]:
    # (times: a timing_phase.CandidateTimes; the timing phase uses `stale`, so it is not imported here)
    """The accepted verdict with its times and roofline facts (eager's outputs on the timing's
    sample set, made again when the task's counts are not kept yet, give the bytes the task writes)."""

    def sample() -> tuple[list[Any], list[Any]]:
        run.phase("roofline-inputs")
        inputs = make_input_set(run.task, times.seed, run.device)
        run.phase("roofline-reference")
        return inputs.values, run_eager(run, inputs)

    outcome = {"stage": "timing", "reason": "ACCEPTED", "kernel_ms": times.kernel_ms, "eager_ms": times.eager_ms,
               "inductor_ms": times.inductor_ms}
    facts = roofline_facts(run, sample, times.copy_gbps)
    if facts is not None:
        outcome["roofline"] = facts
    return outcome
