"""The trainer end to end on the CPU: `kevin train` with the tiny config raises a synthetic reward,
and a run resumed from a checkpoint takes exactly the step the uninterrupted run took.

The model is tests/tiny_lm.py's randomly initialized two-layer Qwen2, with its tokenizer trained
here on the prompt templates and the tiny tasks (so a prompt is ~600 tokens instead of ~1500 with
the generic tiny tokenizer, which keeps a training step around a second on two cores). Nothing is
downloaded. Run this file as a script to build that model for `configs/train/tiny.yaml`:

    python tests/test_rl_train.py runs/tiny-lm
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("accelerate")
pytestmark = pytest.mark.usefixtures("one_share_of_the_cores")  # (conftest.py)

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
from tiny_lm import CORPUS, tiny_model, train_tokenizer  # noqa: E402

TINY_CONFIG = ROOT / "configs" / "train" / "tiny.yaml"
TINY_TASKS = ROOT / "configs" / "train" / "tiny_tasks"


def training_corpus() -> tuple[str, ...]:
    """tiny_lm's lines plus every line of the prompt templates and the tiny tasks."""
    from kevin_backend.generate.prompts import TEMPLATES_DIR

    lines = list(CORPUS)
    for path in [*sorted(TEMPLATES_DIR.glob("*.txt")), *sorted(TINY_TASKS.glob("*.py"))]:
        lines.extend(line for line in path.read_text().splitlines() if line.strip())
    return tuple(lines)


