"""The cache's format: what it stores for one key (a decision: a kernel or Inductor, with its
reason and measurements) and for a task still to decide."""

from __future__ import annotations

import datetime as _dt
import math
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from kevin_backend.cache.key import CacheKey
from kevin_backend.types import KernelTask

__all__ = ["EntryKind", "Timings", "Retiming", "CacheEntry", "PendingTask", "now_iso"]


def now_iso() -> str:
    return _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat()


class EntryKind(str, Enum):
    KERNEL = "kernel"  # a verified kernel that beat Inductor: swap it in
    INDUCTOR = "inductor"  # nothing beat Inductor: keep Inductor's code, do not generate again


@dataclass(frozen=True)
class Timings:
    """Median milliseconds per call under the judge's protocol; None when not measured."""

    eager_ms: float | None = None
    inductor_ms: float | None = None
    kernel_ms: float | None = None

    @property
    def speedup_vs_eager(self) -> float | None:
        if self.eager_ms is None or not self.kernel_ms:
            return None
        return self.eager_ms / self.kernel_ms

    @property
    def speedup_vs_inductor(self) -> float | None:
        if self.inductor_ms is None or not self.kernel_ms:
            return None
        return self.inductor_ms / self.kernel_ms

    def as_dict(self) -> dict[str, Any]:
        return {"eager_ms": self.eager_ms, "inductor_ms": self.inductor_ms, "kernel_ms": self.kernel_ms}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Timings":
        def num(name: str) -> float | None:
            value = data.get(name)
            return None if value is None else float(value)

        return cls(num("eager_ms"), num("inductor_ms"), num("kernel_ms"))


