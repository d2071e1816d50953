"""The generator's loop on the CPU: the real judge (its static stage decides here), a replay
policy for the model's answers. What each turn was sent, beam and patience bookkeeping, the
cache decision, and the trajectory log read back with `datasets`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from judge_cases import GATED_TASK, HONEST, program
from kevin_backend.cache.format import EntryKind
from kevin_backend.cache.key import CacheKey
from kevin_backend.generate.engine import Engine, SearchConfig, SearchResult, TurnRecord, _Trajectory, select_beam
from kevin_backend.generate.decision import decide_entry
from kevin_backend.generate.generator import SearchGenerator
from kevin_backend.generate.log import TrajectoryLog
from kevin_backend.generate.policy import EarlierTurn, PolicyError, Reply, TurnReader
from kevin_backend.generate.prompts import Turn
from kevin_backend.generate.replay import ReplayPolicy
from kevin_backend.generate.writers import make_policy
from kevin_backend.judge.judge import Judge
from kevin_backend.judge.result import JudgeResult, JudgeTimings, Reason, Stage
from kevin_backend.config import ConfigError
from kevin_backend.types import KernelTask, TensorSpec


def reply(code: str | None, secret: str, summary: str) -> str:
    block = f"```python\n{code}\n```\n" if code is not None else "I could not write it this time.\n"
    return f"<think>{secret}: long private reasoning</think>\nHere is my attempt.\n{block}Summary: {summary}"


TRY_EXCEPT = program("uses try/except", forward="try:\n            return ext.gated(x, w)\n        except Exception:\n            return x")
USES_MODEL = program("calls the reference", forward="return Model()(x, w)")
SYNTAX = "class ModelNew(:\n    pass"


@pytest.fixture
def judge(tmp_path: Path) -> Judge:
    return Judge(tmp_path / "builds")


def test_each_turn_gets_the_right_feedback_and_no_earlier_reasoning(judge: Judge) -> None:
    replies = [reply(TRY_EXCEPT, "SECRET-0", "tried try/except"), reply(None, "SECRET-1", "gave up"),
               reply(SYNTAX, "SECRET-2", "broken python"), reply(USES_MODEL, "SECRET-3", "reused Model")]
    policy = ReplayPolicy(replies)
    result = Engine(policy, judge, SearchConfig(trajectories=1, turns=4), gpu="NVIDIA H200", capability="9.0").search(GATED_TASK, "gated")
    assert len(result.records) == 4 and policy.calls == 4
    sent = [conversations[0] for conversations in policy.received]
    # turn 0: system + task, which names the GPU
    assert [m["role"] for m in sent[0]] == ["system", "user"] and "NVIDIA H200" in sent[0][1]["content"]
    # turn 1: the rule broken at turn 0, the turn's code and summary, none of its reasoning
    assert "no-try-except" in sent[1][-1]["content"]
    assert "tried try/except" in sent[1][-2]["content"] and "ext.gated" in sent[1][-2]["content"]
    # turn 2: no code in the last reply; turn 3: a syntax error
    assert [r.step.result is None for r in result.records] == [False, True, False, False]
    assert result.records[2].step.result.reason is Reason.SYNTAX_ERROR
    assert result.records[3].step.result.violations[0].rule == "no-reference-model"
    assert sent[2][-1]["content"] != sent[1][-1]["content"]
    for turn, messages in enumerate(sent):
        text = "\n".join(m["content"] for m in messages)
        assert not any(f"SECRET-{i}" in text for i in range(4)), turn
        assert all(f"{s}" in text for s in ["tried try/except", "gave up", "broken python"][:turn])
    assert all(r.score == 0.0 for r in result.records) and result.best is None


def test_oldest_turns_are_cut_at_the_token_budget(judge: Judge) -> None:
    policy = ReplayPolicy([reply(TRY_EXCEPT, "S", f"summary number {i}") for i in range(4)])
    Engine(policy, judge, SearchConfig(trajectories=1, turns=4, max_prompt_tokens=1400)).search(GATED_TASK)
    last = "\n".join(m["content"] for m in policy.received[3][0])
    assert "summary number 2" in last and "summary number 0" not in last
    assert "omitted" in policy.received[3][0][1]["content"].lower()


class _TurnReading(ReplayPolicy):
    """A scripted policy that reads its earlier turns as data (`TurnReader`): what it was given
    each turn is kept."""

    def __init__(self, replies: list[str]) -> None:
        super().__init__(replies)
        self.earlier: list[list[list[EarlierTurn]]] = []

    def generate_after(self, conversations, earlier, sampling):  # type: ignore[no-untyped-def]
        self.earlier.append([list(e) for e in earlier])
        return self.generate(conversations, sampling)


def test_a_turn_reader_gets_every_earlier_turn_with_the_judges_verdict(judge: Judge) -> None:
    """The conversation drops the oldest turns at the token budget; the earlier turns handed
    beside it do not, and each carries the reply as the policy wrote it and the judge's verdict."""
    policy = _TurnReading([reply(TRY_EXCEPT, "S", f"summary number {i}") for i in range(3)] + [reply(None, "S", "none")])
    assert isinstance(policy, TurnReader)
    result = Engine(policy, judge, SearchConfig(trajectories=1, turns=4, max_prompt_tokens=1400)).search(GATED_TASK)
    assert [len(e[0]) for e in policy.earlier] == [0, 1, 2, 3]
    last = "\n".join(m["content"] for m in policy.received[3][0])
    assert "summary number 0" not in last  # dropped from the conversation ...
    seen = policy.earlier[3][0]
    assert "summary number 0" in seen[0].reply.text  # ... not from the turns
    assert [s.result for s in seen] == [r.step.result for r in result.records[:3]]
    assert all(s.result is not None and s.result.violations[0].rule == "no-try-except" for s in seen)


