"""What a serving worker keeps of a task between its candidates: the task's module, its init
inputs on the device, the seeded reference and its exact (float64) copy, and the task's roofline
counts; fingerprinted, so that a candidate that wrote into any of it (out of bounds) is caught.

A one-shot worker makes the same state and drops it after its one run.
"""

from __future__ import annotations

import hashlib
import types
from dataclasses import dataclass, field
from typing import Any

import torch

from kevin_backend.judge.job import Job
from kevin_backend.measure.inputs import fingerprint, to_device
from kevin_backend.types import load_program

__all__ = ["TaskState", "TaskStates", "device_of", "task_state_of"]


@dataclass
class TaskState:
    """What a worker keeps of one task between candidates: the task's module, its init inputs on
    the device, the seeded reference and its exact (float64) copy."""

    task: types.ModuleType
    init: list[Any]
    reference: torch.nn.Module
    exact_model: list[torch.nn.Module] = field(default_factory=list)
    marked: tuple[int, ...] = ()  # the fingerprint when last known intact
    counts: tuple[int, int] | None = None  # the task's bytes and FLOPs for the roofline (the same for every candidate)

    def fingerprint(self) -> tuple[int, ...]:
        """The bits of everything kept between candidates (the init inputs, every reference's
        parameters and buffers): a candidate that wrote into them (out of bounds) leaves a
        different fingerprint. Everything else a candidate could reach is released after it and
        written again (inputs) or poisoned (outputs) before the next one runs."""
        return fingerprint(self._kept(with_exact=True))

    def _kept(self, with_exact: bool) -> list[torch.Tensor]:
        models = (self.reference, *self.exact_model) if with_exact else (self.reference,)
        return [v for v in self.init if isinstance(v, torch.Tensor)] + \
            [t for m in models for t in (*m.parameters(), *m.buffers())]

    def forget_exact(self) -> None:
        """The exact copy is gone: only the init inputs and the reference stay checked."""
        self.marked = self.marked[:len(self._kept(with_exact=False))]

    def mark(self) -> None:
        self.marked = self.fingerprint()

    def intact(self) -> bool:
        return self.fingerprint() == self.marked


class TaskStates:
    """A worker's task states, the most recently used kept (each holds a model on the GPU)."""

    def __init__(self, keep: int = 2) -> None:
        self.keep = keep
        self.states: dict[str, TaskState] = {}

    def get(self, key: str) -> TaskState | None:
        state = self.states.pop(key, None)
        if state is not None:
            self.states[key] = state  # most recent last
        return state

    def put(self, key: str, state: TaskState) -> None:
        self.states[key] = state
        while len(self.states) > self.keep:
            self.states.pop(next(iter(self.states)))

    def intact(self) -> bool:
        return all(state.intact() for state in self.states.values())


def device_of(job: Job) -> torch.device:
    """The device under test, made the current one (the job's, else the current GPU, else the CPU)."""
    device = torch.device(job.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda":
        device = torch.device("cuda", torch.cuda.current_device() if device.index is None else device.index)
        torch.cuda.set_device(device)
    return device


def task_state_of(job: Job, device: torch.device, states: TaskStates | None) -> TaskState:
    """The job's task as the worker keeps it: from `states` when a candidate of the same task,
    device and first seed came before, else loaded, built and fingerprinted now."""
    key = hashlib.sha256(f"{device} {job.seeds[0]}\n{job.task}".encode()).hexdigest()
    state = states.get(key) if states is not None else None
    if state is not None:
        return state
    task = load_program(job.task, "kevin_task")
    # KernelBench's placement: each model built (seeded alike) where its program makes it, then
    # moved with the init inputs to the device under test.
    init = [to_device(v, device) for v in task.get_init_inputs()]
    torch.manual_seed(job.seeds[0])
    state = TaskState(task, init, task.Model(*init).to(device).eval())
    state.mark()
    if states is not None:
        states.put(key, state)
    return state
