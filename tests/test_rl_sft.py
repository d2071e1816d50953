"""The warm start (config section `sft`): demonstrations of the built-in writer in the rollouts'
own conversations, a loss on the reply tokens only, the loss going down, the config's checks,
a resumed run that does not repeat it, two processes taking the same steps as one, the small
model builder and the H200 run's script in its CPU smoke mode.

The model is `kevin_backend/rl/tiny.py`'s, at test size (hidden 32, one layer), its tokenizer
trained on the prompts and the built-in writer's programs for one task, so a demonstration is
about 60 prompt and 150-200 reply tokens. Nothing is downloaded.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("accelerate")
pytestmark = pytest.mark.usefixtures("one_share_of_the_cores")  # (conftest.py)

from kevin_backend.rl.train_config import SFTSettings, TrainConfig, TrainConfigError  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
H200_CONFIG = ROOT / "configs" / "train" / "h200-builtin.yaml"
TASK = "gated-f32"


@pytest.fixture(autouse=True)
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")


@pytest.fixture(autouse=True)
def fresh_accelerate_state():
    from accelerate.state import AcceleratorState, GradientState

    yield
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> SimpleNamespace:
    from kevin_backend.rl.tiny import build_model, write_suite_tasks

    root = tmp_path_factory.mktemp("sft")
    write_suite_tasks(root / "tasks", [TASK])
    build_model(root / "lm", tasks=root / "tasks", hidden=32, layers=1, heads=2, max_positions=1024)
    return SimpleNamespace(tasks=root / "tasks", model=root / "lm")


def _config(setup: SimpleNamespace, run_dir: Path, *extra: str) -> TrainConfig:
    """The H200 config at test size: the synthetic judge, one task, few steps, short replies."""
    return TrainConfig.from_yaml(H200_CONFIG, [
        f"run_dir={run_dir}", f"model.path={setup.model}", f"tasks.folders=[{setup.tasks}]",
        "batches=1", "checkpoint_every=1", "keep_checkpoints=5", "monitor.tensorboard=false",
        "judge={kind: synthetic, target: __global__}", "rollout.trajectories=2", "rollout.turns=1",
        "rollout.max_tokens=8", "grpo.tasks_per_batch=1", "grpo.micro_batch_size=2",
        "sft.trajectories=2", "sft.turns=1", "sft.steps=3", "sft.batch_size=2", "sft.micro_batch_size=2",
        "sft.warmup_steps=0", "sft.lr=3e-3", *extra])


def _lines(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _weights(trainer) -> dict[str, torch.Tensor]:
    model = trainer.accelerator.unwrap_model(trainer.model)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


# ---------------------------------------------------------------------------------------------
# demonstrations


def test_demonstrations_are_the_rollouts_conversations(setup: SimpleNamespace, tmp_path: Path) -> None:
    """A first-turn demonstration's prompt is token for token what the live policy sends on a
    rollout's first turn; its reply is the built-in writer's program, ended with the
    end-of-sequence token; a second-turn demonstration answers a "correct" verdict on the first
    turn's program; identical demonstrations are kept once."""
    from kevin_backend.generate.builtin.builtin_policy import BuiltinPolicy
    from kevin_backend.generate.policy import Sampling
    from kevin_backend.generate.prompts import build_messages
    from kevin_backend.rl.sft import builtin_demonstrations
    from kevin_backend.rl.trainer import Trainer

    trainer = Trainer(_config(setup, tmp_path / "run"))
    tok = trainer.tokenizer
    (result,) = trainer.rollouts.run(trainer.tasks, batch=0, seed=0)
    sent = result.records[0].step.reply.extra["prompt_ids"]

    settings = SFTSettings(trajectories=3, turns=2)
    demos = builtin_demonstrations(trainer.tasks, tok, settings, trainer.config.rollout)
    first = [d for d in demos if d.turn == 0]
    second = [d for d in demos if d.turn == 1]
    assert len(first) == 3 and len(second) == 3 and all(d.task == TASK for d in demos)
    assert all(list(d.prompt_ids) == sent for d in first)
    writer = BuiltinPolicy().generate([build_messages(trainer.tasks[0].source, "", [], 1 << 20)] * 3, Sampling())
    for demo, reply in zip(first, writer):
        assert demo.completion_ids[-1] == tok.eos_token_id
        assert tok.decode(list(demo.completion_ids), skip_special_tokens=True) == reply.text
        assert "__global__" in reply.text and "class ModelNew" in reply.text
    assert len({d.completion_ids for d in first}) == 3  # three variants of the first kernel
    prompt = tok.decode(list(second[0].prompt_ids))
    assert "Your program is correct" in prompt and "variant 1" in prompt and "__global__" in prompt  # (the first of preferred_order)
    assert "Summary:" in tok.decode(list(second[0].completion_ids))
    # the same settings twice over: each (prompt, reply) once
    again = builtin_demonstrations(trainer.tasks * 2, tok, settings, trainer.config.rollout)
    assert len(again) == len(demos)


