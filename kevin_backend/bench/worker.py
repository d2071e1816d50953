"""Fresh processes for `kevin bench`: one per model or task, so every compile starts cold.

    python -m kevin_backend.bench.worker < job.json     # prints one line: token + JSON outcome

The parent (`run_isolated`) gives each worker its own, empty Inductor cache (unless told to share
one), so Inductor compiles every graph and the kevin pass sees, and reports, every partition. A
crash, hang or out-of-memory ends the worker, not the benchmark: the parent turns it into an
error for that model or task and carries on.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import traceback
from typing import Any

from kevin_backend.config import child_env

__all__ = ["WorkerError", "run_isolated", "main"]


class WorkerError(RuntimeError):
    """The worker process ended without an outcome (crash, timeout, killed)."""


def run_isolated(job: dict[str, Any], timeout_s: float, inductor_cache: str | None = None) -> dict[str, Any]:
    """Run `job` in a fresh worker process and return its outcome (raises WorkerError)."""
    token = secrets.token_hex(16)  # text the models print cannot pose as the outcome
    with tempfile.TemporaryDirectory(prefix="kevin-bench-inductor-") as fresh:
        env = child_env(TORCHINDUCTOR_CACHE_DIR=inductor_cache or fresh, PYTHONUNBUFFERED="1")
        proc = subprocess.Popen(
            [sys.executable, "-m", "kevin_backend.bench.worker"],
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


def _run(job: dict[str, Any]) -> dict[str, Any]:
    from kevin_backend.bench.runner import BenchSettings, measure_model

    settings = BenchSettings.from_dict(job["settings"])
    if job["kind"] == "model":
        results = measure_model(job["name"], tuple(job["workloads"]), settings, first=job.get("first", "inductor"))
        return {"results": [r.as_dict() for r in results]}
    if job["kind"] == "task":
        from kevin_backend.bench.kernelbench import measure_task

        return {"result": measure_task(job["path"], settings, first=job.get("first", "inductor")).as_dict()}
    raise ValueError(f"unknown job kind {job['kind']!r}")


def main() -> int:
    job = json.loads(sys.stdin.read())
    token = job.pop("token")
    try:
        outcome = _run(job)
    except Exception as exc:  # reported as the whole job's error
        print(traceback.format_exc(), file=sys.stderr)
        print(f"{token} {json.dumps({'error': f'{type(exc).__name__}: {exc}'})}", flush=True)
        return 3
    print(f"{token} {json.dumps(outcome)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
