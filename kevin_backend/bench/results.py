"""What `kevin bench` measured, as frozen dataclasses that round-trip through JSON.

A `BenchReport` holds the environment, one `ModelResult` per model and workload, and, for
`--kernelbench`, a `KernelBenchResult` (one `TaskResult` per task and KernelBench's fast_p).
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

__all__ = [
    "COMPILERS",
    "FAST_P",
    "Timing",
    "KevinStats",
    "ModelResult",
    "TaskResult",
    "KernelBenchResult",
    "BenchReport",
    "fast_p",
    "paired_ratio",
]

COMPILERS = ("eager", "inductor", "kevin")
# KernelBench's thresholds: fast_p is the fraction of tasks that are correct and more than p times
# faster than the baseline (fast_0 is the fraction correct).
FAST_P = (0.0, 1.0, 1.5, 2.0)


def paired_ratio(mine_ms: Sequence[float], base_ms: Sequence[float],
                 confidence: float = 0.95) -> tuple[float, float, float] | None:
    """base / mine from interleaved rounds paired one by one: the geometric mean of the per-round
    ratios and its two-sided `confidence` interval (Student's t on the logarithms, as the kernel
    decisions use); None with fewer than two pairs."""
    logs = [math.log(b / m) for m, b in zip(mine_ms, base_ms) if m > 0 and b > 0]
    if len(logs) < 2:
        return None
    from kevin_backend.measure.statistics import t_quantile

    mean = statistics.fmean(logs)
    half = t_quantile(0.5 + confidence / 2, len(logs) - 1) * statistics.stdev(logs) / math.sqrt(len(logs))
    return math.exp(mean), math.exp(mean - half), math.exp(mean + half)


@dataclass(frozen=True)
class Timing:
    """One compiler's time for one step: the median over rounds of each round's median."""

    compiler: str
    rounds_ms: tuple[float, ...]
    first_call_s: float | None = None  # wall time of the first call: compile (if any) + one step

    @property
    def median_ms(self) -> float:
        return statistics.median(self.rounds_ms)

    @property
    def spread(self) -> float:
        """(slowest round - fastest round) / median: how steady the rounds were."""
        return (max(self.rounds_ms) - min(self.rounds_ms)) / self.median_ms if self.median_ms > 0 else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {"compiler": self.compiler, "median_ms": self.median_ms, "rounds_ms": list(self.rounds_ms),
                "first_call_s": self.first_call_s}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Timing":
        return cls(str(data["compiler"]), tuple(float(v) for v in data["rounds_ms"]), data.get("first_call_s"))


# counter (kevin_backend.counters) -> KevinStats field
_STAT_COUNTERS = {
    "graphs": "graphs", "partitions": "partitions", "hits": "hits", "misses": "misses",
    "inductor_winners": "inductor", "skipped": "skipped", "fallbacks": "fallbacks",
    "compile_fallbacks": "compile_fallbacks", "runtime_loads": "runtime_loads",
    "runtime_errors": "runtime_errors", "runtime_size_fallbacks": "runtime_size_fallbacks",
    "dropped": "dropped",
}


@dataclass(frozen=True)
class KevinStats:
    """What the kevin backend did for one model or task: the change of its counters over the
    compile and the timed runs. `graphs == 0` means no graph reached the kevin pass (Inductor's own
    cache served the compile), so the partitions are unknown, not absent."""

    graphs: int = 0
    partitions: int = 0
    hits: int = 0  # partitions replaced by a cached kernel
    misses: int = 0  # no entry (recorded as pending tasks for prewarming)
    inductor: int = 0  # the cache says Inductor's code wins
    skipped: int = 0  # not looked up (e.g. no CUDA)
    fallbacks: int = 0  # the kevin path failed; Inductor ran the partition
    compile_fallbacks: int = 0  # a whole graph compiled by plain Inductor after a failure
    runtime_loads: int = 0  # kernels loaded (built, smoke-run) in the process
    runtime_errors: int = 0  # kernel calls that raised and ran their reference instead
    runtime_size_fallbacks: int = 0
    dropped: int = 0  # kernels the graph-level check left out: the graph was not faster with them

    @classmethod
    def between(cls, before: Mapping[str, int], after: Mapping[str, int]) -> "KevinStats":
        return cls(**{f: int(after.get(c, 0)) - int(before.get(c, 0)) for c, f in _STAT_COUNTERS.items()})

    def short(self) -> str:
        """E.g. `3/10 hit, 6 miss, 1 fallback`; `cached compile` when no graph reached the pass."""
        if self.graphs == 0:
            return "cached compile"
        extra = [(self.misses, "miss"), (self.inductor, "inductor"), (self.dropped, "dropped"), (self.skipped, "skipped"),
                 (self.fallbacks + self.compile_fallbacks, "fallback"), (self.runtime_errors, "runtime error")]
        return ", ".join([f"{self.hits}/{self.partitions} hit", *(f"{n} {what}" for n, what in extra if n)])

    def as_dict(self) -> dict[str, int]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> "KevinStats | None":
        if data is None:
            return None
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: int(v) for k, v in data.items() if k in names})


@dataclass(frozen=True, kw_only=True)
class _Timed:
    timings: tuple[Timing, ...] = ()
    kevin: KevinStats | None = None
    error: str | None = None  # the run failed (the row has what was measured before, if anything)

    def timing(self, compiler: str) -> Timing | None:
        return next((t for t in self.timings if t.compiler == compiler), None)

    def ms(self, compiler: str) -> float | None:
        t = self.timing(compiler)
        return None if t is None else t.median_ms

    def speedup(self, compiler: str = "kevin", baseline: str = "eager") -> float | None:
        """baseline ms / compiler ms (above 1: `compiler` is faster)."""
        mine, base = self.ms(compiler), self.ms(baseline)
        return None if mine is None or base is None or mine <= 0 else base / mine

    def paired(self, compiler: str = "kevin", baseline: str = "inductor", confidence: float = 0.95) -> tuple[float, float, float] | None:
        """baseline / compiler from the interleaved rounds, paired round by round: the geometric
        mean of the per-round ratios and its two-sided `confidence` interval (Student's t on the
        logarithms, as the kernel decisions use); None with fewer than two rounds a side. An
        interval that holds 1 is a tie within the noise."""
        mine, base = self.timing(compiler), self.timing(baseline)
        if mine is None or base is None:
            return None
        return paired_ratio(mine.rounds_ms, base.rounds_ms, confidence)

    def _common_dict(self) -> dict[str, Any]:
        return {
            "timings": {t.compiler: t.as_dict() for t in self.timings},
            "speedup_vs_eager": {c: self.speedup(c) for c in COMPILERS if self.timing(c)},
            "kevin_vs_inductor": self.speedup("kevin", "inductor"),
            # per-round pairs: (geometric mean, 95% interval low, high)
            "kevin_vs_inductor_paired": None if (paired := self.paired("kevin", "inductor")) is None else list(paired),
            "kevin": None if self.kevin is None else self.kevin.as_dict(),
            "error": self.error,
        }

    @staticmethod
    def _common_from(data: Mapping[str, Any]) -> dict[str, Any]:
        return {
            "timings": tuple(Timing.from_dict(t) for t in (data.get("timings") or {}).values()),
            "kevin": KevinStats.from_dict(data.get("kevin")),
            "error": data.get("error"),
        }


@dataclass(frozen=True, kw_only=True)
class ModelResult(_Timed):
    """One model and workload: the three compilers' times and what kevin did."""

    model: str
    workload: str
    description: str = ""
    size: str = ""  # the model's size (models.SIZES) and dtype, when the run says
    dtype: str = ""
    kernels: tuple[str, ...] = ()  # the partitions kevin kernels run, one line each (runner.kept_kernels)
    # what each graph-level check found, and each kernel it dropped with the reason (runs.graph_checks)
    graph_checks: tuple[str, ...] = ()
    # infer only: the largest |output - eager output| of each compiled model (a sanity check:
    # compiled code reorders floating-point sums, so small differences are expected)
    deviation: dict[str, float] = field(default_factory=dict)
    trials: int | None = None  # timed calls per round (more than the settings' for a short step)

    def as_dict(self) -> dict[str, Any]:
        return {"model": self.model, "workload": self.workload, "description": self.description, "size": self.size,
                "dtype": self.dtype, **self._common_dict(), "deviation": dict(self.deviation), "kernels": list(self.kernels),
                "graph_checks": list(self.graph_checks),
                "trials": self.trials}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "ModelResult":
        return cls(model=str(data["model"]), workload=str(data["workload"]), description=str(data.get("description", "")),
                   size=str(data.get("size", "")), dtype=str(data.get("dtype", "")),
                   kernels=tuple(str(k) for k in data.get("kernels") or ()),
                   graph_checks=tuple(str(k) for k in data.get("graph_checks") or ()),
                   deviation={k: float(v) for k, v in (data.get("deviation") or {}).items()},
                   trials=None if data.get("trials") is None else int(data["trials"]), **cls._common_from(data))


