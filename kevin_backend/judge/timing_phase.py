"""The timing phase of a judged run: one protocol for the candidate, the eager reference and the
Inductor-compiled reference (`measure/timer.py`), under the judge's GPU lock. Inductor's one
compiled graph is called directly, without Dynamo's guards, as the backend's re-timing calls it
(`measure/inductor.inductor_call`); in the job that times Inductor, the candidate and Inductor are
timed in interleaved rounds (`INDUCTOR_ROUNDS`). The GPU's copy bandwidth is measured here too,
while the GPU is still this worker's alone (`roofline_phase.py`).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any, Callable

import torch

from kevin_backend.judge.judged_run import Run
from kevin_backend.judge.roofline_phase import measured_copy_bandwidth
from kevin_backend.locks import gpu_hold
from kevin_backend.measure.inputs import InputSet, make_input_set
from kevin_backend.measure.timer import make_timer

__all__ = ["INDUCTOR_ROUNDS", "CandidateTimes", "candidate_and_inductor", "time_candidate"]

# Rounds of the candidate and Inductor, interleaved, in the job that times Inductor (once per task
# and GPU; the judge keeps the time for the task's later candidates): each side's median over
# rounds does not hang on one moment of the GPU. The notes name Inductor's code and its kernels'
# chosen configurations (`measure/inductor.inductor_code`): they showed that the Inductor times that
# moved 1.26-3.4x between H200 runs were other code, compiled for any size
# (`measure/inductor.inductor_call` now compiles for the task's own).
INDUCTOR_ROUNDS = 5


@dataclass(frozen=True)
class CandidateTimes:
    """What the timing phase measured, and on which inputs (the replay check reuses their buffers)."""

    inputs: InputSet  # the timing set: the task's own values under the job's first seed
    kernel_ms: float
    eager_ms: float | None  # None when this job does not time the references (the judge keeps their times)
    inductor_ms: float | None
    copy_gbps: float | None  # the GPU's copy bandwidth; None on a CPU or when measuring it failed


def time_candidate(run: Run) -> CandidateTimes:
    """Candidate, eager and Inductor timed under one protocol (in the job that times Inductor, the
    candidate and Inductor in interleaved rounds, `INDUCTOR_ROUNDS`).

    Every step on the GPU holds its lock: the timing and Inductor's first call exclusively (that
    call compiles and benchmarks the configurations of Inductor's kernels, which another worker's
    run beside it would skew for good), the inputs shared (their work must not land inside
    another worker's timing). The timer's flush buffer and the compiled reference are dropped on
    return: their memory goes to the replay check."""
    job = run.job
    gpu_lock = job.gpu_lock

    with gpu_hold(gpu_lock, shared=True):
        run.phase("inputs")
        inputs = make_input_set(run.task, job.seeds[0], run.device)
    values = inputs.values
    measure = make_timer(run.device, job.trials, job.warmup, queued=True)
    compiled: Callable[[], Any] | None = None
    run.phase("lock")  # waiting for the GPU alone: the judge's step, whatever the wait
    with torch.no_grad(), gpu_hold(gpu_lock, shared=False):
        if job.inductor:  # (asked for once per task and GPU: the judge keeps the references' times)
            run.phase("inductor")
            from kevin_backend.measure.inductor import generated_modules, inductor_call, inductor_code

            # Inductor's code as a compiled model calls it: the one graph's compiled function without
            # Dynamo's guards (tens of microseconds a call), as the backend's decision times it
            mark = generated_modules()
            compiled, how = inductor_call(run.reference, values, job.compile_backend)
            code = inductor_code(mark)
            run.ledger.notes.append(f"Inductor timed as {how}" + (f"; Inductor's {code}" if code else ""))
        kernel_ms, inductor_ms = candidate_and_inductor(run, measure, values, compiled)
        run.phase("timing-reference")
        # the references' times are measured once per task and GPU (the judge keeps them)
        eager_ms = measure(lambda: run.reference(*values)) if job.eager else None
        run.ledger.observe()
        copy_gbps = measured_copy_bandwidth(run)  # while the GPU is still this worker's alone
    run.ledger.observe()
    return CandidateTimes(inputs, kernel_ms, eager_ms, inductor_ms, copy_gbps)


def candidate_and_inductor(run: Run, measure: Callable[[Callable[[], Any]], float], values: list[Any],
                           compiled: Callable[[], Any] | None) -> tuple[float, float | None]:
    """The candidate's time and, when this job times Inductor, Inductor's: then both as the median
    of `INDUCTOR_ROUNDS` interleaved rounds (candidate, Inductor, candidate, ...), the rounds noted."""
    def candidate() -> float:
        run.phase("timing-candidate")
        return measure(lambda: run.model(*values))

    if compiled is None:
        return candidate(), None

    def inductor() -> float:
        run.phase("timing-reference")
        return measure(compiled)

    from kevin_backend.measure.interleave import interleaved_rounds

    kernel_rounds, inductor_rounds = interleaved_rounds(candidate, inductor, INDUCTOR_ROUNDS)
    kernel_ms, inductor_ms = statistics.median(kernel_rounds), statistics.median(inductor_rounds)
    run.ledger.notes.append(
        f"candidate and Inductor timed in {INDUCTOR_ROUNDS} interleaved rounds, medians {kernel_ms:.4f} and "
        f"{inductor_ms:.4f} ms; rounds: candidate {' '.join(f'{v:.4f}' for v in kernel_rounds)}, "
        f"Inductor {' '.join(f'{v:.4f}' for v in inductor_rounds)}")
    return kernel_ms, inductor_ms
