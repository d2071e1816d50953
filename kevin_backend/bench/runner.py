"""`kevin bench` on models: eager, Inductor and kevin, for inference and a training step.

For each model, in a fresh process with an empty Inductor cache (`worker.py`), for each workload:

  1. the model and its inputs (`models.py`), a copy compiled with Inductor and a copy compiled with
     the kevin backend in mode `cache` on the user's kernel cache (which compiles first alternates
     model by model and workload by workload)
  2. the first call of each (compile + one step, wall time); for inference, how far each compiled
     output is from eager's
  3. the step timed under the judge's protocol (`timing.py`), `repeats` rounds of `trials` calls,
     the three compilers rotating their order round by round; each one's time is the median over
     rounds of the round's median
  4. what kevin did: its counters' change (partitions, hits, misses, fallbacks, runtime errors)

    report = run_bench(["mlp", "gpt2"], ["infer", "train"], settings=BenchSettings(device="cuda"))
"""

from __future__ import annotations

import copy
import gc
import platform
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import torch

from kevin_backend.bench.models import MODELS, SIZES, WORKLOADS, describe, make_model
from kevin_backend.bench.progress import Progress
from kevin_backend.bench.results import COMPILERS, BenchReport, KevinStats, ModelResult, Timing
from kevin_backend.bench.timing import Measure, interleaved, timer
from kevin_backend.config import Config

__all__ = [
    "DTYPES",
    "BenchSettings",
    "kevin_options",
    "compile_model",
    "measure_model",
    "run_models",
    "run_bench",
    "environment",
]

DTYPES = ("float32", "bfloat16", "float16")


@dataclass(frozen=True)
class BenchSettings:
    device: str = "cuda"
    dtype: str = "float32"  # the models' weights and floating-point inputs (KernelBench tasks keep their own)
    size: str = "full"  # "full" (GPU-sized) or "tiny" (tests, smoke runs)
    repeats: int = 5  # rounds: the compilers alternate, round by round
    trials: int = 10  # timed calls per round (the round's median counts)
    warmup: int = 3  # untimed calls before each round's trials
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
        if self.repeats < 1 or self.trials < 1 or self.warmup < 0:
            raise ValueError(f"need repeats >= 1, trials >= 1, warmup >= 0; got {self.repeats}, {self.trials}, {self.warmup}")

    @property
    def torch_dtype(self) -> torch.dtype:
        return getattr(torch, self.dtype)

    def measure(self) -> Measure:
        return timer(self.device, self.trials, self.warmup)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "BenchSettings":
        return cls(**data)


def kevin_options(config: Config) -> dict[str, Any]:
    """The kevin backend's options for a benchmark: mode `cache`, and the settings of `config`
    that decide which partitions exist and where their kernels are found (JSON-ready)."""
    options: dict[str, Any] = {
        "mode": "cache",
        "cache_dir": str(config.cache_dir),
        "seed_cache": config.seed_cache,
        "cpu_kernels": config.cpu_kernels,
        "writer": config.writer,
        "min_partition": config.min_partition,
        "max_partition": config.max_partition,
        "record_pending": config.record_pending,
    }
    if isinstance(config.policy, str):  # the writer "auto" resolves through the policy's name
        options["policy"] = config.policy
    return options


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


def _step(model: Any, inputs: tuple[Any, ...], train: bool) -> Callable[[], Any]:
    if train:
        params = [p for p in model.parameters() if p.requires_grad]

        def train_step() -> None:
            for p in params:
                p.grad = None
            model(*inputs).backward()

        return train_step

    def infer_step() -> Any:
        with torch.no_grad():
            return model(*inputs)

    return infer_step


def _deviation(got: Any, want: Any) -> float:
    return float((got.detach().double() - want.detach().double()).abs().max()) if got.numel() else 0.0


