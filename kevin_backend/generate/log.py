"""The trajectory log: every turn of every search, one JSON line each, the RL trainer's input.

    log = TrajectoryLog.default(config.cache_dir)     # <cache>/trajectories/<run>.jsonl
    engine = Engine(policy, judge, on_record=log.write)
    ...
    datasets.load_dataset("json", data_files=str(log.path))   # or <cache>/trajectories/*.jsonl

A line is flat and typed the same way in every line (so Arrow reads the files without a schema):
the messages sent, the reply and its reasoning, summary and code, the verdict's stage, reason,
score and timings (and the full verdict as JSON text), the cost, the policy, its sampling
settings and the prompts' version. Lines are appended and flushed as turns finish, under a lock,
so a search killed at any moment leaves every finished turn on disk.
"""

from __future__ import annotations

import datetime as _dt
import fcntl
import json
import os
import threading
import uuid
from pathlib import Path
from typing import Any

from kevin_backend.generate.engine import SearchContext, TurnRecord

__all__ = ["TrajectoryLog", "record_line"]


def record_line(record: TurnRecord, context: SearchContext, run: str = "") -> dict[str, Any]:
    step, result = record.step, record.step.result
    timings = result.timings if result is not None else None
    return {
        "run": run,
        "task": context.task,
        "task_source": context.task_source,
        "trajectory": record.trajectory,
        "turn": record.turn,
        "parent": record.parent,
        "messages": [{"role": m["role"], "content": m["content"]} for m in record.messages],
        "reply": step.reply.text,
        "reasoning": step.reply.reasoning,
        "reply_error": step.reply.error,
        "finish_reason": step.reply.finish_reason,
        "summary": step.summary,
        "code": step.code,
        "stage": result.stage.value if result is not None else None,
        "reason": result.reason.name if result is not None else "NO_CODE",
        "correct": record.correct,
        "score": float(record.score),
        "feedback": step.feedback,
        "kernel_ms": timings.kernel_ms if timings else None,
        "eager_ms": timings.eager_ms if timings else None,
        "inductor_ms": timings.inductor_ms if timings else None,
        "speedup_vs_eager": timings.speedup_vs_eager if timings else None,
        "speedup_vs_inductor": timings.speedup_vs_inductor if timings else None,
        "judge": json.dumps(result.as_dict()) if result is not None else None,
        "prompt_tokens": step.reply.prompt_tokens,
        "completion_tokens": step.reply.completion_tokens,
        "model_seconds": record.model_seconds,
        "judge_seconds": record.judge_seconds,
        "policy": context.policy,
        "sampling": {"temperature": context.sampling.temperature, "top_p": context.sampling.top_p,
                     "max_tokens": context.sampling.max_tokens, "seed": context.sampling.seed},
        "prompt_version": context.prompt_version,
        "gpu": context.gpu,
        "time": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }


class TrajectoryLog:
    def __init__(self, path: Path, run: str | None = None) -> None:
        self.path = Path(path)
        self.run = run or uuid.uuid4().hex[:12]
        self._lock = threading.Lock()

    @classmethod
    def default(cls, cache_dir: Path) -> "TrajectoryLog":
        """A new file for this run under `<cache_dir>/trajectories/`."""
        stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%d-%H%M%S")
        run = f"{stamp}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        return cls(Path(cache_dir) / "trajectories" / f"{run}.jsonl", run)

    def write(self, record: TurnRecord, context: SearchContext) -> None:
        line = json.dumps(record_line(record, context, self.run), ensure_ascii=False) + "\n"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self._lock, open(self.path, "a", encoding="utf-8") as f:
            fcntl.flock(f, fcntl.LOCK_EX)  # other processes may append to the same file
            f.write(line)
            f.flush()
            fcntl.flock(f, fcntl.LOCK_UN)

    def read(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        return [json.loads(line) for line in self.path.read_text(encoding="utf-8").splitlines() if line.strip()]
