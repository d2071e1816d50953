"""Generate mode in a user's process: the memory this process's allocator caches is given back
before the judges run (once per compile, recorded in the report); a search the judge could not
finish leaves its task pending with the reason, no decision stored; each partition's search time,
and the total, are in the readable report and in its data."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

import kevin_backend
from conftest import _CPU_KERNEL, ReferenceGenerator, assert_close_tree
from kevin_backend.backend import cached_memory
from kevin_backend.backend.report import FallbackReason, Status
from kevin_backend.cache.store import KernelCache
from kevin_backend.config import Config
from kevin_backend.generate.engine import SearchConfig
from kevin_backend.generate.generator import SearchGenerator
from kevin_backend.generate.log import TrajectoryLog
from kevin_backend.generate.policy import Reply
from kevin_backend.judge.result import JudgeResult, JudgeTimings, Reason, Stage
from kevin_backend.runtime.counters import counters


class _Norm(torch.nn.Module):
    """One partition: an L2 norm over rows."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x / torch.sqrt((x * x).sum(-1, keepdim=True) + 1e-12)


class _Repeated(torch.nn.Module):
    """Three partitions, two or more with the same key (a cumsum between them stays out)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for _ in range(3):
            x = torch.cumsum(torch.sigmoid(x) * 2.0 + 1.0, dim=-1) / 100.0
        return x


class _Writer:
    """A writer whose every "kernel" runs the task's reference (conftest's stand-in: loaded by
    the runtime on a machine without a GPU)."""

    name = "test-reference"

    def generate(self, conversations: Any, sampling: Any) -> list[Reply]:
        from kevin_backend.generate.builtin.builtin_policy import task_from_messages

        return [Reply(f"```python\n{task_from_messages(c)}{_CPU_KERNEL}```\n") for c in conversations]


class _ShortOfMemory:
    """A judge whose workers cannot get GPU memory: RESOURCE, its own failure, never a verdict."""

    def __init__(self) -> None:
        self.calls = 0

    def judge(self, task_source: str, candidate_source: str) -> JudgeResult:
        self.calls += 1
        return JudgeResult(Stage.RUN, Reason.RESOURCE, feedback="the judge could not get GPU memory while making inputs")


class _Accepting:
    """A judge that accepts every candidate at 0.5 ms against Inductor's 0.8 ms."""

    def judge(self, task_source: str, candidate_source: str) -> JudgeResult:
        return JudgeResult(Stage.TIMING, Reason.ACCEPTED, timings=JudgeTimings(0.5, 1.0, 0.8, 10))


def _search(judge: Any, cache_dir: Path, turns: int = 3) -> SearchGenerator:
    config = Config(cache_dir=cache_dir)
    return SearchGenerator(_Writer(), judge, SearchConfig(trajectories=1, turns=turns), config,
                           log=TrajectoryLog(cache_dir / "log.jsonl"))


def _compile(model: torch.nn.Module, x: torch.Tensor, generator: Any, cache_dir: Path) -> torch.Tensor:
    torch._dynamo.reset()
    with torch.no_grad():
        return torch.compile(model, backend="kevin", options={"mode": "generate", "generator": generator,
                                                             "cache_dir": str(cache_dir), "cpu_kernels": True})(x)


def test_a_search_the_judge_could_not_finish_leaves_the_task_pending_with_the_reason(kevin_dir: Path) -> None:
    judge = _ShortOfMemory()
    x = torch.randn(8, 32)
    got = _compile(_Repeated(), x, _search(judge, kevin_dir), kevin_dir)
    assert_close_tree(got, _Repeated()(x))  # Inductor's code ran every partition
    records = kevin_backend.last_report().records()
    keys = [r.key for r in records]
    assert len(records) == 3 and len(set(keys)) < 3
    assert [r.status for r in records] == [Status.PENDING] * 3
    assert {r.reason for r in records} == {FallbackReason.SEARCH_INCOMPLETE}
    assert all("RESOURCE" in r.detail and "could not get GPU memory" in r.detail for r in records)
    # each key judged, judged again once, then its search stopped; a repeated key not searched again
    assert judge.calls == 2 * len(set(keys))
    assert [r.search is not None for r in records] == [k not in keys[:i] for i, k in enumerate(keys)]
    with KernelCache(kevin_dir, None) as cache:
        assert cache.entries() == []  # no decision stored
        assert sorted(p.key.digest for p in cache.pending()) == sorted(set(keys))  # left for `kevin prewarm`
    counters.expect(pending_recorded=len(set(keys)), generated=0, inductor_winners=0)
    text = str(kevin_backend.last_report())
    assert "pending" in text and "left for `kevin prewarm`" in text and "RESOURCE" in text


