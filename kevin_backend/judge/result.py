"""What the judge says about one candidate: the stage it reached, why it stopped, and its score."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from kevin_backend.measure.roofline import Roofline
from kevin_backend.toolchain.rule_violation import RuleViolation

__all__ = ["Stage", "Reason", "RuleViolation", "Mismatch", "JudgeTimings", "JudgeResult", "score"]


class Stage(str, Enum):
    """The stages in order; a result names the last one the candidate entered."""

    STATIC = "static"
    BUILD = "build"
    RUN = "run"
    CORRECTNESS = "correctness"
    TIMING = "timing"


class Reason(str, Enum):
    ACCEPTED = "accepted"
    STATIC_OK = "passes the static rules (not built or run)"
    RULE_VIOLATION = "breaks a rule"
    NO_MODELNEW = "defines no ModelNew"
    SYNTAX_ERROR = "is not valid Python"
    BUILD_ERROR = "does not compile"
    BUILD_TIMEOUT = "build timed out"
    RUNTIME_ERROR = "raised an error"
    CRASH = "crashed the process"
    HANG = "did not finish in time"
    ILLEGAL_ADDRESS = "made an illegal memory access"
    OUT_OF_MEMORY = "ran out of memory"
    PYTORCH_COMPUTE = "computes with PyTorch ops in its forward"
    SHAPE_MISMATCH = "returns the wrong shape"
    DTYPE_MISMATCH = "returns the wrong dtype"
    MISMATCH = "returns wrong values"
    NAN_INF = "returns NaN or Inf where the reference does not"
    INPUT_MUTATED = "changes its inputs"
    REPLAYED_OUTPUT = "returns stale outputs after its inputs changed"
    SUSPICIOUS_SPEEDUP = "claims an implausible speedup that does not hold up"
    NO_GPU = "needs a CUDA GPU to judge"
    # The judge's own failures: no verdict on the candidate (never its score, never fed back to
    # the writer, never a cached decision; the task stays pending and is tried again later).
    RESOURCE = "the judge could not get the GPU memory it needs"
    INFRA = "the judge itself failed"

    @property
    def judge_side(self) -> bool:
        """True when this is the judge's failure, not a verdict on the candidate."""
        return self in _JUDGE_SIDE


_JUDGE_SIDE = frozenset({Reason.RESOURCE, Reason.INFRA, Reason.NO_GPU})


@dataclass(frozen=True)
class Mismatch:
    """How a candidate's output differs from the reference (errors against the exact reference,
    float64 where it ran: `exact` says which)."""

    output: int
    max_abs_error: float
    max_rel_error: float
    bad_elements: int
    total_elements: int
    first_bad_index: tuple[int, ...]
    expected: float
    got: float
    trial: int
    allowed: float | None = None  # the error bound at the first bad element
    worst_ratio: float | None = None  # the largest error / bound over the output
    eager_error: float | None = None  # how far eager itself lies from exact at the first bad element
    exact: str = ""  # "float64", "float32" or "eager" (no exact run: KernelBench's tolerances)

    def __str__(self) -> str:
        text = (
            f"output {self.output}, input set {self.trial}: {self.bad_elements} of {self.total_elements} elements "
            f"outside the error bound; max abs error {self.max_abs_error:.3g}, max rel error {self.max_rel_error:.3g}; "
            f"first at index {list(self.first_bad_index)}: expected {self.expected:.6g}, got {self.got:.6g}"
        )
        if self.allowed is not None and self.allowed == self.allowed:
            text += f" (error {abs(self.got - self.expected):.3g}, allowed {self.allowed:.3g})"
        return text

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Mismatch":
        known = {k: data[k] for k in cls.__dataclass_fields__ if k in data}  # type: ignore[attr-defined]
        return cls(**{**known, "first_bad_index": tuple(known.get("first_bad_index", ()))})

    def as_dict(self) -> dict[str, Any]:
        return {**self.__dict__, "first_bad_index": list(self.first_bad_index)}


@dataclass(frozen=True)
class JudgeTimings:
    """Median milliseconds per call, one protocol for all three; None when not measured."""

    kernel_ms: float | None = None
    eager_ms: float | None = None
    inductor_ms: float | None = None
    trials: int = 0

    @property
    def speedup_vs_eager(self) -> float | None:
        return None if not self.kernel_ms or self.eager_ms is None else self.eager_ms / self.kernel_ms

    @property
    def speedup_vs_inductor(self) -> float | None:
        return None if not self.kernel_ms or self.inductor_ms is None else self.inductor_ms / self.kernel_ms