def test_a_task_the_writer_declines_is_a_clear_error(setup: SimpleNamespace, tmp_path: Path) -> None:
    from kevin_backend.rl.sft import builtin_demonstrations
    from kevin_backend.rl.tasks import TrainTask
    from transformers import AutoTokenizer

    matmul = (ROOT / "configs" / "train" / "tiny_tasks" / "add_relu.py").read_text().replace(
        "return torch.relu(x + y)", "return x @ y")
    assert "x @ y" in matmul
    tok = AutoTokenizer.from_pretrained(str(setup.model))
    from kevin_backend.rl.train_config import RolloutSettings

    with pytest.raises(TrainConfigError, match="sft.source: the built-in writer declined every training task"):
        builtin_demonstrations([TrainTask("matmul", matmul, "")], tok, SFTSettings(), RolloutSettings())


# ---------------------------------------------------------------------------------------------
# the loss


class _Recorder(torch.nn.Module):
    """A stand-in LM whose logits keep their gradient, to see which positions the loss reaches."""

    def __init__(self, vocab: int) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = torch.nn.Embedding(vocab, 16)
        self.head = torch.nn.Linear(16, vocab)
        self.logits: torch.Tensor | None = None

    def forward(self, input_ids, attention_mask=None, use_cache=False):  # noqa: ANN001
        hidden = torch.cumsum(self.embed(input_ids), dim=1)  # causal: position p sees tokens 0..p
        self.logits = self.head(hidden)
        self.logits.retain_grad()
        return SimpleNamespace(logits=self.logits)


def test_only_reply_tokens_carry_the_sft_loss() -> None:
    """The loss is the mean negative log-likelihood of the reply tokens; the logits of every
    prompt and padding position, and all of a zero-weight filler's, get exactly zero gradient,
    while every reply position gets some."""
    from kevin_backend.rl.loss import sequence_logprobs
    from kevin_backend.rl.samples import Sample, collate
    from kevin_backend.rl.sft import sft_loss

    def sample(prompt: tuple[int, ...], reply: tuple[int, ...], weight: float = 1.0) -> Sample:
        return Sample(task="t", group="g", trajectory=0, turn=0, prompt_ids=prompt, completion_ids=reply, text="",
                      score=0.0, correct=False, speedup=None, finish_reason="stop", weight=weight)

    samples = [sample((5, 6, 7, 8, 9), (10, 11, 12)), sample((5, 6), (13, 14, 15, 16, 17, 18)),
               sample((0,), (0,), weight=0.0)]
    batch = collate(samples, pad_id=0)
    model = _Recorder(vocab=20)
    tokens = 3 + 6
    loss, nll = sft_loss(sequence_logprobs(model, batch, 1.0), batch.loss_mask, tokens)
    loss.backward()
    grad = model.logits.grad
    assert grad is not None
    # the expected value, computed apart: -log p(reply token | everything before it)
    logp = torch.log_softmax(model.logits.detach(), dim=-1)
    want = 0.0
    for row, s in enumerate(samples[:2]):
        ids = s.prompt_ids + s.completion_ids
        for k in range(len(s.prompt_ids), len(ids)):
            want -= float(logp[row, k - 1, ids[k]])
    assert float(loss.detach()) == pytest.approx(want / tokens, rel=1e-5) and nll == pytest.approx(want, rel=1e-5)
    for row, s in enumerate(samples):
        reply = range(len(s.prompt_ids) - 1, len(s.prompt_ids) - 1 + len(s.completion_ids)) if s.weight else range(0)
        for position in range(grad.shape[1]):
            touched = bool(grad[row, position].abs().sum() > 0)
            assert touched == (position in reply), (row, position)


