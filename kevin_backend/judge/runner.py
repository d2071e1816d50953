"""The judge's side of a run: start the sandboxed worker, enforce its time limit, and turn its
exit into a verdict (a crash, hang, illegal address or out-of-memory is a reason, not an error).
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

__all__ = ["RunConfig", "RunOutcome", "run_in_sandbox"]


@dataclass(frozen=True)
class RunConfig:
    seeds: tuple[int, ...] = (11, 12, 13, 14, 15)  # input sets for correctness (recorded in results)
    trials: int = 100
    warmup: int = 10
    timeout: float = 300.0  # seconds for the whole run
    inductor: bool = True  # also time the Inductor-compiled reference
    build_root: str | None = None  # the judge's build cache: candidates' load_inline is answered from it
    arch: str | None = None
    grow: int = 1  # correctness on inputs this many times larger along the shared batch dimension
    gpu_lock: str | None = None  # a file every worker locks while it times: one timing on the GPU at a time


@dataclass(frozen=True)
class RunOutcome:
    stage: str
    reason: str  # a judge.result.Reason name
    feedback: str = ""
    mismatch: dict[str, Any] | None = None
    kernel_ms: float | None = None
    eager_ms: float | None = None
    inductor_ms: float | None = None


_SIGNS = (
    ("illegal memory access", "ILLEGAL_ADDRESS"),
    ("misaligned address", "ILLEGAL_ADDRESS"),
    ("out of memory", "OUT_OF_MEMORY"),
)


def _worker_env() -> dict[str, str]:
    # Inductor compiles one small reference per worker: in-process, without starting a pool of
    # compile processes in every one of the judge's concurrent workers (unless the user chose).
    env = child_env(PYTHONUNBUFFERED="1")
    env.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
    return env


def run_in_sandbox(task_source: str, candidate_source: str, config: RunConfig = RunConfig()) -> RunOutcome:
    """Run `candidate_source` against `task_source` in a fresh worker process."""
    # The verdict line carries a token only the worker knows, so text the candidate prints cannot
    # pose as a verdict.
    token = secrets.token_hex(16)
    job = {
        "token": token,
        "task": task_source,
        "candidate": candidate_source,
        "seeds": list(config.seeds),
        "trials": config.trials,
        "warmup": config.warmup,
        "inductor": config.inductor,
        "build_root": config.build_root,
        "arch": config.arch,
        "grow": config.grow,
        "gpu_lock": config.gpu_lock,
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "kevin_backend.judge.run_worker"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True, env=_worker_env(),
    )
    try:
        out, err = proc.communicate(json.dumps(job), timeout=config.timeout)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.communicate()
        return RunOutcome("run", "HANG", f"the run did not finish in {config.timeout:.0f} s")
    verdict = _verdict(out, token)
    text = (err or "") + (verdict or {}).get("feedback", "")
    for sign, reason in _SIGNS:
        if sign in text.lower():
            return RunOutcome("run", reason, _tail(text))
    if verdict is None:
        how = f"signal {-proc.returncode}" if proc.returncode < 0 else f"exit status {proc.returncode}"
        return RunOutcome("run", "CRASH", f"the process died ({how}): {_tail(err or '')}")
    return RunOutcome(
        stage=verdict.get("stage", "run"),
        reason=verdict.get("reason", "RUNTIME_ERROR"),
        feedback=verdict.get("feedback", ""),
        mismatch=verdict.get("mismatch"),
        kernel_ms=verdict.get("kernel_ms"),
        eager_ms=verdict.get("eager_ms"),
        inductor_ms=verdict.get("inductor_ms"),
    )


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


def _tail(text: str, lines: int = 8) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])
