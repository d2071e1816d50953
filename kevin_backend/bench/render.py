"""A `BenchReport` as a markdown table, a JSON file and a PNG bar chart (speedup over eager)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Sequence

from kevin_backend.bench.results import FAST_P, BenchReport, KernelBenchResult, ModelResult, TaskResult

__all__ = ["MissingDependency", "require_matplotlib", "markdown", "write_json", "write_chart", "interval"]


class MissingDependency(RuntimeError):
    """An optional package the asked-for output needs is not installed; the message says which."""


def require_matplotlib() -> None:
    """Raise MissingDependency unless matplotlib can be imported (the chart needs it)."""
    try:
        import matplotlib  # noqa: F401
    except ImportError as exc:
        raise MissingDependency(
            "the chart needs matplotlib, which is not installed: pip install 'kevin_backend[bench]' (or matplotlib)"
        ) from exc


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def _first_calls(row: ModelResult | TaskResult) -> str:
    values = [row.timing(c) for c in ("eager", "inductor", "kevin")]
    return " / ".join("-" if t is None or t.first_call_s is None else f"{t.first_call_s:.1f}" for t in values)


def _header(report: BenchReport) -> str:
    env = report.environment
    settings = env.get("settings") or {}
    where = env.get("gpu") or env.get("cpu") or "?"
    return (f"kevin bench on {where} ({env.get('device')}), torch {env.get('torch')}, dtype {settings.get('dtype')}, "
            f"size {settings.get('size')}, {settings.get('repeats')} rounds x {settings.get('trials')} trials"
            + (f" (more for a short step: rounds of at least {settings['round_ms']:g} ms)"
               if settings.get("round_ms") and settings.get("device") == "cuda" else "")
            + (f", until the paired interval is within +-{settings['precision']:.0%} (at most {settings.get('max_repeats')} rounds)"
               if settings.get("precision") and settings.get("device") == "cuda" else "")
            + (", the compilers taking turns call by call" if settings.get("interleave") == "call" else "") + ", "
            f"{env.get('date')}" + (f"; command: `{env['command']}`" if env.get("command") else ""))


def _label(r: ModelResult) -> str:
    """A row's model, with its size and dtype when the run names them."""
    return " ".join(x for x in (r.model, r.size, r.dtype) if x)


def interval(r: ModelResult | TaskResult | None) -> str:
    """` [low-high]`: the 95% interval of kevin over Inductor from the rounds paired ("" without one)."""
    paired = r.paired("kevin", "inductor") if r is not None else None
    return "" if paired is None else f" [{paired[1]:.2f}-{paired[2]:.2f}]"


_TIE = "tie (no kevin kernel ran)"


def _ran_no_kevin_kernel(r: ModelResult | TaskResult) -> bool:
    """Known to have run no kevin kernel: the kevin pass saw the graphs (not a compile Inductor's
    own cache served) and replaced no partition, so kevin ran Inductor's code."""
    stats = r.kevin
    return (stats is not None and stats.graphs > 0 and stats.hits == 0 and not getattr(r, "kernels", ())
            and not getattr(r, "kernel_calls", 0))


def _is_tie(r: ModelResult | TaskResult) -> bool:
    """kevin and Inductor ran the same code (no kevin kernel ran) and the paired interval of kevin
    over Inductor holds 1.00: a ratio away from 1 there is noise, shown as a tie."""
    paired = r.paired("kevin", "inductor")
    return paired is not None and paired[1] <= 1.0 <= paired[2] and _ran_no_kevin_kernel(r)