def test_the_warm_start_learns_the_demonstrations(setup: SimpleNamespace, tmp_path: Path) -> None:
    """Forty steps on the writer's two first replies: the loss per reply token falls by more
    than half, token accuracy rises, every step is logged (metrics.jsonl lines of kind sft, a
    summary, the plot's warm-start panels), the batch lines stay apart, and the state records it."""
    from kevin_backend.rl.metrics import plot_metrics, read_metrics, read_sft_metrics
    from kevin_backend.rl.trainer import Trainer

    run_dir = tmp_path / "run"
    trainer = Trainer(_config(setup, run_dir, "sft.steps=40", "sft.lr=1e-2"))
    before = _weights(trainer)
    seen: list[int] = []
    report = trainer.warm_start(on_step=lambda s: seen.append(s.step))
    assert report is not None and seen == list(range(1, 41))
    print(f"sft loss {report.loss_before:.3f} -> {report.loss_after:.3f}, token accuracy "
          f"{report.token_accuracy_before:.3f} -> {report.token_accuracy_after:.3f}")
    assert report.demonstrations == 2 and report.steps == 40
    assert report.loss_after < 0.5 * report.loss_before
    assert report.token_accuracy_after > report.token_accuracy_before + 0.2
    steps, summary = read_sft_metrics(run_dir)
    assert [s["step"] for s in steps] == list(range(1, 41)) and summary["loss_after"] == report.loss_after
    assert sum(s["loss"] for s in steps[-3:]) < 0.6 * sum(s["loss"] for s in steps[:3])
    assert all(s["grad_norm"] > 0 and s["tokens"] > 100 for s in steps)
    assert trainer.state.sft_done and trainer.state.sft_steps == 40 and trainer.state.optimizer_step == 0
    assert any(not torch.equal(before[k], v) for k, v in _weights(trainer).items())
    assert trainer.warm_start() is None  # once per run
    trainer.train()
    assert [r["batch"] for r in read_metrics(run_dir)] == [1]
    assert len([r for r in _lines(run_dir) if r.get("kind") == "sft"]) == 40
    png = plot_metrics(run_dir)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# ---------------------------------------------------------------------------------------------
# resuming


