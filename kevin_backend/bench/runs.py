"""`kevin bench` on models: eager, Inductor and kevin, for inference and a training step.

For each model, in a fresh process with an empty Inductor cache (`isolate.py`, `child.py`), for each workload:

  1. the model and its inputs (`models.py`), a copy compiled with Inductor and a copy compiled with
     the kevin backend in mode `cache` on the user's kernel cache (which compiles first alternates
     model by model and workload by workload)
  2. the first call of each (compile + one step, wall time); for inference, how far each compiled
     output is from eager's
  3. the step timed under the judge's protocol (`measure/interleave.py`), `repeats` rounds of `trials` calls
     (more for a step shorter than `round_ms / trials`: a round lasts at least `round_ms`),
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
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from kevin_backend.bench.common import DTYPES, BenchSettings, compile_model, compile_order, row_summary, short_error, sync
from kevin_backend.bench.isolate import WorkerError, run_isolated
from kevin_backend.bench.kernelbench import run_kernelbench, task_files
from kevin_backend.bench.models import MODELS, WORKLOADS, describe, make_model
from kevin_backend.bench.progress import Progress
from kevin_backend.bench.results import COMPILERS, BenchReport, KevinStats, ModelResult, Timing
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


def model_step(model: Any, inputs: tuple[Any, ...], train: bool) -> Callable[[], Any]:
    """One step of a bench model as kevin bench times it: a training step's forward and backward
    (its gradients cleared first), or inference under no_grad (returning the output)."""
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


def _measure_workload(name: str, workload: str, settings: BenchSettings, order: tuple[str, str]) -> ModelResult:
    from kevin_backend.backend.report import collecting_reports
    from kevin_backend.runtime.counters import counters

    device = torch.device(settings.device)
    train = workload == "train"
    model, inputs = make_model(name, workload, device, settings.torch_dtype, settings.size)
    before = counters.snapshot()
    models = {"eager": model, **{c: compile_model(copy.deepcopy(model), c, settings) for c in order}}
    steps = {c: model_step(m, inputs, train) for c, m in models.items()}
    first_call: dict[str, float] = {}
    outputs: dict[str, Any] = {}
    kevin_reports: list[Any] = []
    for compiler in ("eager", *order):
        sync(device)
        start = time.perf_counter()
        with collecting_reports() as reports:  # the first call compiles: what the kevin pass did
            out = steps[compiler]()
        sync(device)
        first_call[compiler] = time.perf_counter() - start
        if compiler == "kevin":
            kevin_reports = reports
        if isinstance(out, torch.Tensor):
            outputs[compiler] = out
    deviation = {c: _deviation(outputs[c], outputs["eager"]) for c in order if c in outputs and "eager" in outputs}
    outputs.clear()
    rounds, trials = settings.rounds(steps)  # a short step gets more calls per round (settings.round_ms)
    stats = KevinStats.between(before, counters.snapshot())
    # read after the timed calls: a training graph whose kernels are all in its backward is checked
    # on its second call (graph_check.py), and its drops and note land in the first call's reports then
    kept, checks = kept_kernels(kevin_reports), graph_checks(kevin_reports)
    return ModelResult(
        model=name, workload=workload, description=describe(name, settings.size), size=settings.size, dtype=settings.dtype,
        timings=tuple(Timing(c, rounds[c], first_call[c]) for c in COMPILERS),
        kevin=stats, deviation=deviation, kernels=tuple(kept), graph_checks=tuple(checks), trials=trials,
    )


def kept_kernels(reports: Sequence[Any]) -> list[str]:
    """One line per partition a kevin kernel runs (hit in the cache, or generated): its graph,
    key, ops and the speedup over Inductor its entry records."""
    from kevin_backend.backend.report import Status, short_op

    lines = []
    for report in reports:
        for graph in report.graphs:
            for r in graph.partitions:
                if r.status in (Status.HIT, Status.GENERATED):
                    ops = ", ".join(dict.fromkeys(short_op(o) for o in r.ops))
                    speed = f", {r.speedup_vs_inductor:.2f}x Inductor" if r.speedup_vs_inductor else ""
                    lines.append(f"{graph.kind} {(r.key or '')[:12]} {len(r.ops)} ops [{ops}]{speed}")
    return lines


def graph_checks(reports: Sequence[Any]) -> list[str]:
    """What each graph-level check found (its note: how many kernels it kept, from which
    comparisons), then one line per kernel it dropped: its graph, key, ops and the reason."""
    from kevin_backend.backend.report import Status, short_op

    lines = [note for report in reports for note in report.notes if note.startswith("graph check")]
    for report in reports:
        for graph in report.graphs:
            for r in graph.partitions:
                if r.status is Status.DROPPED:
                    ops = ", ".join(dict.fromkeys(short_op(o) for o in r.ops))
                    lines.append(f"dropped: {graph.kind} {(r.key or '')[:12]} [{ops}]: {r.detail}")
    return lines


def measure_model(name: str, workloads: Sequence[str], settings: BenchSettings, first: str = "inductor") -> list[ModelResult]:
    """Every workload of model `name`, in this process (one failure is that row's error)."""
    results = []
    for index, workload in enumerate(workloads):
        torch._dynamo.reset()  # each workload compiles from scratch
        try:
            results.append(_measure_workload(name, workload, settings, compile_order(first, index)))
        except Exception as exc:
            results.append(ModelResult(model=name, workload=workload, description=describe(name, settings.size),
                                       size=settings.size, dtype=settings.dtype, error=short_error(exc)))
        finally:
            gc.collect()
            if torch.device(settings.device).type == "cuda":
                torch.cuda.empty_cache()
    torch._dynamo.reset()
    return results


def run_models(
    names: Sequence[str], workloads: Sequence[str], settings: BenchSettings, progress: Progress | None = None
) -> tuple[ModelResult, ...]:
    """Each model in its own worker process (or in this one: `settings.isolate=False`)."""
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
                got = [ModelResult(model=name, workload=w, description=describe(name, settings.size),
                                   size=settings.size, dtype=settings.dtype, error=str(exc))
                       for w in workloads]
        else:
            got = measure_model(name, workloads, settings, first)
        rows.extend(got)
        progress.finish(name, "; ".join(row_summary(r, r.workload) for r in got))
    return tuple(rows)


def environment(settings: BenchSettings, command: str | None = None) -> dict[str, Any]:
    """Where and how the benchmark ran (the report's header)."""
    from kevin_backend.version import __version__

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
