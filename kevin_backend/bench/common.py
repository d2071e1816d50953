"""What the runs of models (`runs.py`) and of KernelBench tasks (`kernelbench.py`) share: the
settings, how each compiler gets its model, which compiles first, and the progress line of a row.

    settings = BenchSettings(device="cuda", size="tiny")
    compiled = compile_model(model, "kevin", settings)
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Mapping, Sequence

import torch

from kevin_backend.bench.models import SIZES
from kevin_backend.bench.results import COMPILERS
from kevin_backend.measure.interleave import INTERLEAVE, interleaved

__all__ = ["DTYPES", "BenchSettings", "compile_model", "compile_order", "sync", "short_error", "row_summary", "probe_ms",
           "precise_enough"]

DTYPES = ("float32", "bfloat16", "float16")
MAX_TRIALS = 500  # timed calls per round, at most (BenchSettings.round_ms)


@dataclass(frozen=True)
class BenchSettings:
    device: str = "cuda"
    dtype: str = "float32"  # the models' weights and floating-point inputs (KernelBench tasks keep their own)
    size: str = "full"  # "full" (GPU-sized) or "tiny" (tests, smoke runs)
    repeats: int = 5  # rounds: the compilers alternate, round by round
    trials: int = 10  # timed calls per round (the round's median counts)
    warmup: int = 3  # untimed calls before each round's trials
    # whole rounds run before the timed ones, their times dropped: on a GPU the first round after
    # compiling was up to 1.7x slower than the rest (a 1 ms step), enough to move a median of 7
    warmup_rounds: int = 1
    # on a GPU, rounds go on after `repeats` until kevin over Inductor's paired 95% interval lies
    # within +-precision of its estimate, or `max_repeats` rounds are done (0: `repeats` rounds);
    # a launch-bound step's rounds were measured 5-10% apart for the same code
    precision: float = 0.01
    max_repeats: int = 45
    # on a GPU a round lasts at least this long: a step shorter than round_ms / trials gets more
    # trials (at most MAX_TRIALS), so host-bound steps (small batches) are not decided by a few noisy calls
    round_ms: float = 200.0
    # "call": inside a round the compilers take turns call by call (drift faster than a round falls
    # on all alike); "round": each compiler's calls of a round back to back (timing.INTERLEAVE)
    interleave: str = "call"
    kevin_options: dict[str, Any] = field(default_factory=lambda: {"mode": "cache"})
    isolate: bool = True  # one fresh process per model and per task
    timeout_s: float = 1800.0  # per model or task (isolated runs)
    inductor_cache: str | None = None  # None: a fresh, empty Inductor cache per process

    def __post_init__(self) -> None:
        if torch.device(self.device).type not in ("cuda", "cpu"):
            raise ValueError(f"device must be cuda or cpu, got {self.device!r}")
        if self.dtype not in DTYPES:
            raise ValueError(f"unknown dtype {self.dtype!r}; valid dtypes: {', '.join(DTYPES)}")
        if self.size not in SIZES:
            raise ValueError(f"unknown size {self.size!r}; valid sizes: {', '.join(SIZES)}")
        if self.repeats < 1 or self.trials < 1 or self.warmup < 0 or self.warmup_rounds < 0 or not self.round_ms >= 0:
            raise ValueError(f"need repeats >= 1, trials >= 1, warmup >= 0, warmup_rounds >= 0, round_ms >= 0; got {self.repeats}, "
                             f"{self.trials}, {self.warmup}, {self.warmup_rounds}, {self.round_ms}")
        if self.interleave not in INTERLEAVE:
            raise ValueError(f"interleave must be one of {', '.join(INTERLEAVE)}, got {self.interleave!r}")
        if not 0 <= self.precision < 1 or self.max_repeats < 1:
            raise ValueError(f"need 0 <= precision < 1 and max_repeats >= 1; got {self.precision}, {self.max_repeats}")

    @property
    def torch_dtype(self) -> torch.dtype:
        return getattr(torch, self.dtype)

    def round_trials(self, steps: Mapping[str, Callable[[], Any]]) -> int:
        """Timed calls per round for these steps: on a GPU with `round_ms` set, from a short probe
        of the fastest (`probe_ms`, `trials_for`); else `trials`, with nothing run."""
        if self.round_ms <= 0 or torch.device(self.device).type != "cuda":
            return self.trials
        return self.trials_for(probe_ms(steps, torch.device(self.device)))

    def trials_for(self, step_ms: float) -> int:
        """Timed calls per round for a step of `step_ms`: `trials`, or on a GPU enough for a round
        of `round_ms` (at most MAX_TRIALS)."""
        if step_ms <= 0 or self.round_ms <= 0 or torch.device(self.device).type != "cuda":
            return self.trials
        return max(self.trials, min(MAX_TRIALS, math.ceil(self.round_ms / step_ms)))

    def rounds(self, fns: Mapping[str, Callable[[], Any]]) -> tuple[dict[str, tuple[float, ...]], int]:
        """Each compiler's per-round median ms over these steps (`timing.interleaved` with these
        settings), and the timed calls per round."""
        trials = self.round_trials(fns)
        rounds = interleaved(fns, self.device, self.repeats, trials=trials, warmup=self.warmup,
                             warmup_rounds=self.warmup_rounds, until=self.stop_rule(), max_rounds=self.max_repeats,
                             interleave=self.interleave)
        return rounds, trials

    def stop_rule(self) -> Callable[[Mapping[str, Sequence[float]]], bool] | None:
        """When rounds may stop after `repeats` (`timing.interleaved`'s `until`): on a GPU with
        `precision` set, once kevin over Inductor's paired interval is within +-precision of its
        estimate; None (exactly `repeats` rounds) otherwise."""
        if self.precision <= 0 or torch.device(self.device).type != "cuda":
            return None
        return lambda samples: precise_enough(samples, self.precision)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "BenchSettings":
        return cls(**data)


def precise_enough(samples: Mapping[str, Sequence[float]], precision: float) -> bool:
    """Whether kevin over Inductor, from the rounds so far paired one by one, has its 95%
    interval within +-`precision` of its estimate (true when either side is not measured)."""
    from kevin_backend.bench.results import paired_ratio

    if "kevin" not in samples or "inductor" not in samples:
        return True
    paired = paired_ratio(samples["kevin"], samples["inductor"])
    if paired is None:
        return False
    estimate, low, high = paired
    return high / estimate - 1 <= precision and 1 - low / estimate <= precision


def compile_model(model: torch.nn.Module, compiler: str, settings: BenchSettings) -> Any:
    """`model` as `compiler` runs it: itself (eager), or compiled by Inductor or by kevin."""
    if compiler == "eager":
        return model
    if compiler == "inductor":
        return torch.compile(model, backend="inductor")
    if compiler == "kevin":
        return torch.compile(model, backend="kevin", options=dict(settings.kevin_options))
    raise ValueError(f"unknown compiler {compiler!r}; valid: {', '.join(COMPILERS)}")


def compile_order(first: str, index: int) -> tuple[str, str]:
    """Which of Inductor and kevin compiles first for the `index`-th item: alternating, so that what
    one leaves behind in the process (warm code caches, loaded modules) favours neither."""
    flip = (first == "kevin") != (index % 2 == 1)
    return ("kevin", "inductor") if flip else ("inductor", "kevin")


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def short_error(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".strip()
    return text if len(text) <= 500 else text[:497] + "..."


def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def row_summary(row: Any, label: str = "") -> str:
    """One line for the progress display: eager's time, the speedups, what kevin did."""
    prefix = f"{label}: " if label else ""
    if row.error and not row.timings:
        return f"{prefix}error {row.error.splitlines()[0][:160]}"
    eager = row.ms("eager")
    text = prefix + (f"eager {eager:.3f} ms, inductor {_x(row.speedup('inductor'))}, kevin {_x(row.speedup('kevin'))}"
                     if eager is not None else "no eager time")
    if row.kevin is not None:
        text += f" ({row.kevin.short()})"
    return text


def probe_ms(steps: Mapping[str, Callable[[], Any]], device: torch.device, calls: int = 3) -> float:
    """About how long the fastest compiler's step takes (ms, wall time, the step's work done)."""
    fastest = float("inf")
    for step in steps.values():
        step()
        sync(device)
        start = time.perf_counter()
        for _ in range(calls):
            step()
        sync(device)
        fastest = min(fastest, (time.perf_counter() - start) * 1e3 / calls)
    return fastest
