"""Whose failure ended a judged run, as the worker's outcome says it: the candidate's (a verdict
on it) or the judge's own (INFRA, or RESOURCE when the GPU was short), never confused.

An outcome is the worker's answer as a dict (stage, reason, feedback and the reason's details):
the one JSON line the parent reads (`sandbox.outcome_of`). A phase deep inside the run ends it by
raising `Verdict` with one.
"""

from __future__ import annotations

import traceback
from typing import TYPE_CHECKING, Any

import torch


if TYPE_CHECKING:  # (the re-timing worker shares the CUDA fault signs without the judged run)
    from kevin_backend.judge.judged_run import Run

__all__ = ["CUDA_FAULTS", "Verdict", "error", "judge_failure"]

# What a CUDA fault says: one the candidate left behind surfaces wherever the GPU is next touched.
CUDA_FAULTS = ("illegal memory access", "misaligned address", "unspecified launch failure", "an illegal instruction",
               "device-side assert")


class Verdict(Exception):
    """Ends the run with an outcome (raised from deep inside a phase)."""

    def __init__(self, outcome: dict[str, Any]) -> None:
        super().__init__(outcome.get("reason"))
        self.outcome = outcome


def error(reason: str, stage: str, feedback: str, **extra: Any) -> dict[str, Any]:
    return {"stage": stage, "reason": reason, "feedback": feedback, **extra}


def judge_failure(run: Run | None, what: str, exc: BaseException) -> dict[str, Any]:
    """An exception outside the candidate's phases: the judge's (RESOURCE when memory ran out),
    unless a CUDA fault the candidate left behind surfaced there."""
    text = f"{type(exc).__name__}: {exc}"
    if run is not None and run.candidate_ran and any(f in text.lower() for f in CUDA_FAULTS):
        return error("ILLEGAL_ADDRESS", "run", f"the GPU reported a fault after the kernel ran: {text}")
    if isinstance(exc, torch.OutOfMemoryError):
        return error("RESOURCE", "run", f"the judge could not get GPU memory while {what}: {text}")
    return error("INFRA", "run", f"the judge failed while {what}: {text}\n{traceback.format_exc(limit=4)}")
