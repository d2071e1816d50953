"""A pool of sandboxed judge workers for one GPU: torch and CUDA initialised once per worker, the
references built and compiled once per worker and task, a worker replaced after any error.

    pool = WorkerPool(size=4)
    pool.prestart(1, "cuda:0")    # optional: a worker starting now, before the first job is known
    outcome = pool.run(task_source, candidate_source, config)   # a RunOutcome, as run_in_sandbox's
    pool.close()

Each worker is `python -m kevin_backend.judge.run_worker --serve` in a session of its own (with
`--prepare DEVICE` once the pool knows its device: the worker's fork server starts with it, before
its first job). A job
(`job.Job`) is one JSON line on its stdin, with its token; the worker answers with token-prefixed
phase lines and one verdict line, as a single run does (`sandbox.py` reads them the same way). A
worker is retired, and a fresh one started at once (its start overlaps the next jobs), when:

- it crashed, hung (killed as a group when the job's `PhaseClock` ran out) or reported a CUDA fault;
- the verdict is one of the judge's own failures (INFRA, RESOURCE, NO_GPU); a verdict on the
  candidate leaves it in order, since the candidate ran in a process of its own;
- the worker found the kept references' parameters changed after a candidate (an out-of-bounds
  write), or could not clean up;
- it has judged `max_jobs` candidates.

A candidate never shares a module namespace with another, its outputs are scrubbed, and the
allocator's cache is released between candidates, so what one candidate leaves on the GPU cannot
be read as the next one's answer.
"""

from __future__ import annotations

import collections
import os
import queue
import secrets
import signal
import subprocess
import sys
import threading
import time
from typing import Any

from kevin_backend.judge.job import Job
from kevin_backend.judge.phases import END, PhaseClock, follow
from kevin_backend.judge.sandbox import RunConfig, RunOutcome, job_of, outcome_of, read_lines, worker_env, write_job

__all__ = ["WorkerPool", "CLEAN_REASONS", "describe"]

# Verdicts after which the worker is known to be in order: the candidate's code ran to the end.
CLEAN_REASONS = frozenset({"ACCEPTED", "MISMATCH", "NAN_INF", "SHAPE_MISMATCH", "DTYPE_MISMATCH", "INPUT_MUTATED",
                           "REPLAYED_OUTPUT", "NO_MODELNEW"})

# Candidates run in processes of their own (`candidate_process.py`), so a worker is in order after
# any verdict on a candidate; after one of the judge's own failures it is replaced.
_JUDGE_REASONS = frozenset({"INFRA", "RESOURCE", "NO_GPU"})

class _Worker:
    """One serving worker process and the threads that read its output."""

    def __init__(self, device: str | None = None) -> None:
        prepare = ["--prepare", device] if device else []
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "kevin_backend.judge.run_worker", "--serve", *prepare],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1,
            start_new_session=True, env=worker_env(),
        )
        self.lines: queue.Queue[Any] = queue.Queue()
        self.errors: collections.deque[str] = collections.deque(maxlen=200)
        self.jobs = 0
        threading.Thread(target=read_lines, args=(self.proc.stdout, self.lines.put, END), daemon=True).start()
        threading.Thread(target=read_lines, args=(self.proc.stderr, self.errors.append), daemon=True).start()

    def run(self, job: Job, token: str, timeout: float) -> tuple[dict[str, Any] | None, str, str, bool, bool]:
        """(verdict or None, last phase, stderr since the job began, stopped at its clock, the
        candidate's own time ran out)."""
        self.errors.clear()
        self.jobs += 1
        # written beside the reading: a worker stuck before it reads (its start) is stopped at the clock
        threading.Thread(target=write_job, args=(self.proc.stdin, job.to_json(token) + "\n", False), daemon=True).start()
        end = follow(lambda seconds: self.lines.get(timeout=seconds), token, PhaseClock(timeout))
        if end.timed_out:
            self.kill()
        elif end.verdict is None:  # the worker's output ended
            self.proc.wait()
            time.sleep(0.05)  # the stderr reader's last lines
        return end.verdict, end.phase, "\n".join(self.errors), end.timed_out, end.hung

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass

    def close(self) -> None:
        try:
            if self.proc.stdin is not None:
                self.proc.stdin.close()
            self.proc.wait(timeout=5)
        except (OSError, subprocess.TimeoutExpired):
            self.kill()


