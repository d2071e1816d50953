"""`TrainConfig`: everything one training run needs, read from a YAML file and checked up front.

    config = TrainConfig.from_yaml("configs/train/kevin32b-8gpu.yaml", overrides=["optim.lr=2e-6"])

The file mirrors the dataclasses below section by section (`model`, `tasks`, `rollout`, `judge`,
`grpo`, `optim`, `monitor`, the optional `sft` warm start, plus a few top-level keys). Every key
is optional except `model.path` and `run_dir`; an unknown key, a value of the wrong type or an
out-of-range number is a `TrainConfigError` that names the key and says what it accepts, so a typo
in a 32-GPU-hour run's config fails in the first second, not after the first rollout. The defaults are the
Kevin-32B recipe (FACTS.md): gamma 0.4, clip 0.2 / 0.28, KL 0, gradient norm 0.05, two gradient
steps per batch, 16 trajectories x 4 turns, 8 tasks per batch, temperature 0.9.

Paths in the file are relative to the directory `kevin train` runs in.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

__all__ = [
    "TrainConfigError",
    "LoraSettings",
    "ModelSettings",
    "TaskSettings",
    "VLLMSettings",
    "RolloutSettings",
    "JudgeSettings",
    "GRPOSettings",
    "OptimSettings",
    "MonitorSettings",
    "SFTSettings",
    "TrainConfig",
    "ROLLOUT_ENGINES",
    "JUDGE_KINDS",
    "ADVANTAGE_MODES",
    "DISTRIBUTED",
    "PRECISIONS",
    "SCHEDULES",
    "SFT_SOURCES",
]

ROLLOUT_ENGINES = ("transformers", "vllm")
JUDGE_KINDS = ("kernelbench", "synthetic")
ADVANTAGE_MODES = ("mean", "mean_std")
DISTRIBUTED = ("none", "ddp", "deepspeed", "fsdp")
PRECISIONS = ("fp32", "bf16")
SCHEDULES = ("constant", "linear", "cosine")
SFT_SOURCES = ("builtin",)


class TrainConfigError(ValueError):
    """The training config is invalid; the message names the key and what it accepts."""


def _check(condition: bool, key: str, message: str) -> None:
    if not condition:
        raise TrainConfigError(f"{key}: {message}")


def _one_of(value: str, choices: Sequence[str], key: str) -> None:
    _check(value in choices, key, f"must be one of {', '.join(choices)}; got {value!r}")


@dataclass(frozen=True)
class LoraSettings:
    """LoRA adapters (peft) instead of full fine-tuning: for one GPU. The frozen base weights
    double as the KL reference (adapters off), so no second model is loaded."""

    r: int = 16
    alpha: int = 32
    dropout: float = 0.0
    target_modules: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")

    def __post_init__(self) -> None:
        _check(self.r >= 1, "model.lora.r", f"must be >= 1, got {self.r}")
        _check(self.alpha >= 1, "model.lora.alpha", f"must be >= 1, got {self.alpha}")
        _check(0.0 <= self.dropout < 1.0, "model.lora.dropout", f"must be in [0, 1), got {self.dropout}")
        _check(bool(self.target_modules), "model.lora.target_modules", "names no module")


@dataclass(frozen=True)
class ModelSettings:
    path: str = ""  # a model folder or hub name (transformers `from_pretrained`)
    tokenizer: str | None = None  # default: the model's
    gradient_checkpointing: bool = False
    lora: LoraSettings | None = None
    attn_implementation: str | None = None  # e.g. "sdpa", "flash_attention_2"; default: transformers'

    def __post_init__(self) -> None:
        _check(bool(self.path), "model.path", "is required (a model folder or hub name)")


@dataclass(frozen=True)
class TaskSettings:
    """Where the training tasks come from: folders of KernelBench-format problems (`*.py` with
    Model, get_inputs, get_init_inputs, searched recursively) and the pending tasks the backend
    recorded in kernel caches (cache-mode misses)."""

    folders: tuple[str, ...] = ()
    pending_caches: tuple[str, ...] = ()
    limit: int | None = None  # keep the first N tasks (sorted by name), e.g. for a smoke run

    def __post_init__(self) -> None:
        _check(bool(self.folders or self.pending_caches), "tasks", "give folders and/or pending_caches")
        _check(self.limit is None or self.limit >= 1, "tasks.limit", f"must be >= 1, got {self.limit}")


@dataclass(frozen=True)
class VLLMSettings:
    """The in-process vLLM engine of each training process (rollout.engine: vllm). Its weights are
    replaced by the trainer's after every batch (`vllm_sync.py`); with sleep mode it gives its
    GPU memory back while the trainer steps."""

    tensor_parallel_size: int = 1
    gpu_memory_utilization: float = 0.35
    max_model_len: int | None = None
    enable_sleep_mode: bool = True
    sync_chunk_mb: int = 1024  # weights are pushed to the engine in chunks of about this size

    def __post_init__(self) -> None:
        _check(self.tensor_parallel_size >= 1, "rollout.vllm.tensor_parallel_size", "must be >= 1")
        _check(0.0 < self.gpu_memory_utilization <= 1.0, "rollout.vllm.gpu_memory_utilization", "must be in (0, 1]")
        _check(self.sync_chunk_mb >= 1, "rollout.vllm.sync_chunk_mb", "must be >= 1")


@dataclass(frozen=True)
class RolloutSettings:
    engine: str = "transformers"  # transformers: `generate` on the live model; vllm: a synced engine
    trajectories: int = 16
    turns: int = 4
    temperature: float = 0.9
    top_p: float = 1.0
    max_tokens: int = 16384  # longest reply
    max_prompt_tokens: int = 8192  # the engine drops the oldest turns beyond this
    generation_batch_size: int = 16  # transformers: conversations generated at once
    judge_workers: int = 8  # replies judged at once (builds in parallel)
    gpu: str = ""  # the GPU named in the prompts ("" : the name of the GPU the judge runs on)
    capability: str = ""
    vllm: VLLMSettings = field(default_factory=VLLMSettings)

    def __post_init__(self) -> None:
        _one_of(self.engine, ROLLOUT_ENGINES, "rollout.engine")
        _check(self.trajectories >= 1, "rollout.trajectories", "must be >= 1")
        _check(self.turns >= 1, "rollout.turns", "must be >= 1")
        _check(self.temperature > 0.0, "rollout.temperature",
               f"must be > 0 (the loss uses the sampling distribution, logits / temperature); got {self.temperature}")
        _check(0.0 < self.top_p <= 1.0, "rollout.top_p", "must be in (0, 1]")
        _check(self.max_tokens >= 1, "rollout.max_tokens", "must be >= 1")
        _check(self.max_prompt_tokens >= 1, "rollout.max_prompt_tokens", "must be >= 1")
        _check(self.generation_batch_size >= 1, "rollout.generation_batch_size", "must be >= 1")
        _check(self.judge_workers >= 1, "rollout.judge_workers", "must be >= 1")


@dataclass(frozen=True)
class JudgeSettings:
    """kernelbench: the real judge (static rules, build, run, correctness, timing; needs a GPU).
    synthetic: a stand-in that scores the reply text by how often `target` occurs in it, for
    CPU runs and tests of the training loop (`synthetic.py`)."""

    kind: str = "kernelbench"
    trials: int = 100  # kernelbench: timing trials
    build_dir: str | None = None  # kernelbench: build cache (default: <run_dir>/builds)
    target: str = ""  # synthetic: the string whose occurrences earn speedup
    per_hit: float = 0.5  # synthetic: speedup per occurrence
    max_speedup: float = 5.0  # synthetic: cap

    def __post_init__(self) -> None:
        _one_of(self.kind, JUDGE_KINDS, "judge.kind")
        _check(self.trials >= 1, "judge.trials", "must be >= 1")
        if self.kind == "synthetic":
            _check(bool(self.target), "judge.target", "the synthetic judge needs a target string")
            _check(self.per_hit > 0 and self.max_speedup > 0, "judge.per_hit / judge.max_speedup", "must be > 0")


@dataclass(frozen=True)
class GRPOSettings:
    tasks_per_batch: int = 8
    gamma: float = 0.4  # R_t = sum_{i>=t} gamma^(i-t) s_i within a trajectory
    advantage: str = "mean_std"  # normalization over all turns of all trajectories of a task
    clip_low: float = 0.2  # ratio clipped to [1 - clip_low, 1 + clip_high] (clip-higher)
    clip_high: float = 0.28
    kl_coef: float = 0.0  # 0: no reference model is loaded
    length_norm: int | None = None  # Dr. GRPO's constant divisor (default: rollout.max_tokens)
    steps_per_batch: int = 2  # the first on-policy, the rest off-policy against the stored log-probs
    micro_batch_size: int = 1  # samples per forward/backward

    def __post_init__(self) -> None:
        _check(self.tasks_per_batch >= 1, "grpo.tasks_per_batch", "must be >= 1")
        _check(0.0 <= self.gamma <= 1.0, "grpo.gamma", f"must be in [0, 1], got {self.gamma}")
        _one_of(self.advantage, ADVANTAGE_MODES, "grpo.advantage")
        _check(0.0 <= self.clip_low < 1.0, "grpo.clip_low", f"must be in [0, 1), got {self.clip_low}")
        _check(self.clip_high >= 0.0, "grpo.clip_high", f"must be >= 0, got {self.clip_high}")
        _check(self.kl_coef >= 0.0, "grpo.kl_coef", f"must be >= 0, got {self.kl_coef}")
        _check(self.length_norm is None or self.length_norm >= 1, "grpo.length_norm", "must be >= 1")
        _check(self.steps_per_batch >= 1, "grpo.steps_per_batch", "must be >= 1")
        _check(self.micro_batch_size >= 1, "grpo.micro_batch_size", "must be >= 1")


@dataclass(frozen=True)
class OptimSettings:
    lr: float = 1e-6
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    warmup_steps: int = 0  # optimizer steps of linear warm-up
    schedule: str = "constant"  # after warm-up: constant, linear or cosine decay to 0 at the last step
    grad_clip: float = 0.05  # total gradient norm is clipped to this

    def __post_init__(self) -> None:
        _check(self.lr > 0, "optim.lr", f"must be > 0, got {self.lr}")
        _check(self.weight_decay >= 0, "optim.weight_decay", "must be >= 0")
        _check(len(self.betas) == 2 and all(0 <= b < 1 for b in self.betas), "optim.betas", "two numbers in [0, 1)")
        _check(self.eps > 0, "optim.eps", "must be > 0")
        _check(self.warmup_steps >= 0, "optim.warmup_steps", "must be >= 0")
        _one_of(self.schedule, SCHEDULES, "optim.schedule")
        _check(self.grad_clip > 0, "optim.grad_clip", f"must be > 0, got {self.grad_clip}")


@dataclass(frozen=True)
class MonitorSettings:
    """Signals of a run going wrong. Kevin-32B's "not okay" ratio (replies whose reasoning does
    not open the way the model's normally does) rose about 15 steps before the outputs turned to
    junk; repeated n-gram loops are the junk itself."""

    reasoning_opener: str | None = None  # e.g. "Okay" for QwQ-32B; None: not measured
    repeat_ngram: int = 20  # a reply "loops" when some token n-gram of this length ...
    repeat_count: int = 4  # ... occurs at least this many times
    tensorboard: bool = True

    def __post_init__(self) -> None:
        _check(self.repeat_ngram >= 1, "monitor.repeat_ngram", "must be >= 1")
        _check(self.repeat_count >= 2, "monitor.repeat_count", "must be >= 2")


@dataclass(frozen=True)
class SFTSettings:
    """The optional warm start: supervised fine-tuning on demonstrations before the first GRPO
    batch, once per run (a resumed run never repeats it). A model that never writes a program
    the judge accepts earns nothing but zeros, and GRPO learns nothing from a group of equal
    rewards; imitating a writer that does gives it rewards to compare.

    source builtin: the built-in writer's replies (`generate/builtin/`) to the training tasks, in
    the very conversations the rollouts send (`sft.py`): the first turn of `trajectories`
    trajectories (the writer starts trajectory i at its variant i), and with `turns` > 1 its
    later replies after a verdict of "correct" with made-up timings. Loss on the reply tokens
    only, averaged over the step's reply tokens; its own AdamW, `steps` optimizer steps of
    `batch_size` demonstrations (or `epochs` passes over them)."""

    source: str = "builtin"
    trajectories: int = 1  # first-turn variants per task
    turns: int = 1  # turns per demonstration search (later turns follow a made-up "correct" verdict)
    steps: int | None = None  # optimizer steps (default 100 unless `epochs` is given)
    epochs: float | None = None  # passes over the demonstrations instead of `steps`
    batch_size: int = 8  # demonstrations per optimizer step (across processes)
    micro_batch_size: int = 8  # demonstrations per forward/backward on a process
    lr: float = 1e-4
    weight_decay: float = 0.0
    warmup_steps: int = 0
    schedule: str = "constant"  # after warm-up: constant, linear or cosine decay to 0 at the last step
    grad_clip: float = 1.0

    def __post_init__(self) -> None:
        _one_of(self.source, SFT_SOURCES, "sft.source")
        _check(self.trajectories >= 1, "sft.trajectories", f"must be >= 1, got {self.trajectories}")
        _check(self.turns >= 1, "sft.turns", f"must be >= 1, got {self.turns}")
        _check(self.steps is None or self.epochs is None, "sft.steps",
               "give sft.steps or sft.epochs, not both")
        _check(self.steps is None or self.steps >= 1, "sft.steps", f"must be >= 1, got {self.steps}")
        _check(self.epochs is None or self.epochs > 0, "sft.epochs", f"must be > 0, got {self.epochs}")
        _check(self.batch_size >= 1, "sft.batch_size", f"must be >= 1, got {self.batch_size}")
        _check(self.micro_batch_size >= 1, "sft.micro_batch_size", f"must be >= 1, got {self.micro_batch_size}")
        _check(self.lr > 0, "sft.lr", f"must be > 0, got {self.lr}")
        _check(self.weight_decay >= 0, "sft.weight_decay", f"must be >= 0, got {self.weight_decay}")
        _check(self.warmup_steps >= 0, "sft.warmup_steps", f"must be >= 0, got {self.warmup_steps}")
        _one_of(self.schedule, SCHEDULES, "sft.schedule")
        _check(self.grad_clip > 0, "sft.grad_clip", f"must be > 0, got {self.grad_clip}")

    def total_steps(self, demonstrations: int) -> int:
        """Optimizer steps for `demonstrations` demonstrations."""
        if self.epochs is not None:
            return max(1, -(-int(round(self.epochs * demonstrations)) // self.batch_size))
        return 100 if self.steps is None else self.steps


@dataclass(frozen=True)
class TrainConfig:
    run_dir: str = ""  # metrics, checkpoints, trajectory logs and the TensorBoard folder
    model: ModelSettings = field(default_factory=ModelSettings)
    tasks: TaskSettings = field(default_factory=TaskSettings)
    rollout: RolloutSettings = field(default_factory=RolloutSettings)
    judge: JudgeSettings = field(default_factory=JudgeSettings)
    grpo: GRPOSettings = field(default_factory=GRPOSettings)
    optim: OptimSettings = field(default_factory=OptimSettings)
    monitor: MonitorSettings = field(default_factory=MonitorSettings)
    sft: SFTSettings | None = None  # the warm start before the first batch; None: none
    seed: int = 0
    batches: int = 100  # batches to train (a resumed run continues up to this count)
    checkpoint_every: int = 10  # batches; 0: only at the end
    keep_checkpoints: int = 2
    precision: str = "fp32"  # bf16: weights and compute in bfloat16 (the Kevin scale)
    distributed: str = "none"  # what `accelerate launch` must have set up: none, ddp, deepspeed, fsdp
    accelerate_config: str | None = None  # the accelerate config file this run expects (shown in errors)
    log_trajectories: bool = True  # every turn of every rollout to <run_dir>/trajectories/*.jsonl

    def __post_init__(self) -> None:
        _check(bool(self.run_dir), "run_dir", "is required")
        _check(self.batches >= 1, "batches", "must be >= 1")
        _check(self.checkpoint_every >= 0, "checkpoint_every", "must be >= 0")
        _check(self.keep_checkpoints >= 1, "keep_checkpoints", "must be >= 1")
        _one_of(self.precision, PRECISIONS, "precision")
        _one_of(self.distributed, DISTRIBUTED, "distributed")
        if self.model.lora is not None and self.distributed in ("deepspeed", "fsdp"):
            raise TrainConfigError("model.lora: LoRA is the one-GPU path; with distributed "
                                   f"{self.distributed!r} train the full model (drop model.lora)")
        if self.grpo.kl_coef > 0 and self.model.lora is None and self.distributed in ("deepspeed", "fsdp"):
            raise TrainConfigError(f"grpo.kl_coef: a KL reference under {self.distributed!r} would need its own sharded "
                                   "copy of the model, which this trainer does not build; Kevin-32B trains with "
                                   "kl_coef 0 (or use LoRA, whose base model is the reference)")
        if self.sft is not None and self.distributed in ("deepspeed", "fsdp"):
            raise TrainConfigError(f"sft: the warm start runs on one process or under ddp, not on {self.distributed!r} "
                                   "shards; fine-tune the model first (a run with distributed none or ddp and "
                                   "batches 1) and point model.path at its final/ folder")

    # -- derived -----------------------------------------------------------------------------

    @property
    def length_norm(self) -> int:
        """Dr. GRPO's constant: the sum of token losses is divided by this (times the samples)."""
        return self.grpo.length_norm or self.rollout.max_tokens

    @property
    def samples_per_task(self) -> int:
        return self.rollout.trajectories * self.rollout.turns

    def digest(self) -> str:
        """A short hash of the whole config (recorded in checkpoints); a config without a warm
        start hashes as it did before the `sft` section existed."""
        data = self.as_dict()
        if data.get("sft") is None:
            data.pop("sft", None)
        return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]

    def as_dict(self) -> dict[str, Any]:
        return _plain(dataclasses.asdict(self))

    # -- reading -----------------------------------------------------------------------------

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], overrides: Sequence[str] = ()) -> "TrainConfig":
        merged = _apply_overrides(dict(data), overrides)
        return _build(cls, merged, "")

    @classmethod
    def from_yaml(cls, path: str | Path, overrides: Sequence[str] = ()) -> "TrainConfig":
        """The config in the YAML file `path`, with `overrides` ("section.key=value", the value
        read as YAML) applied on top."""
        yaml = _yaml()
        path = Path(path)
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise TrainConfigError(f"cannot read the training config {path}: {exc.strerror or exc}") from exc
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise TrainConfigError(f"{path} is not valid YAML: {exc}") from exc
        if data is None:
            data = {}
        if not isinstance(data, dict):
            raise TrainConfigError(f"{path}: the top level must be a mapping of sections, got {type(data).__name__}")
        try:
            return cls.from_dict(data, overrides)
        except TrainConfigError as exc:
            raise TrainConfigError(f"{path}: {exc}") from None


