"""The compile report: what the backend decided for every partition, and why (the process-wide
counters are `runtime/counters.py`'s). In generate mode it also says how long each partition's
search took (and where: the writer, the judge, the re-timing of the winner), their total, and what
the process's own GPU memory cache gave back before the searches (`cached_memory.py`).

    report = kevin_backend.last_report()
    print(report)                 # the readable report
    json.dumps(report.as_dict())  # the same as data
"""

from __future__ import annotations

import ast
import contextlib
from collections import Counter
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Iterator

from kevin_backend.backend.cached_memory import CacheRelease
from kevin_backend.backend.partition import LeftOut

__all__ = [
    "Status",
    "FallbackReason",
    "PartitionRecord",
    "GraphReport",
    "CompileReport",
    "last_report",
    "SearchTime",
    "kernel_summary",
]


class Status(str, Enum):
    HIT = "hit"  # a cached kernel replaces the partition
    GENERATED = "generated"  # generated now (mode generate), verified, cached and swapped in
    # miss in cache mode, or a generate-mode search the judge (or the writer's server) could not
    # finish (see reason): recorded for `kevin prewarm`, no decision stored; Inductor runs it
    PENDING = "pending"
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
    SEARCH_INCOMPLETE = "the search could not finish (not the kernels' failure): left for `kevin prewarm`"


@dataclass(frozen=True)
class SearchTime:
    """How long a partition's search took in generate mode, wall clock: `seconds` from asking the
    generator to its decision stored (a kernel known from another environment judged again, the
    search, the re-timing of its winner). The parts are the search generator's own account
    (None from a generator that keeps none): the writer's calls, the judge's verdicts, the
    re-timing; `turns` and `candidates` judged."""

    seconds: float
    writer_seconds: float | None = None
    judge_seconds: float | None = None
    retime_seconds: float | None = None
    turns: int | None = None
    candidates: int | None = None

    def describe(self) -> str:
        parts = [f"{name} {value:.1f} s" for name, value in (("writer", self.writer_seconds), ("judge", self.judge_seconds),
                                                             ("re-timing", self.retime_seconds)) if value is not None]
        if self.turns is not None:
            parts.append(f"{self.turns} turn{'' if self.turns == 1 else 's'}")
        return f"searched in {self.seconds:.1f} s" + (f" ({', '.join(parts)})" if parts else "")

    def as_dict(self) -> dict[str, Any]:
        return {"seconds": round(self.seconds, 3), "writer_seconds": _rounded(self.writer_seconds),
                "judge_seconds": _rounded(self.judge_seconds), "retime_seconds": _rounded(self.retime_seconds),
                "turns": self.turns, "candidates": self.candidates}


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


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
    search: SearchTime | None = None  # generate mode: how long this partition's search took (None: no search)

    def as_dict(self) -> dict[str, Any]:
        return {"index": self.index, "ops": list(self.ops), "status": self.status.value, "key": self.key,
                "task": self.task, "reason": self.reason.value if self.reason else None, "detail": self.detail,
                "speedup_vs_inductor": self.speedup_vs_inductor, "roofline_fraction": self.roofline_fraction,
                "search": self.search.as_dict() if self.search else None}


@dataclass
class GraphReport:
    graph_id: int
    kind: str  # forward | backward | inference
    nodes: int
    partitions: list[PartitionRecord] = field(default_factory=list)
    left_out: tuple[LeftOut, ...] = ()
    error: str | None = None
    seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return {"graph_id": self.graph_id, "kind": self.kind, "nodes": self.nodes, "seconds": round(self.seconds, 3),
                "error": self.error, "left_out": len(self.left_out), "partitions": [r.as_dict() for r in self.partitions]}


@dataclass
class CompileReport:
    """All graphs of one backend call (a Dynamo frame): forward, backward or inference."""

    config: dict[str, Any]
    graphs: list[GraphReport] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    # generate mode: what this process's CUDA allocator gave back before the first search, per device
    released: tuple[CacheRelease, ...] = ()
    graph_check_seconds: float = 0.0  # the graph-level check's time (graph_check.py), on the graph's first call

    def records(self) -> list[PartitionRecord]:
        return [r for g in self.graphs for r in g.partitions]

    def count(self, status: Status) -> int:
        return sum(1 for r in self.records() if r.status is status)

    def summary(self) -> dict[str, int]:
        return {s.value: self.count(s) for s in Status if self.count(s)}

    def searches(self) -> list[SearchTime]:
        """Every partition's search in generate mode, in order."""
        return [r.search for r in self.records() if r.search is not None]

    def search_seconds(self) -> float:
        """The time the searches of this compile took, all together."""
        return sum(s.seconds for s in self.searches())

    def as_dict(self) -> dict[str, Any]:
        """The report as JSON-ready data: every graph and partition, the searches' time, the
        memory given back."""
        return {"config": self.config, "graphs": [g.as_dict() for g in self.graphs], "notes": list(self.notes),
                "summary": self.summary(), "searches": len(self.searches()),
                "search_seconds": round(self.search_seconds(), 3), "graph_check_seconds": round(self.graph_check_seconds, 3),
                "released": [r.as_dict() for r in self.released]}

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
                searched = f" [{r.search.describe()}]" if r.search is not None else ""
                lines.append(f"    #{r.index:<3} {r.status.value:<9} {key}  {len(r.ops):>3} ops [{ops}]{speed}{why}{detail}{searched}")
            reasons = Counter(lo.reason.value for lo in g.left_out)
            if reasons:
                lines.append("    left out: " + ", ".join(f"{n} {why}" for why, n in reasons.most_common()))
        lines.extend(f"  note: {n}" for n in self.notes)
        lines.extend(f"  before the search: {r.describe()}" for r in self.released)
        searches = self.searches()
        if searches:
            lines.append(f"  search time: {self.search_seconds():.1f} s for {len(searches)} partition"
                         f"{'s' if len(searches) != 1 else ''}")
        totals = ", ".join(f"{v} {k}" for k, v in self.summary().items()) or "no partitions"
        lines.append(f"  total: {totals}")
        return "\n".join(lines)


def kernel_summary(source: str | None, limit: int = 160) -> str:
    """What a kept kernel is, for the report: the first line of its program's docstring (the
    built-in writer names its kernel and variant there: "a direct 2-D convolution 3 -> 16 channels,
    ..., direct 256 threads x 1 position"), without the writer's name; "" where the program has none."""
    if not source:
        return ""
    try:
        doc = ast.get_docstring(ast.parse(source))
    except (SyntaxError, ValueError):
        return ""
    text = (doc or "").strip()
    line = text.splitlines()[0].strip() if text else ""
    line = line.removeprefix("Written by kevin's built-in writer: ").rstrip(".")
    return line if len(line) <= limit else line[:limit - 3].rstrip() + "..."


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