def build_training_lm(folder: Path, seed: int = 0) -> Path:
    """The tiny model and tokenizer for training runs, saved in `folder` (from_pretrained loads it)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer = train_tokenizer(training_corpus(), vocab_size=2000)
    tiny_model(tokenizer, seed=seed).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def tiny_lm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_training_lm(tmp_path_factory.mktemp("tiny_train_lm"))


@pytest.fixture(autouse=True)
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")


@pytest.fixture(autouse=True)
def fresh_accelerate_state():
    """accelerate keeps one process-wide state (precision, devices): a real run sets it once per
    process; each test here is its own run."""
    from accelerate.state import AcceleratorState, GradientState

    yield
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()


def _rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_kevin_train_raises_the_synthetic_reward(tiny_lm: Path, tmp_path: Path) -> None:
    """12 batches of the tiny config (at 4 times its learning rate, so that 12 batches do what its
    30 do) through the real command: the replies' mean score (the synthetic judge pays for each
    "o") must rise clearly, the first gradient step of each batch must be on-policy (importance
    ratio 1), and the run must leave metrics, TensorBoard events, checkpoints (the newest two
    kept), the final model and a plot. The last 5 batches' mean score exceeded the first 5's by
    2.1, 4.3 and 2.4 with the model's seeds 0, 1 and 2 (30 batches at the config's rate: 2.2)."""
    from kevin_backend.cli.main import main

    run_dir = tmp_path / "run"
    code = main(["train", "--config", str(TINY_CONFIG), "--set", f"model.path={tiny_lm}",
                 "--set", f"run_dir={run_dir}", "--set", f"tasks.folders=[{TINY_TASKS}]",
                 "--set", "batches=12", "--set", "optim.lr=2.0e-2", "--set", "checkpoint_every=4"])
    assert code == 0
    rows = _rows(run_dir)
    assert [r["batch"] for r in rows] == list(range(1, 13))
    scores = [r["mean_score"] for r in rows]
    first, last = sum(scores[:5]) / 5, sum(scores[-5:]) / 5
    print(f"mean score, first 5 batches {first:.3f}, last 5 batches {last:.3f}")
    assert last > first + 0.75, scores
    for r in rows:
        assert r["samples"] == 16 and r["tasks"] == 2
        assert len(r["steps"]) == 2
        assert abs(r["steps"][0]["ratio_mean"] - 1.0) < 1e-4 and r["steps"][0]["clip_fraction"] == 0.0
        assert r["steps"][0]["grad_norm_clipped"] <= 1.0 + 1e-5
        assert r["not_opener_rate"] == 1.0
    assert r["optimizer_step"] == 24
    assert list((run_dir / "tensorboard").glob("events.out.tfevents.*"))
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["batch-000008", "batch-000012"]
    assert (run_dir / "final" / "config.json").is_file()
    logged = list((run_dir / "trajectories").glob("*.jsonl"))
    assert len(logged) == 12
    assert main(["train", "plot", str(run_dir)]) == 0
    png = run_dir / "metrics.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _config(tiny_lm: Path, run_dir: Path, **changes: object):
    from kevin_backend.rl.train_config import TrainConfig

    overrides = [f"model.path={tiny_lm}", f"run_dir={run_dir}", f"tasks.folders=[{TINY_TASKS}]",
                 "batches=3", "checkpoint_every=1", "keep_checkpoints=5", "monitor.tensorboard=false",
                 "optim.grad_clip=0.05", "optim.schedule=cosine", "optim.warmup_steps=1",
                 "rollout.trajectories=3", "grpo.micro_batch_size=5"]
    overrides += [f"{k}={v}" for k, v in changes.items()]
    return TrainConfig.from_yaml(TINY_CONFIG, overrides)


def _weights(trainer) -> dict[str, torch.Tensor]:
    model = trainer.accelerator.unwrap_model(trainer.model)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_resume_reproduces_the_next_step(tiny_lm: Path, tmp_path: Path) -> None:
    """Train 3 batches with a checkpoint after each; a fresh trainer resumed from the checkpoint
    after batch 2 (weights, AdamW state, cosine schedule, RNG states, data order) must take batch
    3 exactly as the uninterrupted run did: same tasks, same replies, same loss, same gradient
    norms, same weights after."""
    from kevin_backend.rl.trainer import Trainer

    straight = Trainer(_config(tiny_lm, tmp_path / "a"))
    history = straight.train()
    want = history[2].as_dict()
    want_weights = _weights(straight)

    checkpoint = tmp_path / "a" / "checkpoints" / "batch-000002"
    copied = tmp_path / "b" / "checkpoints" / "batch-000002"
    shutil.copytree(checkpoint, copied)
    resumed = Trainer(_config(tiny_lm, tmp_path / "b"))
    assert resumed.resume()  # the newest checkpoint in run_dir b: batch 2
    assert resumed.state.batch == 2 and resumed.state.optimizer_step == 4
    (got,) = resumed.train()
    got = got.as_dict()
    for key in ("mean_score", "correct_rate", "mean_speedup", "reply_tokens", "mean_return", "tasks", "samples"):
        assert got[key] == want[key], key
    for mine, theirs in zip(got["steps"], want["steps"]):
        for key in ("loss", "policy_loss", "clip_fraction", "ratio_mean", "grad_norm", "grad_norm_clipped", "lr"):
            assert mine[key] == pytest.approx(theirs[key], rel=1e-6, abs=1e-9), key
        # gradient clipping at the recipe's 0.05 held on every step
        assert mine["grad_norm"] > 0.05 and mine["grad_norm_clipped"] <= 0.05 + 1e-6
    for name, tensor in _weights(resumed).items():
        torch.testing.assert_close(tensor, want_weights[name], rtol=0, atol=1e-7, msg=name)
    assert got["steps"][1]["lr"] < got["steps"][0]["lr"]  # the cosine schedule came back too


def test_rollouts_use_the_live_weights(tiny_lm: Path, tmp_path: Path) -> None:
    """The policy generates with the very module the optimizer updates (no copy), records the
    sampled token ids, and the trainer's samples are exactly those tokens."""
    from kevin_backend.rl.rollout import LivePolicy
    from kevin_backend.rl.samples import sample_from_record
    from kevin_backend.rl.trainer import Trainer

    trainer = Trainer(_config(tiny_lm, tmp_path / "live", batches=1))
    policy = trainer.rollouts.policy.policy  # inside the synthetic judge's FencedPolicy
    assert isinstance(policy, LivePolicy)
    assert policy.model is trainer.accelerator.unwrap_model(trainer.model)
    before = {k: v.clone() for k, v in policy.model.state_dict().items()}
    (result,) = trainer.rollouts.run(trainer.tasks[:1], batch=0, seed=0)
    record = result.records[0]
    ids = record.step.reply.extra["completion_ids"]
    sample = sample_from_record(record, "t", trainer.tokenizer)
    assert list(sample.completion_ids) == ids
    assert trainer.tokenizer.decode(ids, skip_special_tokens=True).strip() in record.step.reply.text
    trainer.train()
    after = policy.model.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)  # the policy's module was trained


