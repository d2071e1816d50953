"""The judge's side of a run: start the sandboxed worker, enforce its time limit, and turn its
exit into a verdict (a crash, hang, illegal address or out-of-memory is a reason, not an error).

The worker announces each phase it enters; when it dies or hangs without a verdict, the phase
says whose failure it was: in the candidate's code (loading it, building its model, its forward)
a crash is the candidate's; in the judge's own steps (making inputs, the reference, comparing) it
is the judge's (INFRA, or RESOURCE when memory ran out), never a verdict on the candidate.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
from dataclasses import dataclass
from typing import Any

from kevin_backend.config import child_env
from kevin_backend.judge.job import Job, WireJob
from kevin_backend.judge.phases import CANDIDATE_PHASES

__all__ = ["RunConfig", "RunOutcome", "WorkerExit", "job_of", "outcome_of", "run_in_sandbox", "run_worker_process", "worker_env",
           "tail"]


@dataclass(frozen=True)
class RunConfig:
    seeds: tuple[int, ...] = (11, 12, 13, 14, 15)  # input sets for correctness (recorded in results)
    salt: int = 0  # salts every input set's seed (`Job.salt`); 0 in a Judge's config: a fresh one per evaluation
    trials: int = 100
    warmup: int = 10
    timeout: float = 300.0  # seconds for the whole run
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


@dataclass(frozen=True)
class WorkerExit:
    """How a one-shot sandboxed worker ended: its verdict line (None if it printed none), the
    last phase it announced, its stderr, whether it was killed at the time limit, its status."""

    verdict: dict[str, Any] | None
    phase: str
    err: str
    timed_out: bool
    returncode: int | None


def run_worker_process(module: str, job: WireJob, timeout: float) -> WorkerExit:
    """Run `python -m module` in a session of its own with `job` (its JSON line) on its stdin; killed as a
    group at `timeout`. The verdict line carries a token only the worker knows, so text the
    candidate prints cannot pose as a verdict. Raises OSError when the process cannot start."""
    token = secrets.token_hex(16)
    proc = subprocess.Popen(
        [sys.executable, "-m", module],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True, env=worker_env(),
    )
    timed_out = False
    try:
        out, err = proc.communicate(job.to_json(token), timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        out, err = proc.communicate()
    return WorkerExit(_verdict(out, token), _last_phase(out, token), err or "", timed_out, proc.returncode)


def run_in_sandbox(task_source: str, candidate_source: str, config: RunConfig = RunConfig()) -> RunOutcome:
    """Run `candidate_source` against `task_source` in a fresh worker process (a `WorkerPool`
    runs many in a few long-lived ones)."""
    end = run_worker_process("kevin_backend.judge.run_worker", job_of(task_source, candidate_source, config), config.timeout)
    return outcome_of(end.verdict, end.phase, end.err, end.timed_out, config.timeout, end.returncode)


def outcome_of(verdict: dict[str, Any] | None, phase: str, err: str, timed_out: bool, timeout: float,
               returncode: int | None) -> RunOutcome:
    """A worker's end as a verdict: its verdict line, or whose failure its death or hang was."""
    if timed_out:
        if phase not in CANDIDATE_PHASES:
            return RunOutcome("run", "INFRA", f"the judge's step '{phase}' did not finish in {timeout:.0f} s", phase=phase)
        return RunOutcome("run", "HANG", f"the run did not finish in {timeout:.0f} s", phase=phase)
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


def _last_phase(text: str, token: str) -> str:
    prefix = f"{token} phase "
    for line in reversed((text or "").splitlines()):
        if line.startswith(prefix):
            return line[len(prefix):].strip()
    return "start"


def _verdict(text: str, token: str) -> dict[str, Any] | None:
    prefix = f"{token} "
    for line in reversed((text or "").strip().splitlines()):
        if not line.startswith(prefix):
            continue
        try:
            value = json.loads(line[len(prefix):])
        except ValueError:
            return None
        return value if isinstance(value, dict) else None
    return None


def tail(text: str, lines: int = 8) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])
