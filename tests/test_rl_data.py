"""Where the trainer's data comes from: task folders and the backend's pending tasks, the seeded
task order, rollouts through the engine with the real judge (static rules on the CPU), and
samples read back from a trajectory log."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Sequence

import pytest

from kevin_backend.generate.engine import Engine, SearchConfig
from kevin_backend.generate.log import TrajectoryLog
from kevin_backend.generate.policy import Message, Reply, Sampling
from kevin_backend.judge.judge import Judge
from kevin_backend.rl.train_config import JudgeSettings, RolloutSettings, TaskSettings, TrainConfigError
from kevin_backend.rl.rollout import Rollouts, make_judge, rollout_seed, search_config
from kevin_backend.rl.samples import sample_from_record, samples_from_log, with_advantages
from kevin_backend.rl.synthetic import FencedPolicy, TargetStringJudge
from kevin_backend.rl.tasks import TaskSampler, TrainTask, load_tasks, tasks_from_folder, tasks_from_pending

sys.path.insert(0, str(Path(__file__).resolve().parent))

ROOT = Path(__file__).resolve().parent.parent
TINY_TASKS = ROOT / "configs" / "train" / "tiny_tasks"

CPU_TASK = '''import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return torch.relu(x) * 2.0


def get_inputs():
    return [torch.randn(64, 32)]


def get_init_inputs():
    return []
'''


def test_tasks_from_folders(tmp_path: Path) -> None:
    tasks = tasks_from_folder(TINY_TASKS)
    assert [t.name for t in tasks] == ["add_relu", "row_sum", "scaled_sigmoid"]
    assert all("class Model" in t.source for t in tasks)
    nested = tmp_path / "level2"
    nested.mkdir()
    (nested / "fused.py").write_text(CPU_TASK)
    (tmp_path / "helpers.py").write_text("def helper():\n    return 1\n")  # not a problem: skipped
    (tmp_path / "copy.py").write_text(tasks[0].source)  # the same program twice: kept once
    both = load_tasks(TaskSettings(folders=(str(TINY_TASKS), str(tmp_path))))
    assert [t.name for t in both] == ["add_relu", "level2/fused", "row_sum", "scaled_sigmoid"]
    assert [t.name for t in load_tasks(TaskSettings(folders=(str(TINY_TASKS),), limit=1))] == ["add_relu"]
    with pytest.raises(TrainConfigError, match="not a folder"):
        tasks_from_folder(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(TrainConfigError, match="no KernelBench-format problem"):
        load_tasks(TaskSettings(folders=(str(tmp_path / "empty"),)))


def test_tasks_from_the_backends_pending_record(tmp_path: Path) -> None:
    from kevin_backend.cache.key import make_key
    from kevin_backend.cache.store import KernelCache
    from kevin_backend.types import KernelTask

    task = KernelTask.from_program("relu_scale", CPU_TASK)
    key = make_key(task)
    with KernelCache(tmp_path, seed_dir=None) as cache:
        assert cache.record_pending(key, task)
    (found,) = tasks_from_pending(tmp_path)
    assert found.source == task.source and found.name == f"pending/{key.digest[:16]}"
    assert found.origin.startswith("pending:")
    assert [t.name for t in load_tasks(TaskSettings(pending_caches=(str(tmp_path),)))] == [found.name]


def test_task_order_is_seeded_and_resumable() -> None:
    tasks = [TrainTask(f"t{i}", CPU_TASK, "") for i in range(5)]
    a = TaskSampler(tasks, seed=3)
    first = [t.name for t in a.take(3)]
    state = a.state_dict()
    rest = [t.name for t in a.take(9)]  # crosses two epoch boundaries
    assert sorted(first + rest[:2]) == [f"t{i}" for i in range(5)]  # one epoch: every task once
    b = TaskSampler(tasks, seed=3)
    b.load_state_dict(state)
    assert [t.name for t in b.take(9)] == rest
    assert [t.name for t in TaskSampler(tasks, seed=3).take(3)] == first
    assert [t.name for t in TaskSampler(tasks, seed=4).take(5)] != [t.name for t in TaskSampler(tasks, seed=3).take(5)]


class Scripted:
    """A policy that answers conversation i of every call with replies[i % len(replies)]."""

    name = "scripted"

    def __init__(self, replies: Sequence[str]) -> None:
        self.replies = list(replies)
        self.calls: list[tuple[int, Sampling]] = []

    def generate(self, conversations: Sequence[Sequence[Message]], sampling: Sampling) -> list[Reply]:
        self.calls.append((len(conversations), sampling))
        return [Reply(text=self.replies[i % len(self.replies)]) for i in range(len(conversations))]


NO_CODE = "I would fuse the two operations into one kernel."
PYTORCH_IN_FORWARD = '''```python
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x):
        return torch.relu(x) * 2.0
```
Summary: used PyTorch.'''


def test_rollouts_go_through_the_engine_and_the_real_judge(tmp_path: Path) -> None:
    """The kernelbench judge is the real one; on this CPU machine it still applies its static
    rules: a reply without code and a reply computing with PyTorch both score 0 (a group of equal
    scores: zero advantages, no NaN). Every turn is logged, and every logged turn reads back as a
    sample with the same prompt tokens."""
    pytest.importorskip("transformers")
    from tiny_lm import train_tokenizer

    judge = make_judge(JudgeSettings(kind="kernelbench", trials=3), tmp_path)
    assert isinstance(judge, Judge)
    policy = Scripted([NO_CODE, PYTORCH_IN_FORWARD])
    settings = RolloutSettings(trajectories=2, turns=2, max_tokens=64)
    rollouts = Rollouts(policy, judge, search_config(settings), log_dir=tmp_path / "logs")
    task = TrainTask("relu_scale", CPU_TASK, "")
    (result,) = rollouts.run([task], batch=7, seed=11, first_index=3)
    assert len(result.records) == 4
    reasons = [r.result.reason.name if r.result else "NO_CODE" for r in result.records]
    assert reasons == ["NO_CODE", "RULE_VIOLATION", "NO_CODE", "RULE_VIOLATION"]
    assert all(r.score == 0.0 for r in result.records)
    # the engine's sampling seed: the task's seed, plus 1000 per turn
    assert [s.seed for _, s in policy.calls] == [rollout_seed(11, 7, 3), rollout_seed(11, 7, 3) + 1000]
    # the second turn's prompt carries the judge's feedback on the first
    assert result.records[3].messages[-1]["content"] == result.records[1].step.feedback

    tokenizer = train_tokenizer()
    samples = with_advantages([sample_from_record(r, task.name, tokenizer) for r in result.records], 0.4, "mean_std")
    assert [s.advantage for s in samples] == [0.0] * 4
    lines = TrajectoryLog(tmp_path / "logs" / "batch-000007-rank0.jsonl").read()
    assert len(lines) == 4
    logged = samples_from_log(lines, tokenizer)
    assert [s.prompt_ids for s in logged] == [s.prompt_ids for s in samples]
    assert [s.completion_ids for s in logged] == [s.completion_ids for s in samples]
    assert samples[0].completion_ids[-1] == tokenizer.eos_token_id  # re-tokenized replies end with the stop


def test_the_synthetic_judge_and_fenced_replies() -> None:
    judge = TargetStringJudge("o", per_hit=0.5, max_speedup=2.0)
    assert judge.judge("", "xyz").score == 0.0 and not judge.judge("", "xyz").correct
    one = judge.judge("", "o")
    assert one.correct and one.timings.speedup_vs_eager == pytest.approx(0.5) and one.score == pytest.approx(0.8)
    assert judge.judge("", "o" * 10).timings.speedup_vs_eager == pytest.approx(2.0)  # capped
    fenced = FencedPolicy(Scripted(["o o o"]))
    engine = Engine(fenced, judge, SearchConfig(trajectories=1, turns=1))
    (record,) = engine.search(CPU_TASK).records
    assert record.step.code == "o o o\n" and record.score == pytest.approx(0.3 + 1.5)
    assert fenced.name == "scripted+fenced"
