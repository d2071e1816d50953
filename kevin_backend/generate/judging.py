"""What the search asks of the judge side: the protocols of a judge, of its optional abilities,
and of the re-timing a decision runs.

    Judging            judge(task, candidate) -> JudgeResult: what every judge does
    BatchJudging       evaluate_many(task, candidates, at_once): its own batch (builds at once,
                       then its worker pool); the engine otherwise judges one candidate a thread
    ConfigurableJudging  configured(numerics=...): a judge of the same builds and workers under a
                       task's numerics settings (the ones its cache key names)
    PreparingJudging   prepare(candidates): start what judging needs (worker processes) ahead of
                       the first candidates, in the background; the search asks it first thing
    BuildingAhead      build_ahead(candidates): build programs a later turn may bring (a
                       `Foreseeing` policy's), in the background
    Retimer            retime(task, kernel) -> RetimeOutcome: the winner against Inductor
    NumericsRetimer    for_numerics(numerics): a retimer under a task's numerics settings

`kevin_backend.judge.judge.Judge` is all five judges and `judge.decide.SandboxRetimer` both
retimers; a test's scripted judge need be no more than `Judging`. The optional abilities are
runtime-checkable: the search asks `isinstance(judge, BatchJudging)`, not for an attribute.
"""

from __future__ import annotations

from typing import Any, Protocol, Sequence, runtime_checkable

from kevin_backend.judge.decide import RetimeOutcome
from kevin_backend.judge.result import JudgeResult

__all__ = ["Judging", "BatchJudging", "ConfigurableJudging", "PreparingJudging", "BuildingAhead", "Retimer",
           "NumericsRetimer", "Numerics"]

Numerics = tuple[tuple[str, Any], ...]  # a cache key's numerics settings, (name, value) pairs


class Judging(Protocol):
    """What the engine needs of a judge."""

    def judge(self, task_source: str, candidate_source: str) -> JudgeResult: ...


@runtime_checkable
class BatchJudging(Protocol):
    """A judge's ability to judge several candidates of one task at once, in order."""

    def evaluate_many(self, task_source: str, candidates: Sequence[str], at_once: int | None = None) -> list[JudgeResult]: ...


@runtime_checkable
class ConfigurableJudging(Protocol):
    """A judge's ability to judge under other run settings, sharing its builds and workers."""

    def configured(self, **changes: Any) -> Judging: ...


@runtime_checkable
class PreparingJudging(Protocol):
    """A judge's ability to get ready for candidates before they come: its workers' start then
    overlaps the writer's reply and the builds. Returns at once."""

    def prepare(self, candidates: int = 1) -> None: ...


@runtime_checkable
class BuildingAhead(Protocol):
    """A judge's ability to build candidates before they are judged. Returns at once."""

    def build_ahead(self, candidates: Sequence[str]) -> None: ...


class Retimer(Protocol):
    """What a decision needs to re-time the winner against Inductor: per-round paired times, or
    the failure and whose it was."""

    def __call__(self, task_source: str, kernel_source: str) -> RetimeOutcome: ...


@runtime_checkable
class NumericsRetimer(Protocol):
    """A retimer's ability to re-time under a task's numerics settings."""

    def for_numerics(self, numerics: Numerics) -> Retimer: ...
