"""The judge's side of a run: start the sandboxed worker, enforce its time limit, and turn its
exit into a verdict (a crash, hang, illegal address or out-of-memory is a reason, not an error).

The worker announces each phase it enters; when it dies or hangs without a verdict, the phase
says whose failure it was: in the candidate's code (loading it, building its model, its forward)
a crash is the candidate's; in the judge's own steps (making inputs, the reference, comparing) it
is the judge's (INFRA, or RESOURCE when memory ran out), never a verdict on the candidate.
"""

from __future__ import annotations

import os
import queue
import secrets
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass
from typing import Any, Callable

from kevin_backend.config import child_env
from kevin_backend.judge.job import Job, WireJob
from kevin_backend.judge.phases import CANDIDATE_PHASES, END, WHOLE_RUN_LIMITS, PhaseClock, follow

__all__ = ["RunConfig", "RunOutcome", "WorkerExit", "job_of", "outcome_of", "run_in_sandbox", "run_worker_process", "worker_env",
           "read_lines", "write_job", "tail"]


@dataclass(frozen=True)
class RunConfig:
    seeds: tuple[int, ...] = (11, 12, 13, 14, 15)  # input sets for correctness (recorded in results)
    salt: int = 0  # salts every input set's seed (`Job.salt`); 0 in a Judge's config: a fresh one per evaluation
    trials: int = 100
    warmup: int = 10
    timeout: float = 300.0  # seconds for the candidate's phases, and for each of the judge's steps (`PhaseClock`)
    inductor: bool = True  # also time the Inductor-compiled reference
    eager: bool = True  # also time the eager reference
    build_root: str | None = None  # the judge's build cache: candidates' load_inline is answered from it
    arch: str | None = None
    grow: int = 1  # correctness on inputs this many times larger along the shared batch dimension
    gpu_lock: str | None = None  # a file every worker locks while it times: one timing on the GPU at a time
    device: str | None = None  # the GPU under test ("cuda:1"); None: the current device
    memory_factor: float = 3.0  # the judge's extra GPU memory, at most this many times the task's inputs + outputs
    # (name, value) numerics settings the run is made under (the cache key's, `cache/key.py`);
    # empty: the worker's own (torch's defaults)
    numerics: tuple[tuple[str, Any], ...] = ()


@dataclass(frozen=True)
class RunOutcome:
    stage: str
    reason: str  # a judge.result.Reason name
    feedback: str = ""
    mismatch: dict[str, Any] | None = None
    kernel_ms: float | None = None
    eager_ms: float | None = None
    inductor_ms: float | None = None
    memory: dict[str, Any] | None = None
    device: str = ""
    exact: str = ""
    phase: str = ""  # the last phase the worker entered
    # an accepted candidate's bytes, FLOPs and the GPU's copy bandwidth (`measure/roofline.py`); None
    # when the worker had no copy bandwidth (a CPU, a failed measurement) or judged no kernel
    roofline: dict[str, Any] | None = None
    phase_seconds: dict[str, float] | None = None  # the worker's wall-clock seconds per phase


_SIGNS = (
    ("illegal memory access", "ILLEGAL_ADDRESS"),
    ("misaligned address", "ILLEGAL_ADDRESS"),
    ("out of memory", "OUT_OF_MEMORY"),
)


def worker_env() -> dict[str, str]:
    # Inductor compiles one small reference per worker: in-process, without starting a pool of
    # compile processes in every one of the judge's concurrent workers (unless the user chose).
    env = child_env(PYTHONUNBUFFERED="1")
    env.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
    return env


def job_of(task_source: str, candidate_source: str, config: RunConfig) -> Job:
    """The job a worker runs (its token is added on the wire)."""
    return Job(
        task=task_source,
        candidate=candidate_source,
        seeds=tuple(config.seeds),
        salt=config.salt,
        trials=config.trials,
        warmup=config.warmup,
        inductor=config.inductor,
        eager=config.eager,
        build_root=config.build_root,
        arch=config.arch,
        grow=config.grow,
        gpu_lock=config.gpu_lock,
        device=config.device,
        memory_factor=config.memory_factor,
        numerics=tuple(config.numerics),
    )


_EXIT_WAIT = 30.0  # seconds a worker may take to exit after its verdict (or its end) before it is stopped


@dataclass(frozen=True)
class WorkerExit:
    """How a one-shot sandboxed worker ended: its verdict line (None if it printed none), the
    last phase it announced, its stderr, whether it was stopped at its clock and, if so, whether
    the candidate's own time ran out (`hung`), its status."""

    verdict: dict[str, Any] | None
    phase: str
    err: str
    timed_out: bool
    returncode: int | None
    hung: bool = False