def test_a_resumed_run_does_not_repeat_the_warm_start(setup: SimpleNamespace, tmp_path: Path) -> None:
    """The warm start's checkpoint (batch 0) and every later one record it: a run resumed from
    either goes on without it (same metrics lines of kind sft, weights as the checkpoint left
    them), while a fresh run in an empty folder does it. A run resumed after batches trained
    without it does not start it mid-run."""
    from kevin_backend.rl.checkpoint import TrainerState
    from kevin_backend.rl.trainer import Trainer

    a = Trainer(_config(setup, tmp_path / "a"))
    a.train()
    sft_lines = [r for r in _lines(tmp_path / "a") if r.get("kind") == "sft"]
    assert len(sft_lines) == 3
    names = sorted(p.name for p in (tmp_path / "a" / "checkpoints").iterdir())
    assert names == ["batch-000000", "batch-000001"]
    state = json.loads((tmp_path / "a" / "checkpoints" / "batch-000000" / "trainer_state.json").read_text())
    assert state["sft_done"] is True and state["batch"] == 0 and state["sft_steps"] == 3

    # resumed after batch 1, to 2 batches: one more batch, no warm start
    b = Trainer(_config(setup, tmp_path / "a", "batches=2"))
    assert b.resume() and b.state.sft_done and b.state.batch == 1
    b.train()
    lines = _lines(tmp_path / "a")
    assert [r for r in lines if r.get("kind") == "sft"] == sft_lines
    assert [r["batch"] for r in lines if "kind" not in r] == [1, 2] and b.sft_report is None

    # resumed from the warm start's own checkpoint: its weights, then straight to batch 1
    (tmp_path / "c" / "checkpoints").mkdir(parents=True)
    import shutil

    shutil.copytree(tmp_path / "a" / "checkpoints" / "batch-000000", tmp_path / "c" / "checkpoints" / "batch-000000")
    c = Trainer(_config(setup, tmp_path / "c"))
    fresh = _weights(c)
    assert c.resume() and c.state.sft_done and c.state.batch == 0
    after_sft = _weights(c)
    assert any(not torch.equal(fresh[k], v) for k, v in after_sft.items())  # the checkpoint's weights came back
    c.train()
    assert c.sft_report is None
    assert not [r for r in _lines(tmp_path / "c") if r.get("kind") in ("sft", "sft_summary")]

    # the negative control: the same config in an empty folder does warm-start
    d = Trainer(_config(setup, tmp_path / "d"))
    assert not d.resume()
    d.train()
    assert d.sft_report is not None and len([r for r in _lines(tmp_path / "d") if r.get("kind") == "sft"]) == 3

    # an older state file (no sft keys) reads as "not done"; after batches without it, none is started
    assert TrainerState.from_dict({"batch": 4, "optimizer_step": 8}).sft_done is False
    e = Trainer(_config(setup, tmp_path / "e"))
    e.state = dataclasses.replace(e.state, batch=4)
    assert e.warm_start() is None and not e.state.sft_done


# ---------------------------------------------------------------------------------------------
# config


BASE = {"run_dir": "runs/x", "model": {"path": "m"}, "tasks": {"folders": ["t"]}}


@pytest.mark.parametrize("sft, key", [
    ({"source": "teacher"}, "sft.source"),
    ({"steps": 0}, "sft.steps"),
    ({"steps": 10, "epochs": 2}, "sft.steps"),
    ({"epochs": 0}, "sft.epochs"),
    ({"batch_size": 0}, "sft.batch_size"),
    ({"micro_batch_size": 0}, "sft.micro_batch_size"),
    ({"lr": 0}, "sft.lr"),
    ({"lr": "fast"}, "sft.lr"),
    ({"trajectories": 0}, "sft.trajectories"),
    ({"turns": 0}, "sft.turns"),
    ({"schedule": "step"}, "sft.schedule"),
    ({"grad_clip": 0}, "sft.grad_clip"),
    ({"warmup_steps": -1}, "sft.warmup_steps"),
    ({"stepz": 3}, "sft: unknown key(s) stepz"),
    ("fast", "sft: expected a mapping"),
])
def test_bad_sft_settings_name_the_key(sft: object, key: str) -> None:
    with pytest.raises(TrainConfigError) as info:
        TrainConfig.from_dict({**BASE, "sft": sft})
    assert str(info.value).startswith(key), str(info.value)