def test_beam_keeps_the_best_and_copies_them() -> None:
    assert select_beam([0.3, 1.5, 0.0, 1.2], keep=2, total=4) == [1, 3, 1, 3]
    assert select_beam([0.3, 0.3, 0.3], keep=1, total=3) == [0, 0, 0]
    engine = Engine(ReplayPolicy([]), None, SearchConfig(trajectories=4, turns=2, beam=2))  # type: ignore[arg-type]
    trajs = [_Trajectory(i, None, [], best) for i, best in enumerate([0.3, 1.5, 0.0, 1.2])]
    kept = engine._beam(trajs)
    assert [(t.id, t.parent, t.best) for t in kept] == [(1, None, 1.5), (3, None, 1.2), (4, 1, 1.5), (5, 3, 1.2)]
    assert kept[2].turns is not kept[0].turns  # copies get their own history


def test_beam_search_runs_the_full_width_each_turn(judge: Judge) -> None:
    policy = ReplayPolicy([reply(TRY_EXCEPT, "S", "x")] * 3)
    result = Engine(policy, judge, SearchConfig(trajectories=4, turns=3, beam=2)).search(GATED_TASK)
    assert [len(c) for c in policy.received] == [4, 4, 4]
    parents = {r.parent for r in result.records if r.turn == 2}
    assert parents - {None} <= {r.trajectory for r in result.records if r.turn == 0}


def test_patience_stops_trajectories_that_do_not_improve(judge: Judge) -> None:
    policy = ReplayPolicy([reply(TRY_EXCEPT, "S", "x")] * 8)
    result = Engine(policy, judge, SearchConfig(trajectories=2, turns=8, patience=2)).search(GATED_TASK)
    assert policy.calls == 3 and "improved" in result.stopped


class _Declining:
    """A writer that takes no task (as the built-in writer answers one it cannot write)."""

    def generate(self, conversations, sampling):  # type: ignore[no-untyped-def]
        return [Reply("I do not take this task: its convolution is cuDNN's in TF32.", finish_reason="declined") for _ in conversations]


@pytest.mark.parametrize("turns", [1, 3])
def test_a_declined_task_says_the_writers_reason_and_counts_no_candidate(judge: Judge, turns: int, tmp_path: Path) -> None:
    # (in a one-turn search too, where the decline comes in the last turn)
    task = KernelTask("gated", GATED_TASK, (TensorSpec((4,), (1,), "float32", "cuda"),), (), (), "h" * 64)
    key = CacheKey("h" * 64, task.inputs, "NVIDIA H200", "9.0", "2.11.0", "13.0")
    generator = SearchGenerator(_Declining(), judge, SearchConfig(trajectories=2, turns=turns), log=TrajectoryLog(tmp_path / "log.jsonl"))
    entry = generator.generate(task, key)
    (result,) = generator.results
    assert len(result.records) == 2 and result.best is None and entry.kind is EntryKind.INDUCTOR
    assert result.stopped == "the policy declined the task: I do not take this task: its convolution is cuDNN's in TF32.", result.stopped
    assert "cuDNN's in TF32" in entry.reason, entry.reason
    assert generator.search_account()["candidates"] == 0


def _record(turn: int, reason: Reason, kernel: float | None, eager: float, inductor: float) -> TurnRecord:
    result = JudgeResult(Stage.TIMING, reason, timings=JudgeTimings(kernel, eager, inductor, 10))
    step = Turn(Reply("text"), f"# kernel {turn}", "", result, "")
    return TurnRecord(0, turn, None, (), step, result.score, 0.0, 0.0)


def test_the_cache_decision_needs_the_margin_over_inductor() -> None:
    task = KernelTask("t", GATED_TASK, (TensorSpec((4,), (1,), "float32", "cuda"),), (), (), "h" * 64)
    key = CacheKey("h" * 64, task.inputs, "NVIDIA H200", "9.0", "2.11.0", "13.0")

    def decide(*records: TurnRecord) -> object:
        return decide_entry(SearchResult("t", records, "all turns", 0, 0, 0, "replay"), key, task, 0.03)

    win = decide(_record(0, Reason.ACCEPTED, 1.0, 1.2, 1.05), _record(1, Reason.ACCEPTED, 0.5, 1.2, 1.05))
    assert win.kind is EntryKind.KERNEL and win.kernel_source == "# kernel 1" and win.timings.kernel_ms == 0.5
    close = decide(_record(0, Reason.ACCEPTED, 1.0, 1.2, 1.02))
    assert close.kind is EntryKind.INDUCTOR and "1.020x" in close.reason
    none = decide(_record(0, Reason.MISMATCH, None, 1.2, 1.0))
    assert none.kind is EntryKind.INDUCTOR and "no correct kernel" in none.reason