def run_worker_process(module: str, job: WireJob, timeout: float,
                       candidate_phases: frozenset[str] = CANDIDATE_PHASES) -> WorkerExit:
    """Run `python -m module` in a session of its own with `job` (its JSON line) on its stdin; killed as a
    group when its `PhaseClock` runs out (`timeout` for the candidate's phases together, and for each
    of the judge's own steps). The verdict line carries a token only the worker knows, so text the
    candidate prints cannot pose as a verdict. Raises OSError when the process cannot start."""
    token = secrets.token_hex(16)
    clock = PhaseClock(timeout, candidate_phases)
    proc = subprocess.Popen(
        [sys.executable, "-m", module],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True, env=worker_env(),
    )
    lines: queue.Queue[Any] = queue.Queue()
    errors: list[str] = []
    readers = [threading.Thread(target=read_lines, args=(proc.stdout, lines.put, END), daemon=True),
               threading.Thread(target=read_lines, args=(proc.stderr, errors.append), daemon=True)]
    for reader in readers:
        reader.start()
    # the job is written beside the reading: a worker that hangs before it reads a job larger than
    # the pipe holds must still be stopped at its clock
    threading.Thread(target=write_job, args=(proc.stdin, job.to_json(token)), daemon=True).start()
    end = follow(lambda seconds: lines.get(timeout=seconds), token, clock)
    if not end.timed_out:
        try:  # its verdict said, the worker exits; one that does not is stopped with the rest of its group
            proc.wait(timeout=max(_EXIT_WAIT, clock.left()))
        except subprocess.TimeoutExpired:
            pass
    try:  # nothing the run started outlives it
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()
    for reader in readers:
        reader.join(timeout=5)
    return WorkerExit(end.verdict, end.phase, "\n".join(errors), end.timed_out, proc.returncode, end.hung)


def write_job(stream: Any, text: str, close: bool = True) -> None:
    """`text` to a worker's stdin, then closed (a one-shot worker) or flushed (a pool's, which
    reads more jobs); a worker that died is said by its output's end, not here."""
    try:
        stream.write(text)
        if close:
            stream.close()
        else:
            stream.flush()
    except (BrokenPipeError, OSError, ValueError):
        pass


def read_lines(stream: Any, put: Callable[[Any], None], end: Any = None) -> None:
    """Each line of `stream`, without its newline, to `put` as it comes; then `end`, if given."""
    for line in stream:
        put(line.rstrip("\n"))
    if end is not None:
        put(end)


def run_in_sandbox(task_source: str, candidate_source: str, config: RunConfig = RunConfig()) -> RunOutcome:
    """Run `candidate_source` against `task_source` in a fresh worker process (a `WorkerPool`
    runs many in a few long-lived ones)."""
    end = run_worker_process("kevin_backend.judge.run_worker", job_of(task_source, candidate_source, config), config.timeout)
    return outcome_of(end.verdict, end.phase, end.err, end.timed_out, config.timeout, end.returncode, end.hung)


def outcome_of(verdict: dict[str, Any] | None, phase: str, err: str, timed_out: bool, timeout: float,
               returncode: int | None, hung: bool) -> RunOutcome:
    """A worker's end as a verdict: its verdict line, or whose failure its death or hang was (a
    stop at the clock is a HANG only when the candidate's own time ran out, `hung`)."""
    if timed_out:
        if not hung:
            return RunOutcome("run", "INFRA", f"the judge's step '{phase}' did not finish within the run's limits "
                              f"({timeout:.0f} s a step, {WHOLE_RUN_LIMITS * timeout:.0f} s in all)", phase=phase)
        return RunOutcome("run", "HANG", f"the candidate's code did not finish in {timeout:.0f} s", phase=phase)
    if verdict is None:
        text = err.lower()
        code = returncode if returncode is not None else 0
        how = f"signal {-code}" if code < 0 else f"exit status {code}"
        for sign, reason in _SIGNS:
            if sign in text and (phase in CANDIDATE_PHASES or reason == "ILLEGAL_ADDRESS"):
                return RunOutcome("run", reason, tail(err), phase=phase)
        if phase not in CANDIDATE_PHASES:
            reason = "RESOURCE" if "out of memory" in text else "INFRA"
            return RunOutcome("run", reason, f"the judge's worker died in its step '{phase}' ({how}): {tail(err)}", phase=phase)
        return RunOutcome("run", "CRASH", f"the process died ({how}): {tail(err)}", phase=phase)
    return RunOutcome(
        stage=verdict.get("stage", "run"),
        reason=verdict.get("reason", "RUNTIME_ERROR"),
        feedback=verdict.get("feedback", ""),
        mismatch=verdict.get("mismatch"),
        kernel_ms=verdict.get("kernel_ms"),
        eager_ms=verdict.get("eager_ms"),
        inductor_ms=verdict.get("inductor_ms"),
        memory=verdict.get("memory"),
        device=str(verdict.get("device", "")),
        exact=str((verdict.get("memory") or {}).get("exact", "")),
        phase=phase,
        roofline=verdict.get("roofline") if isinstance(verdict.get("roofline"), dict) else None,
        phase_seconds=verdict.get("phase_seconds") if isinstance(verdict.get("phase_seconds"), dict) else None,
    )


def tail(text: str, lines: int = 8) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])
