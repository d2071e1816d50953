"""The sandboxed side of the judge: runs one candidate against its task in this (worker) process.

    python -m kevin_backend.judge.run_worker < job.json     # prints one JSON line: the outcome
    python -m kevin_backend.judge.run_worker --serve        # a pool's worker: one job per line
    python -m kevin_backend.judge.run_worker --serve --prepare cuda:0   # its fork server started at once

A job is a `job.Job`, one JSON line with the parent's token beside it. A pool's worker (`pool.py`)
keeps torch and CUDA initialised and, per task, the reference model and its float64 copy
(`task_state.py`); every candidate still gets a fresh module namespace, its outputs are scrubbed,
the references' parameters are fingerprinted after each candidate (a change ends the worker) and
the parent replaces the worker after any error.

A crash, hang, illegal address or out-of-memory here ends this process, never the judge; the
parent (`sandbox.py`) reads the exit status, the output and the last phase this worker announced
(a failure in the judge's own phases is the judge's, never the candidate's: `attribution.py`).
The protocol, this module running its steps in order:

  1. load the task (the reference `Model`) and the candidate (`ModelNew`), both seeded alike and
     moved to the device under test (KernelBench's placement); the candidate's `load_inline`
     calls are answered from the judge's build cache
  2. correctness, for each seeded input set (the problem's own values, then mixed scales; never
     zeros; true layouts, on the device under test, `measure/inputs.py`), `correctness.py`:
       a. the eager reference, in the task's dtype (a mixed set whose reference overflows is made
          again with a narrower range of scales), `reference_sets.py`
       b. the exact reference: the same model and inputs in float64, when that fits the memory the
          judge may take (`measure/memory.py`), `reference_sets.py`
       c. the candidate, on memory poisoned with NaN, every op it dispatches audited (allocation,
          view and metadata ops only, `audit.py`), its inputs fingerprinted before and after
       d. the comparison (`measure/compare.py`); a candidate wrong on non-contiguous inputs is run once
          more on contiguous copies, to say whether it ignores their strides
  3. timing, one protocol for the candidate, the eager reference and the Inductor-compiled
     reference (`measure/timer.py`), under the judge's GPU lock; Inductor's one compiled graph is called
     directly, without Dynamo's guards, as the backend's re-timing calls it
     (`measure/inductor.inductor_call`), `timing_phase.py`
  4. replay check: fresh values written into the candidate's input buffers, output checked again,
     `replay_check.py`
  5. roofline (an accepted candidate): the bytes the task must move, its matmul/convolution FLOPs
     and the GPU's copy bandwidth (measured once per GPU and software, under the timing lock),
     from which the judge derives each side's fraction of the copy bandwidth (`measure/roofline.py`),
     `roofline_phase.py`
"""

from __future__ import annotations

import gc
import json
import sys
import time
from typing import Any, Callable

import torch

from kevin_backend.cache.key import apply_numerics, current_numerics
from kevin_backend.judge.attribution import Verdict, error, judge_failure
from kevin_backend.judge.candidate_process import Launcher, RemoteModel, shared_folder
from kevin_backend.judge.correctness import check_input_set
from kevin_backend.judge.fork_server import make_undumpable
from kevin_backend.judge.job import Job
from kevin_backend.judge.judged_run import Run
from kevin_backend.judge.replay_check import accepted
from kevin_backend.judge.task_state import TaskState, TaskStates, device_of, task_state_of
from kevin_backend.judge.timing_phase import time_candidate
from kevin_backend.locks import gpu_hold
from kevin_backend.measure.memory import JUDGE_FLOOR, MemoryLedger
from kevin_backend.measure.timer import flush_bytes

__all__ = ["main", "run", "serve"]

_LAUNCHERS: dict[str, Launcher] = {}  # per device: this worker's fork server and spare process
# Verdicts that a write into the reference's memory could have made: they do not stand then.
_CHECKED_AFTER = frozenset({"ACCEPTED", "MISMATCH", "NAN_INF", "SHAPE_MISMATCH", "DTYPE_MISMATCH", "REPLAYED_OUTPUT"})
_LOAD_STEPS = ("numerics", "builder", "task", "confine", "program", "model")  # the load's steps the candidate's process times
_NO_DEADLINE = 24 * 3600.0  # the parent kills this worker at the job's time limit; the candidate's process dies with it


def launcher_for(device: torch.device) -> Launcher:
    """This worker's fork server for `device` (started on first use; the processes it forks share
    memory with this worker through a folder of its own)."""
    key = str(device)
    if key not in _LAUNCHERS:
        _LAUNCHERS[key] = Launcher(device, shared_folder())
    return _LAUNCHERS[key]


