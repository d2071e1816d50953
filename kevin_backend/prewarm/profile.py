"""Profile-guided prewarm: which partitions are worth a search, and in what order.

    profiles = profile_items(items, device)        # each partition's Inductor time, once
    ranked = rank(profiles)                        # the largest expected gain first
    print(gain_table(ranked, outcomes))            # expected and measured gains, per partition and in all

A partition's share of the model's time is its Inductor time times how often the model runs it
(`WorkItem.occurrences`: a layer repeated four times runs its partitions four times). How far
that time is from the roofline is the time a copy of the partition's bytes takes (inputs read once,
outputs written once; `measure/roofline.py`) against the GPU's copy bandwidth. The expected gain of a
partition is the time a kernel at the roofline would save over Inductor's code:

    expected gain = occurrences x (Inductor ms - roofline ms)

which is the share of the model's time times the distance from the roofline, in milliseconds. On
a machine without a GPU there is no copy bandwidth: partitions rank by their Inductor time alone.
Profiling compiles and times each partition's reference in this process: the tasks are the
backend's own programs, not generated code.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import torch

__all__ = ["Profile", "profile_items", "rank", "gain_table", "parse_budget"]


@dataclass(frozen=True)
class Profile:
    digest: str
    name: str
    occurrences: int
    inductor_ms: float | None  # Inductor's code for the partition, one call
    roofline_ms: float | None  # its bytes at the GPU's copy bandwidth (None without a GPU)
    nbytes: int = 0
    error: str = ""  # why the partition could not be profiled (it then ranks last)

    @property
    def fraction(self) -> float | None:
        """Inductor's fraction of the roofline (1: at the copy bandwidth)."""
        if not self.inductor_ms or self.roofline_ms is None:
            return None
        return min(1.0, self.roofline_ms / self.inductor_ms)

    @property
    def expected_gain_ms(self) -> float | None:
        """Milliseconds per model step a kernel at the roofline would save (Inductor's time, when
        there is no roofline to measure against)."""
        if self.inductor_ms is None:
            return None
        floor = self.roofline_ms if self.roofline_ms is not None else 0.0
        return self.occurrences * max(0.0, self.inductor_ms - floor)


def profile_items(items: Sequence[Any], device: torch.device | str, trials: int = 20, warmup: int = 3,
                  progress: Any = None) -> list[Profile]:
    """Each item's partition timed as Inductor compiles it (its one graph called directly, as the
    judge and the backend's re-timing call it), with its roofline. A partition that fails to
    compile or run is profiled with its error, never the end of the run."""
    from kevin_backend.measure.inputs import make_input_set
    from kevin_backend.measure.inductor import inductor_call
    from kevin_backend.measure.roofline import copy_bandwidth, task_bytes
    from kevin_backend.measure.timer import make_timer

    device = torch.device(device)
    gbps = copy_bandwidth(device) if device.type == "cuda" else None
    measure = make_timer(device, trials, warmup, queued=True)
    profiles = []
    for n, item in enumerate(items, 1):
        task = item.task
        nbytes = task_bytes(task.inputs, task.outputs)
        roofline_ms = nbytes / (gbps * 1e6) if gbps else None
        occurrences = int(getattr(item, "occurrences", 1) or 1)
        try:
            module = task.load()
            torch.manual_seed(0)
            reference = module.Model(*module.get_init_inputs()).to(device).eval()
            values = make_input_set(module, 0, device).values
            with torch.no_grad():
                call, _ = inductor_call(reference, values, "inductor")
                ms: float | None = measure(call)
            error = ""
        except Exception as exc:  # noqa: BLE001 - a partition Inductor cannot take still gets searched, last
            ms, error = None, f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
        finally:
            torch._dynamo.reset()
        profiles.append(Profile(item.digest, task.name, occurrences, ms, roofline_ms, nbytes, error))
        if progress is not None:
            progress(profiles[-1], n, len(items))
    return profiles


def rank(profiles: Sequence[Profile]) -> list[Profile]:
    """The largest expected gain first; partitions that could not be profiled last."""
    return sorted(profiles, key=lambda p: (p.expected_gain_ms is None, -(p.expected_gain_ms or 0.0), p.digest))


_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0}


def parse_budget(text: str) -> float:
    """Seconds of `30m`, `90s`, `1.5h` or a plain number of seconds; ValueError naming the text."""
    found = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smh]?)\s*", text or "")
    if not found or float(found.group(1)) <= 0:
        raise ValueError(f"budget {text!r}: expected a duration such as 30m, 90s or 1.5h")
    return float(found.group(1)) * _UNITS.get(found.group(2) or "s", 1.0)


def gain_table(ranked: Sequence[Profile], outcomes: Mapping[str, Mapping[str, Any]]) -> str:
    """Markdown: per partition in rank order, its profile, the expected gain and what the search
    measured; then the totals over the model's partitions. `outcomes`: digest -> a prewarm
    outcome (status, speedup_vs_inductor); a partition without one was not searched (the budget
    ran out first) and stays pending."""
    lines = ["| rank | partition | times per step | Inductor ms | roofline ms | Inductor % of roofline | expected gain ms "
             "| outcome | kernel ms | measured gain ms |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    total_inductor = total_expected = total_measured = 0.0
    for i, p in enumerate(ranked, 1):
        outcome = outcomes.get(p.digest)
        status = outcome.get("status", "?") if outcome else "not searched (pending)"
        speedup = outcome.get("speedup_vs_inductor") if outcome else None
        kernel_ms = p.inductor_ms / speedup if (p.inductor_ms and speedup and status == "kernel") else None
        measured = p.occurrences * (p.inductor_ms - kernel_ms) if kernel_ms is not None and p.inductor_ms else 0.0
        if p.inductor_ms is not None:
            total_inductor += p.occurrences * p.inductor_ms
        total_expected += p.expected_gain_ms or 0.0
        total_measured += measured
        lines.append(
            f"| {i} | {p.name} `{p.digest[:12]}` | {p.occurrences} | {_num(p.inductor_ms, '.4f')} | {_num(p.roofline_ms, '.4f')} | "
            f"{_num(p.fraction, '.0%')} | {_num(p.expected_gain_ms, '.4f')} | {status}{' (' + p.error + ')' if p.error else ''} | "
            f"{_num(kernel_ms, '.4f')} | {measured:.4f} |")
    share = (lambda v: f" ({v / total_inductor:.0%} of it)") if total_inductor else (lambda v: "")
    lines += ["", f"model: the partitions' Inductor time per step {total_inductor:.4f} ms; expected gain at the roofline "
                  f"{total_expected:.4f} ms{share(total_expected)}; measured gain of the kernels kept "
                  f"{total_measured:.4f} ms{share(total_measured)}"]
    return "\n".join(lines)


def _num(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)
