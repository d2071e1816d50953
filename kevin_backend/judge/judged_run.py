"""One judged run inside the worker: the job, the task and candidate, where they run, the
memory ledger, and the phase now running (`phases.py`: whose failure a crash there would be).

Every phase of the worker (`correctness.py`, `timing_phase.py`, `replay_check.py`,
`roofline_phase.py`) reads and updates the run through this one object.
"""

from __future__ import annotations

import types
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch

from kevin_backend.judge.job import Job
from kevin_backend.judge.task_state import TaskState
from kevin_backend.measure.memory import MemoryLedger

__all__ = ["Run", "scrub", "sync"]


@dataclass
class Run:
    """One judged run: the job, the task and candidate, where they run, and the memory ledger."""

    job: Job
    task: types.ModuleType
    reference: torch.nn.Module
    model: Any  # the candidate in its own process (`candidate_process.RemoteModel`)
    device: torch.device
    ledger: MemoryLedger
    announce: Callable[[str], None]
    exact_dtype: torch.dtype | None = None  # decided on the first input set
    # per output, the 16-bit dtype whose rounding the task leaves in it (`measure/precision.py`), from the first set
    precision: tuple[torch.dtype | None, ...] | None = None
    output_bytes: tuple[int, ...] = ()
    candidate_ran: bool = False
    reference_temps: int = 0  # the most eager allocated beyond its outputs, in bytes
    compare_bytes: int = 0  # what the last comparison of a set took beyond what was held (`MemoryLedger.taken`)
    current: str = "setup"  # the phase now running
    state: TaskState | None = None  # what the worker keeps of the task between candidates
    # starts the references' own process (eager and Inductor timed as the candidate is: `timing_phase.py`)
    start_reference: Callable[[], Any] | None = None

    def phase(self, name: str) -> None:
        self.ledger.enter(name)
        self.current = name
        self.announce(name)


def scrub(values: Sequence[Any]) -> None:
    """NaN into outputs about to be freed: a later candidate must not find their values."""
    for t in values:
        if isinstance(t, torch.Tensor) and t.numel() and not t.is_inference():
            with torch.no_grad():
                t.fill_(float("nan") if t.is_floating_point() else -1)
        elif isinstance(t, torch.Tensor) and t.numel():
            with torch.inference_mode():
                t.fill_(float("nan") if t.is_floating_point() else -1)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
