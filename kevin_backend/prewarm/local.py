"""Prewarm's scheduler: one worker process per local GPU (or `--workers` on a CPU machine), each
running the generator on one task at a time, fed from a shared queue; a line per finished task
with the ETA, and a summary at the end.

    summary = prewarm_local(items, setup, gpus=[0, 1], progress=print_progress)

Decisions are written to the cache by the workers as each task finishes, so a run killed at any
moment loses no finished task; the next run finds the rest still pending.
"""

from __future__ import annotations

import json
import queue
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from kevin_backend.config import child_env
from kevin_backend.prewarm.sources import WorkItem

__all__ = ["Summary", "prewarm_local", "format_summary", "Progress"]

Progress = Callable[[dict[str, Any], int, int, float], None]  # (outcome, done, total, elapsed seconds)


@dataclass
class Summary:
    outcomes: list[dict[str, Any]] = field(default_factory=list)
    skipped: int = 0  # finished before this run
    seconds: float = 0.0
    unsearched: list[str] = field(default_factory=list)  # digests the budget left pending

    @property
    def kernels(self) -> int:
        return sum(o["status"] == "kernel" for o in self.outcomes)

    @property
    def inductor(self) -> int:
        return sum(o["status"] == "inductor" for o in self.outcomes)

    @property
    def failures(self) -> Counter[str]:
        return Counter(o["reason"].split(":")[0] for o in self.outcomes if o["status"] == "failed")

    def as_dict(self) -> dict[str, Any]:
        return {"tasks": len(self.outcomes) + self.skipped + len(self.unsearched), "skipped": self.skipped,
                "unsearched": list(self.unsearched), "kernels": self.kernels,
                "inductor": self.inductor, "failures": dict(self.failures), "seconds": self.seconds,
                "model_seconds": sum(o.get("model_seconds", 0.0) for o in self.outcomes),
                "judge_seconds": sum(o.get("judge_seconds", 0.0) for o in self.outcomes), "outcomes": self.outcomes}


class _Worker:
    def __init__(self, setup: dict[str, Any], gpu: int | None) -> None:
        env = child_env(**({"CUDA_VISIBLE_DEVICES": str(gpu)} if gpu is not None else {}))
        self.name = f"gpu{gpu}" if gpu is not None else "cpu"
        self.proc = subprocess.Popen([sys.executable, "-m", "kevin_backend.prewarm.gpu_worker"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, env=env, bufsize=1)
        self._send(setup)
        ready = self._receive()
        if not ready or not ready.get("ready"):
            raise RuntimeError(f"prewarm worker {self.name} did not start")

    def _send(self, data: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(data) + "\n")
        self.proc.stdin.flush()

    def _receive(self) -> dict[str, Any] | None:
        assert self.proc.stdout is not None
        while True:
            line = self.proc.stdout.readline()
            if not line:
                return None
            try:
                return json.loads(line)
            except ValueError:
                continue  # a stray print of the generator's

    def run(self, digest: str) -> dict[str, Any]:
        self._send({"digest": digest})
        outcome = self._receive()
        if outcome is None:
            raise RuntimeError(f"prewarm worker {self.name} died (exit status {self.proc.poll()})")
        return outcome

    def close(self) -> None:
        if self.proc.stdin:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def prewarm_local(items: Sequence[WorkItem], setup: dict[str, Any], gpus: Sequence[int | None],
                  progress: Progress | None = None, deadline: float | None = None) -> Summary:
    """Run every item on the workers (one per entry of `gpus`; None: a worker without a GPU), in
    the order given. With a `deadline` (a `time.perf_counter()` value), a worker takes no new item
    once the mean search so far would end past it; the items left stay pending (`Summary.unsearched`)."""
    start = time.perf_counter()
    summary = Summary()
    work: queue.Queue[WorkItem] = queue.Queue()
    for item in items:
        work.put(item)
    lock = threading.Lock()

    def serve(gpu: int | None) -> None:
        try:
            worker = _Worker(setup, gpu)
        except Exception as exc:  # a worker that cannot start leaves its share to the others
            with lock:
                summary.outcomes.append({"digest": "-", "status": "failed", "reason": f"worker start: {exc}", "seconds": 0.0})
            return
        try:
            while True:
                if deadline is not None:
                    with lock:
                        spent = [o.get("seconds", 0.0) for o in summary.outcomes]
                    expected = sum(spent) / len(spent) if spent else 0.0
                    if time.perf_counter() + expected > deadline:
                        return
                try:
                    item = work.get_nowait()
                except queue.Empty:
                    return
                try:
                    outcome = worker.run(item.digest)
                except RuntimeError as exc:  # the worker died: the task is failed, the worker restarted
                    outcome = {"digest": item.digest, "name": item.task.name, "status": "failed", "reason": str(exc), "seconds": 0.0}
                    worker.close()
                    worker = _Worker(setup, gpu)
                outcome.setdefault("name", item.task.name)
                outcome["origin"] = item.origin
                with lock:
                    if outcome["status"] == "skipped":
                        summary.skipped += 1
                    else:
                        summary.outcomes.append(outcome)
                    done = len(summary.outcomes) + summary.skipped
                    if progress is not None:
                        progress(outcome, done, len(items), time.perf_counter() - start)
        finally:
            worker.close()

    threads = [threading.Thread(target=serve, args=(gpu,), daemon=True) for gpu in gpus]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    while True:
        try:
            summary.unsearched.append(work.get_nowait().digest)
        except queue.Empty:
            break
    summary.seconds = time.perf_counter() - start
    return summary


def print_progress(outcome: dict[str, Any], done: int, total: int, elapsed: float) -> None:
    eta = elapsed / max(done, 1) * (total - done)
    bar = "#" * int(20 * done / max(total, 1))
    detail = outcome.get("reason") or ""
    if outcome["status"] == "kernel" and outcome.get("speedup_vs_inductor"):
        detail = f"{outcome['speedup_vs_inductor']:.2f}x Inductor"
    print(f"[{bar:<20}] {done}/{total} {elapsed:.0f}s eta {eta:.0f}s  {outcome.get('name', outcome['digest'][:12])}: "
          f"{outcome['status']} {detail}"[:200], file=sys.stderr, flush=True)


def format_summary(summary: Summary) -> str:
    data = summary.as_dict()
    lines = ["| tasks | finished before | kernel winners | Inductor winners | failures | model s | judge s | wall s |",
             "|---|---|---|---|---|---|---|---|",
             f"| {data['tasks']} | {data['skipped']} | {data['kernels']} | {data['inductor']} | {sum(summary.failures.values())} | "
             f"{data['model_seconds']:.1f} | {data['judge_seconds']:.1f} | {data['seconds']:.1f} |"]
    devices = Counter(o.get("device") for o in summary.outcomes if o.get("device"))
    if len(devices) > 1:
        lines.append("")
        lines.append("tasks per worker: " + ", ".join(f"{device} x{n}" for device, n in sorted(devices.items())))
    if summary.unsearched:
        lines.append("")
        lines.append(f"not searched within the budget: {len(summary.unsearched)} task(s), still pending (the next run resumes them)")
    if summary.failures:
        lines.append("")
        lines.append("failures by reason: " + ", ".join(f"{reason} x{n}" for reason, n in summary.failures.most_common()))
    return "\n".join(lines)
