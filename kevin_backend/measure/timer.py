"""The one timing protocol of the project: the judge's candidate, eager and Inductor times,
`kevin bench`'s whole steps (`measure/interleave.py` takes turns with it), the graph check's
variants, the prewarm profile and the GPU's copy bandwidth (`measure/roofline.py`).

    measure = make_timer(torch.device("cuda"), trials=100, warmup=10, queued=True)
    ms = measure(lambda: model(*inputs))        # median milliseconds
    samples = trial_times(fn, torch.device("cuda"), trials=10, warmup=2)   # every trial's ms
"""

from __future__ import annotations

import math
import statistics
import time
from typing import Any, Callable

import torch

__all__ = ["flush_bytes", "make_timer", "trial_times"]

_FLUSH_UNKNOWN = 256 << 20  # where the device does not say its L2 size


def flush_bytes(device: torch.device) -> int:
    """The size of the buffer written before every trial to evict the inputs from L2: twice
    the device's L2 cache (120 MB on an H200), a fixed cost that does not grow with the task."""
    if device.type != "cuda":
        return 0
    l2 = int(getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0) or 0)
    return 2 * l2 if l2 > 0 else _FLUSH_UNKNOWN


def make_timer(device: torch.device, trials: int, warmup: int, queued: bool = False) -> Callable[[Callable[[], Any]], float]:
    """Median milliseconds of `fn` under one protocol for everything timed.

    Every trial starts with the L2 cache flushed. `queued=False` (whole models, `kevin bench`):
    the GPU is idle when a trial starts and the trial ends when all its work has, so the time
    includes the host's part (Python, dispatch, launches). `queued=True` (the judge, one subgraph
    at a time): the GPU is first kept busy while every trial is queued behind it, so each trial's
    two events measure the GPU's own time for it; the host's part, which in a compiled model
    overlaps the GPU's work and is paid per graph rather than per subgraph, is left out for the
    candidate, eager and Inductor alike (what a standalone call of a torch.compile'd function
    spends in guards and wrappers would otherwise dwarf a small kernel)."""
    flush = _flush_buffer(device)

    def measure(fn: Callable[[], Any]) -> float:
        for _ in range(warmup):
            fn()
        if device.type == "cuda" and queued:
            return _queued(fn, flush, trials)
        return statistics.median(_trials(fn, device, trials, flush))

    return measure


def trial_times(fn: Callable[[], Any], device: torch.device, trials: int, warmup: int) -> list[float]:
    """Every trial's milliseconds of `fn` under the protocol's unqueued form (L2 flushed, then a
    device-wide synchronisation, CUDA events around the call, a synchronisation after it; on a
    CPU, `time.perf_counter`), for a caller that keeps the samples."""
    for _ in range(warmup):
        fn()
    return _trials(fn, device, trials, _flush_buffer(device))


def _flush_buffer(device: torch.device) -> torch.Tensor | None:
    return torch.empty(flush_bytes(device) // 4, dtype=torch.int32, device=device) if device.type == "cuda" else None


def _trials(fn: Callable[[], Any], device: torch.device, trials: int, flush: torch.Tensor | None) -> list[float]:
    samples = []
    if device.type != "cuda" or flush is None:
        for _ in range(trials):
            start = time.perf_counter()
            fn()
            samples.append((time.perf_counter() - start) * 1e3)
        return samples
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(trials):
        flush.zero_()  # evict the inputs from L2
        torch.cuda.synchronize()  # device-wide: work on any stream ends before the timer starts
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()  # ... and before it stops
        samples.append(start.elapsed_time(end))
    return samples


def _queued(fn: Callable[[], Any], flush: Any, trials: int, attempts: int = 4) -> float:
    """Median GPU milliseconds of `fn`, every trial queued while the GPU is still busy.

    The GPU is kept busy for about twice the time the host needs to queue the trials (estimated
    from three calls). If queueing took longer than that (a loaded CPU, a call slower than its
    first three), the GPU ran dry and waited for the host inside some trials, which would then
    count the host's part: the measurement is repeated with a longer busy period."""
    torch.cuda.synchronize()
    host = time.perf_counter()
    for _ in range(3):  # the host's time to queue one trial, flush included
        flush.zero_()
        fn()
    host = (time.perf_counter() - host) / 3
    torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(trials)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(trials)]
    busy_ms = min(_MAX_BUSY_MS, 2.0 * host * 1e3 * trials + 1.0)  # GPU work ahead of the queue
    for _ in range(attempts):
        torch.cuda._sleep(int(busy_ms * _cycles_per_ms()))
        began = time.perf_counter()
        for i in range(trials):
            flush.zero_()  # evict the inputs from L2
            starts[i].record()
            fn()
            ends[i].record()
        queued_ms = (time.perf_counter() - began) * 1e3
        torch.cuda.synchronize()  # device-wide: every trial's work, on any stream, has ended
        if queued_ms < 0.8 * busy_ms or busy_ms >= _MAX_BUSY_MS:
            break
        busy_ms = min(_MAX_BUSY_MS, 3.0 * queued_ms + 1.0)  # the GPU ran dry: again, busy for longer
    return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends))


# The longest the GPU is kept busy ahead of one measurement's trials.
_MAX_BUSY_MS = 4000.0


_CYCLES_PER_MS: list[float] = []


def _cycles_per_ms() -> float:
    """GPU clock cycles per millisecond, as `torch.cuda._sleep` counts them (measured once: the
    fastest of three sleeps, since another process's kernels sharing the GPU only lengthen one)."""
    if not _CYCLES_PER_MS:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        fastest = math.inf
        for _ in range(3):
            torch.cuda.synchronize()
            start.record()
            torch.cuda._sleep(10_000_000)
            end.record()
            torch.cuda.synchronize()
            fastest = min(fastest, start.elapsed_time(end))
        _CYCLES_PER_MS.append(10_000_000 / max(fastest, 1e-3))
    return _CYCLES_PER_MS[0]
