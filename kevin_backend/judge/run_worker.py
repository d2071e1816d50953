"""The sandboxed side of the judge: runs one candidate against its task in this (worker) process.

    python -m kevin_backend.judge.run_worker < job.json     # prints one JSON line: the outcome
    python -m kevin_backend.judge.run_worker --serve        # a pool's worker: one job per line

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

import contextlib
import gc
import json
import sys
from typing import Any, Callable

import torch

from kevin_backend.cache.key import apply_numerics, current_numerics
from kevin_backend.judge.attribution import Verdict, candidate_failure, error, judge_failure
from kevin_backend.judge.correctness import check_input_set
from kevin_backend.judge.job import Job
from kevin_backend.judge.judged_run import Run
from kevin_backend.judge.phases import CANDIDATE_PHASES
from kevin_backend.judge.replay_check import check_replay
from kevin_backend.judge.task_state import TaskState, TaskStates, device_of, task_state_of
from kevin_backend.judge.timing_phase import time_candidate
from kevin_backend.locks import gpu_hold
from kevin_backend.measure.memory import MemoryLedger
from kevin_backend.measure.timer import flush_bytes
from kevin_backend.types import load_program

__all__ = ["main", "run", "serve"]

_WORKER_LIFETIME = contextlib.ExitStack()
_ANSWERING: set[tuple[str, str | None]] = set()

# Verdicts that a write into the reference's memory could have made: they do not stand then.
_CHECKED_AFTER = frozenset({"ACCEPTED", "MISMATCH", "NAN_INF", "SHAPE_MISMATCH", "DTYPE_MISMATCH", "REPLAYED_OUTPUT"})


def _answer_load_inline(job: Job) -> None:
    """The candidate's `load_inline` answered from the judge's build cache, for this worker's
    whole life: a candidate may call load_inline in __init__ or forward too."""
    if job.build_root is None or (job.build_root, job.arch) in _ANSWERING:
        return
    from pathlib import Path

    from kevin_backend.toolchain.build import Builder, answering_load_inline

    _WORKER_LIFETIME.enter_context(answering_load_inline(Builder(Path(job.build_root), jobs=1), job.arch))
    _ANSWERING.add((job.build_root, job.arch))


def run(job: Job, announce: Callable[[str], None] = lambda phase: None,
        states: TaskStates | None = None) -> dict[str, Any]:
    """One job from setup to its outcome (the worker's answer: stage, reason, feedback, details,
    the memory report and the device)."""
    announce("setup")
    device = device_of(job)
    if job.numerics:
        apply_numerics(dict(job.numerics))  # the numerics the task's cache key names
    _answer_load_inline(job)
    task_state = task_state_of(job, device, states)
    announce("load")
    try:
        candidate = load_program(job.candidate, "kevin_candidate")
    except Exception as exc:  # noqa: BLE001 - the candidate's program failed to load
        return error("RUNTIME_ERROR", "run", f"loading the candidate failed: {type(exc).__name__}: {exc}")
    if not hasattr(candidate, "ModelNew"):
        return error("NO_MODELNEW", "run", "the program defines no ModelNew")
    announce("setup")
    reference = task_state.reference
    ledger = MemoryLedger(device, job.memory_factor, fixed=flush_bytes(device))
    # until the inputs are known, the bound for the candidate's own parameters is the reference's
    ledger.task_bytes = sum(p.numel() * p.element_size() for p in reference.parameters()) + (1 << 30)
    announce("init")
    torch.manual_seed(job.seeds[0])
    state = Run(job, task_state.task, reference, reference, device, ledger, announce, current="init", state=task_state)
    try:
        state.model = candidate.ModelNew(*task_state.init).to(device).eval()
    except Exception as exc:  # noqa: BLE001
        return {**candidate_failure(state, "ModelNew(...)", exc), "device": str(device)}
    ledger.task_bytes = 0
    ledger.start()
    try:
        outcome = _judge(state)
    except Verdict as v:
        outcome = v.outcome
    except Exception as exc:  # noqa: BLE001 - whose failure it is depends on whose code was running
        outcome = (candidate_failure(state, "forward", exc) if state.current in CANDIDATE_PHASES
                   else judge_failure(state, f"in its step '{state.current}'", exc))
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
    gpu_lock = run.job.gpu_lock
    with gpu_hold(gpu_lock, shared=True):
        for index, seed in enumerate(run.job.seeds):
            bad = check_input_set(run, index, seed, exact_model)
            if bad is not None:
                return bad
    times = time_candidate(run)
    # shared, as correctness: the replay's work must not land inside another worker's timing
    with gpu_hold(gpu_lock, shared=True):
        return check_replay(run, times, exact_model)


def serve() -> int:
    """A pool's worker: torch and CUDA initialised once, then one job per line of stdin, each
    answered like a single run. After each candidate the outputs are gone, the allocator's
    cache is released and the kept references are fingerprinted: a reference that changed (a
    candidate wrote out of bounds into it) ends the worker, as does a CUDA error; the parent
    replaces it."""
    if torch.cuda.is_available():
        torch.cuda.init()
    states = TaskStates()
    own = current_numerics()  # restored before every job: no job's settings reach the next
    print("ready", flush=True)
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
        print(f"{token} {json.dumps(outcome, default=float)}", flush=True)
        if not healthy:
            return 0
    return 0


def main() -> int:
    if "--serve" in sys.argv[1:]:
        return serve()
    job, token = Job.from_json(sys.stdin.read())

    def announce(phase: str) -> None:
        print(f"{token} phase {phase}", flush=True)

    try:
        outcome = run(job, announce)
    except Exception as exc:  # noqa: BLE001 - before the run began: the judge's own failure
        outcome = judge_failure(None, "setting up the run", exc)
        print(f"{token} {json.dumps(outcome)}", flush=True)
        return 3
    print(f"{token} {json.dumps(outcome, default=float)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
