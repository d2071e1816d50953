"""`kevin bench`: eager, Inductor and the kevin backend on benchmark models and KernelBench tasks.

    from kevin_backend.bench import BenchSettings, run_bench, markdown, write_chart
    report = run_bench(["mlp", "gpt2"], ["infer", "train"], settings=BenchSettings(device="cuda"))
    print(markdown(report)); write_chart(report, "bench.png")

Modules: `models` (the benchmark models), `common` (settings, compiling a model, the order of
compilers, a row's progress line: what the next two share), `runs` (models x workloads),
`kernelbench` (a folder of tasks, fast_p), `results` (frozen result dataclasses, JSON round trip),
`render` (markdown, JSON, PNG chart), `isolate` and `child` (a fresh process per model or task:
the parent's and the child's side), `progress` (the lines on stderr). Timing is
`kevin_backend.measure`'s (the one timer, interleaved).
"""

from kevin_backend.bench.common import DTYPES, BenchSettings
from kevin_backend.bench.kernelbench import measure_task, run_kernelbench, task_files
from kevin_backend.bench.models import MODELS, SIZES, WORKLOADS, make_model
from kevin_backend.bench.render import MissingDependency, markdown, require_matplotlib, write_chart, write_json
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
from kevin_backend.bench.runs import kevin_options, measure_model, run_bench, run_models

__all__ = [
    "BenchReport", "BenchSettings", "COMPILERS", "DTYPES", "FAST_P", "KernelBenchResult", "KevinStats", "MODELS",
    "MissingDependency", "ModelResult", "SIZES", "TaskResult", "Timing", "WORKLOADS", "fast_p",
    "kevin_options", "make_model", "markdown", "measure_model", "measure_task", "require_matplotlib",
    "run_bench", "run_kernelbench", "run_models", "task_files", "write_chart", "write_json",
]
