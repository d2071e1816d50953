"""The compile report: what the backend decided for every partition, and why (the process-wide
counters are `runtime/counters.py`'s)."""

from __future__ import annotations

import contextlib
from collections import Counter
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Iterator

from kevin_backend.backend.partition import LeftOut

__all__ = [
    "Status",
    "FallbackReason",
    "PartitionRecord",
    "GraphReport",
    "CompileReport",
    "last_report",
]


class Status(str, Enum):
    HIT = "hit"  # a cached kernel replaces the partition
    GENERATED = "generated"  # generated now (mode generate), verified, cached and swapped in
    PENDING = "pending"  # miss in cache mode, recorded for `kevin prewarm`; Inductor runs it
    MISS = "miss"  # miss, not recorded; Inductor runs it
    INDUCTOR = "inductor"  # the cache says Inductor's code is the best known: Inductor runs it
    SKIPPED = "skipped"  # not looked up (see reason); Inductor runs it
    FALLBACK = "fallback"  # something failed in the kevin path; Inductor runs it
    DROPPED = "dropped"  # a kernel that made its graph slower (graph_check.py): Inductor runs it


class FallbackReason(str, Enum):
    NEEDS_CUDA = "generated kernels need CUDA"
    EXTRACTION_ERROR = "could not write the partition as a task"
    LOOKUP_ERROR = "cache lookup failed"
    LOAD_ERROR = "could not load the cached kernel"
    REJECTED_PROGRAM = "the cached kernel program breaks the static rules"
    KERNEL_MISMATCH = "cached kernel's outputs do not match the partition"
    GENERATOR_ERROR = "the generator failed"
    POLICY_ERROR = "the kernel writer could not answer"


@dataclass(frozen=True)
class PartitionRecord:
    index: int
    ops: tuple[str, ...]
    status: Status
    key: str | None = None  # the cache key's digest
    key_dict: dict[str, Any] | None = None
    task: str | None = None  # the task's name
    reason: FallbackReason | None = None
    detail: str = ""
    speedup_vs_inductor: float | None = None
    # the kernel's fraction of the GPU's copy bandwidth, from its entry's judge record (None when
    # the record has no roofline)
    roofline_fraction: float | None = None


@dataclass
class GraphReport:
    graph_id: int
    kind: str  # forward | backward | inference
    nodes: int
    partitions: list[PartitionRecord] = field(default_factory=list)
    left_out: tuple[LeftOut, ...] = ()
    error: str | None = None
    seconds: float = 0.0


@dataclass
class CompileReport:
    """All graphs of one backend call (a Dynamo frame): forward, backward or inference."""

    config: dict[str, Any]
    graphs: list[GraphReport] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def records(self) -> list[PartitionRecord]:
        return [r for g in self.graphs for r in g.partitions]

    def count(self, status: Status) -> int:
        return sum(1 for r in self.records() if r.status is status)

    def summary(self) -> dict[str, int]:
        return {s.value: self.count(s) for s in Status if self.count(s)}

    def __str__(self) -> str:
        lines = [f"kevin compile report (mode={self.config.get('mode')})"]
        if not self.graphs:
            lines.append("  no graph reached the kevin pass (Inductor's cache served this compile, or mode is off)")
        for g in self.graphs:
            lines.append(
                f"  graph {g.graph_id} [{g.kind}]: {g.nodes} nodes, {len(g.partitions)} partitions, "
                f"{len(g.left_out)} nodes left out, {g.seconds * 1000:.1f} ms"
            )
            if g.error:
                lines.append(f"    error: {g.error}")
            for r in g.partitions:
                ops = ", ".join(dict.fromkeys(short_op(o) for o in r.ops))
                why = f" - {r.reason.value}" if r.reason else ""
                detail = f" ({r.detail})" if r.detail else ""
                speed = f" {r.speedup_vs_inductor:.2f}x vs inductor" if r.speedup_vs_inductor else ""
                if r.roofline_fraction is not None and r.status in (Status.HIT, Status.GENERATED):
                    speed += f" ({r.roofline_fraction:.0%} of copy bandwidth)"
                key = r.key[:12] if r.key else "-" * 12
                lines.append(f"    #{r.index:<3} {r.status.value:<9} {key}  {len(r.ops):>3} ops [{ops}]{speed}{why}{detail}")
            reasons = Counter(lo.reason.value for lo in g.left_out)
            if reasons:
                lines.append("    left out: " + ", ".join(f"{n} {why}" for why, n in reasons.most_common()))
        lines.extend(f"  note: {n}" for n in self.notes)
        totals = ", ".join(f"{v} {k}" for k, v in self.summary().items()) or "no partitions"
        lines.append(f"  total: {totals}")
        return "\n".join(lines)


def short_op(name: str) -> str:
    """`aten.add.Tensor` -> `add`; `prims.convert_element_type.default` -> `convert_element_type`."""
    parts = name.split(".")
    return parts[1] if len(parts) >= 3 else parts[0]


_last: list[CompileReport] = []
_collectors: list[list[CompileReport]] = []


def begin_report(config: dict[str, Any]) -> CompileReport:
    report = CompileReport(config=config)
    _last[:] = [report]
    for found in _collectors:
        found.append(report)
    return report


@contextlib.contextmanager
def collecting_reports() -> Iterator[list[CompileReport]]:
    """Every report begun inside the block, in order: a model with graph breaks compiles one
    graph (and report) per piece, and `last_report()` is only the last of them.

        with collecting_reports() as reports:
            compiled(*inputs)
        keys = {r.key for report in reports for r in report.records()}
    """
    found: list[CompileReport] = []
    _collectors.append(found)
    try:
        yield found
    finally:
        _collectors.remove(found)


def last_report() -> CompileReport | None:
    """The report of the most recent `backend="kevin"` compile in this process (None before any)."""
    return _last[0] if _last else None