@dataclass(frozen=True, kw_only=True)
class TaskResult(_Timed):
    """One KernelBench task: kevin's correctness against eager, and the three times."""

    task: str
    path: str = ""
    correct: bool = False  # kevin's outputs matched eager's (tolerance by dtype) on every input set
    inductor_correct: bool | None = None
    mismatch: str = ""  # why kevin's outputs were not correct
    kernel_calls: int = 0  # calls of kevin kernels themselves while the task ran (`registry.kernel_calls`)

    def as_dict(self) -> dict[str, Any]:
        return {"task": self.task, "path": self.path, "correct": self.correct, "inductor_correct": self.inductor_correct,
                "mismatch": self.mismatch, "kernel_calls": self.kernel_calls, **self._common_dict()}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "TaskResult":
        return cls(task=str(data["task"]), path=str(data.get("path", "")), correct=bool(data["correct"]),
                   inductor_correct=data.get("inductor_correct"), mismatch=str(data.get("mismatch", "")),
                   kernel_calls=int(data.get("kernel_calls") or 0), **cls._common_from(data))


def fast_p(tasks: tuple[TaskResult, ...] | list[TaskResult], p: float, baseline: str = "eager") -> float:
    """KernelBench's fast_p: the fraction of `tasks` (all of them, failed ones too) whose kevin
    outputs are correct and that run more than `p` times faster than `baseline`."""
    if not tasks:
        return 0.0
    good = 0
    for t in tasks:
        speedup = t.speedup("kevin", baseline)
        if t.correct and t.error is None and speedup is not None and speedup > p:
            good += 1
    return good / len(tasks)


