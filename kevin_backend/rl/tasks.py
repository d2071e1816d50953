"""Training tasks and the order they are visited in.

Tasks come from two places, both in the KernelBench format the whole project speaks:

* folders of problem files (`*.py` defining `Model`, `get_inputs`, `get_init_inputs`), e.g.
  KernelBench's level1/level2 folders; searched recursively, named by their path in the folder;
* the pending tasks the backend recorded in a kernel cache (`KernelCache(dir).pending()`: the
  partitions of real models that missed the cache), named `pending/<digest>`.

`TaskSampler` walks the tasks in a seeded random order, epoch after epoch; its state (epoch,
position) goes into checkpoints so a resumed run sees the same tasks in the same order.
"""

from __future__ import annotations

import hashlib
import logging
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence


from kevin_backend.judge.static_judge import ProblemError, check_problem
from kevin_backend.rl.train_config import TaskSettings, TrainConfigError

__all__ = ["TrainTask", "tasks_from_folder", "tasks_from_pending", "load_tasks", "TaskSampler"]

log = logging.getLogger("kevin_backend.rl")


@dataclass(frozen=True)
class TrainTask:
    name: str
    source: str  # a KernelBench-format program
    origin: str  # the file it was read from, or "pending:<cache>/<digest>"


def tasks_from_folder(folder: str | Path) -> list[TrainTask]:
    """Every KernelBench-format problem under `folder` (recursively), sorted by name. Files that
    are not problems (helpers, `__init__.py`) are skipped with a log line."""
    root = Path(folder)
    if not root.is_dir():
        raise TrainConfigError(f"tasks.folders: {root} is not a folder")
    tasks = []
    for path in sorted(root.rglob("*.py")):
        try:
            source = path.read_text(encoding="utf-8")
            check_problem(source)
        except (OSError, UnicodeDecodeError, ProblemError) as exc:
            log.info("skipping %s: %s", path, exc)
            continue
        tasks.append(TrainTask(path.relative_to(root).with_suffix("").as_posix(), source, str(path)))
    return tasks


def tasks_from_pending(cache_dir: str | Path) -> list[TrainTask]:
    """The pending tasks recorded in the kernel cache at `cache_dir` (oldest first)."""
    from kevin_backend.cache.store import KernelCache

    root = Path(cache_dir)
    if not root.is_dir():
        raise TrainConfigError(f"tasks.pending_caches: {root} is not a folder")
    with KernelCache(root, seed_dir=None) as cache:
        pending = cache.pending()
    return [TrainTask(f"pending/{p.digest[:16]}", p.task.source, f"pending:{root}/{p.digest}") for p in pending]


def load_tasks(settings: TaskSettings) -> list[TrainTask]:
    """All tasks the settings name, without duplicates (same program text), sorted by name."""
    found: list[TrainTask] = []
    for folder in settings.folders:
        found.extend(tasks_from_folder(folder))
    for cache in settings.pending_caches:
        found.extend(tasks_from_pending(cache))
    seen: set[str] = set()
    tasks = []
    for task in sorted(found, key=lambda t: (t.name, t.origin)):
        digest = hashlib.sha256(task.source.encode()).hexdigest()
        if digest in seen:
            continue
        seen.add(digest)
        tasks.append(task)
    if settings.limit is not None:
        tasks = tasks[: settings.limit]
    if not tasks:
        where = ", ".join([*settings.folders, *settings.pending_caches])
        raise TrainConfigError(f"tasks: no KernelBench-format problem found in {where}")
    return tasks


class TaskSampler:
    """Tasks in a seeded random order, one permutation per epoch; `take(k)` continues where the
    last call stopped (into the next epoch when needed)."""

    def __init__(self, tasks: Sequence[TrainTask], seed: int) -> None:
        if not tasks:
            raise ValueError("no tasks to sample from")
        self.tasks = list(tasks)
        self.seed = seed
        self.epoch = 0
        self.position = 0

    def _order(self, epoch: int) -> list[int]:
        """The permutation of one epoch: a function of (seed, epoch) only (string seeds are
        hashed with SHA-512 by `random`, the same on every platform and Python 3 version)."""
        order = list(range(len(self.tasks)))
        random.Random(f"kevin-rl-tasks:{self.seed}:{epoch}").shuffle(order)
        return order

    def take(self, count: int) -> list[TrainTask]:
        out: list[TrainTask] = []
        while len(out) < count:
            order = self._order(self.epoch)
            step = min(count - len(out), len(order) - self.position)
            out.extend(self.tasks[i] for i in order[self.position: self.position + step])
            self.position += step
            if self.position >= len(order):
                self.epoch, self.position = self.epoch + 1, 0
        return out

    def fingerprint(self) -> str:
        return hashlib.sha256("\0".join(t.name for t in self.tasks).encode()).hexdigest()[:16]

    def state_dict(self) -> dict[str, Any]:
        return {"seed": self.seed, "epoch": self.epoch, "position": self.position, "tasks": self.fingerprint()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("tasks") != self.fingerprint():
            log.warning("the task set changed since the checkpoint; the order continues on the new set")
        self.seed, self.epoch, self.position = int(state["seed"]), int(state["epoch"]), int(state["position"])
        if self.position >= len(self.tasks):
            self.epoch, self.position = self.epoch + 1, 0
