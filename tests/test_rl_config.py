"""Training configs: the shipped ones say what the recipe says, bad ones fail with the key named;
the accelerate configs; the `kevin train` command's usage errors and its plot action; the
monitors and the learning-rate schedule."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kevin_backend.cli.main import EXIT_USAGE, main
from kevin_backend.rl.train_config import TrainConfig, TrainConfigError
from kevin_backend.rl.metrics import (BatchMetrics, MetricsWriter, StepStats, has_repeated_ngram, opens_as_expected,
                                      read_metrics, rollout_stats)
from kevin_backend.rl.samples import Sample

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = ROOT / "configs"

yaml = pytest.importorskip("yaml")


def test_the_kevin32b_config_is_the_recipe() -> None:
    c = TrainConfig.from_yaml(CONFIGS / "train" / "kevin32b-8gpu.yaml")
    assert c.model.path == "Qwen/QwQ-32B" and c.model.gradient_checkpointing and c.model.lora is None
    assert c.rollout.engine == "vllm" and c.rollout.trajectories == 16 and c.rollout.turns == 4
    assert c.rollout.temperature == 0.9
    assert c.grpo.tasks_per_batch == 8 and c.grpo.gamma == 0.4
    assert (c.grpo.clip_low, c.grpo.clip_high, c.grpo.kl_coef) == (0.2, 0.28, 0.0)
    assert c.grpo.steps_per_batch == 2 and c.optim.grad_clip == 0.05
    assert c.length_norm == c.rollout.max_tokens == 16384  # Dr. GRPO's constant
    assert c.distributed == "deepspeed" and c.precision == "bf16"
    assert c.judge.kind == "kernelbench" and c.monitor.reasoning_opener == "Okay"
    assert (ROOT / c.accelerate_config).is_file()


def test_the_tiny_config_is_a_cpu_run() -> None:
    c = TrainConfig.from_yaml(CONFIGS / "train" / "tiny.yaml")
    assert c.rollout.engine == "transformers" and c.distributed == "none" and c.precision == "fp32"
    assert c.judge.kind == "synthetic" and c.judge.target
    assert all((ROOT / folder).is_dir() for folder in c.tasks.folders)


def test_the_accelerate_configs() -> None:
    zero3 = yaml.safe_load((CONFIGS / "accelerate" / "deepspeed_zero3.yaml").read_text())
    assert zero3["distributed_type"] == "DEEPSPEED" and zero3["num_processes"] == 8
    ds = json.loads((ROOT / zero3["deepspeed_config"]["deepspeed_config_file"]).read_text())
    assert ds["zero_optimization"]["stage"] == 3 and ds["bf16"]["enabled"] == "auto"
    assert ds["gradient_clipping"] == "auto"  # filled from optim.grad_clip by the trainer
    fsdp = yaml.safe_load((CONFIGS / "accelerate" / "fsdp2.yaml").read_text())
    assert fsdp["distributed_type"] == "FSDP" and fsdp["fsdp_config"]["fsdp_version"] == 2
    assert fsdp["fsdp_config"]["fsdp_transformer_layer_cls_to_wrap"] == "Qwen2DecoderLayer"
    assert fsdp["mixed_precision"] == "bf16"


BASE = {"run_dir": "runs/x", "model": {"path": "m"}, "tasks": {"folders": ["t"]}}


@pytest.mark.parametrize(
    "change, message",
    [
        ({"grpo": {"clip_hi": 0.3}}, "grpo: unknown key(s) clip_hi"),
        ({"grpo": {"gamma": "high"}}, "grpo.gamma: expected a number"),
        ({"grpo": {"gamma": 1.5}}, "grpo.gamma: must be in [0, 1]"),
        ({"grpo": {"advantage": "std"}}, "grpo.advantage: must be one of mean, mean_std"),
        ({"rollout": {"engine": "sglang"}}, "rollout.engine: must be one of transformers, vllm"),
        ({"rollout": {"trajectories": 2.5}}, "rollout.trajectories: expected an integer"),
        ({"rollout": {"temperature": 0}}, "rollout.temperature: must be > 0"),
        ({"optim": {"grad_clip": 0}}, "optim.grad_clip: must be > 0"),
        ({"judge": {"kind": "synthetic"}}, "judge.target: the synthetic judge needs a target"),
        ({"model": {"path": ""}}, "model.path: is required"),
        ({"model": {"path": "m", "lora": {"r": 0}}}, "model.lora.r: must be >= 1"),
        ({"tasks": {}}, "tasks: give folders and/or pending_caches"),
        ({"model": {"path": "m", "lora": {}}, "distributed": "deepspeed"}, "LoRA is the one-GPU path"),
        ({"grpo": {"kl_coef": 0.1}, "distributed": "fsdp"}, "grpo.kl_coef"),
        ({"colour": "blue"}, "unknown key(s) colour"),
        ({"monitor": {"tensorboard": "yes"}}, "monitor.tensorboard: expected true or false"),
    ],
)
def test_bad_configs_name_the_key(change: dict, message: str) -> None:
    with pytest.raises(TrainConfigError) as info:
        TrainConfig.from_dict({**BASE, **change})
    assert message in str(info.value)


def test_defaults_overrides_and_lora() -> None:
    c = TrainConfig.from_dict(BASE, ["optim.lr=2e-6", "grpo.kl_coef=0.01", "model.lora={r: 8}", "tasks.folders=a"])
    assert c.optim.lr == 2e-6 and c.grpo.kl_coef == 0.01
    assert c.model.lora is not None and c.model.lora.r == 8 and c.model.lora.alpha == 32
    assert c.tasks.folders == ("a",)
    assert c.samples_per_task == 64 and c.grpo.steps_per_batch == 2  # the recipe's defaults
    assert c.digest() != TrainConfig.from_dict(BASE).digest()
    with pytest.raises(TrainConfigError, match="expected section.key=value"):
        TrainConfig.from_dict(BASE, ["optim.lr"])


def test_kevin_train_usage_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train"]) == EXIT_USAGE
    assert "needs --config" in capsys.readouterr().err
    bad = tmp_path / "bad.yaml"
    bad.write_text("run_dir: x\nmodel: {path: m}\ntasks: {folders: [t]}\ngrpo: {gama: 0.4}\n")
    assert main(["train", "--config", str(bad)]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert "bad.yaml" in err and "gama" in err
    assert main(["train", "--config", str(tmp_path / "missing.yaml")]) == EXIT_USAGE
    assert "cannot read" in capsys.readouterr().err
    assert main(["train", "plot", str(tmp_path)]) == EXIT_USAGE
    assert "no metrics.jsonl" in capsys.readouterr().err


def _metrics(batch: int, score: float) -> BatchMetrics:
    step = StepStats(0, -0.01, -0.02, None, 0.1, 1.0, 1.2, 0.3, 0.05, 1e-6)
    return BatchMetrics(batch, 2 * batch, 8, 512, score, 0.5, 1.1, 2.0, 1.0, 900.0, 0.0, 0.1, 0.02, 10.0, 5.0,
                        (step, step))


def test_metrics_jsonl_and_the_plot(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("matplotlib")
    writer = MetricsWriter(tmp_path, tensorboard=False)
    for batch in range(1, 6):
        writer.write(_metrics(batch, 0.1 * batch))
    writer.write(_metrics(5, 9.0))  # a resumed run repeats batch 5: the latest line wins
    rows = read_metrics(tmp_path)
    assert [r["batch"] for r in rows] == [1, 2, 3, 4, 5] and rows[-1]["mean_score"] == 9.0
    assert main(["train", "plot", str(tmp_path), "--out", str(tmp_path / "curves.png")]) == 0
    assert capsys.readouterr().out.strip().endswith("curves.png")
    assert (tmp_path / "curves.png").read_bytes()[:4] == b"\x89PNG"


def test_monitors() -> None:
    assert has_repeated_ngram([1, 2, 3] * 4, n=3, count=4)
    assert not has_repeated_ngram([1, 2, 3] * 3, n=3, count=4)
    assert not has_repeated_ngram(list(range(100)), n=2, count=2)
    assert opens_as_expected("  Okay, so the task", "Okay")
    assert opens_as_expected("<think>\nOkay, so", "Okay")
    assert not opens_as_expected("Alright, junk junk", "Okay")
    from kevin_backend.rl.train_config import MonitorSettings

    def sample(text: str, ids: tuple[int, ...], score: float, finish: str = "stop", weight: float = 1.0) -> Sample:
        return Sample("t", "0:t", 0, 0, (1,), ids, text, score, score > 0, score - 0.3 if score else None, finish,
                      weight=weight)

    stats = rollout_stats([sample("Okay, fine", (1, 2, 3), 1.3), sample("hmm", (5, 5, 5, 5, 5), 0.0, "length"),
                           sample("", (0,), 99.0, weight=0.0)],
                          MonitorSettings(reasoning_opener="Okay", repeat_ngram=1, repeat_count=4))
    assert stats["samples"] == 2 and stats["mean_score"] == pytest.approx(0.65)
    assert stats["correct_rate"] == 0.5 and stats["mean_speedup"] == pytest.approx(1.0)
    assert stats["not_opener_rate"] == 0.5 and stats["repetition_rate"] == 0.5 and stats["truncated_rate"] == 0.5
    assert stats["reply_tokens"] == 4.0


def test_learning_rate_schedule() -> None:
    pytest.importorskip("accelerate")
    from kevin_backend.rl.trainer import lr_factor

    assert [lr_factor(s, 2, 10, "constant") for s in range(4)] == [0.5, 1.0, 1.0, 1.0]
    assert lr_factor(2, 2, 10, "linear") == 1.0 and lr_factor(10, 2, 10, "linear") == 0.0
    assert lr_factor(6, 2, 10, "cosine") == pytest.approx(0.5)
