"""`kevin bench`: eager, Inductor and the kevin backend on benchmark models and KernelBench tasks.

    from kevin_backend.bench import BenchSettings, run_bench, markdown, write_chart
    report = run_bench(["mlp", "gpt2"], ["infer", "train"], settings=BenchSettings(device="cuda"))
    print(markdown(report)); write_chart(report, "bench.png")

Modules: `timing` (the judge's timing protocol, interleaved), `models` (the benchmark models),
`common` (settings, compiling a model, the order of compilers, a row's progress line: what the
next two share), `runner` (models x workloads), `kernelbench` (a folder of tasks, fast_p),
`results` (frozen result dataclasses, JSON round trip), `report` (markdown, JSON, PNG chart),
`isolate` and `worker` (a fresh process per model or task: the parent's and the worker's side),
`progress` (the lines on stderr).
"""

from kevin_backend.bench.common import DTYPES, BenchSettings
from kevin_backend.bench.kernelbench import measure_task, run_kernelbench, task_files
from kevin_backend.bench.models import MODELS, SIZES, WORKLOADS, make_model
from kevin_backend.bench.report import MissingDependency, markdown, require_matplotlib, write_chart, write_json
from kevin_backend.bench.results import (
    COMPILERS,
    FAST_P,
    BenchReport,
    KernelBenchResult,
    KevinStats,
    ModelResult,
    TaskResult,
    Timing,
    fast_p,
)
from kevin_backend.bench.runner import kevin_options, measure_model, run_bench, run_models
from kevin_backend.bench.timing import interleaved, measure_ms, timer

__all__ = [
    "BenchReport", "BenchSettings", "COMPILERS", "DTYPES", "FAST_P", "KernelBenchResult", "KevinStats", "MODELS",
    "MissingDependency", "ModelResult", "SIZES", "TaskResult", "Timing", "WORKLOADS", "fast_p", "interleaved",
    "kevin_options", "make_model", "markdown", "measure_ms", "measure_model", "measure_task", "require_matplotlib",
    "run_bench", "run_kernelbench", "run_models", "task_files", "timer", "write_chart", "write_json",
]
