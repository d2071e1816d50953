"""What a generate-mode compile waits for, overlapped where it can be: the judge's workers start as
the search begins (their fork server with them), beside the first turn's writing and building; the
re-timing's runs start their workers at once where the GPU lock keeps their measurements apart."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from kevin_backend.generate.engine import Engine, SearchConfig
from kevin_backend.generate.policy import Reply
from kevin_backend.generate.prompts import numerics_in
from kevin_backend.judge import decide
from kevin_backend.judge.decide import RetimeConfig, RetimeOutcome, retime_runs
from kevin_backend.judge.pool import WorkerPool
from kevin_backend.judge.result import JudgeResult, JudgeTimings, Reason, Stage
from test_judge_pool import FAST, HONEST, TASK


def _children(pid: int) -> list[str]:
    """The command lines of `pid`'s child processes."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            parent = int(stat.rsplit(")", 1)[1].split()[1])
            if parent == pid:
                found.append(Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode())
        except (OSError, ValueError, IndexError):
            continue
    return found


def test_a_prestarted_worker_is_ready_with_its_fork_server_before_its_first_job() -> None:
    with WorkerPool(size=2) as pool:
        assert pool.prestart(1, "cpu") == 1
        assert pool.prestart(1, "cpu") == 0  # one is idle already
        (worker,) = pool._idle
        assert worker.lines.get(timeout=120) == "ready"
        assert any("kevin_backend.judge.fork_server" in c for c in _children(worker.proc.pid))  # before any job
        out = pool.run(TASK, HONEST, FAST)
        assert out.reason == "ACCEPTED", out.feedback
        assert pool.started == 1  # the job went to the prestarted worker
        assert pool.prestart(5, "cpu") == 1  # up to the pool's size
        assert pool.started == 2


def test_preparing_the_judge_reads_the_headers_macros_in_the_background_once(monkeypatch: pytest.MonkeyPatch,
                                                                              tmp_path: Path) -> None:
    from kevin_backend.judge import judge as judge_module

    read_in: list[str] = []
    monkeypatch.setattr(judge_module, "_warming", [])
    monkeypatch.setattr(judge_module, "header_macros", lambda: read_in.append(threading.current_thread().name))
    judge = judge_module.Judge(tmp_path / "builds", workers=0)  # (no pool: the warm-up alone)
    judge.prepare(1)
    judge.prepare(1)
    for thread in judge_module._warming:
        thread.join(timeout=30)
    assert read_in == ["kevin-static-rules-warm"]


class _Judge:
    """A scripted judge that can prepare, and the order of what it was asked."""

    def __init__(self, said: list[str]) -> None:
        self.said = said

    def prepare(self, candidates: int = 1) -> None:
        self.said.append(f"prepare {candidates}")

    def judge(self, task_source: str, candidate_source: str) -> JudgeResult:
        self.said.append("judge")
        return JudgeResult(Stage.TIMING, Reason.ACCEPTED, timings=JudgeTimings(0.5, 1.0, 0.8, 10))


class _Writer:
    name = "writer"

    def __init__(self, said: list[str]) -> None:
        self.said = said

    def generate(self, conversations: Any, sampling: Any) -> list[Reply]:
        self.said.append("write")
        return [Reply("```python\nclass ModelNew:\n    pass\n```\n") for _ in conversations]


@pytest.mark.parametrize("trajectories, workers, asked", [(1, 8, 1), (3, 2, 2)])
def test_the_search_asks_its_judge_to_prepare_before_the_first_reply(trajectories: int, workers: int, asked: int) -> None:
    said: list[str] = []
    config = SearchConfig(trajectories=trajectories, turns=2, judge_workers=workers, roofline_stop=None)
    Engine(_Writer(said), _Judge(said), config).search(TASK, "t")
    assert said == [f"prepare {asked}"] + (["write"] + ["judge"] * trajectories) * 2


def _rounds(n: int = 6) -> RetimeOutcome:
    return RetimeOutcome((1.0,) * n, (1.2,) * n, (n,), trials=5, protocol="p")


