"""`kevin bench --kernelbench DIR`: the backend over a folder of KernelBench-format tasks.

Each `*.py` file in DIR (not starting with `_`) defines `Model`, `get_inputs()` and
`get_init_inputs()`. For each task, in a fresh process: the task's `Model` compiled by the kevin
backend (mode `cache`, the user's kernel cache) and by Inductor; kevin's outputs checked against
eager's on two seeded input sets with the judge's comparison (`kevin_backend.measure.compare`: shape,
dtype, NaN/Inf, eager standing in for the exact reference); Inductor's checked alike, for reference; then eager,
Inductor and kevin timed, interleaved, under the judge's protocol.

KernelBench's metric: fast_p is the fraction of all tasks whose kevin outputs are correct and that
run more than p times faster than eager (fast_0: the fraction correct); reported for p in 0, 1,
1.5 and 2, against eager and against Inductor. Inputs are placed as the judge places them
(`measure/inputs.py`): `get_inputs()` runs under `placed_on(device)`, so its tensors are made on the
bench's device whatever device the task names, and anything made elsewhere is moved; init inputs
are moved. Tasks written with CPU or CUDA tensors both run, on a GPU or with `--device cpu`; their
dtypes are the task's own.
"""

from __future__ import annotations

import copy
import time
from pathlib import Path
from typing import Any

import torch

from kevin_backend.bench.common import BenchSettings, compile_model, compile_order, row_summary, short_error, sync
from kevin_backend.bench.isolate import WorkerError, run_isolated
from kevin_backend.bench.progress import Progress
from kevin_backend.bench.results import FAST_P, KernelBenchResult, KevinStats, TaskResult, Timing, fast_p
from kevin_backend.measure.compare import Mismatch, compare_outputs, output_list
from kevin_backend.measure.inputs import clone_layout, to_device
from kevin_backend.placement import placed_on

__all__ = ["FAST_P", "fast_p", "task_files", "measure_task", "run_kernelbench"]

SEEDS = (0, 1)  # input sets for the correctness check (the first is also timed)


def task_files(directory: str | Path) -> list[Path]:
    """The task files in `directory`, sorted (FileNotFoundError / NotADirectoryError / ValueError)."""
    folder = Path(directory)
    if not folder.exists():
        raise FileNotFoundError(f"no such folder: {folder}")
    if not folder.is_dir():
        raise NotADirectoryError(f"not a folder: {folder}")
    files = sorted(p for p in folder.glob("*.py") if not p.name.startswith("_"))
    if not files:
        raise ValueError(f"no task files (*.py) in {folder}")
    return files


def _clone(values: list[Any]) -> list[Any]:
    return [clone_layout(v) if isinstance(v, torch.Tensor) else v for v in values]


def _describe(bad: Mismatch) -> str:
    if not bad.total_elements:
        return f"{bad.reason}: {bad.message}"
    return (f"{bad.reason}: output {bad.output}: {bad.bad_elements}/{bad.total_elements} elements off, max abs error "
            f"{bad.max_abs_error:.3g} (at {bad.first_bad_index}: expected {bad.expected:.6g}, got {bad.got:.6g})")


def measure_task(path: str | Path, settings: BenchSettings, first: str = "inductor") -> TaskResult:
    """One task, in this process; any failure is the result's error."""
    path = Path(path)
    try:
        return _measure_task(path, settings, first)
    except Exception as exc:
        return TaskResult(task=path.stem, path=str(path), error=short_error(exc))
    finally:
        torch._dynamo.reset()


def _measure_task(path: Path, settings: BenchSettings, first: str) -> TaskResult:
    from kevin_backend.runtime.counters import counters
    from kevin_backend.runtime.registry import kernel_calls
    from kevin_backend.judge.static_judge import check_problem
    from kevin_backend.types import load_program

    source = path.read_text()
    check_problem(source)
    task = load_program(source, f"kevin_bench_{path.stem}")
    device = torch.device(settings.device)
    torch._dynamo.reset()
    torch.manual_seed(0)
    init = [to_device(v, device) for v in task.get_init_inputs()]
    model = task.Model(*init).to(device).eval()
    input_sets = []
    for seed in SEEDS:
        torch.manual_seed(seed)
        with placed_on(device):  # made where they run, as the judge makes them (`make_input_set`)
            values = list(task.get_inputs())
        input_sets.append([to_device(v, device) for v in values])  # layouts kept

    order = compile_order(first, 0)
    before, calls = counters.snapshot(), sum(kernel_calls().values())
    models = {"eager": model, **{c: compile_model(copy.deepcopy(model), c, settings) for c in order}}
    first_call: dict[str, float] = {}
    wrong: dict[str, str] = {}
    with torch.no_grad():
        for inputs in input_sets:
            outs: dict[str, list[Any]] = {}
            for compiler in ("eager", *order):
                sync(device)
                start = time.perf_counter()
                outs[compiler] = output_list(models[compiler](*_clone(inputs)))
                sync(device)
                first_call.setdefault(compiler, time.perf_counter() - start)
            for compiler in order:
                bad = compare_outputs(outs[compiler], outs["eager"], None)  # the judge's comparison, eager as reference
                if bad is not None and compiler not in wrong:
                    wrong[compiler] = _describe(bad)
        timed = input_sets[0]
        fns = {c: (lambda m=m: m(*timed)) for c, m in models.items()}
        rounds, _ = settings.rounds(fns)
    return TaskResult(
        task=path.stem, path=str(path), correct="kevin" not in wrong, inductor_correct="inductor" not in wrong,
        mismatch=wrong.get("kevin", ""),
        timings=tuple(Timing(c, rounds[c], first_call[c]) for c in ("eager", "inductor", "kevin")),
        kevin=KevinStats.between(before, counters.snapshot()), kernel_calls=sum(kernel_calls().values()) - calls,
    )


def run_kernelbench(directory: str | Path, settings: BenchSettings, progress: Progress | None = None) -> KernelBenchResult:
    """Every task in `directory`, each in its own worker process (or in this one when
    `settings.isolate` is False)."""
    files = task_files(directory)
    progress = progress or Progress(len(files), enabled=False)
    results = []
    for index, path in enumerate(files):
        first = "inductor" if index % 2 == 0 else "kevin"
        progress.start(f"task {path.stem}")
        if settings.isolate:
            job = {"kind": "task", "path": str(path), "settings": settings.as_dict(), "first": first}
            try:
                outcome = run_isolated(job, settings.timeout_s, settings.inductor_cache)
                if "error" in outcome:
                    raise WorkerError(outcome["error"])
                result = TaskResult.from_dict(outcome["result"])
            except WorkerError as exc:
                result = TaskResult(task=path.stem, path=str(path), error=str(exc))
        else:
            result = measure_task(path, settings, first)
        results.append(result)
        if result.error:
            summary = row_summary(result)
        else:
            summary = ("correct, " if result.correct else "WRONG, ") + row_summary(result)
            if not result.correct:
                summary += f"; {result.mismatch[:160]}"
        progress.finish(f"task {path.stem}", summary)
    return KernelBenchResult(str(directory), tuple(results))
