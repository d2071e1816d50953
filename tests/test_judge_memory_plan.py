"""The exact reference's plan counts what the candidate's process will hold beside it: the
candidate's copy of the inputs, its outputs and the judge's copy of them. On an H200 a task whose
inputs and outputs were each a twentieth of the GPU, beside a process holding half, took a float64
reference that fitted the judge's own bound and the free memory by itself, and then ran out of
memory in its own step once the candidate's buffers were there (RESOURCE, no verdict).

The device's numbers are set here (a CPU machine has none); sizes are MiB for the GPU's GiB."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from kevin_backend.judge.reference_sets import plan_exact
from kevin_backend.measure.inputs import InputSet
from kevin_backend.measure.memory import MemoryLedger

MIB = 1 << 20


def _plan(monkeypatch: pytest.MonkeyPatch, free_mib: int) -> tuple[torch.dtype | None, list[str]]:
    x = torch.zeros(7 * MIB // 4)  # 7 MiB of float32 in, 7 MiB out; eager's temporaries another 7 MiB
    want = [torch.zeros(7 * MIB // 4)]
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: 14 * MIB)
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: 14 * MIB)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (free_mib * MIB, 140 * MIB))
    ledger = MemoryLedger(torch.device("cuda", 0), task_bytes=14 * MIB)
    run = SimpleNamespace(reference=torch.nn.Identity(), ledger=ledger)
    return plan_exact(run, InputSet([x], 11, 0), want, 7 * MIB), ledger.notes  # type: ignore[arg-type]


def test_a_float64_reference_is_not_planned_where_the_candidate_would_then_not_fit(monkeypatch: pytest.MonkeyPatch) -> None:
    # 54 free: the float64 run alone (42) fits 90% of it (48.6); with the candidate's 21 beside it, not
    dtype, notes = _plan(monkeypatch, 54)
    assert dtype is None
    assert any("the candidate 0.02 GiB beside it" in n and "not taken" in n for n in notes), notes


def test_with_room_for_both_the_float64_reference_is_planned(monkeypatch: pytest.MonkeyPatch) -> None:
    dtype, notes = _plan(monkeypatch, 80)  # 63 <= 72
    assert dtype is torch.float64 and not notes


def test_the_judges_own_bound_still_applies(monkeypatch: pytest.MonkeyPatch) -> None:
    ledger = MemoryLedger(torch.device("cuda", 0), task_bytes=14 * MIB)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: 14 * MIB)
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: 14 * MIB)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (10_000 * MIB, 20_000 * MIB))
    assert ledger.fits(42 * MIB, beside=1000 * MIB)  # the judge's own: within 3 x task; the device: plenty
    assert not ledger.fits(43 * MIB)  # beyond the judge's bound, whatever the device has


def test_the_timings_slots_are_reported_apart_from_the_judges_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    # On an H200 a 48 MiB task's 32 timing slots (1.3 GiB, outside torch's allocator, within their
    # own allowance) were counted as the judge's extra: 1.38 GB reported against a 0.28 GB bound.
    from kevin_backend.measure import memory

    allocated = {"now": 14 * MIB, "peak": 14 * MIB}
    for name, value in (("synchronize", lambda device=None: None), ("reset_peak_memory_stats", lambda device=None: None),
                        ("memory_allocated", lambda device=None: allocated["now"]),
                        ("max_memory_allocated", lambda device=None: allocated["peak"]),
                        ("memory_reserved", lambda device=None: allocated["peak"]),
                        ("mem_get_info", lambda device=None: (10_000 * MIB, 20_000 * MIB))):
        monkeypatch.setattr(torch.cuda, name, value)
    monkeypatch.setattr(memory, "_OUTSIDE", {})
    monkeypatch.setattr(memory, "_SLOTS", {})
    device = torch.device("cuda", 0)
    ledger = MemoryLedger(device, task_bytes=14 * MIB)
    ledger.start()
    allocated["peak"] = 14 * MIB + 20 * MIB  # the judge's own: 20 MiB of torch's memory at its peak
    memory.note_outside(device, 6 * MIB)  # a buffer shared with the candidate's process: the judge's
    ledger.observe()
    memory.note_outside(device, 1300 * MIB, slots=True)  # the slots
    ledger.observe()
    assert ledger.held() == 6 * MIB and ledger.fits(30 * MIB)  # the slots take nothing from the bound
    ledger.enter("reference")  # on an H200 the slots outlived the timing (the processes they were shared
    ledger.observe()           # with still mapped them) and a later step counted them: 1.12 GB
    memory.note_outside(device, -1300 * MIB, slots=True)
    report = ledger.report()
    assert report.judge_extra_bytes == 26 * MIB - 14 * MIB <= report.budget_bytes
    assert report.slot_bytes == 1300 * MIB


def test_the_report_names_the_step_that_took_the_most() -> None:
    # an H200 eval reported 1.09 GB of the judge's extra against a 0.28 GB bound, with nothing to
    # say where it was taken: the report names the step in which the peak was reached
    ledger = MemoryLedger(torch.device("cpu"), task_bytes=14 * MIB)
    for step, held in (("inputs", 20 * MIB), ("exact", 60 * MIB), ("compare", 30 * MIB), ("roofline", 50 * MIB)):
        ledger.enter(step)
        ledger.grow(held)
    report = ledger.report()
    assert (report.peak_bytes, report.peak_step) == (60 * MIB, "exact")
    assert report.as_dict()["peak_step"] == "exact"