def test_each_partitions_search_time_is_in_the_report_and_its_data(kevin_dir: Path) -> None:
    x = torch.randn(8, 32)
    got = _compile(_Norm(), x, _search(_Accepting(), kevin_dir), kevin_dir)
    assert_close_tree(got, _Norm()(x), atol=1e-4)
    report = kevin_backend.last_report()
    (record,) = report.records()
    assert record.status is Status.GENERATED and record.search is not None
    search = record.search
    assert search.turns == 3 and search.candidates == 3
    assert search.seconds > 0 and search.writer_seconds is not None and search.judge_seconds is not None
    assert search.retime_seconds is not None  # (a scripted judge's decision: not re-timed, decided at once)
    assert search.writer_seconds + search.judge_seconds + search.retime_seconds <= search.seconds
    text = str(report)
    assert f"searched in {search.seconds:.1f} s" in text and "3 turns" in text
    assert f"search time: {search.seconds:.1f} s for 1 partition" in text
    data = json.loads(json.dumps(report.as_dict()))
    (part,) = data["graphs"][0]["partitions"]
    assert part["status"] == "generated" and part["search"]["turns"] == 3
    assert part["search"]["seconds"] == pytest.approx(search.seconds, abs=1e-3)
    assert data["searches"] == 1 and data["search_seconds"] == pytest.approx(search.seconds, abs=1e-3)

    # a hit searches nothing: no search time
    _compile(_Norm(), x, _search(_Accepting(), kevin_dir), kevin_dir)
    (hit,) = kevin_backend.last_report().records()
    assert hit.status is Status.HIT and hit.search is None
    assert "search time" not in str(kevin_backend.last_report())


class _SlowFirstLook:
    """A judge whose one timing puts every candidate at 0.93x Inductor (close enough to be re-timed)."""

    def judge(self, task_source: str, candidate_source: str) -> JudgeResult:
        return JudgeResult(Stage.TIMING, Reason.ACCEPTED, timings=JudgeTimings(0.86, 1.0, 0.8, 10))


def test_a_kept_kernel_is_reported_at_the_speed_its_re_timing_measured(kevin_dir: Path) -> None:
    from kevin_backend.judge.decide import RetimeOutcome

    def retime(task_source: str, code: str) -> RetimeOutcome:  # interleaved rounds: the kernel 1.6x Inductor
        return RetimeOutcome((0.5,) * 7, (0.8,) * 7, trials=10, device="cuda:0", protocol="scripted")

    generator = SearchGenerator(_Writer(), _SlowFirstLook(), SearchConfig(trajectories=1, turns=1),
                                Config(cache_dir=kevin_dir), log=TrajectoryLog(kevin_dir / "log.jsonl"), retimer=retime)
    x = torch.randn(8, 32)
    _compile(_Norm(), x, generator, kevin_dir)
    (record,) = kevin_backend.last_report().records()
    assert record.status is Status.GENERATED
    assert record.speedup_vs_inductor == pytest.approx(1.6)  # not the judge's one look (0.93x)
    assert "1.60x vs inductor" in str(kevin_backend.last_report())
    with KernelCache(kevin_dir, None) as cache:
        (info,) = cache.entries()
        assert info.timings.speedup_vs_inductor == pytest.approx(0.8 / 0.86)
        assert info.entry.speedup_vs_inductor == pytest.approx(1.6)


def test_a_generator_of_its_own_gets_the_wall_clock_time_of_its_search(kevin_dir: Path) -> None:
    _compile(_Norm(), torch.randn(8, 32), ReferenceGenerator(), kevin_dir)
    (record,) = kevin_backend.last_report().records()
    assert record.status is Status.GENERATED and record.search is not None and record.search.seconds > 0
    assert record.search.turns is None and record.search.judge_seconds is None  # it keeps no account


class _FakeCuda:
    """torch.cuda as the backend's give-back sees it, for a process that cached 100 GiB on cuda:1
    and uses 2 GiB there (cuda:0 never used); every call it gets, in order."""

    def __init__(self, calls: list[str]) -> None:
        self.reserved = {0: 0, 1: 102 << 30}
        self.allocated = {0: 0, 1: 2 << 30}
        self.calls = calls
        self.current = 0

    def is_available(self) -> bool:
        return True

    def is_initialized(self) -> bool:
        return True

    def device_count(self) -> int:
        return 2

    def memory_reserved(self, device: int) -> int:
        return self.reserved[device]

    def memory_allocated(self, device: int) -> int:
        return self.allocated[device]

    def synchronize(self, device: int) -> None:
        self.calls.append(f"synchronize {device}")

    def device(self, index: int) -> Any:
        import contextlib

        self.current = index
        return contextlib.nullcontext()

    def empty_cache(self) -> None:
        self.calls.append(f"empty_cache on {self.current}")
        self.reserved = dict(self.allocated)


