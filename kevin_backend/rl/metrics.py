"""What a training run reports per batch, where it writes it, and the plot of it.

Per batch: the rewards (mean score, correctness rate, mean speedup of the correct kernels), the
reply lengths, and two early warnings of degenerate "junk" outputs: the share of replies whose
reasoning does not open the way the model's normally does (Kevin-32B's "not okay" ratio, which
rose about 15 steps before the junk) and the share of replies caught in a repeated n-gram loop;
per gradient step: the loss, the clipped-token share, the importance ratios, the gradient norm
before and after clipping, the learning rate. The warm start (`sft.py`) adds a line of kind
"sft" per optimizer step (loss, gradient norm, learning rate) and one of kind "sft_summary"
(loss, token accuracy and exact replies before and after); batch lines have no kind.

    writer = MetricsWriter(run_dir, tensorboard=True)   # <run_dir>/metrics.jsonl, <run_dir>/tensorboard/
    writer.write(metrics)
    plot_metrics(run_dir)                               # <run_dir>/metrics.png
"""

from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Sequence

from kevin_backend.rl.train_config import MonitorSettings
from kevin_backend.rl.samples import Sample

__all__ = ["StepStats", "BatchMetrics", "rollout_stats", "has_repeated_ngram", "opens_as_expected",
           "MetricsWriter", "read_metrics", "read_sft_metrics", "plot_metrics", "METRICS_FILE"]

METRICS_FILE = "metrics.jsonl"


@dataclass(frozen=True)
class StepStats:
    """One optimizer step (of the `steps_per_batch` taken on a batch)."""

    index: int  # 0: on-policy; 1...: off-policy against the stored log-probs
    loss: float
    policy_loss: float  # mean over completion tokens
    kl: float | None  # mean over completion tokens; None without a reference
    clip_fraction: float  # share of completion tokens whose ratio was clipped
    ratio_mean: float
    ratio_max: float
    grad_norm: float | None  # before clipping
    grad_norm_clipped: float | None  # after clipping (None where it cannot be measured cheaply)
    lr: float


@dataclass(frozen=True)
class BatchMetrics:
    batch: int  # 1-based count of batches trained
    optimizer_step: int
    tasks: int
    samples: int
    mean_score: float
    correct_rate: float
    mean_speedup: float | None  # over eager, of the correct replies; None when none was correct
    best_score: float
    mean_return: float
    reply_tokens: float  # mean completion length
    truncated_rate: float  # replies cut at max_tokens
    not_opener_rate: float | None  # None when monitor.reasoning_opener is not set
    repetition_rate: float
    rollout_seconds: float
    train_seconds: float
    steps: tuple[StepStats, ...]

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["steps"] = [asdict(s) for s in self.steps]
        return data


def has_repeated_ngram(ids: Sequence[int], n: int, count: int) -> bool:
    """Whether some n-gram of `ids` occurs at least `count` times (overlaps included): the mark
    of a reply stuck in a loop."""
    if len(ids) < n + count - 1:
        return False
    seen: Counter[tuple[int, ...]] = Counter()
    for i in range(len(ids) - n + 1):
        gram = tuple(ids[i: i + n])
        seen[gram] += 1
        if seen[gram] >= count:
            return True
    return False


def opens_as_expected(text: str, opener: str) -> bool:
    """Whether a completion starts with `opener` (ignoring leading white space and a `<think>`
    tag the model writes itself when the chat template did not open it)."""
    body = text.lstrip()
    if body.startswith("<think>") and not opener.startswith("<think>"):
        body = body[len("<think>"):].lstrip()
    return body.startswith(opener)


def _mean(values: Sequence[float]) -> float:
    return math.fsum(values) / len(values) if values else 0.0


def rollout_stats(samples: Sequence[Sample], monitor: MonitorSettings) -> dict[str, Any]:
    """The reward and health fields of `BatchMetrics` for the real (weight > 0) samples."""
    real = [s for s in samples if s.weight > 0]
    speedups = [s.speedup for s in real if s.correct and s.speedup is not None]
    opener = monitor.reasoning_opener
    return {
        "samples": len(real),
        "mean_score": _mean([s.score for s in real]),
        "correct_rate": _mean([1.0 if s.correct else 0.0 for s in real]),
        "mean_speedup": _mean(speedups) if speedups else None,
        "best_score": max((s.score for s in real), default=0.0),
        "mean_return": _mean([s.ret for s in real]),
        "reply_tokens": _mean([float(len(s.completion_ids)) for s in real]),
        "truncated_rate": _mean([1.0 if s.finish_reason == "length" else 0.0 for s in real]),
        "not_opener_rate": None if not opener else _mean(
            [0.0 if opens_as_expected(s.text, opener) else 1.0 for s in real]),
        "repetition_rate": _mean([1.0 if has_repeated_ngram(s.completion_ids, monitor.repeat_ngram,
                                                            monitor.repeat_count) else 0.0 for s in real]),
    }


