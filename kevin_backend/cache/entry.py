"""What the kernel cache stores for one key."""

from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from kevin_backend.cache.key import CacheKey
from kevin_backend.types import KernelTask

__all__ = ["EntryKind", "Timings", "CacheEntry", "PendingTask", "now_iso"]


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
class CacheEntry:
    """A decision for one key: a winning kernel, or Inductor.

    `judge_record` is the judge's serialized verdict (stage, reason, timings, seeds) exactly as the
    judge wrote it; the cache stores it and never interprets it.
    """

    key: CacheKey
    kind: EntryKind
    task: KernelTask
    kernel_source: str | None
    timings: Timings = field(default_factory=Timings)
    policy: str = ""
    judge_record: dict[str, Any] | None = None
    created: str = field(default_factory=now_iso)
    reason: str = ""  # why Inductor won, for INDUCTOR entries

    def __post_init__(self) -> None:
        if self.kind is EntryKind.KERNEL and not self.kernel_source:
            raise ValueError("a KERNEL entry needs kernel_source")
        if self.kind is EntryKind.INDUCTOR and self.kernel_source is not None:
            raise ValueError("an INDUCTOR entry has no kernel_source")

    @property
    def digest(self) -> str:
        return self.key.digest


@dataclass(frozen=True)
class PendingTask:
    """A cache miss recorded by a `cache`-mode run, waiting for `kevin prewarm`."""

    key: CacheKey
    task: KernelTask
    recorded: str = field(default_factory=now_iso)

    @property
    def digest(self) -> str:
        return self.key.digest