@dataclass(frozen=True)
class KernelBenchResult:
    directory: str
    tasks: tuple[TaskResult, ...]

    def fast_p(self, p: float, baseline: str = "eager") -> float:
        return fast_p(self.tasks, p, baseline)

    def fast_p_table(self) -> dict[str, dict[str, float]]:
        """{"eager": {"0.0": fast_0, "1.0": fast_1, ...}, "inductor": {...}}."""
        return {b: {str(p): self.fast_p(p, b) for p in FAST_P} for b in ("eager", "inductor")}

    def as_dict(self) -> dict[str, Any]:
        return {"directory": self.directory, "tasks": [t.as_dict() for t in self.tasks], "fast_p": self.fast_p_table(),
                "correct": sum(t.correct for t in self.tasks)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "KernelBenchResult":
        return cls(str(data["directory"]), tuple(TaskResult.from_dict(t) for t in data["tasks"]))


@dataclass(frozen=True)
class BenchReport:
    environment: dict[str, Any]  # torch version, device, GPU name, dtype, date, command, settings
    models: tuple[ModelResult, ...] = ()
    kernelbench: KernelBenchResult | None = None

    @property
    def errors(self) -> list[str]:
        rows: list[Any] = [*self.models, *(self.kernelbench.tasks if self.kernelbench else ())]
        return [f"{getattr(r, 'task', '') or f'{r.model} {r.workload}'}: {r.error}" for r in rows if r.error]

    def as_dict(self) -> dict[str, Any]:
        return {"environment": self.environment, "models": [m.as_dict() for m in self.models],
                "kernelbench": None if self.kernelbench is None else self.kernelbench.as_dict()}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "BenchReport":
        kb = data.get("kernelbench")
        return cls(dict(data.get("environment") or {}), tuple(ModelResult.from_dict(m) for m in data.get("models") or ()),
                   None if kb is None else KernelBenchResult.from_dict(kb))