def _close_launchers() -> None:
    import shutil

    for launcher in _LAUNCHERS.values():
        launcher.close()
        shutil.rmtree(launcher.folder, ignore_errors=True)
    _LAUNCHERS.clear()


def run(job: Job, announce: Callable[[str], None] = lambda phase: None,
        states: TaskStates | None = None) -> dict[str, Any]:
    """One job from setup to its outcome (the worker's answer: stage, reason, feedback, details,
    the memory report, the device and the seconds spent in each phase). The candidate runs in a
    process of its own, started for it and killed after it (`candidate_process.py`); nothing of it
    runs here."""
    clock = _PhaseClock(announce)
    outcome = _run(job, clock, states)
    outcome["phase_seconds"] = clock.seconds()
    return outcome


class _PhaseClock:
    """Announces each phase and keeps the wall-clock seconds spent in each (where a judged run's
    time goes: `JudgeResult.phase_seconds`)."""

    def __init__(self, announce: Callable[[str], None]) -> None:
        self.announce = announce
        self.spent: dict[str, float] = {}
        self.steps: dict[str, float] = {}  # parts of a phase, as another process reported them
        self.current = ""
        self.since = time.perf_counter()

    def __call__(self, phase: str) -> None:
        self._stop()
        self.current = phase
        self.announce(phase)

    def _stop(self) -> None:
        now = time.perf_counter()
        if self.current:
            self.spent[self.current] = self.spent.get(self.current, 0.0) + now - self.since
        self.since = now

    def note(self, step: str, seconds: float) -> None:
        self.steps[step] = self.steps.get(step, 0.0) + seconds

    def seconds(self) -> dict[str, float]:
        self._stop()
        return {name: round(value, 4) for name, value in {**self.spent, **self.steps}.items()}


def _run(job: Job, announce: _PhaseClock, states: TaskStates | None) -> dict[str, Any]:
    announce("setup")
    device = device_of(job)
    if job.numerics:
        apply_numerics(dict(job.numerics))  # the numerics the task's cache key names
    task_state = task_state_of(job, device, states)
    reference = task_state.reference
    ledger = MemoryLedger(device, job.memory_factor, fixed=flush_bytes(device), floor=JUDGE_FLOOR)
    # until the inputs are known, the bound for the candidate's own parameters is the reference's
    ledger.params = sum(p.numel() * p.element_size() for p in reference.parameters())
    ledger.task_bytes = ledger.params + (1 << 30)
    launcher = launcher_for(device)
    deadline = time.monotonic() + _NO_DEADLINE
    announce("load")
    remote = RemoteModel(launcher.take(), device, launcher.folder, deadline, ledger=ledger)

    def start_reference() -> RemoteModel:
        process = RemoteModel(launcher.take(), device, launcher.folder, deadline, trusted=True, ledger=ledger)
        process.load({"mode": "reference", "task": job.task, "seed": job.seeds[0], "numerics": dict(job.numerics),
                      "compile_backend": job.compile_backend})
        return process

    state = Run(job, task_state.task, reference, remote, device, ledger, announce, current="load", state=task_state,
                start_reference=start_reference)
    try:
        try:
            loaded = remote.load({"mode": "candidate", "candidate": job.candidate, "task": job.task, "seed": job.seeds[0],
                                  "build_root": job.build_root, "arch": job.arch, "numerics": dict(job.numerics)})
        except Verdict as v:
            return {**v.outcome, "device": str(device)}
        ledger.task_bytes = 0
        # what the candidate's process says of itself (its program had loaded when it said it):
        # information for the report, never part of the verdict, and only in the shapes expected
        if isinstance(loaded.get("confinement"), str) and loaded["confinement"]:
            ledger.notes.append(f"the candidate's process reports: {loaded['confinement'][:300]}")
        seconds = loaded.get("seconds") if isinstance(loaded.get("seconds"), dict) else {}
        for step in _LOAD_STEPS:
            if isinstance(seconds.get(step), (int, float)):
                announce.note(f"load: {step}", float(seconds[step]))
        ledger.start()
        try:
            outcome = _judge(state)
        except Verdict as v:
            outcome = v.outcome
        except torch.OutOfMemoryError as exc:  # the judge's own allocation, beside the candidate's live process
            outcome = judge_failure(state, f"in its step '{state.current}'", exc)
            if outcome["reason"] == "RESOURCE":
                outcome = remote.judge_short(exc, f"in its step '{state.current}'")
        except Exception as exc:  # noqa: BLE001 - nothing of the candidate runs here: the judge's own failure
            outcome = judge_failure(state, f"in its step '{state.current}'", exc)
    finally:
        announce("close")  # the candidate's process killed and gone (its GPU context released)
        remote.close()
    announce("after")  # the references checked intact, the report
    if state.candidate_ran and outcome.get("reason") in _CHECKED_AFTER and not _intact(task_state):
        outcome = error("INPUT_MUTATED", "run", "the forward wrote into memory it does not own: the reference "
                        "model's parameters changed while the candidate ran")
    outcome["memory"] = {**state.ledger.report().as_dict(), "notes": state.ledger.notes}
    outcome["device"] = str(device)
    return outcome


