"""The offline RL trainer: multi-turn GRPO on the judge's rewards (the Kevin-32B recipe).

    config = TrainConfig.from_yaml("configs/train/tiny.yaml")
    Trainer(config).train()                     # or: kevin train --config configs/train/tiny.yaml

One batch: tasks -> rollouts through the generator's loop (`generate/engine.py`) with the model
being trained -> one sample per turn (prompt tokens masked, reply tokens carry the loss) ->
discounted returns within a trajectory, advantages normalized per task -> clipped policy-gradient
steps (first on-policy, then off-policy against the stored log-probs) -> metrics, checkpoints.

An optional warm start comes first (config section `sft`, module `sft`): supervised fine-tuning
on the built-in writer's replies, so a model that writes no accepted kernel yet gets rewards to
compare; `tiny` builds small models for tests and short runs.

The stages live in their own modules (`config`, `tasks`, `rollout`, `samples`, `returns`, `loss`,
`sft`, `schedule` (the learning-rate factor both loops use), `trainer`, `checkpoint`, `metrics`, `vllm_sync`,
`synthetic` (a stand-in reward for tests), `tiny`); importing this package imports
none of the heavy optional dependencies (transformers, accelerate, peft, vllm), the modules that
need them import them when used.
"""

from kevin_backend.rl.train_config import TrainConfig, TrainConfigError

__all__ = ["TrainConfig", "TrainConfigError"]