def test_the_log_reads_back_with_datasets(judge: Judge, tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets")
    log = TrajectoryLog.default(tmp_path / "cache")
    policy = ReplayPolicy([reply(TRY_EXCEPT, "S", "a"), reply(None, "S", "b"), reply(SYNTAX, "S", "c")])
    result = Engine(policy, judge, SearchConfig(trajectories=2, turns=3), on_record=log.write).search(GATED_TASK, "gated")
    rows = datasets.load_dataset("json", data_files=str(log.path), split="train", cache_dir=str(tmp_path / "hf"))
    assert len(rows) == len(result.records) == 6
    assert rows[0]["messages"][0]["role"] == "system" and rows[0]["reason"] == "RULE_VIOLATION"
    assert sorted(set(rows["reason"])) == ["NO_CODE", "RULE_VIOLATION", "SYNTAX_ERROR"]
    assert rows[2]["reasoning"].startswith("S:") and rows[2]["policy"] == "replay" and rows[0]["sampling"]["temperature"] == 0.9
    assert json.loads(rows[0]["judge"])["violations"][0]["rule"] == "no-try-except"


def test_a_policy_that_never_answers_caches_no_decision(judge: Judge, tmp_path: Path) -> None:
    task = KernelTask("t", GATED_TASK, (TensorSpec((4,), (1,), "float32", "cuda"),), (), (), "h" * 64)
    key = CacheKey("h" * 64, task.inputs, "NVIDIA H200", "9.0", "2.11.0", "13.0")
    generator = SearchGenerator(ReplayPolicy([]), judge, SearchConfig(trajectories=2, turns=2),
                                log=TrajectoryLog(tmp_path / "log.jsonl"))
    with pytest.raises(PolicyError, match="replay script"):
        generator.generate(task, key)


def test_policy_names() -> None:
    with pytest.raises(ConfigError, match="unknown policy"):
        make_policy("gpt:whatever")
    assert make_policy("openai:my-model").name == "openai:my-model"


def test_kevin_generate_needs_a_gpu_here(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import torch

    from kevin_backend.cli.main import main

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    (tmp_path / "task.py").write_text(GATED_TASK)
    (tmp_path / "replies.json").write_text(json.dumps([HONEST[0].source]))
    code = main(["--cache-dir", str(tmp_path / "c"), "generate", str(tmp_path / "task.py"), "--policy", f"replay:{tmp_path / 'replies.json'}"])
    assert code == 2 and "CUDA GPU" in capsys.readouterr().err


class _ShortOfMemory:
    """A judge that cannot get GPU memory (RESOURCE): its own failure, no verdict on any kernel."""

    def __init__(self) -> None:
        self.calls = 0

    def judge(self, task_source: str, candidate_source: str) -> JudgeResult:
        self.calls += 1
        return JudgeResult(Stage.RUN, Reason.RESOURCE, feedback="the judge could not get GPU memory while making inputs")


def test_a_search_cut_short_by_the_judges_failure_decides_nothing(tmp_path: Path) -> None:
    from kevin_backend.cache.store import KernelCache
    from kevin_backend.config import Config
    from kevin_backend.generate.generator import SearchIncomplete

    judge = _ShortOfMemory()
    policy = ReplayPolicy([reply(HONEST[0].source, "S", "a fused kernel")] * 4)
    config = Config(cache_dir=tmp_path / "cache")
    generator = SearchGenerator(policy, judge, SearchConfig(trajectories=1, turns=3), config,
                                log=TrajectoryLog(tmp_path / "log.jsonl"))
    task = KernelTask.from_program("gated", GATED_TASK, "cpu")
    key = CacheKey(task.graph_hash, task.inputs, "NVIDIA H200", "9.0", "2.11.0", "13.0")
    with pytest.raises(SearchIncomplete, match="RESOURCE"):
        generator.generate(task, key)
    result = generator.results[-1]
    assert judge.calls == 2 and len(result.records) == 1  # judged again once, then the search stopped
    assert result.incomplete and policy.calls == 1
    with pytest.raises(ValueError):
        decide_entry(result, key, task)
    with KernelCache(config.cache_dir) as cache:
        assert cache.get(key) is None


def test_a_model_server_that_dies_part_way_leaves_no_decision(tmp_path: Path) -> None:
    policy = ReplayPolicy([reply(TRY_EXCEPT, "S", "first")])  # one answer, then it fails like a dead server
    result = Engine(policy, Judge(tmp_path / "b"), SearchConfig(trajectories=1, turns=3)).search(GATED_TASK, "gated")
    assert result.stopped.startswith("policy error") and result.incomplete and len(result.records) == 1
