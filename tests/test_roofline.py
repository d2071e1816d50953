"""The roofline on the CPU (`kevin_backend/measure/roofline.py` and where it is wired): the bytes a
task must move for contiguous, broadcast, transposed and multi-output tensors; FLOPs of matmul
and convolution work (none for elementwise work); the copy bandwidth kept on disk and read back
without measuring again; `Roofline` and its judge record; the writer's feedback; the search
stopping near the roofline; `kevin cache ls` and the compile report."""

from __future__ import annotations

import dataclasses
import json
import types
from pathlib import Path
from typing import Any

import pytest
import torch

import kevin_backend
from conftest import ReferenceGenerator
from test_cache import make_entry
from kevin_backend.backend.report import CompileReport, GraphReport, PartitionRecord, Status
from kevin_backend.cache import CacheEntry, KernelCache
from kevin_backend.cli.main import main
from kevin_backend.generate.engine import Engine, SearchConfig
from kevin_backend.generate.prompts import feedback_for
from kevin_backend.generate.replay import ReplayPolicy
from kevin_backend.measure import roofline as roofline_module
from kevin_backend.judge import roofline_phase
from kevin_backend.judge.judge import roofline_of
from kevin_backend.judge.result import JudgeResult, JudgeTimings, Reason, Stage
from kevin_backend.measure.roofline import Roofline, copy_bandwidth, record_fraction, spanned_bytes, task_bytes, task_flops
from kevin_backend.judge.sandbox import RunOutcome, outcome_of
from kevin_backend.types import KernelTask, TensorSpec

F32 = 4


# -- bytes ----------------------------------------------------------------------------------------


def test_contiguous_inputs_and_output_count_once_each() -> None:
    x, y = torch.randn(64, 128), torch.randn(64, 128)
    assert task_bytes([x, y], [x + y]) == 3 * 64 * 128 * F32
    half = torch.randn(10, 7, dtype=torch.float16)
    assert task_bytes([half, 3, None], [half]) == 2 * 70 * 2  # non-tensor arguments move nothing


def test_a_broadcast_input_counts_its_storage_not_its_expanded_size() -> None:
    x, bias = torch.randn(64, 128), torch.randn(128)
    wide = bias.expand(64, 128)
    assert wide.stride() == (0, 1)
    assert spanned_bytes(wide) == 128 * F32
    assert task_bytes([x, wide], [x + wide]) == (64 * 128 + 128 + 64 * 128) * F32
    column = torch.randn(64, 1).expand(64, 128)  # stride (1, 0)
    assert spanned_bytes(column) == 64 * F32
    scalar = torch.tensor(2.0).expand(8, 8)  # every stride 0: one element
    assert spanned_bytes(scalar) == F32


def test_a_transposed_input_counts_its_numel_and_a_stepped_slice_its_elements() -> None:
    x = torch.randn(256, 64)
    assert spanned_bytes(x.t()) == 256 * 64 * F32
    assert spanned_bytes(x[:, ::2]) == 256 * 32 * F32  # the gaps are not read
    assert spanned_bytes(torch.empty(0, 5)) == 0


def test_specs_count_as_their_tensors_and_every_output_is_written() -> None:
    x, bias = torch.randn(32, 48), torch.randn(48).expand(32, 48)
    outs = (torch.randn(32, 48), torch.randn(32))  # two outputs, e.g. a value and a row max
    as_tensors = task_bytes([x.t(), bias], outs)
    as_specs = task_bytes([TensorSpec.of(x.t()), TensorSpec.of(bias)], [TensorSpec.of(o) for o in outs])
    assert as_tensors == as_specs == (32 * 48 + 48 + 32 * 48 + 32) * F32
    bf16 = TensorSpec((4, 4), (4, 1), "bfloat16", "cuda")
    assert spanned_bytes(bf16) == 32


# -- FLOPs ----------------------------------------------------------------------------------------


MATMUL_TASK = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, a, b):
        return torch.relu(torch.matmul(a, b))


def get_inputs():
    return [torch.randn(64, 128), torch.randn(128, 32)]


def get_init_inputs():
    return []
