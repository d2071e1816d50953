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


def _plan(monkeypatch: pytest.MonkeyPatch, free_mib: int, in_mib: int = 7, out_mib: int = 7,
          held_mib: int | None = None, floor_mib: int = 0) -> tuple[torch.dtype | None, list[str]]:
    x = torch.zeros(in_mib * MIB // 4)  # float32 in and out; eager's temporaries none
    want = [torch.zeros(out_mib * MIB // 4)]
    held = (in_mib + out_mib if held_mib is None else held_mib) * MIB
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: held)
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: held)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (free_mib * MIB, 140 * MIB))
    ledger = MemoryLedger(torch.device("cuda", 0), task_bytes=(in_mib + out_mib) * MIB,  # the bound: task + 3 x task
                          floor=floor_mib * MIB)  # (or task + the floor)
    run = SimpleNamespace(reference=torch.nn.Identity(), ledger=ledger)
    return plan_exact(run, InputSet([x], 11, 0), want, 0), ledger.notes  # type: ignore[arg-type]


def test_a_float64_reference_is_not_planned_where_the_candidate_would_then_not_fit(monkeypatch: pytest.MonkeyPatch) -> None:
    # 54 free: the float64 run (2 x (7 + 7) = 28) fits 90% of it (48.6); with the candidate's copy of
    # its inputs and its outputs beside it (7 + 2 x 7), not
    dtype, notes = _plan(monkeypatch, 54)
    assert dtype is None
    assert any("needs about 0.03 GiB more, the candidate 0.02 GiB beside it" in n and "not taken" in n for n in notes), notes


def test_with_room_for_both_the_float64_reference_is_planned(monkeypatch: pytest.MonkeyPatch) -> None:
    dtype, notes = _plan(monkeypatch, 80)  # 49 <= 72
    assert dtype is torch.float64 and not notes


def test_the_plan_counts_the_exact_outputs_beside_the_judges_copy_of_the_candidates(monkeypatch: pytest.MonkeyPatch) -> None:
    # 1 MiB in, 7 out, 12 held: the float64 run alone (16) fits the bound (12 + 16 <= 8 + 24), but
    # its outputs (14) are then kept beside the judge's copy of the candidate's (7): 12 + 21 > 32
    dtype, notes = _plan(monkeypatch, 10_000, in_mib=1, out_mib=7, held_mib=12)
    assert dtype is None
    assert any("a torch.float64 reference needs about 0.02 GiB more" in n for n in notes), notes
    assert _plan(monkeypatch, 10_000, in_mib=1, out_mib=7, held_mib=11)[0] is torch.float64  # 11 + 21 <= 32


def test_a_small_task_may_take_the_judges_floor_for_its_exact_run(monkeypatch: pytest.MonkeyPatch) -> None:
    # as above, 12 + 21 > 8 + 3 x 8; with a floor of 32 (the judge's 1 GiB, for a task of 8 GiB), 12 + 21 <= 8 + 32
    assert _plan(monkeypatch, 10_000, in_mib=1, out_mib=7, held_mib=12, floor_mib=24)[0] is None
    assert _plan(monkeypatch, 10_000, in_mib=1, out_mib=7, held_mib=12, floor_mib=32)[0] is torch.float64
    # a floor under 3 x task changes nothing; the device's free memory still bounds it
    assert _plan(monkeypatch, 10_000, in_mib=7, out_mib=7, floor_mib=1)[0] is torch.float64
    assert _plan(monkeypatch, 54, floor_mib=1024)[0] is None


def test_the_judges_runs_have_the_floor() -> None:
    import inspect

    from kevin_backend.judge import run_worker
    from kevin_backend.measure.memory import JUDGE_FLOOR

    assert JUDGE_FLOOR == 1 << 30 and "floor=JUDGE_FLOOR" in inspect.getsource(run_worker._run)


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
    monkeypatch.setattr(memory, "_APART", {"slots": {}, "inputs": {}})
    device = torch.device("cuda", 0)
    ledger = MemoryLedger(device, task_bytes=14 * MIB)
    ledger.start()
    allocated["peak"] = 14 * MIB + 20 * MIB  # the judge's own: 20 MiB of torch's memory at its peak
    memory.note_outside(device, 6 * MIB)  # a buffer shared with the candidate's process: the judge's
    ledger.observe()
    memory.note_outside(device, 1300 * MIB, apart="slots")  # the slots
    ledger.observe()
    assert ledger.held() == 6 * MIB and ledger.fits(30 * MIB)  # the slots take nothing from the bound
    ledger.enter("reference")  # on an H200 the slots outlived the timing (the processes they were shared
    ledger.observe()           # with still mapped them) and a later step counted them: 1.12 GB
    memory.note_outside(device, -1300 * MIB, apart="slots")
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