def _models_table(rows: Sequence[ModelResult]) -> list[str]:
    lines = [
        "Models: ms per step (median over rounds, compilers interleaved); speedups over eager and kevin over Inductor "
        "(in brackets: the 95% interval of kevin over Inductor from the rounds paired; one that holds 1.00 is a tie "
        f"within the noise; `{_TIE}` where it holds 1.00 and kevin ran Inductor's code alone)",
        "",
        "| model | size | dtype | workload | eager ms | inductor ms | kevin ms | inductor x eager | kevin x eager | kevin x inductor "
        "| kevin partitions | first call s (eager / inductor / kevin) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        kevin = r.kevin.short() if r.kevin else "-"
        lines.append(
            f"| {r.model} | {r.size or '-'} | {r.dtype or '-'} | {r.workload} | {_ms(r.ms('eager'))} | {_ms(r.ms('inductor'))} | {_ms(r.ms('kevin'))} | "
            f"{_x(r.speedup('inductor'))} | {_x(r.speedup('kevin'))} | "
            f"{_TIE if _is_tie(r) else _x(r.speedup('kevin', 'inductor')) + interval(r)} | "
            f"{kevin} | {_first_calls(r)} |"
        )
    notes = [f"- {_label(r)} {r.workload}: {r.error}" for r in rows if r.error]
    deviations = [f"{_label(r)} " + ", ".join(f"{c} {v:.2e}" for c, v in r.deviation.items()) for r in rows if r.deviation]
    if deviations:
        lines += ["", "Inference outputs, largest |compiled - eager|: " + "; ".join(deviations)]
    if notes:
        lines += ["", "Errors:", *notes]
    kept = [f"- {_label(r)} {r.workload}: " + "; ".join(r.kernels) for r in rows if r.kernels]
    lines += ["", "Kevin kernels run:", *kept] if kept else ["", "Kevin kernels run: none (Inductor's code ran every partition)"]
    checks = [f"- {_label(r)} {r.workload}: {line}" for r in rows for line in getattr(r, "graph_checks", ())]
    lines += ["", "Graph checks:", *checks] if checks else []
    described = dict.fromkeys((r.model, r.size, r.description) for r in rows)
    lines += ["", "Models: " + "; ".join(f"{m}{f' ({size})' if size else ''}: {d}" for m, size, d in described)]
    return lines


def _kernelbench_table(kb: KernelBenchResult) -> list[str]:
    correct = sum(t.correct for t in kb.tasks)
    lines = [
        f"KernelBench tasks in {kb.directory}: {len(kb.tasks)} tasks, kevin correct on {correct}",
        "",
        "| task | kevin correct | inductor correct | eager ms | inductor ms | kevin ms | kevin x eager | kevin x inductor "
        "| kevin partitions |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for t in kb.tasks:
        ok = "error" if t.error else ("yes" if t.correct else "NO")
        ind = "-" if t.error or t.inductor_correct is None else ("yes" if t.inductor_correct else "no")
        lines.append(
            f"| {t.task} | {ok} | {ind} | {_ms(t.ms('eager'))} | {_ms(t.ms('inductor'))} | {_ms(t.ms('kevin'))} | "
            f"{_x(t.speedup('kevin'))} | {_TIE if _is_tie(t) else _x(t.speedup('kevin', 'inductor'))} | "
            f"{t.kevin.short() if t.kevin else '-'}{f', {t.kernel_calls} kernel calls' if t.kernel_calls else ''} |"
        )
    table = kb.fast_p_table()
    lines += [
        "",
        "fast_p: the fraction of all tasks correct and more than p times faster than the baseline",
        "",
        "| baseline | " + " | ".join(f"fast_{p:g}" for p in FAST_P) + " |",
        "|---|" + "---|" * len(FAST_P),
    ]
    for baseline, values in table.items():
        lines.append(f"| {baseline} | " + " | ".join(f"{values[str(p)]:.2f}" for p in FAST_P) + " |")
    problems = [f"- {t.task}: {t.error or t.mismatch}" for t in kb.tasks if t.error or not t.correct]
    if problems:
        lines += ["", "Not correct:", *problems]
    return lines


def markdown(report: BenchReport) -> str:
    """The report as markdown: a header line, the models' table, the KernelBench table and fast_p."""
    lines = [_header(report), ""]
    if report.models:
        lines += _models_table(report.models) + [""]
    if report.kernelbench is not None:
        lines += _kernelbench_table(report.kernelbench) + [""]
    return "\n".join(lines).rstrip() + "\n"


def write_json(report: BenchReport, path: str | Path) -> None:
    Path(path).write_text(json.dumps(report.as_dict(), indent=1) + "\n")


def _bars(ax: Any, labels: list[str], rows: Sequence[ModelResult | TaskResult], title: str) -> None:
    import numpy as np

    x = np.arange(len(labels))
    width = 0.38
    for offset, compiler, color in ((-width / 2, "inductor", "#7f8c8d"), (width / 2, "kevin", "#2e86c1")):
        values = [r.speedup(compiler) for r in rows]
        heights = [math.nan if v is None else v for v in values]
        bars = ax.bar(x + offset, heights, width, label="Inductor" if compiler == "inductor" else "kevin", color=color)
        ax.bar_label(bars, labels=["" if v is None else f"{v:.2f}" for v in values], fontsize=7, padding=2)
    shown = [v for r in rows for v in (r.speedup("inductor"), r.speedup("kevin")) if v]
    log = bool(shown) and max(shown) / min(shown) > 8  # one outlier would flatten every other bar
    if log:
        ax.set_yscale("log")
    ax.axhline(1.0, color="black", linestyle="--", linewidth=0.8)
    ax.set_xlim(-0.5 - max(0.0, (4 - len(labels)) * 0.25), len(labels) - 0.5 + max(0.0, (4 - len(labels)) * 0.25))
    ax.set_xticks(x, labels, fontsize=8, rotation=30 if len(labels) > 8 else 0, ha="right" if len(labels) > 8 else "center")
    ax.set_ylabel("speedup over eager (x" + (", log scale)" if log else ")"))
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8)
    ax.margins(y=0.15)


def write_chart(report: BenchReport, path: str | Path) -> None:
    """A PNG: speedup over eager of Inductor and kevin, per model and workload (and per
    KernelBench task, in a second panel). Needs matplotlib (MissingDependency otherwise)."""
    require_matplotlib()
    from matplotlib.figure import Figure  # no pyplot: no global state, no display backend

    panels: list[tuple[list[str], Sequence[Any], str]] = []
    if report.models:
        labels = [f"{r.model}\n{' '.join(x for x in (r.size, r.dtype.replace('float', 'fp').replace('bfloat', 'bf')) if x)}\n{r.workload}"
                  + ("\n(error)" if r.error else "") for r in report.models]
        panels.append((labels, report.models, "Models: speedup over eager (dashed line: eager)"))
    kb = report.kernelbench
    if kb is not None and kb.tasks:
        labels = [t.task + ("" if t.correct else "\n(not correct)") for t in kb.tasks]
        title = f"KernelBench tasks: speedup over eager; fast_1 vs eager {kb.fast_p(1.0):.2f}"
        panels.append((labels, kb.tasks, title))
    if not panels:
        raise ValueError("nothing to chart: the report has no models and no tasks")
    width = max(6.0, 1.0 * max(len(p[0]) for p in panels) + 2.0)
    fig = Figure(figsize=(width, 3.8 * len(panels)), layout="constrained")
    axes = fig.subplots(len(panels), 1, squeeze=False)[:, 0]
    for ax, (labels, rows, title) in zip(axes, panels):
        _bars(ax, labels, rows, title)
    env = report.environment
    fig.suptitle(f"kevin bench: {env.get('gpu') or env.get('cpu') or env.get('device')}, torch {env.get('torch')}, "
                 f"{(env.get('settings') or {}).get('dtype')}", fontsize=10)
    fig.savefig(str(path), format="png", dpi=120)