'''


def test_flops_of_a_matmul_task_and_none_for_elementwise_work() -> None:
    task = KernelTask.from_program("mm", MATMUL_TASK, "cpu").load()
    a, b = task.get_inputs()
    assert task_flops(task.Model(), [a, b]) == 2 * 64 * 128 * 32
    assert task_flops(lambda x, y: torch.sigmoid(x) * y + 1.0, [a, a]) == 0
    conv = torch.nn.Conv2d(3, 8, 3, bias=False)
    assert task_flops(conv, [torch.randn(2, 3, 10, 10)]) == 2 * (2 * 8 * 8 * 8) * (3 * 3 * 3)


def test_flops_are_counted_for_a_reference_that_needs_real_values() -> None:
    def data_dependent(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        rows = x[x[:, 0] > 0]  # a shape only real values decide
        return rows @ w

    x = torch.randn(50, 16)
    x[:20, 0] = 1.0
    x[20:, 0] = -1.0
    assert task_flops(data_dependent, [x, torch.randn(16, 4)]) == 2 * 20 * 16 * 4


# -- the copy bandwidth, kept on disk ----------------------------------------------------------------


def test_no_copy_bandwidth_on_a_cpu() -> None:
    assert copy_bandwidth(torch.device("cpu")) is None
    run = types.SimpleNamespace(device=torch.device("cpu"), job={}, ledger=types.SimpleNamespace(notes=[]))
    assert roofline_phase.measured_copy_bandwidth(run) is None  # type: ignore[arg-type]


@pytest.fixture
def fake_gpu(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """copy_bandwidth as on a GPU: a fixed key, and a measurement that counts its calls."""
    measured: list[int] = []

    def measure(device: torch.device) -> tuple[float, dict[str, object]]:
        measured.append(1)
        return 4310.0, {"copy_gbps": 4310.0, "bytes": 2 << 30}

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(roofline_module, "copy_bandwidth_key", lambda device: "this-gpu")
    monkeypatch.setattr(roofline_module, "measure_copy_bandwidth", measure)
    monkeypatch.setattr(roofline_module, "_KNOWN", {})
    return measured


def test_the_copy_bandwidth_is_measured_once_and_read_back_from_disk(tmp_path: Path, fake_gpu: list[int],
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    store = tmp_path / "builds" / "copy_bandwidth"
    assert copy_bandwidth(torch.device("cuda", 0), store) == 4310.0
    assert fake_gpu == [1] and json.loads((store / "this-gpu.json").read_text())["copy_gbps"] == 4310.0
    monkeypatch.setattr(roofline_module, "_KNOWN", {})  # another worker process: only the file is shared
    assert copy_bandwidth(torch.device("cuda", 0), store) == 4310.0
    assert fake_gpu == [1]  # read, not measured again


def test_a_damaged_bandwidth_file_is_measured_again(tmp_path: Path, fake_gpu: list[int]) -> None:
    store = tmp_path / "copy_bandwidth"
    store.mkdir()
    (store / "this-gpu.json").write_text("{not json")
    assert copy_bandwidth(torch.device("cuda", 0), store) == 4310.0 and fake_gpu == [1]


def test_a_failed_measurement_is_a_note_not_the_candidates_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    def fails(device: torch.device, store: object) -> float:
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1.00 GiB")

    monkeypatch.setattr(roofline_module, "copy_bandwidth", fails)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda device=None: None)
    run = types.SimpleNamespace(device=torch.device("cuda", 0), job=types.SimpleNamespace(build_root=None),
                                ledger=types.SimpleNamespace(notes=[]), phase=lambda name: None)
    assert roofline_phase.measured_copy_bandwidth(run) is None  # type: ignore[arg-type]
    assert "no copy bandwidth measured" in run.ledger.notes[0]


def test_the_workers_facts_need_a_copy_bandwidth() -> None:
    task = KernelTask.from_program("mm", MATMUL_TASK, "cpu").load()
    a, b = task.get_inputs()
    state = types.SimpleNamespace(counts=None)  # the worker's kept task: the counts are made once per task
    run = types.SimpleNamespace(reference=task.Model(), ledger=types.SimpleNamespace(notes=[]), phase=lambda name: None,
                                state=state)
    out = [torch.relu(a @ b)]
    made = []

    def sample() -> tuple[list, list]:  # type: ignore[type-arg]
        made.append(1)
        return [a, b], out

    assert roofline_phase.roofline_facts(run, sample, None) is None  # type: ignore[arg-type]
    facts = roofline_phase.roofline_facts(run, sample, 4310.0)  # type: ignore[arg-type]
    assert facts == {"bytes": (64 * 128 + 128 * 32 + 64 * 32) * F32, "flops": 2 * 64 * 128 * 32, "copy_gbps": 4310.0}
    assert state.counts == (facts["bytes"], facts["flops"])
    run.reference = None  # the next candidate of the task: nothing is counted again
    assert roofline_phase.roofline_facts(run, sample, 4310.0) == facts  # type: ignore[arg-type]
    assert made == [1]  # (nor its sample made again)


# -- Roofline and the judge's record ------------------------------------------------------------------


def example() -> Roofline:
    nbytes = 1_070_000_000
    return Roofline.of(nbytes, 0, 4310.0, kernel_ms=nbytes / 3.41e12 * 1e3, eager_ms=nbytes / 2.0e12 * 1e3,
                       inductor_ms=nbytes / 2.95e12 * 1e3)


def test_roofline_fractions_round_trip_and_describe() -> None:
    r = example()
    assert r.kernel_gbps == pytest.approx(3410) and r.inductor_gbps == pytest.approx(2950) and r.eager_gbps == pytest.approx(2000)
    assert r.kernel_fraction == pytest.approx(3410 / 4310) and r.inductor_fraction == pytest.approx(2950 / 4310)
    assert r.kernel_tflops is None
    assert Roofline.from_dict(json.loads(json.dumps(r.as_dict()))) == r
    assert r.describe() == ("moves 1.07 GB: kernel 3.41 TB/s (79% of the GPU's 4.31 TB/s copy bandwidth), "
                            "Inductor 2.95 TB/s (68%)")
    assert "79%" in r.headroom() and "1.26x" in r.headroom()
    mm = Roofline.of(1_000_000, 2_000_000_000, 4000.0, kernel_ms=0.01)
    assert mm.kernel_tflops == pytest.approx(200.0) and "2 GFLOP at 200 TFLOP/s" in mm.describe()
    assert "FLOPs" in mm.headroom()
    at_roof = Roofline.of(1_000_000, 0, 1000.0, kernel_ms=0.0009)
    assert at_roof.kernel_fraction > 1 and "no more speed" in at_roof.headroom()
    retimed = r.retimed(r.bytes / 4.0e12 * 1e3, None, None)
    assert retimed.kernel_gbps == pytest.approx(4000) and retimed.inductor_fraction is None


def test_a_judge_record_with_and_without_a_roofline_loads() -> None:
    result = JudgeResult(Stage.TIMING, Reason.ACCEPTED, timings=JudgeTimings(0.3, 0.6, 0.4, 10), roofline=example())
    record = json.loads(json.dumps(result.as_dict()))
    assert record["roofline"]["kernel_fraction"] == pytest.approx(3410 / 4310)
    assert JudgeResult.from_dict(record) == result
    assert record_fraction(record) == pytest.approx(3410 / 4310)
    old = {k: v for k, v in record.items() if k != "roofline"}  # a record made before the roofline
    assert JudgeResult.from_dict(old).roofline is None and record_fraction(old) is None
    assert JudgeResult.from_dict({**record, "roofline": None}).roofline is None
    assert record_fraction({"roofline": {"kernel_fraction": "x"}}) is None and record_fraction(None) is None


def test_the_judge_builds_the_roofline_from_the_workers_facts() -> None:
    verdict = {"stage": "timing", "reason": "ACCEPTED", "kernel_ms": 0.5, "eager_ms": 1.0, "inductor_ms": 0.6,
               "roofline": {"bytes": 2_000_000_000, "flops": 0, "copy_gbps": 5000.0}}
    outcome = outcome_of(verdict, "roofline", "", False, 60.0, 0, False)
    assert outcome.roofline == verdict["roofline"]
    roofline = roofline_of(outcome, JudgeTimings(0.5, 1.0, 0.6, 10))
    assert roofline is not None and roofline.kernel_gbps == pytest.approx(4000) and roofline.kernel_fraction == pytest.approx(0.8)
    assert roofline.inductor_fraction == pytest.approx(4000 / 0.6 * 0.5 / 5000)
    # none without a copy bandwidth, for a rejected run, or from facts it cannot read
    assert roofline_of(outcome_of({**verdict, "roofline": None}, "", "", False, 60.0, 0, False), JudgeTimings(0.5)) is None
    assert roofline_of(RunOutcome("correctness", "MISMATCH", roofline=verdict["roofline"]), JudgeTimings(0.5)) is None
    assert roofline_of(RunOutcome("timing", "ACCEPTED", roofline={"bytes": "?"}), JudgeTimings(0.5)) is None


def test_an_entry_keeps_the_roofline_in_its_judge_record() -> None:
    record = JudgeResult(Stage.TIMING, Reason.ACCEPTED, timings=JudgeTimings(0.3, 0.6, 0.4, 10), roofline=example()).as_dict()
    entry = _entry(0, record)
    again = CacheEntry.from_dict(json.loads(json.dumps(entry.to_dict())))
    assert record_fraction(again.judge_record) == pytest.approx(3410 / 4310)


# -- the writer's feedback ----------------------------------------------------------------------------


def test_feedback_says_how_far_the_kernel_is_from_the_roofline() -> None:
    timings = JudgeTimings(0.3, 0.6, 0.4, 10)
    text = feedback_for(JudgeResult(Stage.TIMING, Reason.ACCEPTED, timings=timings, roofline=example()))
    assert example().describe() in text and "at most 1.26x faster" in text
    assert "your program: 0.3 ms" in text  # the line the built-in writer reads its timings from
    plain = feedback_for(JudgeResult(Stage.TIMING, Reason.ACCEPTED, timings=timings))
    assert "roofline" not in plain.lower() and "your program: 0.3 ms" in plain


# -- the search stops near the roofline -------------------------------------------------------------


class RooflineJudge:
    """Accepts every program; its kernel's fraction of the copy bandwidth is written in the
    program ("# fraction 0.95"), "none" for a verdict without a roofline."""

    def __init__(self) -> None:
        self.calls = 0

    def judge(self, task_source: str, candidate_source: str) -> JudgeResult:
        self.calls += 1
        fraction = candidate_source.split("# fraction ")[1].split()[0]
        roofline = None
        if fraction != "none":
            nbytes = 1_000_000_000
            roofline = Roofline.of(nbytes, 0, 4000.0, kernel_ms=nbytes / (float(fraction) * 4000e9) * 1e3)
        kernel_ms = 1.0 / max(float(fraction) if fraction != "none" else 0.1, 0.01)
        return JudgeResult(Stage.TIMING, Reason.ACCEPTED, timings=JudgeTimings(kernel_ms, 10.0, 5.0, 10), roofline=roofline)


def scripted(*fractions: str) -> list[str]:
    return [f"```python\nclass ModelNew:\n    pass  # fraction {f}\n```\nSummary: try {i}" for i, f in enumerate(fractions)]


def test_a_trajectory_stops_once_its_best_kernel_reaches_the_roofline() -> None:
    policy = ReplayPolicy(scripted("0.5", "0.7", "0.92", "0.99", "0.99"))
    result = Engine(policy, RooflineJudge(), SearchConfig(trajectories=1, turns=5)).search("task", "t")
    assert len(result.records) == 3 and policy.calls == 3
    assert result.stopped.startswith("roofline:") and "reached 90%" in result.stopped and "92%" in result.stopped
    # the turn after a kernel at 70% was told how far it was
    assert "70% of the memory roofline" in policy.received[2][0][-1]["content"]


def test_below_the_fraction_the_search_goes_on() -> None:
    policy = ReplayPolicy(scripted("0.5", "0.89", "0.6", "0.8"))
    result = Engine(policy, RooflineJudge(), SearchConfig(trajectories=1, turns=4)).search("task", "t")
    assert len(result.records) == 4 and result.stopped == "all 4 turns"


def test_the_fraction_is_configurable_and_can_be_off() -> None:
    low = Engine(ReplayPolicy(scripted("0.5", "0.7", "0.8")), RooflineJudge(),
                 SearchConfig(trajectories=1, turns=3, roofline_stop=0.6)).search("task", "t")
    assert len(low.records) == 2 and "reached 60%" in low.stopped
    off = Engine(ReplayPolicy(scripted("0.99", "0.99", "0.99")), RooflineJudge(),
                 SearchConfig(trajectories=1, turns=3, roofline_stop=None)).search("task", "t")
    assert len(off.records) == 3 and off.stopped == "all 3 turns"
    unknown = Engine(ReplayPolicy(scripted("none", "none")), RooflineJudge(), SearchConfig(trajectories=1, turns=2)).search("task", "t")
    assert len(unknown.records) == 2  # no roofline measured (a CPU judge): nothing stops
    with pytest.raises(ValueError, match="roofline_stop"):
        SearchConfig(roofline_stop=0.0)


def test_with_several_trajectories_only_the_one_at_the_roofline_stops() -> None:
    # the replay answers by position among the live conversations: after turn 0 only trajectory 1 is
    # live, and it gets the first script's later replies
    policy = ReplayPolicy([scripted("0.95", "0.3", "0.3"), scripted("0.3", "0.3", "0.3")], per_conversation=True)
    result = Engine(policy, RooflineJudge(), SearchConfig(trajectories=2, turns=3, patience=1)).search("task", "t")
    assert [len(c) for c in policy.received] == [2, 1]  # trajectory 0 stopped after turn 0
    assert result.stopped.startswith("roofline: 1 of 2 trajectories") and "did not improve for 1 turns" in result.stopped


def test_the_generators_search_takes_the_configured_fraction(tmp_path: Path) -> None:
    from kevin_backend.config import Config, ConfigError
    from kevin_backend.generate.generator import SearchGenerator

    assert Config().roofline_stop == 0.9
    policy = ReplayPolicy([])
    assert SearchGenerator(policy, RooflineJudge(), config=Config(cache_dir=tmp_path)).search.roofline_stop == 0.9
    assert SearchGenerator(policy, RooflineJudge(), config=Config.from_options({"cache_dir": tmp_path, "roofline_stop": 0})
                           ).search.roofline_stop is None
    with pytest.raises(ConfigError, match="roofline_stop"):
        Config.from_options({"roofline_stop": -1})


# -- kevin cache ls and the compile report --------------------------------------------------------------


def _entry(n: int, judge_record: dict[str, object] | None) -> CacheEntry:
    """The cache tests' kernel entry, with this judge record."""
    return dataclasses.replace(make_entry(n), judge_record=judge_record)


def test_cache_ls_shows_the_kernels_fraction_of_the_copy_bandwidth(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with_roofline = _entry(0, {"stage": "timing", "roofline": {**example().as_dict(), "kernel_fraction": 0.834}})
    without = _entry(1, {"stage": "timing"})
    with KernelCache(tmp_path / "cache", seed_dir=None) as cache:
        cache.put(with_roofline)
        cache.put(without)
    assert main(["cache", "ls", "--cache-dir", str(tmp_path / "cache"), "--no-seed"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:6] == ["DIGEST", "KIND", "SOURCE", "VS", "INDUCTOR", "ROOFLINE"]
    row = next(line for line in lines if line.startswith(with_roofline.digest[:12]))
    assert row.split()[1:5] == ["kernel", "user", "2.00x", "83%"]
    row = next(line for line in lines if line.startswith(without.digest[:12]))
    assert row.split()[1:5] == ["kernel", "user", "2.00x", "-"]
    assert main(["cache", "ls", "--cache-dir", str(tmp_path / "cache"), "--no-seed", "--json"]) == 0
    listed = {item["digest"]: item["roofline_fraction"] for item in json.loads(capsys.readouterr().out)}
    assert listed == {with_roofline.digest: 0.834, without.digest: None}


def test_the_compile_report_shows_the_fraction_beside_the_speedup() -> None:
    report = CompileReport({"mode": "cache"})
    graph = GraphReport(0, "inference", 5)
    graph.partitions += [
        PartitionRecord(0, ("aten.add.Tensor",), Status.HIT, key="a" * 64, speedup_vs_inductor=1.5, roofline_fraction=0.83),
        PartitionRecord(1, ("aten.mul.Tensor",), Status.GENERATED, key="b" * 64, speedup_vs_inductor=1.2),
    ]
    report.graphs.append(graph)
    lines = str(report).splitlines()
    hit = next(line for line in lines if "#0" in line)
    assert "1.50x vs inductor (83% of copy bandwidth)" in hit
    generated = next(line for line in lines if "#1" in line)
    assert "1.20x vs inductor" in generated and "copy bandwidth" not in generated


class RooflineGenerator(ReferenceGenerator):
    """The tests' reference generator, its entries' judge records carrying a roofline."""

    def generate(self, task: Any, key: Any) -> Any:
        entry = super().generate(task, key)
        record = {"stage": "timing", "roofline": {**example().as_dict(), "kernel_fraction": 0.77}}
        return dataclasses.replace(entry, judge_record=record)


def test_a_compile_reports_the_fraction_of_a_generated_kernel(kevin_dir: Path) -> None:
    def f(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.relu(x * y + 1.0)

    options = {"cache_dir": str(kevin_dir), "mode": "generate", "cpu_kernels": True, "generator": RooflineGenerator()}
    x, y = torch.randn(16, 32), torch.randn(16, 32)
    torch.testing.assert_close(torch.compile(f, backend="kevin", options=options)(x, y), f(x, y))
    report = kevin_backend.last_report()
    assert report is not None
    generated = [r for r in report.records() if r.status is Status.GENERATED]
    assert generated and all(r.roofline_fraction == pytest.approx(0.77) for r in generated)
    assert "1.60x vs inductor (77% of copy bandwidth)" in str(report)
