"""The phases of a judged run, as the sandboxed worker announces them (`run_worker.py`).

A failure inside a candidate phase is the candidate's (a crash, a hang, a CUDA fault); a failure
in any other phase is the judge's own (INFRA, or RESOURCE when memory ran out) and never a
verdict on the candidate.

    setup, load*, init*, inputs, reference, exact, poison, candidate*, compare,
    inductor, fingerprint, timing-candidate*, timed-read, timing-reference, timed-reference, timed-compare,
    roofline, roofline-inputs, roofline-reference,
    close (the candidate's process killed and waited for), after (the references checked, the report)
    (* the candidate's)

A run's time limit is charged by phase (`PhaseClock`): the candidate's phases share it, and each
of the judge's own steps has it anew, so the judge's slowness never reads as the candidate's hang.
"""

from __future__ import annotations

import json
import queue
import time
from dataclasses import dataclass
from typing import Any, Callable

__all__ = ["CANDIDATE_PHASES", "END", "Followed", "PhaseClock", "WHOLE_RUN_LIMITS", "follow"]

CANDIDATE_PHASES = frozenset({"load", "init", "candidate", "timing-candidate", "replay"})


WHOLE_RUN_LIMITS = 3.0
"""A run's whole time, at most this many times its limit, however its steps split it."""


class PhaseClock:
    """A judged run's time limit, charged by whose step is running. The candidate's phases together
    get `limit` seconds; each of the judge's own steps gets `limit` of its own; the whole run at
    most `WHOLE_RUN_LIMITS` times `limit`. So a judge slow to start (torch's import, an exact
    reference on a loaded machine) does not eat the candidate's time and turn its honest forward
    into a hang, and a hang is the candidate's only when its own time ran out.

        clock.enter("candidate"); ...; clock.left()   # seconds until the run is stopped
        clock.candidates()   # after a stop: True when the candidate's time ran out
    """

    def __init__(self, limit: float, candidate_phases: frozenset[str] = CANDIDATE_PHASES,
                 now: Callable[[], float] = time.monotonic) -> None:
        self.limit = limit
        self.candidate_phases = candidate_phases
        self._now = now
        self.start = self.since = now()
        self.phase = "start"
        self.spent = 0.0  # the candidate's phases' time before the current phase

    def enter(self, phase: str) -> None:
        at = self._now()
        if self.phase in self.candidate_phases:
            self.spent += at - self.since
        self.phase, self.since = phase, at

    def left(self) -> float:
        at = self._now()
        whole = WHOLE_RUN_LIMITS * self.limit - (at - self.start)
        if self.phase in self.candidate_phases:
            return min(whole, self.limit - self.spent - (at - self.since))
        return min(whole, self.limit - (at - self.since))

    def candidates(self) -> bool:
        """Whether the time that ran out was the candidate's: its phases' time reached the limit."""
        spent = self.spent + (self._now() - self.since if self.phase in self.candidate_phases else 0.0)
        return self.phase in self.candidate_phases and spent >= self.limit * 0.999


@dataclass(frozen=True)
class Followed:
    """What a worker said for one job: its verdict (None if it said none), its last phase, and,
    when it was stopped at the clock, whose time ran out."""

    verdict: dict[str, Any] | None
    phase: str
    timed_out: bool = False
    hung: bool = False  # the candidate's own time ran out (a hang); a timed-out run without it is the judge's


END = object()
"""What `next_line` gives when the worker's output ended."""


def follow(next_line: Callable[[float], Any], token: str, clock: PhaseClock) -> Followed:
    """Read a worker's token-prefixed phase and verdict lines (`next_line(seconds)` gives a line,
    `END`, or raises `queue.Empty` after `seconds`) until its verdict, its end, or its clock runs out."""
    prefix, phase_prefix = f"{token} ", f"{token} phase "
    while True:
        try:
            line = next_line(max(0.01, clock.left()))
        except queue.Empty:
            if clock.left() > 0:
                continue
            return Followed(None, clock.phase, True, clock.candidates())
        if line is END:
            return Followed(None, clock.phase)
        if line.startswith(phase_prefix):
            clock.enter(line[len(phase_prefix):].strip())
        elif line.startswith(prefix):
            try:
                verdict = json.loads(line[len(prefix):])
            except ValueError:
                verdict = None
            return Followed(verdict if isinstance(verdict, dict) else None, clock.phase)