@pytest.mark.parametrize("changes", [
    {"model.lora": "{r: 4, alpha: 8, target_modules: [q_proj, v_proj]}", "model.gradient_checkpointing": "true",
     "grpo.kl_coef": "0.05", "precision": "bf16"},
    {"grpo.kl_coef": "0.05", "grpo.advantage": "mean"},
], ids=["lora-bf16-checkpointing-kl", "full-kl-reference"])
def test_lora_and_kl_paths(tiny_lm: Path, tmp_path: Path, changes: dict) -> None:
    """LoRA (peft) trains only the adapters and uses the base model with adapters off as the KL
    reference; without LoRA a frozen copy is loaded. Both take real steps with a finite KL."""
    from kevin_backend.rl.trainer import Trainer

    trainer = Trainer(_config(tiny_lm, tmp_path / "run", batches=1, **{"rollout.trajectories": 2, **changes}))
    model = trainer.accelerator.unwrap_model(trainer.model)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    frozen_before = {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}
    (m,) = trainer.train()
    step = m.steps[1]
    assert step.kl is not None and step.kl >= 0.0 and step.grad_norm is not None and step.grad_norm > 0
    if "model.lora" in changes:
        assert trainer.reference is None
        assert trainable and all("lora_" in n for n in trainable)
        assert all(torch.equal(p, frozen_before[n]) for n, p in model.named_parameters() if not p.requires_grad)
        assert (tmp_path / "run" / "final" / "adapter_config.json").is_file()
    else:
        assert trainer.reference is not None and not any(p.requires_grad for p in trainer.reference.parameters())


def test_two_processes_take_the_same_step_as_one(tiny_lm: Path, tmp_path: Path) -> None:
    """Data parallel on two CPU processes (torchrun, gloo): 3 tasks split 2 + 1 (the second
    process topped up with zero-weight fillers), each process scaling its loss by the batch's
    real sample count, gradients averaged: the same loss and gradient norms as one process."""
    import os
    import subprocess

    args = ["train", "--config", str(TINY_CONFIG), "--set", f"model.path={tiny_lm}", "--set", "batches=1",
            "--set", "grpo.tasks_per_batch=3", "--set", "rollout.trajectories=2", "--set", "monitor.tensorboard=false",
            "--set", f"tasks.folders=[{TINY_TASKS}]"]
    from kevin_backend.cli.main import main

    assert main([*args, "--set", f"run_dir={tmp_path / 'one'}"]) == 0
    env = {**os.environ, "ACCELERATE_USE_CPU": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                           "-m", "kevin_backend", *args, "--set", f"run_dir={tmp_path / 'two'}", "--set", "distributed=ddp"],
                          env=env, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    (one,), (two,) = _rows(tmp_path / "one"), _rows(tmp_path / "two")
    assert two["samples"] == one["samples"] == 12 and two["tasks"] == 3
    assert two["mean_score"] == pytest.approx(one["mean_score"], rel=1e-12)
    assert sorted(p.name for p in (tmp_path / "two" / "trajectories").iterdir()) == [
        "batch-000000-rank0.jsonl", "batch-000000-rank1.jsonl"]
    # (the first step's ratios are 1 and each group's advantages sum to zero, so its loss is float32's
    # rounding of a zero sum, a few 1e-9 that the reduction's order moves; its gradient is not zero)
    for a, b in zip(one["steps"], two["steps"]):
        for key, noise in (("loss", 1e-7), ("grad_norm", 1e-9), ("ratio_mean", 1e-9), ("clip_fraction", 1e-9)):
            assert b[key] == pytest.approx(a[key], rel=1e-4, abs=noise), key


if __name__ == "__main__":
    print(build_training_lm(Path(sys.argv[1] if len(sys.argv) > 1 else "runs/tiny-lm")))