def test_the_cached_memory_is_given_back_before_the_first_search_once_per_compile(
        kevin_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    fake = _FakeCuda(calls)
    monkeypatch.setattr(cached_memory, "_cuda", lambda: fake)

    class Watching(ReferenceGenerator):
        def generate(self, task: Any, key: Any) -> Any:
            calls.append("generate")
            return super().generate(task, key)

    x = torch.randn(8, 32)
    model = _Repeated()
    _compile(model, x, Watching(), kevin_dir)
    report = kevin_backend.last_report()
    generated = [r for r in report.records() if r.status is Status.GENERATED]
    assert len(generated) >= 2
    # the device this process used, synchronised and emptied, before the first search only
    assert calls == ["synchronize 1", "empty_cache on 1"] + ["generate"] * len(generated)
    (release,) = report.released
    assert release.device == "cuda:1" and release.reserved_before == 102 << 30 and release.reserved_after == 2 << 30
    assert release.released == 100 << 30 and release.allocated == 2 << 30
    assert "cuda:1 gave back 100.00 GiB its allocator cached but did not use (reserved 102.00 -> 2.00 GiB" in str(report)
    assert report.as_dict()["released"] == [release.as_dict()]


def test_a_cache_mode_compile_gives_nothing_back(kevin_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from kevin_backend.backend import kevin_pass

    called: list[str] = []
    monkeypatch.setattr(kevin_pass, "give_back_cached_memory", lambda: called.append("give back") or ())
    x = torch.randn(8, 32)
    torch._dynamo.reset()
    with torch.no_grad():
        torch.compile(_Norm(), backend="kevin", options={"cache_dir": str(kevin_dir), "cpu_kernels": True})(x)
    assert [r.status for r in kevin_backend.last_report().records()] == [Status.PENDING]
    assert called == [] and kevin_backend.last_report().released == ()
    _compile(_Norm(), x, ReferenceGenerator(), kevin_dir)
    assert called == ["give back"]


def test_without_cuda_there_is_nothing_to_give_back() -> None:
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        pytest.skip("about a process without a CUDA context")
    assert cached_memory.give_back_cached_memory() == ()


def test_the_graph_checks_time_is_in_the_reports_data(kevin_dir: Path) -> None:
    x = torch.randn(8, 32)
    torch._dynamo.reset()
    with torch.no_grad():
        torch.compile(_Norm(), backend="kevin", options={"mode": "generate", "generator": ReferenceGenerator(),
                                                         "cache_dir": str(kevin_dir), "cpu_kernels": True,
                                                         "graph_check": True})(x)
    report = kevin_backend.last_report()
    assert any(n.startswith("graph check (") for n in report.notes)
    assert report.graph_check_seconds > 0 and report.as_dict()["graph_check_seconds"] == round(report.graph_check_seconds, 3)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the --cpu plumbing check is for machines without a GPU")
def test_the_compile_time_benchmark_runs_its_models_each_in_a_process_of_its_own(tmp_path: Path) -> None:
    """Its plumbing, on the CPU: the search runs and the judge answers NO_GPU, so the partition
    is left pending; the row carries the compile and search seconds, and the median is taken."""
    import subprocess
    import sys

    script = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_generate_compile.py"
    out = tmp_path / "bench.json"
    done = subprocess.run([sys.executable, str(script), "--cpu", "--small", "--problems", "l2norm", "--turns", "1",
                           "--cache", str(tmp_path / "cache"), "--json", str(out)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    data = json.loads(out.read_text())
    (row,) = data["rows"]
    assert row["problem"] == "l2norm" and row["shape"] == [256, 65535] and row["match"]
    (part,) = row["partitions"]
    assert part["status"] == "pending" and "no GPU to judge on" in part["detail"] and part["search"]["turns"] == 1
    assert 0 < row["search_seconds"] < row["compile_seconds"]
    assert data["summary"]["median_compile_seconds"] == row["compile_seconds"] and data["turns"] == 1
    assert "median compile" in done.stdout and "l2norm" in done.stdout


def test_a_kept_kernel_is_named_in_the_report_by_its_programs_first_line(kevin_dir: Path) -> None:
    # the built-in writer's programs say what their kernel is on their docstring's first line (the
    # plan and the variant): the report shows it beside the kept kernel, without the writer's name
    class Named(_Writer):
        def generate(self, conversations: Any, sampling: Any) -> list[Reply]:
            doc = '"""Written by kevin\'s built-in writer: an L2 norm over rows of 32, one warp a row.\n\nMore lines."""\n'
            return [Reply(r.text.replace("```python\n", "```python\n" + doc, 1)) for r in super().generate(conversations, sampling)]

    generator = SearchGenerator(Named(), _Accepting(), SearchConfig(trajectories=1, turns=1), Config(cache_dir=kevin_dir),
                                log=TrajectoryLog(kevin_dir / "log.jsonl"))
    _compile(_Norm(), torch.randn(8, 32), generator, kevin_dir)
    (record,) = kevin_backend.last_report().records()
    assert record.status is Status.GENERATED and record.detail == "an L2 norm over rows of 32, one warp a row", record
    assert "(an L2 norm over rows of 32, one warp a row)" in str(kevin_backend.last_report())
    assert json.loads(json.dumps(kevin_backend.last_report().as_dict()))["graphs"][0]["partitions"][0]["detail"] == record.detail
