"""The phases of a judged run, as the sandboxed worker announces them (`run_worker.py`).

A failure inside a candidate phase is the candidate's (a crash, a hang, a CUDA fault); a failure
in any other phase is the judge's own (INFRA, or RESOURCE when memory ran out) and never a
verdict on the candidate.

    setup, load*, init*, inputs, reference, exact, poison, candidate*, compare,
    inductor, fingerprint, timing-candidate*, timed-read, timing-reference, timed-reference, timed-compare,
    roofline, roofline-inputs, roofline-reference,
    close (the candidate's process killed and waited for), after (the references checked, the report)
    (* the candidate's)
"""

from __future__ import annotations

__all__ = ["CANDIDATE_PHASES"]

CANDIDATE_PHASES = frozenset({"load", "init", "candidate", "timing-candidate", "replay"})
