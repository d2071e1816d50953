"""The judge's timer on a GPU: queued (the judge) measures the GPU's own time for a call and
leaves the host's part out; not queued (whole models) includes it."""

from __future__ import annotations

import time

import pytest
import torch

from kevin_backend.measure.timer import _cycles_per_ms
from kevin_backend.measure.timer import make_timer as _timer

pytestmark = pytest.mark.gpu


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_queued_timing_leaves_the_host_part_out() -> None:
    device = torch.device("cuda")
    gpu_ms, host_ms = 0.05, 1.0
    cycles = int(gpu_ms * _cycles_per_ms())

    def call() -> None:  # 1 ms on the host, 0.05 ms on the GPU
        end = time.perf_counter() + host_ms / 1e3
        while time.perf_counter() < end:
            pass
        torch.cuda._sleep(cycles)

    queued = _timer(device, trials=20, warmup=2, queued=True)(call)
    whole = _timer(device, trials=20, warmup=2, queued=False)(call)
    print(f"queued {queued:.4f} ms, end to end {whole:.4f} ms")
    assert queued < 0.3 * host_ms, queued  # the GPU's 0.05 ms, give or take, not the host's 1 ms
    assert queued > 0.5 * gpu_ms, queued
    assert whole > host_ms, whole


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_queued_timing_holds_when_the_host_slows_down_after_its_estimate() -> None:
    # As on a loaded machine: the first calls (the estimate of the time to queue) are quick, the
    # trials' are slow, so the GPU runs dry before they are all queued; the timer must notice and
    # measure again with a longer busy period instead of counting the host's time
    device = torch.device("cuda")
    gpu_ms, warmup = 0.05, 2
    cycles = int(gpu_ms * _cycles_per_ms())
    calls = [0]

    def call() -> None:
        calls[0] += 1
        end = time.perf_counter() + (0.02 if calls[0] <= warmup + 3 else 1.0) / 1e3
        while time.perf_counter() < end:
            pass
        torch.cuda._sleep(cycles)

    queued = _timer(device, trials=20, warmup=warmup, queued=True)(call)
    print(f"queued {queued:.4f} ms after {calls[0]} calls")
    assert calls[0] > warmup + 3 + 20  # measured more than once
    assert 0.5 * gpu_ms < queued < 0.3, queued


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_the_judge_measures_inductor_once_per_task(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from kevin_backend.generate.builtin.planner import plan_task
    from kevin_backend.generate.builtin.program import write_program
    from kevin_backend.generate.builtin.variants import VARIANTS_POINTWISE
    from kevin_backend.generate.builtin.suite import SUITE
    from kevin_backend.judge.judge import Judge
    from kevin_backend.judge.sandbox import RunConfig

    task = next(t for t in SUITE if t.name == "gated-f32")
    plan = plan_task(task.source)
    assert plan
    judge = Judge(tmp_path, RunConfig(trials=20, warmup=3))
    first, second = (judge.judge(task.source, write_program(plan, VARIANTS_POINTWISE[i])) for i in (0, 1))
    print(first.timings, second.timings)
    assert first.correct and second.correct
    assert second.timings.inductor_ms == first.timings.inductor_ms  # measured with the first, reused
    assert second.timings.kernel_ms is not None and second.timings.speedup_vs_inductor is not None
