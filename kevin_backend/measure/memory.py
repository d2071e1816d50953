"""The judge's GPU memory: what it may take, what it took, and whose an out-of-memory error is.

The judge works beside other processes (a training job, a compile holding its own tensors), so
it takes memory in proportion to the task, not to the GPU:

    task = bytes of the task's inputs (the memory they span) + bytes of its outputs
    the judge's own extra (exact reference, eager outputs, poison, comparisons)
        <= max(factor x task, floor) + fixed
    fixed = the timer's L2 flush buffer (twice the GPU's L2 cache), the one cost that does not
            grow with the task
    floor = what the judge may take however small the task (`JUDGE_FLOOR`, 1 GiB in the judge's
            runs): a small task's exact run upcasts eager's temporaries too, and a chain of three
            full-size values after a convolution (its output, an activation's, the result) needed
            more than 3 x task in float64 on an H200, so it was judged against eager's TF32
            convolution with KernelBench's tolerance instead
    apart, with allowances of their own: the timing's input slots and the candidate's copy of
            its inputs, shared with its process (`note_outside`)

`MemoryLedger` measures the peak step by step (the judge's steps: `judged_run.Run.phase`): the
most the caching allocator held during the step plus the most the judge held outside it (the
buffers it shares with a candidate's process, counted by `note_outside`) during the same step,
so that a peak of one step is never added to a buffer made in a later one. It says whether a planned allocation fits both that bound and the memory the
device has free. An out-of-memory
error is the judge's (RESOURCE: not the candidate's failure, not a decision) when the judge was
allocating; a candidate's, in its own process, is its own (OUT_OF_MEMORY) unless the judge's
reading of free memory after that process is gone says the GPU was short
(`judge/candidate_process.py`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import torch

__all__ = ["JUDGE_FLOOR", "MEMORY_FACTOR", "MemoryLedger", "MemoryReport", "candidate_workspace", "note_outside", "outside_bytes", "poison"]

MEMORY_FACTOR = 3.0  # the judge's extra memory, at most this many times the task's inputs + outputs
JUDGE_FLOOR = 1 << 30  # ... or at most this much, whichever is more (the judge's runs: `judge/run_worker.py`)
_POISON_SLACK = 64 << 20  # besides blocks of the outputs' sizes, this much of the allocator's free cache is poisoned
_OUTSIDE: dict[int, int] = {}  # device index -> bytes this process holds outside torch's caching allocator
# device index -> of those, what has an allowance of its own (`note_outside`), by kind
_APART: dict[str, dict[int, int]] = {"slots": {}, "inputs": {}}
_TOP: dict[int, int] = {}  # device index -> the most held outside, the kinds apart left out, since `reset_outside_top`


def note_outside(device: torch.device, nbytes: int, apart: str = "") -> None:
    """`nbytes` more (or, negative, fewer) held on `device` outside torch's caching allocator.
    `apart` names memory that neither the judge's extra nor its bound counts, from its allocation
    to its release, because it has an allowance of its own: "slots", the timing's input slots
    (`timing_phase.slot_memory`: enough calls per batch, within an eighth of the free memory);
    "inputs", the candidate's copy of its inputs, which the judge shares with its process (the
    task's inputs once more: the candidate's, in the judge's memory so that its process cannot
    touch the judge's own)."""
    index = _index(device)
    _OUTSIDE[index] = _OUTSIDE.get(index, 0) + int(nbytes)
    if apart:
        _APART[apart][index] = _APART[apart].get(index, 0) + int(nbytes)
    _TOP[index] = max(_TOP.get(index, 0), _own(index))


def _own(index: int) -> int:
    return _OUTSIDE.get(index, 0) - sum(kind.get(index, 0) for kind in _APART.values())


def outside_top(device: torch.device) -> int:
    """The most this process held on `device` outside torch's allocator, the kinds apart left out,
    since the last `reset_outside_top` (0 off a GPU)."""
    return max(_TOP.get(_index(device), 0), _own(_index(device))) if device.type == "cuda" else 0


def reset_outside_top(device: torch.device) -> None:
    """From now on `outside_top` counts from what is held now (as torch's peak statistics reset)."""
    if device.type == "cuda":
        _TOP[_index(device)] = _own(_index(device))