class WorkerPool:
    """Up to `size` workers judging at once on one machine; `run` blocks while all are busy."""

    def __init__(self, size: int = 2, max_jobs: int = 64) -> None:
        if size < 1 or max_jobs < 1:
            raise ValueError("a worker pool needs at least one worker and one job per worker")
        self.size = size
        self.max_jobs = max_jobs
        self._idle: list[_Worker] = []
        self._busy = 0
        self._cond = threading.Condition()
        self._closed = False
        self.started = 0  # workers started over the pool's life
        self.retired: list[str] = []  # why each retired worker was retired
        self.device: str | None = None  # the device its jobs run on, once `prestart` was told

    def prestart(self, count: int, device: str | None = None) -> int:
        """Start workers ahead of the jobs, until `count` are idle (within the pool's size): a
        worker's start (torch's import, CUDA, with `device` its fork server) then overlaps what
        comes before its first job, the candidate's build. How many were started."""
        started = 0
        with self._cond:
            self.device = device or self.device
            while not self._closed and len(self._idle) < count and len(self._idle) + self._busy < self.size:
                self._idle.append(_Worker(self.device))
                self.started += 1
                started += 1
        return started

    def run(self, task_source: str, candidate_source: str, config: RunConfig = RunConfig()) -> RunOutcome:
        worker = self._take()
        token = secrets.token_hex(16)
        job = job_of(task_source, candidate_source, config)
        keep = False
        try:
            verdict, phase, err, timed_out, hung = worker.run(job, token, config.timeout)
            outcome = outcome_of(verdict, phase, err, timed_out, config.timeout, worker.proc.returncode, hung)
            keep, why = self._keep(worker, verdict, outcome)
            if not keep:
                self.retired.append(why)
            return outcome
        finally:
            self._give(worker, keep)

    def _keep(self, worker: _Worker, verdict: dict[str, Any] | None, outcome: RunOutcome) -> tuple[bool, str]:
        if verdict is None:
            return False, f"{outcome.reason} in phase {outcome.phase}"
        if not verdict.get("worker_healthy", False):
            return False, "the kept references changed or the worker could not clean up"
        if outcome.reason in _JUDGE_REASONS:
            return False, f"verdict {outcome.reason}"
        if worker.jobs >= self.max_jobs:
            return False, f"{worker.jobs} jobs"
        return worker.alive(), "exited"

    def _take(self) -> _Worker:
        with self._cond:
            while True:
                if self._closed:
                    raise RuntimeError("the worker pool is closed")
                if self._idle:
                    self._busy += 1
                    return self._idle.pop()
                if self._busy < self.size:
                    self._busy += 1
                    break
                self._cond.wait()
        self.started += 1
        return _Worker(self.device)

    def _give(self, worker: _Worker, keep: bool) -> None:
        if not keep:
            worker.kill()
        with self._cond:
            self._busy -= 1
            if keep and not self._closed:
                self._idle.append(worker)
            elif not self._closed and len(self._idle) + self._busy < self.size:
                # the replacement starts now: its torch import overlaps the other workers' jobs
                self.started += 1
                self._idle.append(_Worker(self.device))
            self._cond.notify()
        if keep and self._closed:
            worker.close()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            idle, self._idle = self._idle, []
            self._cond.notify_all()
        for worker in idle:
            worker.close()

    def __enter__(self) -> "WorkerPool":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def describe(pool: WorkerPool) -> dict[str, Any]:
    """The pool's life so far, for reports and benchmarks."""
    return {"size": pool.size, "max_jobs": pool.max_jobs, "started": pool.started, "retired": list(pool.retired)}