def test_sft_settings() -> None:
    assert TrainConfig.from_dict(BASE).sft is None
    assert TrainConfig.from_dict({**BASE, "sft": None}).sft is None
    default = TrainConfig.from_dict({**BASE, "sft": {}}).sft
    assert default == SFTSettings() and default.total_steps(40) == 100
    assert TrainConfig.from_dict(BASE, ["sft.epochs=2.5", "sft.batch_size=4"]).sft.total_steps(10) == 7  # 25 / 4
    assert TrainConfig.from_dict({**BASE, "sft": {}}).digest() != TrainConfig.from_dict(BASE).digest()
    # without a warm start, the digest is the one checkpoints written before the section existed recorded
    plain = {k: v for k, v in TrainConfig.from_dict(BASE).as_dict().items() if k != "sft"}
    import hashlib

    assert TrainConfig.from_dict(BASE).digest() == hashlib.sha256(
        json.dumps(plain, sort_keys=True).encode()).hexdigest()[:16]
    with pytest.raises(TrainConfigError, match="^sft: the warm start runs on one process or under ddp"):
        TrainConfig.from_dict({**BASE, "sft": {}, "distributed": "deepspeed"})
    TrainConfig.from_dict({**BASE, "sft": {}, "distributed": "ddp"})


def test_the_h200_config_fits_the_writers_replies() -> None:
    """The H200 run's config: the real judge, the transformers engine, a warm start; and with the
    tokenizer `make-model` trains (on the H200's prompts), every demonstration's reply fits in
    rollout.max_tokens and every prompt in max_prompt_tokens."""
    from kevin_backend.rl.sft import builtin_demonstrations
    from kevin_backend.rl.tasks import TrainTask
    from kevin_backend.rl.tiny import DEFAULT_SUITE_TASKS, builtin_corpus, suite_tasks, train_tokenizer

    c = TrainConfig.from_yaml(H200_CONFIG)
    assert c.judge.kind == "kernelbench" and c.judge.trials <= 50
    assert c.rollout.engine == "transformers" and c.rollout.trajectories == 4 and c.rollout.turns == 2
    assert c.sft is not None and c.sft.source == "builtin" and 4 <= c.batches <= 6
    tasks = suite_tasks(DEFAULT_SUITE_TASKS)
    assert 4 <= len(tasks) <= 8 and all("float32" in t.source for t in tasks)
    assert {t.category for t in tasks} >= {"reduction"} and any(t.category.startswith("chain") for t in tasks)
    tokenizer = train_tokenizer(builtin_corpus([t.source for t in tasks], gpu="NVIDIA H200", capability="9.0"), 8192,
                                whole_lines=True)
    demos = builtin_demonstrations([TrainTask(t.name, t.source, "") for t in tasks], tokenizer, c.sft, c.rollout,
                                   "NVIDIA H200", "9.0")
    assert len(demos) == len(tasks) * c.sft.trajectories * c.sft.turns
    longest = max(len(d.completion_ids) for d in demos)
    print(f"{len(demos)} demonstrations, longest reply {longest} tokens, longest prompt "
          f"{max(len(d.prompt_ids) for d in demos)} tokens")
    assert longest <= c.rollout.max_tokens
    assert max(len(d.prompt_ids) for d in demos) <= c.rollout.max_prompt_tokens
    assert max(d.length for d in demos) + c.rollout.max_tokens <= 4096  # make-model's --max-positions


# ---------------------------------------------------------------------------------------------
# the model builder and the H200 script


def test_whole_line_tokens_keep_programs_short_and_exact(setup: SimpleNamespace) -> None:
    from transformers import AutoConfig, AutoTokenizer

    from kevin_backend.generate.builtin.builtin_policy import BuiltinPolicy
    from kevin_backend.generate.policy import Sampling
    from kevin_backend.generate.prompts import build_messages
    from kevin_backend.rl.tiny import suite_tasks, train_tokenizer

    tok = AutoTokenizer.from_pretrained(str(setup.model))
    assert AutoConfig.from_pretrained(str(setup.model)).model_type == "qwen3"
    (task,) = suite_tasks([TASK])
    reply = BuiltinPolicy().generate([build_messages(task.source, "", [], 1 << 20)], Sampling())[0].text
    ids = tok(reply, add_special_tokens=False).input_ids
    words = train_tokenizer([reply], 8192)  # the same corpus, pieces cut at words
    # a token a line at most (the program is a few hundred lines: its device helpers grow with the
    # writer), against thousands for pieces cut at words
    assert len(ids) <= len(reply.splitlines()) and 10 * len(ids) < len(words(reply, add_special_tokens=False).input_ids)
    assert tok.decode(ids) == reply
    other = "__global__ void kernel(float* y) { y[threadIdx.x] = 0.5f; }  // not in the corpus"
    assert tok.decode(tok(other, add_special_tokens=False).input_ids) == other


