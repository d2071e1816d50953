"""Revalidation: a kernel verified under another environment, judged again for this one.

    outcome = revalidate(entry, key, judge, retime, margin=0.03)     # a Revalidation
    outcome = first_known(generator, cache, task, key)               # None: nothing known, or no judge

A cache key names the GPU, torch and CUDA a kernel was verified under, so a torch upgrade makes
every entry a miss. The kernel is still the best-known candidate for its task: it is judged here
through the normal judge (built against this torch, run for correctness on this GPU under the
key's numerics) and, when correct, decided by the generator's own rule (`decide_entry`: re-timed
against this Inductor, kept only beyond the margin). Outcomes:

    kept      a KERNEL entry for `key`, to be stored (the old entry stays where it is)
    dropped   wrong here, or not faster than this Inductor: nothing is stored, so the task stays a
              miss that a search may still fill (one candidate tried is no decision for the task)
    failed    the judge's own failure (RESOURCE, INFRA, NO_GPU, a re-timing it could not carry
              out): no verdict on the kernel, nothing stored

`kevin cache revalidate` runs it over the cache's entries; generate mode and `kevin prewarm` try
the same task's kernels from other environments first (`first_known`) and search only when none
is kept.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from kevin_backend.cache.format import CacheEntry, EntryKind
from kevin_backend.cache.key import CacheKey, environment_changes
from kevin_backend.generate.decision import decide_entry
from kevin_backend.generate.engine import SearchIncomplete, SearchResult, TurnRecord
from kevin_backend.generate.judging import ConfigurableJudging, Judging, NumericsRetimer, Retimer
from kevin_backend.generate.policy import Reply
from kevin_backend.generate.prompts import Turn
from kevin_backend.judge.result import JudgeResult, Reason, Stage
from kevin_backend.types import KernelTask

__all__ = ["KEPT", "DROPPED", "FAILED", "Revalidation", "revalidate", "first_known"]

KEPT, DROPPED, FAILED = "kept", "dropped", "failed"


@dataclass(frozen=True)
class Revalidation:
    """What judging `source`'s kernel again for `key` gave: `outcome` (KEPT, DROPPED, FAILED),
    why, and the KERNEL entry to store when kept (None otherwise)."""

    source: CacheKey  # the key the kernel was verified under
    key: CacheKey  # the key it was judged for here
    outcome: str
    reason: str
    entry: CacheEntry | None = None
    judge_reason: str = ""  # the judge's verdict (a Reason name), "" when the judge gave none
    seconds: float = 0.0

    @property
    def changes(self) -> tuple[str, ...]:
        """How this environment differs from the one the kernel was verified under."""
        return environment_changes(self.source, self.key)

    @property
    def speedup_vs_inductor(self) -> float | None:
        """The measurement the decision rests on: the re-timing's Inductor/kernel ratio where there
        was one (the judge's own timing is one unpaired run), else the judge's."""
        return None if self.entry is None else self.entry.speedup_vs_inductor

    def as_dict(self) -> dict[str, Any]:
        return {
            "digest": self.source.digest, "key": self.key.digest, "outcome": self.outcome, "reason": self.reason,
            "judge_reason": self.judge_reason or None, "changes": list(self.changes),
            "speedup_vs_inductor": self.speedup_vs_inductor, "seconds": round(self.seconds, 3),
            "retiming": None if self.entry is None or self.entry.retiming is None else self.entry.retiming.as_dict(),
        }


def _one_turn(task: KernelTask, kernel_source: str, result: JudgeResult, policy: str, seconds: float) -> SearchResult:
    """The verdict as a search of one turn, the form `decide_entry` decides on."""
    step = Turn(Reply(""), kernel_source, "", result, "")
    record = TurnRecord(0, 0, None, (), step, result.score, 0.0, seconds)
    return SearchResult(task.name, (record,), "revalidation", 0.0, seconds, seconds, policy)


def revalidate(entry: CacheEntry, key: CacheKey, judge: Judging, retime: Retimer | None,
               margin: float = 0.03, task: KernelTask | None = None) -> Revalidation:
    """Judge `entry`'s kernel for `key` (the same task, another environment) and decide it as the
    generator decides a search's winner. `judge` and `retime` are configured here with the key's
    numerics when they can be; `retime` None decides on the judge's timings alone (a scripted
    judge), as `decide_entry` does. `task`: the task as the caller extracted it (default the
    entry's own program)."""
    assert entry.kernel_source is not None, "only a KERNEL entry has a kernel to judge again"
    task = task or entry.task
    start = time.perf_counter()

    def outcome(kind: str, reason: str, kept: CacheEntry | None = None, verdict: str = "") -> Revalidation:
        return Revalidation(entry.key, key, kind, reason, kept, verdict, time.perf_counter() - start)

    if key.numerics and isinstance(judge, ConfigurableJudging):  # judged under the settings the key names
        judge = judge.configured(numerics=tuple(key.numerics))
    if retime is not None and key.numerics and isinstance(retime, NumericsRetimer):
        retime = retime.for_numerics(key.numerics)
    try:
        result = judge.judge(task.source, entry.kernel_source)
    except Exception as exc:  # noqa: BLE001 - the judge's own failure, never the kernel's
        result = JudgeResult(Stage.RUN, Reason.INFRA, feedback=f"the judge failed: {type(exc).__name__}: {exc}")
    first_line = next((line.strip() for line in result.feedback.splitlines() if line.strip()), "")
    said = f"{result.reason.name}: {result.reason.value}" + (f" ({first_line[:200]})" if first_line else "")
    if result.judge_side:
        return outcome(FAILED, f"no verdict: {said}", verdict=result.reason.name)
    if not result.correct:
        return outcome(DROPPED, said, verdict=result.reason.name)
    search = _one_turn(task, entry.kernel_source, result, entry.policy, time.perf_counter() - start)
    try:
        decided = decide_entry(search, key, task, margin, retime=retime)
    except SearchIncomplete as exc:
        return outcome(FAILED, f"no verdict: {exc}", verdict=result.reason.name)
    if decided.kind is not EntryKind.KERNEL:
        return outcome(DROPPED, decided.reason, verdict=result.reason.name)
    changes = ", ".join(environment_changes(entry.key, key)) or "the same environment"
    reason = f"revalidated from {entry.digest[:12]} ({changes}): {decided.reason}"
    kept = CacheEntry(decided.key, decided.kind, decided.task, decided.kernel_source, decided.timings,
                      decided.policy, decided.judge_record, reason=reason, retiming=decided.retiming)
    return outcome(KEPT, decided.reason, kept, result.reason.name)


def first_known(generator: Any, cache: Any, task: KernelTask, key: CacheKey) -> Revalidation | None:
    """Before a search for `key`: the same task's kernels that `cache` holds for other
    environments (`KernelCache.elsewhere`), judged again here with `generator`'s judge, re-timer
    and margin (a `SearchGenerator`'s), until one is kept. The kept one (its entry to store), or
    the last outcome when none was, or None when there was no candidate or the generator has no
    judge to give (a generator of the user's own decides by itself)."""
    judge = getattr(generator, "judge", None)
    search = getattr(generator, "search", None)
    if judge is None or search is None or not hasattr(generator, "retimer"):
        return None
    last = None
    for entry in cache.elsewhere(key):
        last = revalidate(entry, key, judge, generator.retimer, search.margin, task)
        if last.outcome == KEPT:
            return last
    return last
