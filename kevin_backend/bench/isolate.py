"""The parent's side of `kevin bench`'s fresh processes: one per model or task, so every compile
starts cold (the worker's side is `child.py`).

    outcome = run_isolated({"kind": "task", "path": ..., "settings": ..., "first": "inductor"}, 600.0)

Each worker gets its own, empty Inductor cache (unless told to share one), so Inductor compiles
every graph and the kevin pass sees, and reports, every partition. A crash, hang or out-of-memory
ends the worker, not the benchmark: `WorkerError`, which the caller turns into an error for that
model or task before carrying on.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import tempfile
from typing import Any

from kevin_backend.config import child_env

__all__ = ["WorkerError", "run_isolated"]


class WorkerError(RuntimeError):
    """The worker process ended without an outcome (crash, timeout, killed)."""


def run_isolated(job: dict[str, Any], timeout_s: float, inductor_cache: str | None = None) -> dict[str, Any]:
    """Run `job` in a fresh worker process and return its outcome (raises WorkerError)."""
    token = secrets.token_hex(16)  # text the models print cannot pose as the outcome
    with tempfile.TemporaryDirectory(prefix="kevin-bench-inductor-") as fresh:
        env = child_env(TORCHINDUCTOR_CACHE_DIR=inductor_cache or fresh, PYTHONUNBUFFERED="1")
        proc = subprocess.Popen(
            [sys.executable, "-m", "kevin_backend.bench.child"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            start_new_session=True, env=env,
        )
        try:
            out, err = proc.communicate(json.dumps({**job, "token": token}), timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _kill_group(proc.pid)
            proc.communicate()
            raise WorkerError(f"did not finish in {timeout_s:.0f} s (killed)") from None
        finally:
            _kill_group(proc.pid)  # compile workers Inductor left behind
    prefix = f"{token} "
    for line in reversed((out or "").splitlines()):
        if line.startswith(prefix):
            return json.loads(line[len(prefix):])
    how = f"signal {-proc.returncode}" if proc.returncode < 0 else f"exit status {proc.returncode}"
    tail = "\n".join((err or "").strip().splitlines()[-12:])
    raise WorkerError(f"the worker process died ({how}): {tail}")


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