def test_the_runs_of_a_re_timing_start_at_once_under_a_gpu_lock(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    both = threading.Barrier(2, timeout=20)  # passed only by two runs at once
    calls: list[str] = []

    def run(task: str, kernel: str, config: RetimeConfig) -> RetimeOutcome:
        calls.append(config.gpu_lock or "")
        both.wait()
        return _rounds()

    monkeypatch.setattr(decide, "retime_in_sandbox", run)
    outcome = retime_runs("task", "kernel", RetimeConfig(runs=2, gpu_lock=str(tmp_path / "gpu0.lock")))
    assert outcome.ok and outcome.runs == (6, 6) and len(outcome.kernel_ms) == 12 and len(calls) == 2


def test_without_a_lock_the_runs_follow_each_other_and_stop_at_a_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    running: list[int] = []
    most = [0]
    outcomes = iter([RetimeOutcome.kernel_failure("it crashed"), _rounds()])

    def run(task: str, kernel: str, config: RetimeConfig) -> RetimeOutcome:
        running.append(1)
        most[0] = max(most[0], len(running))
        time.sleep(0.05)
        running.pop()
        return next(outcomes)

    monkeypatch.setattr(decide, "retime_in_sandbox", run)
    outcome = retime_runs("task", "kernel", RetimeConfig(runs=2))
    assert not outcome.ok and outcome.failure == "it crashed"
    assert most[0] == 1 and next(outcomes).ok  # one at a time; the second never ran


def test_at_once_the_first_failure_in_run_order_is_the_outcome(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    ends = {0: _rounds(), 1: RetimeOutcome.judge_failure("no memory")}
    lock = threading.Lock()
    order: list[int] = []

    def run(task: str, kernel: str, config: RetimeConfig) -> RetimeOutcome:
        with lock:
            order.append(len(order))
            return ends[order[-1]]

    monkeypatch.setattr(decide, "retime_in_sandbox", run)
    outcome = retime_runs("task", "kernel", RetimeConfig(runs=2, gpu_lock=str(tmp_path / "gpu0.lock")))
    assert not outcome.ok and outcome.judge_side and outcome.failure == "no memory"


def test_two_real_runs_at_once_measure_one_after_the_other_under_the_lock(tmp_path: Path) -> None:
    from test_decide import TASK_SOURCE, THROUGH_RUNTIME, cpu_config

    lock = tmp_path / "gpu0.lock"
    lock.touch()
    outcome = retime_runs(TASK_SOURCE, THROUGH_RUNTIME, cpu_config(rounds=5, runs=2, gpu_lock=str(lock)))
    assert outcome.ok, outcome.failure
    assert outcome.runs == (5, 5) and len(outcome.kernel_ms) == len(outcome.inductor_ms) == 10
    assert outcome.protocol.startswith("2 runs, each in a fresh worker")


class _Foreseeing(_Writer):
    """A writer that says which program it writes next (its turn number, as a comment)."""

    def __init__(self, said: list[str]) -> None:
        super().__init__(said)
        self.turn = 0
        self.earlier: list[Any] = []
        self.turns_left: list[Any] = []
        self.numerics: list[Any] = []  # what each foreseen conversation's task says of its numerics

    def generate(self, conversations: Any, sampling: Any) -> list[Reply]:
        self.said.append("write")
        self.turn += 1
        return [Reply(f"```python\n# turn {self.turn}\nclass ModelNew:\n    pass\n```\n") for _ in conversations]

    def foresee(self, conversations: Any, earlier: Any, turns_left: Any = None) -> list[str]:
        self.earlier.append(earlier)
        self.turns_left.append(turns_left)
        self.numerics += [numerics_in(c) for c in conversations]
        return [f"# turn {self.turn + 1}\nclass ModelNew:\n    pass\n"]


class _BuildingJudge(_Judge):
    def build_ahead(self, candidates: Any) -> None:
        self.said.append("build ahead " + " ".join(c.splitlines()[0] for c in candidates))


def test_a_foreseeing_writers_next_programs_are_built_while_its_turn_is_judged() -> None:
    said: list[str] = []
    writer = _Foreseeing(said)
    Engine(writer, _BuildingJudge(said), SearchConfig(trajectories=1, turns=3, roofline_stop=None)).search(TASK, "t")
    assert said == ["prepare 1", "write", "build ahead # turn 2", "judge", "write", "build ahead # turn 3", "judge",
                    "write", "judge"]  # (after the last turn's reply nothing comes: nothing built ahead)
    first, second = writer.earlier
    assert [len(t) for t in first] == [1] and first[0][0].result is None  # this turn's reply, not judged yet
    assert [len(t) for t in second] == [2] and second[0][0].result.reason is Reason.ACCEPTED and second[0][1].result is None
    assert writer.turns_left == [2, 1]  # (the turns the search takes after the reply at hand)


def test_the_judge_builds_ahead_in_the_background(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from kevin_backend.judge.judge import Judge

    built: list[tuple[str, list[str], bool]] = []
    release = threading.Event()

    def prebuild(self: Judge, candidates: list[str], background: bool = False) -> None:
        release.wait(timeout=30)
        built.append((threading.current_thread().name, candidates, background))

    monkeypatch.setattr(Judge, "_prebuild", prebuild)
    judge = Judge(tmp_path / "builds", workers=0)
    judge.build_ahead(["a", "b"])  # returns while the builds go on
    assert built == []
    release.set()
    for _ in range(300):
        if built:
            break
        time.sleep(0.01)
    # (in the background: its compilers at a lower priority than a turn's own, `test_nvcc_chains`)
    assert built == [("kevin-build-ahead", ["a", "b"], True)]


def test_a_batchs_verdicts_carry_the_seconds_their_builds_took_in_it(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The judge builds a batch's candidates side by side before judging each (its build then a
    cache hit): each verdict's build time is its own builds' in the batch, the slowest of its
    extensions (bench_builtin's per-turn build seconds read it)."""
    import types

    import torch

    from kevin_backend.judge import judge as judge_module
    from kevin_backend.judge.judge import Judge
    from kevin_backend.judge.result import JudgeResult, Reason, Stage

    judge = Judge(tmp_path / "builds", workers=0)
    parsed = {"a": ["a1", "a2"], "b": ["b1"], "c": []}  # c: a candidate without an extension
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    monkeypatch.setattr(Judge, "device", property(lambda self: torch.device("cuda", 0)))
    monkeypatch.setattr(judge_module, "_static_rules_warmed", lambda: None)
    monkeypatch.setattr(judge_module, "judge_static", lambda source: types.SimpleNamespace(reason=Reason.STATIC_OK))
    monkeypatch.setattr(judge_module.Candidate, "parse", staticmethod(lambda source: types.SimpleNamespace(extensions=parsed[source])))
    monkeypatch.setattr(judge_module.BuildSpec, "of", staticmethod(lambda ext, arch: ext))
    seconds = {"a1": 3.0, "a2": 41.5, "b1": 0.2}
    monkeypatch.setattr(judge.builder, "build_many", lambda specs, background=False: [types.SimpleNamespace(seconds=seconds[s]) for s in specs])
    monkeypatch.setattr(Judge, "judge", lambda self, task, source: JudgeResult(Stage.RUN, Reason.ACCEPTED, build_seconds=0.01))
    got = [r.build_seconds for r in judge.evaluate_many("task", ["a", "b", "c"])]
    assert got == [41.5, 0.2, 0.01]


def test_a_compiles_later_tasks_first_programs_are_built_before_their_searches() -> None:
    # `SearchGenerator.foresee` -> `Engine.build_first_turns`: each later task's conversation as its
    # first turn would have it, one per trajectory, no turn before; what the writer foresees goes to
    # the judge's builds ahead; a writer or judge that cannot, or a foresight that fails, is no error
    from kevin_backend.cache.key import CacheKey
    from kevin_backend.generate.generator import SearchGenerator
    from kevin_backend.types import KernelTask

    said: list[str] = []
    writer = _Foreseeing(said)
    generator = SearchGenerator(writer, _BuildingJudge(said), SearchConfig(trajectories=2, turns=3, roofline_stop=None))
    tasks = [KernelTask(f"t{i}", f"{TASK}\n# task {i}\n", (), (), (), f"h{i}") for i in range(2)]
    keys = [CacheKey("g", (), "NVIDIA H200", "9.0", "2.11", "13.0", numerics={"cudnn_tf32": on}) for on in (True, False)]
    generator.foresee(tasks, keys)
    assert said == ["build ahead # turn 1"] * 2  # (one engine for each task's numerics; the same program)
    assert writer.numerics == [{"cudnn_tf32": True}] * 2 + [{"cudnn_tf32": False}] * 2  # each task's own, as its search would say them
    assert writer.earlier == [[[], []], [[], []]] and writer.turns_left == [3, 3]  # each task: two trajectories, no turn yet
    Engine(writer, _Judge(said), SearchConfig(trajectories=1, turns=1)).build_first_turns([TASK])  # (a judge that builds nothing ahead)
    assert said == ["build ahead # turn 1"] * 2