def _fake_allocator(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """torch's allocator statistics as a dict the test moves ("now", "peak"; a reset of the peak
    sets it to "now"), and the ledger's memory outside it empty."""
    from kevin_backend.measure import memory

    alloc = {"now": 0, "peak": 0}
    for name, value in (("synchronize", lambda device=None: None),
                        ("reset_peak_memory_stats", lambda device=None: alloc.update(peak=alloc["now"])),
                        ("memory_allocated", lambda device=None: alloc["now"]),
                        ("max_memory_allocated", lambda device=None: alloc["peak"])):
        monkeypatch.setattr(torch.cuda, name, value)
    monkeypatch.setattr(memory, "_OUTSIDE", {})
    monkeypatch.setattr(memory, "_APART", {"slots": {}, "inputs": {}})
    monkeypatch.setattr(memory, "_TOP", {})
    return alloc


def test_a_peak_of_one_step_is_not_added_to_a_buffer_made_in_a_later_one(monkeypatch: pytest.MonkeyPatch) -> None:
    # On an H200, mean over dim 1 of a 512 MiB input reported 1.86 GB of the judge's extra against a
    # 1.66 GB bound: the float64 reference's 1 GiB input copy (torch's peak, freed at the step's end)
    # was added to the candidate's 512 MiB input arena, made in the next step. (That arena is the
    # candidate's inputs once more, counted apart from the judge's extra, as the timing's slots are.)
    from kevin_backend.measure import memory

    alloc = _fake_allocator(monkeypatch)

    def allocate(nbytes: int) -> None:
        alloc["now"] += nbytes
        alloc["peak"] = max(alloc["peak"], alloc["now"])

    device = torch.device("cuda", 0)
    ledger = MemoryLedger(device, task_bytes=512 * MIB)
    ledger.start()
    ledger.enter("reference")
    allocate(512 * MIB)  # the input set
    ledger.enter("exact")
    allocate(1024 * MIB)  # the float64 copy of the input, freed when the exact run ends
    allocate(-1024 * MIB)
    ledger.enter("candidate")
    memory.note_outside(device, 512 * MIB, apart="inputs")  # the candidate's copy of its input, shared with its process
    memory.note_outside(device, 256 * MIB)  # a buffer of the judge's own
    memory.note_outside(device, -256 * MIB)
    ledger.enter("compare")
    report = ledger.report()
    assert (report.peak_bytes, report.peak_step) == (1536 * MIB, "exact"), report
    assert report.candidate_inputs_bytes == 512 * MIB and report.slot_bytes == 0
    # by step: what was held when it began (the input set, kept from "reference" on), and its peak
    assert report.steps == {"reference": [0, 512 * MIB], "exact": [512 * MIB, 1536 * MIB],
                            "candidate": [512 * MIB, 768 * MIB], "compare": [512 * MIB, 512 * MIB]}, report.steps


def test_a_timed_call_is_checked_against_eager_alone_where_its_exact_reference_does_not_fit(monkeypatch: pytest.MonkeyPatch) -> None:
    # On an H200 the timing's check held both checked calls' outputs, eager's and the float64
    # reference's at once: 4 GiB beyond a 1 GiB task, against a 3.1 GiB bound
    from kevin_backend.judge.timing_phase import _exact_fits

    held = {"now": 0}
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: held["now"])
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: held["now"])
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (10_000 * MIB, 20_000 * MIB))
    ledger = MemoryLedger(torch.device("cuda", 0), task_bytes=14 * MIB)  # the bound: 56 held
    run = SimpleNamespace(reference=torch.nn.Identity(), ledger=ledger, exact_dtype=torch.float64, reference_temps=0)
    inputs, want = InputSet([torch.zeros(7 * MIB // 4)], 11, 0), [torch.zeros(7 * MIB // 4)]
    held["now"] = 21 * MIB  # two checked calls' outputs (14) and eager's (7): the float64 run's 28 fits
    assert _exact_fits(run, inputs, want) and not ledger.notes  # type: ignore[arg-type]
    held["now"] = 35 * MIB
    assert not _exact_fits(run, inputs, want)  # type: ignore[arg-type]
    assert ledger.notes == ["timed calls checked against eager alone: their exact reference would not fit the judge's memory beside them"]


def test_the_exact_run_copies_an_input_read_far_into_its_slot_alone() -> None:
    # On an H200 the timing's check of a swiglu task (two 128 MiB bf16 inputs in one slot of the
    # judge's memory, the second at 128 MiB into it) ran its float32 reference on copies that kept
    # each input's storage offset: 256 MiB of float32 before the second input's values, more than
    # the plan counted (`exact_bytes`), and the judge went over its bound. The copy takes only
    # what the input spans, with its sizes and strides.
    from kevin_backend.judge.reference_sets import exact_bytes, run_exact

    slot = torch.randn(3 * 4096, dtype=torch.bfloat16)
    gate = slot[:4096].view(64, 64)
    up = torch.as_strided(slot, (64, 64), (1, 64), 2 * 4096)  # far into the slot, and transposed
    seen: list[tuple[int, int, tuple[int, ...]]] = []

    class Swiglu(torch.nn.Module):
        def forward(self, g: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
            seen.extend((t.untyped_storage().nbytes(), t.storage_offset(), t.stride()) for t in (g, u))
            return torch.nn.functional.silu(g) * u

    ledger = MemoryLedger(torch.device("cpu"), task_bytes=3 * 4096 * 2)
    run = SimpleNamespace(exact_dtype=torch.float32, device=torch.device("cpu"), ledger=ledger, state=None,
                          reference=Swiglu())
    inputs = InputSet([gate, up], 5, 0)
    out = run_exact(run, inputs, [Swiglu()])  # type: ignore[arg-type]
    assert out is not None and out[0].dtype == torch.float32
    torch.testing.assert_close(out[0], (torch.nn.functional.silu(gate.float()) * up.float()))
    assert seen == [(4096 * 4, 0, (64, 1)), (4096 * 4, 0, (1, 64))], seen  # each its own span, strides kept
    want = [torch.nn.functional.silu(gate) * up]
    assert exact_bytes(run, inputs, want, 0, torch.float32)[0] == (2 * 4096 * 2 + 4096 * 2) * 2  # type: ignore[arg-type,index]


def test_the_contiguous_rerun_counts_its_comparison_as_the_first_one_took(monkeypatch: pytest.MonkeyPatch) -> None:
    # On an H200 a candidate ignoring a transposed 512 MiB input's strides was run again on a
    # contiguous copy; the plan counted the copy and the outputs, and the comparison after it took
    # 1.13 GiB more, as the first comparison had: the judge went over its bound (3.63 GiB against
    # 3.12). The first comparison's cost is measured (`MemoryLedger.taken`) and counted for the second.
    from kevin_backend.judge.correctness import _dense_rerun_bytes

    alloc = _fake_allocator(monkeypatch)
    ledger = MemoryLedger(torch.device("cuda", 0), task_bytes=1024 * MIB)
    ledger.start()
    alloc.update(now=2560 * MIB, peak=2560 * MIB)  # the set's inputs, eager's and the exact outputs, the candidate's
    ledger.enter("compare")
    assert ledger.taken() == 0
    alloc.update(peak=2560 * MIB + 1157 * MIB)  # the comparison's temporaries, freed at its end
    assert ledger.taken() == 1157 * MIB
    x = torch.zeros(8, 4).t()  # the transposed input
    run = SimpleNamespace(ledger=ledger, output_bytes=(512 * MIB,), compare_bytes=ledger.taken(), model=SimpleNamespace(scratch=None))
    judge_bytes, beside = _dense_rerun_bytes(run, InputSet([x], 1, 0), [(0, x)])  # type: ignore[arg-type]
    assert judge_bytes == x.numel() * 4 + 512 * MIB + 1157 * MIB
    run.compare_bytes = 0
    assert _dense_rerun_bytes(run, InputSet([x], 1, 0), [(0, x)])[0] == x.numel() * 4 + 512 * MIB  # type: ignore[arg-type]