def score(correct: bool, speedup_vs_eager: float | None) -> float:
    """The Kevin paper's score: S = 0.3 * correct + speedup * correct (speedup over eager)."""
    if not correct:
        return 0.0
    return 0.3 + (speedup_vs_eager or 0.0)


@dataclass(frozen=True)
class JudgeResult:
    stage: Stage
    reason: Reason
    feedback: str = ""  # text for the kernel writer: compiler errors, runtime error, mismatch summary
    violations: tuple[RuleViolation, ...] = ()
    mismatch: Mismatch | None = None
    timings: JudgeTimings = field(default_factory=JudgeTimings)
    seeds: tuple[int, ...] = ()  # input-set seeds used for correctness
    salt: int = 0  # this evaluation's salt of those seeds (`Job.salt`): with the seeds, its inputs exactly
    build_seconds: float | None = None
    memory: dict[str, Any] | None = None  # the run's GPU memory (measure/memory.py MemoryReport.as_dict())
    device: str = ""  # the GPU the candidate ran on ("cuda:0")
    exact: str = ""  # the exact reference's dtype, "eager" when there was none
    # an accepted kernel against the GPU's copy bandwidth (`measure/roofline.py`); None when not
    # accepted, on a CPU, when the bandwidth could not be measured, or in records made before it
    roofline: Roofline | None = None
    # where the sandboxed run's time went: wall-clock seconds per phase of the judge's worker
    # (load, reference, candidate, timing-candidate, ..., cleanup) and parts of a phase as the
    # candidate's process reported them ("load: program"); None when no worker ran
    phase_seconds: dict[str, float] | None = None

    @property
    def judge_side(self) -> bool:
        """No verdict on the candidate: the judge could not run it (RESOURCE, INFRA, NO_GPU)."""
        return self.reason.judge_side

    @property
    def correct(self) -> bool:
        return self.reason is Reason.ACCEPTED

    @property
    def score(self) -> float:
        return score(self.correct, self.timings.speedup_vs_eager)

    def as_dict(self) -> dict[str, Any]:
        return {
            "stage": self.stage.value,
            "reason": self.reason.name,
            "correct": self.correct,
            "score": self.score,
            "feedback": self.feedback,
            "violations": [v.as_dict() for v in self.violations],
            "judge_side": self.judge_side,
            "mismatch": None if self.mismatch is None else self.mismatch.as_dict(),
            "timings": {
                "kernel_ms": self.timings.kernel_ms,
                "eager_ms": self.timings.eager_ms,
                "inductor_ms": self.timings.inductor_ms,
                "trials": self.timings.trials,
                "speedup_vs_eager": self.timings.speedup_vs_eager,
                "speedup_vs_inductor": self.timings.speedup_vs_inductor,
            },
            "seeds": list(self.seeds),
            "salt": self.salt,
            "build_seconds": self.build_seconds,
            "memory": self.memory,
            "device": self.device,
            "exact": self.exact,
            "roofline": None if self.roofline is None else self.roofline.as_dict(),
            "phase_seconds": self.phase_seconds,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "JudgeResult":
        mismatch = data.get("mismatch")
        t = data.get("timings") or {}
        return cls(
            stage=Stage(data["stage"]),
            reason=Reason[data["reason"]],
            feedback=data.get("feedback", ""),
            violations=tuple(RuleViolation(**v) for v in data.get("violations", ())),
            mismatch=None if mismatch is None else Mismatch.from_dict(mismatch),
            timings=JudgeTimings(t.get("kernel_ms"), t.get("eager_ms"), t.get("inductor_ms"), int(t.get("trials", 0))),
            seeds=tuple(data.get("seeds", ())),
            salt=int(data.get("salt", 0) or 0),
            build_seconds=data.get("build_seconds"),
            memory=data.get("memory"),
            device=str(data.get("device", "")),
            exact=str(data.get("exact", "")),
            roofline=Roofline.from_dict(data["roofline"]) if isinstance(data.get("roofline"), dict) else None,
            phase_seconds=data.get("phase_seconds") if isinstance(data.get("phase_seconds"), dict) else None,
        )
