"""The worker's side of `kevin bench`'s fresh processes: one model or task, its outcome printed.

    python -m kevin_backend.bench.child < job.json     # prints one line: token + JSON outcome

The parent (`isolate.run_isolated`) starts it with its own, empty Inductor cache and a job: a
model with its workloads (`runner.measure_model`) or a KernelBench task (`kernelbench.measure_task`).
An exception is the whole job's error, printed the same way; a crash, hang or out-of-memory ends
this process, which the parent reports as that model's or task's error.
"""

from __future__ import annotations

import json
import sys
import traceback
from typing import Any

from kevin_backend.bench.common import BenchSettings
from kevin_backend.bench.kernelbench import measure_task
from kevin_backend.bench.runs import measure_model

__all__ = ["main"]


def _run(job: dict[str, Any]) -> dict[str, Any]:
    settings = BenchSettings.from_dict(job["settings"])
    if job["kind"] == "model":
        results = measure_model(job["name"], tuple(job["workloads"]), settings, first=job.get("first", "inductor"))
        return {"results": [r.as_dict() for r in results]}
    if job["kind"] == "task":
        return {"result": measure_task(job["path"], settings, first=job.get("first", "inductor")).as_dict()}
    raise ValueError(f"unknown job kind {job['kind']!r}")


def main() -> int:
    from kevin_backend.lifeline import die_with_parent

    die_with_parent()  # a killed bench leaves no timing running
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