def _intact(state: TaskState) -> bool:
    try:
        return state.intact()
    except Exception:  # noqa: BLE001 - a CUDA fault surfaced: the verdict already says what happened
        return True


def _judge(run: Run) -> dict[str, Any]:
    """Correctness on every input set, then the timing and the replay check."""
    exact_model: list[torch.nn.Module] = run.state.exact_model if run.state is not None else []
    # Correctness runs share the GPU with each other, never with a timing (which holds the lock
    # alone: another worker's correctness run would slow what it measures).
    # Held one input set at a time: a timing waiting for the GPU alone waits for one set, not all.
    gpu_lock = run.job.gpu_lock
    for index, seed in enumerate(run.job.seeds):
        with gpu_hold(gpu_lock, shared=True):
            bad = check_input_set(run, index, run.job.input_seed(seed), exact_model)
        if bad is not None:
            return bad
    times = time_candidate(run)
    with gpu_hold(gpu_lock, shared=True):
        return accepted(run, times)


def serve(prepare: str | None = None) -> int:
    """A pool's worker: torch and CUDA initialised once (and, for the device `prepare` names, the
    fork server: before the first job, not in it), then one job per line of stdin, each
    answered like a single run. After each candidate the outputs are gone, the allocator's
    cache is released and the kept references are fingerprinted: a reference that changed (a
    candidate wrote out of bounds into it) ends the worker, as does a CUDA error; the parent
    replaces it."""
    make_undumpable()
    if torch.cuda.is_available():
        torch.cuda.init()
    if prepare:
        try:
            launcher_for(torch.device(prepare))
        except Exception:  # noqa: BLE001 - the first job starts it again and says what went wrong
            pass
    states = TaskStates()
    own = current_numerics()  # restored before every job: no job's settings reach the next
    print("ready", flush=True)
    frozen = False
    for line in sys.stdin:
        if not line.strip():
            continue
        job, token = Job.from_json(line)
        apply_numerics(own)

        def announce(phase: str, token: str = token) -> None:
            print(f"{token} phase {phase}", flush=True)

        try:
            outcome = run(job, announce, states)
        except Exception as exc:  # noqa: BLE001 - before the run began: the judge's own failure
            outcome = judge_failure(None, "setting up the run", exc)
        cleanup = time.perf_counter()
        gc.collect()
        healthy = True
        try:
            announce("cleanup")
            if torch.cuda.is_available():
                torch.cuda.synchronize()
                torch.cuda.empty_cache()
            healthy = states.intact()
        except Exception:  # noqa: BLE001 - a CUDA error left behind: this worker is done
            healthy = False
        outcome["worker_healthy"] = healthy
        if not frozen:  # torch and every module the first job imported: never scanned again (a
            gc.freeze()  # full collection then takes milliseconds, not a tenth of a second)
            frozen = True
        if isinstance(outcome.get("phase_seconds"), dict):
            outcome["phase_seconds"]["cleanup"] = round(time.perf_counter() - cleanup, 4)
        print(f"{token} {json.dumps(outcome, default=float)}", flush=True)
        if not healthy:
            break
    _close_launchers()
    return 0


def main() -> int:
    from kevin_backend.lifeline import die_with_parent

    die_with_parent()  # a judge that was killed leaves no job running on its GPU
    args = sys.argv[1:]
    if "--serve" in args:
        at = args.index("--prepare") + 1 if "--prepare" in args else 0
        return serve(args[at] if 0 < at < len(args) else None)
    make_undumpable()
    job, token = Job.from_json(sys.stdin.read())

    def announce(phase: str) -> None:
        print(f"{token} phase {phase}", flush=True)

    try:
        outcome = run(job, announce)
    except Exception as exc:  # noqa: BLE001 - before the run began: the judge's own failure
        outcome = judge_failure(None, "setting up the run", exc)
        print(f"{token} {json.dumps(outcome)}", flush=True)
        return 3
    finally:
        _close_launchers()
    print(f"{token} {json.dumps(outcome, default=float)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