@dataclass(frozen=True)
class Retiming:
    """The measurement a KERNEL decision rests on (`judge/decide.py`): the search's winner and
    Inductor's code re-timed in interleaved rounds, each side as the backend runs it (host time
    included: `protocol` says what), and the verdict on them.

    `kernel_ms[i]` and `inductor_ms[i]` are round i (each the median of `trials` trials); `ratio`
    is Inductor's time over the kernel's, `bound` its lower confidence bound at `confidence`;
    the kernel was kept when `bound` > 1 + `margin`."""

    kernel_ms: tuple[float, ...]
    inductor_ms: tuple[float, ...]
    ratio: float
    bound: float
    margin: float
    confidence: float
    keep: bool
    reason: str
    trials: int = 0
    device: str = ""
    protocol: str = ""
    runs: tuple[int, ...] = ()  # rounds of each run (fresh workers), in order; empty: one run

    @property
    def rounds(self) -> int:
        return min(len(self.kernel_ms), len(self.inductor_ms))

    def as_dict(self) -> dict[str, Any]:
        return {
            "kernel_ms": list(self.kernel_ms), "inductor_ms": list(self.inductor_ms), "ratio": self.ratio,
            "bound": self.bound, "margin": self.margin, "confidence": self.confidence, "keep": self.keep,
            "reason": self.reason, "trials": self.trials, "device": self.device, "protocol": self.protocol,
            "runs": list(self.runs),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Retiming":
        def num(name: str) -> float:
            value = data.get(name)
            return math.nan if value is None else float(value)

        return cls(
            kernel_ms=tuple(float(v) for v in data.get("kernel_ms") or ()),
            inductor_ms=tuple(float(v) for v in data.get("inductor_ms") or ()),
            ratio=num("ratio"), bound=num("bound"), margin=num("margin"), confidence=num("confidence"),
            keep=bool(data.get("keep", False)), reason=str(data.get("reason", "")), trials=int(data.get("trials") or 0),
            device=str(data.get("device", "")), protocol=str(data.get("protocol", "")),
            runs=tuple(int(v) for v in data.get("runs") or ()),
        )


# The key under which an entry's re-timing also rides in its judge_record, so that every store of
# entries (which writes judge_record as it is) keeps it: meta.json shows it, and an entry read
# back finds it there (CacheEntry.__post_init__).
RETIMING_KEY = "retiming"


@dataclass(frozen=True)
class CacheEntry:
    """A decision for one key: a winning kernel, or Inductor.

    `judge_record` is the judge's serialized verdict (stage, reason, timings, seeds) exactly as the
    judge wrote it; the cache stores it and never interprets it. `timings` are the judge's (its
    queued GPU-time protocol, eager's time measured beside the kernel's). `retiming` is the
    decision's own measurement of the winner against Inductor (None for entries made before it,
    or without a GPU judge); it is kept in `judge_record` under "retiming" too, so it survives
    any store that writes judge_record, and read from there when not given. `reason` says why the
    decision went as it did.
    """

    key: CacheKey
    kind: EntryKind
    task: KernelTask
    kernel_source: str | None
    timings: Timings = field(default_factory=Timings)
    policy: str = ""
    judge_record: dict[str, Any] | None = None
    created: str = field(default_factory=now_iso)
    reason: str = ""  # why the decision went as it did (always for INDUCTOR entries)
    retiming: Retiming | None = None

    def __post_init__(self) -> None:
        if self.kind is EntryKind.KERNEL and not self.kernel_source:
            raise ValueError("a KERNEL entry needs kernel_source")
        if self.kind is EntryKind.INDUCTOR and self.kernel_source is not None:
            raise ValueError("an INDUCTOR entry has no kernel_source")
        record = self.judge_record
        if self.retiming is None and isinstance(record, dict) and isinstance(record.get(RETIMING_KEY), dict):
            object.__setattr__(self, "retiming", Retiming.from_dict(record[RETIMING_KEY]))
        elif self.retiming is not None and (not isinstance(record, dict) or record.get(RETIMING_KEY) != self.retiming.as_dict()):
            object.__setattr__(self, "judge_record", {**(record or {}), RETIMING_KEY: self.retiming.as_dict()})

    @property
    def digest(self) -> str:
        return self.key.digest

    @property
    def speedup_vs_inductor(self) -> float | None:
        """The measurement the decision rests on: the re-timing's Inductor/kernel ratio where there
        was one (the judge's own timing is one unpaired run), else the judge's."""
        if self.retiming is not None and math.isfinite(self.retiming.ratio):
            return self.retiming.ratio
        return self.timings.speedup_vs_inductor

    def to_dict(self) -> dict[str, Any]:
        """Everything in the entry as JSON-ready values (sources included)."""
        return {
            "key": self.key.as_dict(),
            "kind": self.kind.value,
            "task": self.task.as_dict(),
            "task_source": self.task.source,
            "kernel_source": self.kernel_source,
            "timings": self.timings.as_dict(),
            "policy": self.policy,
            "judge_record": self.judge_record,
            "created": self.created,
            "reason": self.reason,
            "retiming": None if self.retiming is None else self.retiming.as_dict(),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any], task_source: str | None = None,
                  kernel_source: str | None = None) -> "CacheEntry":
        """The entry `to_dict` wrote, or an older record: fields added later (the re-timing, the
        reason) may be missing; sources may be given apart (a cache folder keeps them in files)."""
        source = data.get("task_source", task_source)
        if source is None:
            raise ValueError("a cache entry record needs its task's source")
        retiming = data.get("retiming")
        return cls(
            key=CacheKey.from_dict(data["key"]),
            kind=EntryKind(data["kind"]),
            task=KernelTask.from_dict(data["task"], source),
            kernel_source=data.get("kernel_source", kernel_source),
            timings=Timings.from_dict(data.get("timings") or {}),
            policy=str(data.get("policy", "")),
            judge_record=data.get("judge_record"),
            created=str(data.get("created") or now_iso()),
            reason=str(data.get("reason") or ""),
            retiming=Retiming.from_dict(retiming) if isinstance(retiming, dict) else None,
        )


@dataclass(frozen=True)
class PendingTask:
    """A cache miss recorded by a `cache`-mode run, waiting for `kevin prewarm`."""

    key: CacheKey
    task: KernelTask
    recorded: str = field(default_factory=now_iso)

    @property
    def digest(self) -> str:
        return self.key.digest
