"""What the judge's parent sends a sandboxed worker: one job, as one JSON line.

    line = job.to_json(token)                  # the parent: the job and the token it chose
    job, token = Job.from_json(line)           # the worker: the same job, typed, and the token

Two kinds of job, each a frozen dataclass of its own: `Job`, one candidate judged against its
task (`run_worker.py`), and `RetimeJob`, a search's winning kernel re-timed against Inductor
(`retime_worker.py`). They share the wire, the task's program, the timing protocol's trials and
warm-up, and where the run happens (device, builds, GPU lock, numerics); the rest differs (a
judged run has correctness seeds, a memory bound and switches for the references' times, a
re-timing has interleaved rounds and one seed), so one class would be mostly optional fields.

The token travels beside the fields, never among them: it is the parent's secret for this job
(the worker prefixes its phase and verdict lines with it, so that what the candidate prints
cannot pose as a verdict), not part of what is run. Plain Python: no torch here.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any, Callable, TypeVar

__all__ = ["Job", "RetimeJob", "WireJob"]

_J = TypeVar("_J", bound="WireJob")


def _numerics_from_wire(value: Any) -> tuple[tuple[str, Any], ...]:
    return tuple(dict(value).items())


# How a field read from the wire becomes the dataclass's type (JSON has lists, not tuples, and
# the numerics travel as an object); fields not named here are taken as they are.
_FROM_WIRE: dict[str, Callable[[Any], Any]] = {
    "seeds": lambda value: tuple(int(s) for s in value),
    "numerics": _numerics_from_wire,
    "trials": int,
    "warmup": int,
    "rounds": int,
    "seed": int,
    "grow": int,
    "salt": int,
    "memory_factor": float,
}


class WireJob:
    """The wire of a worker's job (a frozen dataclass deriving from this): one JSON object on one
    line, the dataclass's fields and the parent's token, the numerics as an object of settings."""

    numerics: tuple[tuple[str, Any], ...]

    def to_json(self, token: str) -> str:
        """The job as the one line (without its newline) a worker reads, `token` beside it."""
        fields = dataclasses.asdict(self)  # type: ignore[call-overload]
        fields["numerics"] = dict(self.numerics)
        return json.dumps({"token": token, **fields})

    @classmethod
    def from_json(cls: type[_J], line: str) -> tuple[_J, str]:
        """The job and the token in a line written by `to_json`. Fields left out take their
        defaults; a missing required field or one this job does not have raises TypeError."""
        data = json.loads(line)
        token = str(data.pop("token"))
        values = {name: _FROM_WIRE.get(name, _same)(value) for name, value in data.items()}
        return cls(**values), token


def _same(value: Any) -> Any:
    return value


@dataclass(frozen=True)
class Job(WireJob):
    """One candidate judged against its task in a worker (`sandbox.job_of` makes it from the
    judge's `RunConfig`; `run_worker.py` runs it)."""

    task: str  # the task's program: `Model`, `get_inputs`, `get_init_inputs` (KernelBench's form)
    candidate: str  # the candidate's program: its `ModelNew`
    # the correctness input sets, one seed each; the first also seeds both models and the timing set
    seeds: tuple[int, ...]
    trials: int  # timed calls per measurement
    warmup: int  # untimed calls before them
    inductor: bool = True  # also time the Inductor-compiled reference (once per task and GPU)
    eager: bool = True  # also time the eager reference (once per task and GPU)
    build_root: str | None = None  # the judge's build cache: the candidate's load_inline is answered from it
    arch: str | None = None  # the GPU's architecture ("9.0") the builds are for
    grow: int = 1  # correctness inputs this many times larger along the shared batch dimension
    gpu_lock: str | None = None  # the file every worker locks: shared for correctness, alone for timing
    device: str | None = None  # the device under test ("cuda:1"); None: the current GPU, else the CPU
    memory_factor: float = 3.0  # the judge's extra GPU memory, at most this many times the task's inputs + outputs
    # (name, value) numerics settings the run is made under (the task's cache key's, `cache/key.py`);
    # empty: the worker's own (torch's defaults)
    numerics: tuple[tuple[str, Any], ...] = ()
    compile_backend: str = "inductor"  # what compiles the reference for its timing (tests on a CPU use "eager")
    # fresh per evaluation (the judge draws it, the verdict records it): every input set's seed is
    # made from its seed and this, so no candidate can know its inputs ahead (0: the seeds as they are)
    salt: int = 0

    def input_seed(self, seed: int) -> int:
        """The seed an input set is made from: `seed` salted with this evaluation's salt (the
        models are always seeded with the unsalted first seed: the references stay the same)."""
        if not self.salt:
            return seed
        return (seed * 1_000_003 + self.salt * 7_919) % (1 << 31)


@dataclass(frozen=True)
class RetimeJob(WireJob):
    """A search's winning kernel re-timed against Inductor's code for its task, in interleaved
    rounds (`decide.retime_in_sandbox` makes it from a `RetimeConfig`; `retime_worker.py` runs it)."""

    task: str  # the task's program (KernelBench's form)
    kernel: str  # the winning kernel's program: its `ModelNew`
    rounds: int  # interleaved rounds: kernel, Inductor, kernel, Inductor, ...
    trials: int  # trials per side per round; a round's time is their median
    warmup: int  # untimed calls before each side's trials in every round
    seed: int = 11  # the input set (the judge's first seed: its timing set); also seeds both models
    device: str | None = None  # "cuda:1"; None: the current GPU, else the CPU
    build_root: str | None = None  # the judge's build cache: the kernel's load_inline is answered from it
    arch: str | None = None  # the GPU's architecture the builds are for
    gpu_lock: str | None = None  # taken exclusively for the whole interleaved measurement
    compile_backend: str = "inductor"  # what compiles the reference (tests on a CPU use "eager")
    numerics: tuple[tuple[str, Any], ...] = ()  # the task's cache key's settings, as when it was judged