class MetricsWriter:
    """Appends each batch's metrics to `<run_dir>/metrics.jsonl` (flushed, so a killed run keeps
    every finished batch) and, when asked, to TensorBoard under `<run_dir>/tensorboard/`."""

    def __init__(self, run_dir: Path, tensorboard: bool = True) -> None:
        self.path = Path(run_dir) / METRICS_FILE
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._tb = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError as exc:
                raise ImportError("monitor.tensorboard needs tensorboard: pip install tensorboard "
                                  "(or set monitor.tensorboard: false)") from exc
            self._tb = SummaryWriter(str(Path(run_dir) / "tensorboard"))

    def write(self, metrics: BatchMetrics) -> None:
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(metrics.as_dict()) + "\n")
            f.flush()
        if self._tb is None:
            return
        scalars = {k: v for k, v in metrics.as_dict().items() if isinstance(v, (int, float)) and k != "batch"}
        for name, value in scalars.items():
            self._tb.add_scalar(f"rollout/{name}", value, metrics.batch)
        for step in metrics.steps:
            at = metrics.optimizer_step - len(metrics.steps) + step.index + 1
            for name, value in asdict(step).items():
                if name != "index" and isinstance(value, (int, float)):
                    self._tb.add_scalar(f"train/{name}", value, at)
        self._tb.flush()

    def _line(self, row: dict[str, Any]) -> None:
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(row) + "\n")
            f.flush()

    def write_sft(self, step: Any) -> None:
        """One warm-start step (`sft.SFTStep`)."""
        self._line(step.as_dict())
        if self._tb is not None:
            for name in ("loss", "grad_norm", "lr"):
                self._tb.add_scalar(f"sft/{name}", getattr(step, name), step.step)
            self._tb.flush()

    def write_sft_summary(self, report: Any) -> None:
        """The warm start's summary (`sft.SFTReport`)."""
        self._line(report.as_dict())
        if self._tb is not None:
            for name, value in report.as_dict().items():
                if isinstance(value, (int, float)):
                    self._tb.add_scalar(f"sft_summary/{name}", value, 0)
            self._tb.flush()

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()
            self._tb = None


def _read_lines(run_dir: Path) -> list[dict[str, Any]]:
    path = Path(run_dir) / METRICS_FILE
    if not path.is_file():
        raise FileNotFoundError(f"no {METRICS_FILE} in {run_dir}: not a training run folder, or no batch finished yet")
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    """The batches' lines, one per batch in order."""
    rows = [row for row in _read_lines(run_dir) if "kind" not in row]
    # a resumed run appends the batches after its checkpoint again: the latest line of a batch wins
    latest = {row["batch"]: row for row in rows}
    return [latest[b] for b in sorted(latest)]


def read_sft_metrics(run_dir: Path) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
    """The warm start's step lines (one per step, in order) and its summary (None when it did not
    finish or the run had none). A warm start begun again from scratch (its run was stopped
    before the checkpoint that records it) supersedes the lines of the earlier attempt."""
    steps: dict[int, dict[str, Any]] = {}
    summary = None
    for row in _read_lines(run_dir):
        if row.get("kind") == "sft":
            if row["step"] == 1:
                steps, summary = {}, None
            steps[row["step"]] = row
        elif row.get("kind") == "sft_summary":
            summary = row
    return [steps[s] for s in sorted(steps)], summary


_PANELS = (
    ("mean_score", "mean score"),
    ("correct_rate", "correct rate"),
    ("mean_speedup", "mean speedup (correct)"),
    ("reply_tokens", "reply tokens"),
    ("not_opener_rate", "not-opener rate"),
    ("repetition_rate", "repetition rate"),
    ("loss", "loss (first step)"),
    ("grad_norm", "grad norm (before clip)"),
)


_SFT_PANELS = (
    ("loss", "warm start: loss per reply token"),
    ("grad_norm", "warm start: grad norm (before clip)"),
)


def plot_metrics(run_dir: Path, out: Path | None = None) -> Path:
    """A PNG of the run's curves, one panel per signal, against the batch (and, for a run with a
    warm start, its loss and gradient norm against its step). Drawn on a bare matplotlib `Figure`
    (the Agg renderer writes the PNG), so no pyplot backend or global state is touched and no
    display is needed."""
    from matplotlib.figure import Figure

    rows = read_metrics(run_dir)
    sft, summary = read_sft_metrics(run_dir)
    out = Path(out) if out is not None else Path(run_dir) / "metrics.png"
    grid = 3 if sft else 2
    fig = Figure(figsize=(16, 3.5 * grid), layout="constrained")
    axes = fig.subplots(grid, 4)
    if sft:
        for ax, (key, title) in zip(axes.flat[8:], _SFT_PANELS):
            points = [(r["step"], r[key]) for r in sft if r.get(key) is not None]
            ax.plot([p[0] for p in points], [p[1] for p in points], marker=".", linewidth=1)
            if key == "loss":
                ax.set_yscale("log")
                if summary is not None:
                    ax.set_title(f"{title}\n(all demos: {summary['loss_before']:.3g} -> {summary['loss_after']:.3g}, "
                                 f"exact {summary['exact_after']:.0%})")
            if not ax.get_title():
                ax.set_title(title)
            ax.set_xlabel("warm-start step")
            ax.grid(True, alpha=0.3)
        for ax in axes.flat[8 + len(_SFT_PANELS):]:
            ax.set_visible(False)
    batches = [r["batch"] for r in rows]
    for ax, (key, title) in zip(axes.flat, _PANELS):
        if key in ("loss", "grad_norm"):
            values = [r["steps"][0][key] if r.get("steps") else None for r in rows]
        else:
            values = [r.get(key) for r in rows]
        points = [(b, v) for b, v in zip(batches, values) if v is not None]
        if points:
            ax.plot([p[0] for p in points], [p[1] for p in points], marker=".", linewidth=1)
        else:
            ax.text(0.5, 0.5, "not measured", ha="center", va="center", transform=ax.transAxes)
        ax.set_title(title)
        ax.set_xlabel("batch")
        ax.grid(True, alpha=0.3)
    fig.suptitle(f"{Path(run_dir).name}: {len(rows)} batches")
    fig.savefig(out, dpi=100, format="png")
    return out
