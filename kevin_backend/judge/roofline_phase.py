"""The roofline phase of a judged run (`measure/roofline.py`): the GPU's copy bandwidth, measured
once per GPU and software under the timing lock, and for an accepted candidate the bytes its
task must move and its matmul/convolution FLOPs, from which the judge derives each side's
fraction of the copy bandwidth. A failure here is never the candidate's: the verdict then
carries no roofline (a CUDA fault the candidate left behind still surfaces).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch

from kevin_backend.judge.attribution import CUDA_FAULTS
from kevin_backend.judge.judged_run import Run

__all__ = ["measured_copy_bandwidth", "roofline_facts"]


def measured_copy_bandwidth(run: Run) -> float | None:
    """The GPU's copy bandwidth (`measure/roofline.py`): kept under the build folder, measured by the
    first worker that needs it. A failure to measure it is never the candidate's: the verdict
    then carries no roofline (a CUDA fault the candidate left behind still surfaces)."""
    if run.device.type != "cuda":
        return None
    from pathlib import Path

    from kevin_backend.measure.roofline import copy_bandwidth

    run.phase("roofline")
    build_root = run.job.build_root
    try:
        gbps = copy_bandwidth(run.device, Path(build_root) / "copy_bandwidth" if build_root else None)
    except Exception as exc:  # noqa: BLE001 - the judge's measurement, not the candidate's
        if any(f in str(exc).lower() for f in CUDA_FAULTS):
            raise
        run.ledger.notes.append(f"no copy bandwidth measured ({type(exc).__name__}: {str(exc).splitlines()[0][:200]})")
        return None
    finally:
        # the copy's two buffers are the measurement's, not the run's: they leave the peak
        torch.cuda.reset_peak_memory_stats(run.device)
    return gbps


def roofline_facts(run: Run, sample: Callable[[], tuple[Sequence[Any], Sequence[Any]]],
                   copy_gbps: float | None) -> dict[str, Any] | None:
    """What the judge needs for an accepted kernel's roofline: the bytes the task must move (its
    inputs as laid out, its outputs), its matmul/convolution FLOPs, the copy bandwidth. None
    without a copy bandwidth, or when counting failed (the verdict stands without a roofline).
    `sample()` gives a set of inputs and the reference's outputs on it, asked for only when the
    task's counts are not already kept."""
    if copy_gbps is None:
        return None
    from kevin_backend.measure.roofline import task_bytes, task_flops

    run.phase("roofline")
    try:
        counts = run.state.counts if run.state is not None else None
        if counts is None:  # what the task moves and computes: counted once per task and worker
            inputs, outputs = sample()
            run.phase("roofline")
            counts = (task_bytes(inputs, outputs), task_flops(run.reference, inputs))
            if run.state is not None:
                run.state.counts = counts
        return {"bytes": counts[0], "flops": counts[1], "copy_gbps": copy_gbps}
    except Exception as exc:  # noqa: BLE001 - the judge's counting, not the candidate's
        if any(f in str(exc).lower() for f in CUDA_FAULTS):
            raise
        run.ledger.notes.append(f"no roofline ({type(exc).__name__}: {str(exc).splitlines()[0][:200]})")
        return None