def _measure_workload(name: str, workload: str, settings: BenchSettings, order: tuple[str, str], measure: Measure) -> ModelResult:
    from kevin_backend.backend.report import counters

    device = torch.device(settings.device)
    train = workload == "train"
    model, inputs = make_model(name, workload, device, settings.torch_dtype, settings.size)
    before = counters.snapshot()
    models = {"eager": model, **{c: compile_model(copy.deepcopy(model), c, settings) for c in order}}
    steps = {c: _step(m, inputs, train) for c, m in models.items()}
    first_call: dict[str, float] = {}
    outputs: dict[str, Any] = {}
    for compiler in ("eager", *order):
        sync(device)
        start = time.perf_counter()
        out = steps[compiler]()
        sync(device)
        first_call[compiler] = time.perf_counter() - start
        if isinstance(out, torch.Tensor):
            outputs[compiler] = out
    deviation = {c: _deviation(outputs[c], outputs["eager"]) for c in order if c in outputs and "eager" in outputs}
    outputs.clear()
    rounds = interleaved(steps, device, settings.repeats, measure=measure)
    stats = KevinStats.between(before, counters.snapshot())
    return ModelResult(
        model=name, workload=workload, description=describe(name, settings.size),
        timings=tuple(Timing(c, rounds[c], first_call[c]) for c in COMPILERS),
        kevin=stats, deviation=deviation,
    )


def measure_model(name: str, workloads: Sequence[str], settings: BenchSettings, first: str = "inductor") -> list[ModelResult]:
    """Every workload of model `name`, in this process (one failure is that row's error)."""
    measure = settings.measure()
    results = []
    for index, workload in enumerate(workloads):
        torch._dynamo.reset()  # each workload compiles from scratch
        try:
            results.append(_measure_workload(name, workload, settings, compile_order(first, index), measure))
        except Exception as exc:
            results.append(ModelResult(model=name, workload=workload, description=describe(name, settings.size),
                                       error=short_error(exc)))
        finally:
            gc.collect()
            if torch.device(settings.device).type == "cuda":
                torch.cuda.empty_cache()
    torch._dynamo.reset()
    return results


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


def run_models(
    names: Sequence[str], workloads: Sequence[str], settings: BenchSettings, progress: Progress | None = None
) -> tuple[ModelResult, ...]:
    """Each model in its own worker process (or in this one: `settings.isolate=False`)."""
    from kevin_backend.bench.worker import WorkerError, run_isolated

    progress = progress or Progress(len(names), enabled=False)
    rows: list[ModelResult] = []
    for index, name in enumerate(names):
        first = "inductor" if index % 2 == 0 else "kevin"
        progress.start(f"{name} ({', '.join(workloads)})")
        if settings.isolate:
            job = {"kind": "model", "name": name, "workloads": list(workloads), "settings": settings.as_dict(), "first": first}
            try:
                outcome = run_isolated(job, settings.timeout_s, settings.inductor_cache)
                if "error" in outcome:
                    raise WorkerError(outcome["error"])
                got = [ModelResult.from_dict(r) for r in outcome["results"]]
            except WorkerError as exc:
                got = [ModelResult(model=name, workload=w, description=describe(name, settings.size), error=str(exc))
                       for w in workloads]
        else:
            got = measure_model(name, workloads, settings, first)
        rows.extend(got)
        progress.finish(name, "; ".join(row_summary(r, r.workload) for r in got))
    return tuple(rows)


def environment(settings: BenchSettings, command: str | None = None) -> dict[str, Any]:
    """Where and how the benchmark ran (the report's header)."""
    from kevin_backend import __version__

    cuda = torch.device(settings.device).type == "cuda" and torch.cuda.is_available()
    return {
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "command": command,
        "device": settings.device,
        "gpu": torch.cuda.get_device_name() if cuda else None,
        "cpu": platform.processor() or platform.machine(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "kevin_backend": __version__,
        "settings": settings.as_dict(),
    }


def run_bench(
    models: Sequence[str] = MODELS,
    workloads: Sequence[str] = WORKLOADS,
    kernelbench: str | Path | None = None,
    settings: BenchSettings | None = None,
    progress: bool = True,
    command: str | None = None,
) -> BenchReport:
    """The whole benchmark: `models` x `workloads`, then the KernelBench tasks in `kernelbench`."""
    from kevin_backend.bench.kernelbench import run_kernelbench, task_files

    settings = settings or BenchSettings()
    for name in models:
        if name not in MODELS:
            raise ValueError(f"unknown model {name!r}; valid models: {', '.join(MODELS)}")
    for workload in workloads:
        if workload not in WORKLOADS:
            raise ValueError(f"unknown workload {workload!r}; valid workloads: {', '.join(WORKLOADS)}")
    tasks = task_files(kernelbench) if kernelbench is not None else []
    bar = Progress(len(models) + len(tasks), enabled=progress, stream=sys.stderr)
    rows = run_models(models, workloads, settings, bar) if models else ()
    kb = run_kernelbench(kernelbench, settings, bar) if kernelbench is not None else None
    return BenchReport(environment(settings, command), rows, kb)
