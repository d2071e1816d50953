"""vLLM rollouts for models too large for transformers `generate`: an in-process `vllm.LLM` per
training process, whose weights are replaced by the trainer's after every batch.

    engine = VLLMRollouts(config.model.path, config.rollout.vllm, seed=config.seed, dtype="bfloat16")
    engine.wake(); engine.load(trainer_weights(accelerator, model)); policy = engine.policy
    ... rollouts with `policy` ...
    engine.sleep()                      # give the GPU memory back while the trainer steps

This is the only module that touches vLLM, and it imports vLLM when an engine is built; it
cannot run on a machine without a GPU and vLLM (the CPU tests use `rollout.LivePolicy`). It uses
vLLM's public offline API only: `LLM(...)`, `LLM.chat` (through the generate unit's
`VLLMPolicy`), `LLM.sleep` / `LLM.wake_up` (sleep mode), `LLM.apply_model` (run a function on
the model inside each worker; its `load_weights` takes checkpoint-named tensors and shards them
for tensor parallelism) and `LLM.reset_prefix_cache` (cached prefixes were computed with the old
weights). With vLLM's V1 engine, set `VLLM_ENABLE_V1_MULTIPROCESSING=0` in the launcher's
environment so the engine lives in the training process and `apply_model` hands it tensors
without pickling them through a pipe.

Layout at Kevin scale (configs/train/kevin32b-8gpu.yaml): 8 processes under `accelerate launch`
with DeepSpeed ZeRO-3, each with its own vLLM engine on its own GPU (tensor_parallel_size 1,
bf16 QwQ-32B fits next to a ZeRO-3 shard when the engine sleeps during the steps), each rolling
out its share of the batch's tasks.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Iterable, Iterator

import torch

from kevin_backend.generate.policy import Reply
from kevin_backend.generate.vllm_policy import VLLMPolicy  # imports vLLM only when an engine is built
from kevin_backend.rl.train_config import VLLMSettings

__all__ = ["VLLMRollouts", "VLLMRolloutPolicy", "trainer_weights"]


class VLLMRolloutPolicy(VLLMPolicy):
    """`VLLMPolicy` that also records the prompt and completion token ids in `Reply.extra` (vLLM
    returns them), so the trainer computes log-probs of the tokens that were sampled."""

    def _reply(self, output: Any, seconds: float) -> Reply:
        reply = super()._reply(output, seconds)
        extra = {**reply.extra, "prompt_ids": list(output.prompt_token_ids or ()),
                 "completion_ids": list(output.outputs[0].token_ids)}
        return dataclasses.replace(reply, extra=extra)


def _load_weights(weights: list[tuple[str, torch.Tensor]], model: Any) -> None:
    """Runs inside each vLLM worker (module level, so it pickles)."""
    model.load_weights(weights=weights)


class VLLMRollouts:
    """One vLLM engine holding a copy of the policy's weights."""

    def __init__(self, model_path: str, settings: VLLMSettings, *, seed: int = 0, dtype: str = "auto",
                 max_tokens: int | None = None) -> None:
        try:
            import vllm
        except ImportError as exc:
            raise ImportError("rollout.engine: vllm needs vLLM on a CUDA machine: pip install 'kevin_backend[vllm]'; "
                              "or use rollout.engine: transformers") from exc
        args: dict[str, Any] = {
            "model": model_path,
            "tensor_parallel_size": settings.tensor_parallel_size,
            "gpu_memory_utilization": settings.gpu_memory_utilization,
            "enable_sleep_mode": settings.enable_sleep_mode,
            "seed": seed,
            "dtype": dtype,
        }
        if settings.max_model_len is not None:
            args["max_model_len"] = settings.max_model_len
        self.settings = settings
        self.llm = vllm.LLM(**args)
        self.policy = VLLMRolloutPolicy(model_path, llm=self.llm)
        self.asleep = False

    def sleep(self) -> None:
        """Free the engine's GPU memory (level 1: weights to CPU, KV cache dropped) for training."""
        if self.settings.enable_sleep_mode and not self.asleep:
            self.llm.sleep(level=1)
            self.asleep = True

    def wake(self) -> None:
        if self.asleep:
            self.llm.wake_up()
            self.asleep = False

    def load(self, weights: Iterable[tuple[str, torch.Tensor]]) -> int:
        """Copy `weights` (checkpoint names, full tensors) into the engine, about
        `sync_chunk_mb` at a time; returns the number of tensors loaded."""
        limit = self.settings.sync_chunk_mb * 2**20
        chunk: list[tuple[str, torch.Tensor]] = []
        size = count = 0
        for name, tensor in weights:
            chunk.append((name, tensor))
            size += tensor.numel() * tensor.element_size()
            count += 1
            if size >= limit:
                self._push(chunk)
                chunk, size = [], 0
        if chunk:
            self._push(chunk)
        self.llm.reset_prefix_cache()  # cached prefixes hold keys and values of the old weights
        return count

    def _push(self, chunk: list[tuple[str, torch.Tensor]]) -> None:
        self.llm.apply_model(functools.partial(_load_weights, chunk))


def trainer_weights(accelerator: Any, model: Any) -> Iterator[tuple[str, torch.Tensor]]:
    """The trainer's current weights under the names of the base model's checkpoint, one full
    tensor at a time: LoRA adapters merged in (and unmerged after), ZeRO-3 partitions gathered,
    FSDP2 shards (DTensors) assembled. Every process must iterate it (gathering is collective)."""
    unwrapped = accelerator.unwrap_model(model)
    if hasattr(unwrapped, "merge_adapter"):  # peft
        yield from _merged_lora(unwrapped)
        return
    zero3 = getattr(getattr(accelerator.state, "deepspeed_plugin", None), "zero_stage", 0) == 3
    for name, param in unwrapped.named_parameters():
        if zero3:
            import deepspeed

            with deepspeed.zero.GatheredParameters([param], modifier_rank=None):
                yield name, param.data.detach().clone()
        elif hasattr(param, "full_tensor"):  # a DTensor under FSDP2
            yield name, param.full_tensor().detach()
        else:
            yield name, param.detach()


def _merged_lora(peft_model: Any) -> Iterator[tuple[str, torch.Tensor]]:
    peft_model.merge_adapter()
    try:
        for name, param in peft_model.named_parameters():
            if "lora_" in name:
                continue
            clean = name.removeprefix("base_model.model.").replace(".base_layer.", ".")
            yield clean, param.detach().clone()  # a copy: the adapters are unmerged when the walk ends
    finally:
        peft_model.unmerge_adapter()