def _yaml() -> Any:
    try:
        import yaml
    except ImportError as exc:  # pragma: no cover - PyYAML is a dependency of the train extra
        raise TrainConfigError("reading a training config needs PyYAML: pip install pyyaml") from exc
    return yaml


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _apply_overrides(data: dict[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """`data` with each "a.b.c=value" set (value parsed as YAML: numbers, booleans, lists, null)."""
    if not overrides:
        return data
    yaml = _yaml()
    for item in overrides:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise TrainConfigError(f"override {item!r}: expected section.key=value")
        try:
            value = yaml.safe_load(raw) if raw.strip() else ""
        except yaml.YAMLError as exc:
            raise TrainConfigError(f"override {item!r}: the value is not valid YAML: {exc}") from exc
        node = data
        parts = key.split(".")
        for part in parts[:-1]:
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            elif not isinstance(child, dict):
                raise TrainConfigError(f"override {item!r}: {part} is not a section")
            else:
                child = node[part] = dict(child)
            node = child
        node[parts[-1]] = value
    return data


def _build(cls: type, data: Any, where: str) -> Any:
    """An instance of dataclass `cls` from a mapping, every value converted to the field's type;
    errors name the dotted key."""
    if not isinstance(data, Mapping):
        raise TrainConfigError(f"{where or 'the config'}: expected a mapping, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise TrainConfigError(f"{where + ': ' if where else ''}unknown key(s) {', '.join(map(str, unknown))}; "
                               f"known: {', '.join(fields)}")
    values = {name: _convert(hints[name], data[name], f"{where}.{name}" if where else name) for name in data}
    try:
        return cls(**values)
    except TypeError as exc:  # pragma: no cover - every field has a default
        raise TrainConfigError(f"{where or 'the config'}: {exc}") from exc


def _convert(hint: Any, value: Any, key: str) -> Any:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        (inner,) = [a for a in args if a is not type(None)]
        return _convert(inner, value, key)
    if dataclasses.is_dataclass(hint):
        return _build(hint, {} if value is None else value, key)
    if origin is tuple:
        if isinstance(value, str) and args[-1] is Ellipsis:
            value = [value]  # a single folder may be written without brackets
        if not isinstance(value, (list, tuple)):
            raise TrainConfigError(f"{key}: expected a list, got {value!r}")
        if args and args[-1] is Ellipsis:
            return tuple(_convert(args[0], v, f"{key}[{i}]") for i, v in enumerate(value))
        if len(value) != len(args):
            raise TrainConfigError(f"{key}: expected {len(args)} values, got {len(value)}")
        return tuple(_convert(a, v, f"{key}[{i}]") for i, (a, v) in enumerate(zip(args, value)))
    if hint is bool:
        if not isinstance(value, bool):
            raise TrainConfigError(f"{key}: expected true or false, got {value!r}")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            if isinstance(value, float) and value.is_integer():
                return int(value)
            raise TrainConfigError(f"{key}: expected an integer, got {value!r}")
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            if isinstance(value, str):  # YAML 1.1 reads 1e-6 (no dot) as a string
                try:
                    return float(value)
                except ValueError:
                    pass
            raise TrainConfigError(f"{key}: expected a number, got {value!r}")
        return float(value)
    if hint is str:
        if not isinstance(value, (str, int, float)) or isinstance(value, bool):
            raise TrainConfigError(f"{key}: expected a string, got {value!r}")
        return str(value)
    raise TrainConfigError(f"{key}: unsupported field type {hint!r}")  # pragma: no cover