def outside_bytes(device: torch.device) -> int:
    """What this process holds on `device` outside torch's caching allocator (`note_outside`);
    0 off a GPU."""
    return _OUTSIDE.get(_index(device), 0) if device.type == "cuda" else 0


def apart_bytes(device: torch.device, apart: str) -> int:
    """Of `outside_bytes`, what memory of kind `apart` (`note_outside`) holds now; 0 off a GPU."""
    return _APART[apart].get(_index(device), 0) if device.type == "cuda" else 0


def _index(device: torch.device) -> int:
    return device.index if device.index is not None else torch.cuda.current_device()


def candidate_workspace(task_bytes: int) -> int:
    """Memory a candidate's process may keep beside its outputs and parameters (temporaries,
    buffers of its own): a quarter of the task's inputs and outputs, at least 512 MiB."""
    return max(512 << 20, task_bytes // 4)


@dataclass(frozen=True)
class MemoryReport:
    """What one judged run took on the GPU (bytes; None where nothing was measured)."""

    task_bytes: int  # the task's inputs (memory spanned) + outputs
    peak_bytes: int  # the most the run held at once beyond the models' parameters
    judge_extra_bytes: int  # peak_bytes - task_bytes: what the judge added
    budget_bytes: int  # max(MEMORY_FACTOR x task_bytes, floor) + fixed_bytes
    exact: str  # the dtype of the exact reference ("float64", "float32"), or "eager" (none fitted)
    fixed_bytes: int = 0  # the timer's L2 flush buffer, allowed whatever the task's size
    slot_bytes: int = 0  # the timing's input slots at most (not in peak_bytes: see `note_outside`)
    candidate_inputs_bytes: int = 0  # the candidate's copy of its inputs at most (not in peak_bytes either)
    peak_step: str = ""  # the judge's step in which the peak was reached ("" where none was seen)
    # per step name: [the most held when it began, the most held during it] (what was already
    # held tells memory kept from an earlier step from what the step itself took)
    steps: dict[str, list[int]] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class MemoryLedger:
    device: torch.device
    factor: float = MEMORY_FACTOR
    task_bytes: int = 0
    baseline: int = 0  # allocated when the models were in place
    peak: int = 0
    exact: str = "eager"
    notes: list[str] = field(default_factory=list)
    fixed: int = 0  # allowed besides factor x task: the timer's L2 flush buffer
    floor: int = 0  # the least factor x task stands for (`JUDGE_FLOOR` in the judge's runs)
    params: int = 0  # the reference's parameters: what a candidate's own may take
    output_bytes: int = 0  # one call's outputs, as the reference's are (0: not known yet)
    own_baseline: int = 0  # held outside torch's allocator when the models were in place, no kind apart (`note_outside`)
    apart_baseline: dict[str, int] = field(default_factory=dict)  # the kinds apart, held when the models were in place
    apart_peak: dict[str, int] = field(default_factory=dict)  # the most each kind apart held since
    step: str = ""  # the judge's step now running (`enter`)
    peak_step: str = ""  # the step in which `peak` last grew
    steps: dict[str, list[int]] = field(default_factory=dict)  # `MemoryReport.steps`
    step_start: int = 0  # held when the step now running began
    started: bool = False  # `start` was called: what is allocated from then on is the run's

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"

    def start(self) -> None:
        """The models are on the device: from here on, what is allocated is the run's."""
        self.started = True
        if self.cuda:
            torch.cuda.synchronize(self.device)
            self.baseline = torch.cuda.memory_allocated(self.device)
            self.apart_baseline = {kind: apart_bytes(self.device, kind) for kind in _APART}
            self.own_baseline = _own(_index(self.device))
            self._new_step()

    def _new_step(self) -> None:
        torch.cuda.reset_peak_memory_stats(self.device)
        reset_outside_top(self.device)

    def _outside(self) -> int:
        """Held outside torch's allocator since `start`, the kinds apart left out (the report gives
        their sizes on their own)."""
        return _own(_index(self.device)) - self.own_baseline

    def observe(self) -> None:
        """The most held in the step so far: torch's peak since the step began with the most held
        outside its allocator in the same time (the two may not coincide: an upper bound)."""
        if self.cuda and self.started:
            for kind, base in self.apart_baseline.items():
                self.apart_peak[kind] = max(self.apart_peak.get(kind, 0), apart_bytes(self.device, kind) - base)
            self.grow(self._step_peak())

    def grow(self, peak: int) -> None:
        """The run held `peak` bytes at some point of the step now running."""
        if peak > self.peak:
            self.peak, self.peak_step = peak, self.step
        if self.step:
            record = self.steps.setdefault(self.step, [0, 0])
            record[1] = max(record[1], peak)

    def enter(self, step: str) -> None:
        """The judge's step `step` begins: what the last one reached is observed first, so that the
        report names the step that took the most, and the peaks count from here."""
        self.observe()
        if self.cuda and self.started:
            self._new_step()
            self.step_start = self.held()
            record = self.steps.setdefault(step, [0, 0])
            record[0] = max(record[0], self.step_start)
        self.step = step

    def taken(self) -> int:
        """What the step now running took so far beyond what was held when it began (its
        temporaries and what it keeps): what doing the same again would take."""
        if not (self.cuda and self.started):
            return 0
        return max(0, self._step_peak() - self.step_start)

    def _step_peak(self) -> int:
        """torch's peak since the step began and the most held outside its allocator in the same time,
        since `start` (the two may not coincide: an upper bound)."""
        return torch.cuda.max_memory_allocated(self.device) - self.baseline + outside_top(self.device) - self.own_baseline

    @property
    def budget(self) -> int:
        return max(int(self.factor * self.task_bytes), self.floor) + self.fixed

    def held(self) -> int:
        """What the run holds now: torch's tensors and the buffers outside its allocator."""
        if not self.cuda:
            return 0
        return torch.cuda.memory_allocated(self.device) - self.baseline + self._outside()

    def available(self) -> int:
        """Bytes the judge could still allocate: the device's free memory plus the allocator's
        cached free blocks."""
        if not self.cuda:
            return 1 << 62
        free, _ = torch.cuda.mem_get_info(self.device)
        cached = torch.cuda.memory_reserved(self.device) - torch.cuda.memory_allocated(self.device)
        return free + cached

    def fits(self, extra: int, beside: int = 0) -> bool:
        """Whether `extra` more bytes stay within the judge's bound and, with `beside` more that
        others will hold at the same time (the candidate's process), the device's free memory
        (with a tenth kept back for fragmentation)."""
        if not self.cuda:
            return True
        within = self.held() + extra <= self.task_bytes + self.budget
        return within and extra + beside <= 0.9 * self.available()

    def report(self) -> MemoryReport:
        self.observe()
        return MemoryReport(self.task_bytes, self.peak, self.peak - self.task_bytes, self.budget, self.exact, self.fixed,
                            self.apart_peak.get("slots", 0), self.apart_peak.get("inputs", 0), self.peak_step,
                            {name: list(v) for name, v in self.steps.items()})


def poison(device: torch.device, output_bytes: Sequence[int]) -> None:
    """Fill the allocator's free memory with NaN, where a candidate's outputs would land: one
    block the size of each output, then more of the cached free memory up to the outputs' total
    plus a little; a candidate that returns memory it never wrote returns NaN. Sized to the task,
    never to the GPU; an allocation that does not fit is skipped."""
    if device.type != "cuda":
        return
    blobs = []
    try:
        for size in output_bytes:
            if size > 0:
                blobs.append(torch.full((max(1, size // 4),), float("nan"), device=device))
        cached = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
        rest = min(cached, sum(output_bytes) + min(_POISON_SLACK, sum(output_bytes)))
        if rest >= 4:
            blobs.append(torch.full((rest // 4,), float("nan"), device=device))
    except torch.OutOfMemoryError:
        pass
    del blobs


def host_oom_kills() -> int | None:
    """How many processes the kernel's out-of-memory killer has killed since boot (/proc/vmstat),
    or None where that is not readable."""
    try:
        with open("/proc/vmstat") as f:
            for line in f:
                if line.startswith("oom_kill "):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return None


def host_memory() -> tuple[int, int] | None:
    """(available, total) bytes of the host's memory (/proc/meminfo), or None."""
    try:
        with open("/proc/meminfo") as f:
            fields = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in f if line.split()[1:2]}
        return fields["MemAvailable"], fields["MemTotal"]
    except (OSError, ValueError, KeyError, IndexError):
        return None


def host_short(available: int, total: int) -> bool:
    """Whether the host is short of memory: less than 2 GiB or a twentieth of it available."""
    return available < max(2 << 30, total // 20)