def test_the_h200_script_smoke_run(tmp_path: Path) -> None:
    """`benchmarks/rl_h200.py --smoke`: the tasks, the model, the warm start and a batch on the
    CPU; the table, the JSON and the PNG."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "2"}
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "rl_h200.py"), "--smoke", "--out",
                           str(tmp_path / "out")], env=env, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:] + done.stdout[-3000:]
    assert "sft step 1" in done.stdout and "batch 1/1" in done.stdout and "| batch | mean score |" in done.stdout
    report = json.loads((tmp_path / "out" / "rl_h200.json").read_text())
    assert report["smoke"] and report["tasks"] == ["gated-f32", "sum-f32"]
    assert report["sft"]["loss_after"] < report["sft"]["loss_before"]
    assert len(report["sft_steps"]) == report["sft"]["steps"] == 4
    assert [b["batch"] for b in report["batches"]] == [1] and report["batches"][0]["samples"] == 2
    assert report["config"]["judge"]["kind"] == "synthetic"
    assert (tmp_path / "out" / "metrics.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_two_processes_take_the_same_warm_start_steps_as_one(setup: SimpleNamespace, tmp_path: Path) -> None:
    """Data parallel on two CPU processes (torchrun, gloo): a step's demonstrations split 2 + 1
    (the second process topped up with a zero-weight filler), each process's loss scaled by the
    step's reply tokens over the processes, gradients averaged: the same losses and gradient
    norms as one process."""
    args = ["-m", "kevin_backend", "train", "--config", str(H200_CONFIG), "--set", f"model.path={setup.model}",
            "--set", f"tasks.folders=[{setup.tasks}]", "--set", "batches=1", "--set", "monitor.tensorboard=false",
            "--set", "judge={kind: synthetic, target: __global__}", "--set", "rollout.trajectories=2",
            "--set", "rollout.turns=1", "--set", "rollout.max_tokens=4", "--set", "grpo.tasks_per_batch=1",
            "--set", "sft.trajectories=3", "--set", "sft.turns=1", "--set", "sft.steps=2", "--set", "sft.batch_size=3",
            "--set", "sft.micro_batch_size=1", "--set", "sft.warmup_steps=0"]
    env = {**os.environ, "ACCELERATE_USE_CPU": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    one = subprocess.run([sys.executable, *args, "--set", f"run_dir={tmp_path / 'one'}"], env=env,
                         capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert one.returncode == 0, one.stderr[-3000:]
    two = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                          *args, "--set", f"run_dir={tmp_path / 'two'}", "--set", "distributed=ddp",
                          "--set", "grpo.tasks_per_batch=2"],
                         env=env, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert two.returncode == 0, two.stderr[-3000:]
    a = [r for r in _lines(tmp_path / "one") if r.get("kind") == "sft"]
    b = [r for r in _lines(tmp_path / "two") if r.get("kind") == "sft"]
    assert len(a) == len(b) == 2
    for x, y in zip(a, b):
        assert x["tokens"] == y["tokens"] and x["demonstrations"] == y["demonstrations"] == 3
        assert y["loss"] == pytest.approx(x["loss"], rel=1e-4)
        assert y["grad_norm"] == pytest.approx(x["grad_norm"], rel=1e-3)
