"""The vLLM weight-sync path without vLLM: the weights the trainer hands over (names of the base
checkpoint, LoRA merged in), the chunked pushes through `LLM.apply_model`, the prefix-cache reset,
sleep and wake, and the token ids recorded from vLLM's outputs. A fake `LLM` stands in; the real
engine runs only on a GPU machine with vLLM installed."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from kevin_backend.rl.train_config import VLLMSettings
from kevin_backend.rl.vllm_sync import VLLMRolloutPolicy, VLLMRollouts, trainer_weights

sys.path.insert(0, str(Path(__file__).resolve().parent))


class FakeLLM:
    """Records what the sync does; `apply_model` runs the function on a plain torch module, as
    vLLM runs it on the model inside each worker."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.loaded: list[list[str]] = []
        self.events: list[str] = []

        def load_weights(weights):
            self.loaded.append([name for name, _ in weights])
            state = dict(self.model.named_parameters())
            with torch.no_grad():
                for name, tensor in weights:
                    state[name].copy_(tensor)

        self.model.load_weights = load_weights

    def apply_model(self, func):
        return [func(self.model)]

    def reset_prefix_cache(self):
        self.events.append("reset")

    def sleep(self, level: int):
        self.events.append(f"sleep{level}")

    def wake_up(self):
        self.events.append("wake")


def _engine(llm: FakeLLM, chunk_mb: int = 1) -> VLLMRollouts:
    engine = object.__new__(VLLMRollouts)  # everything but building a real vllm.LLM
    engine.settings = VLLMSettings(sync_chunk_mb=chunk_mb)
    engine.llm = llm
    engine.asleep = False
    return engine


ACCELERATOR = SimpleNamespace(unwrap_model=lambda m: m, state=SimpleNamespace(deepspeed_plugin=None))


@pytest.fixture()
def tiny():
    pytest.importorskip("transformers")
    from tiny_lm import tiny_model, train_tokenizer

    tokenizer = train_tokenizer()
    return lambda seed, hidden=64: tiny_model(tokenizer, seed=seed, hidden=hidden)


def test_full_weights_reach_the_engine_in_chunks(tiny) -> None:
    trainer, served = tiny(1, 256), tiny(2, 256)  # ~6 MB of float32 weights
    llm = FakeLLM(served)
    engine = _engine(llm, chunk_mb=1)
    count = engine.load(trainer_weights(ACCELERATOR, trainer))
    assert count == len(list(trainer.named_parameters()))
    assert len(llm.loaded) > 1  # ~1 MiB per push: several pushes for this model
    assert llm.events == ["reset"]
    for (name, a), (_, b) in zip(trainer.state_dict().items(), served.state_dict().items()):
        assert torch.equal(a, b), name


def test_lora_is_merged_under_the_base_names(tiny) -> None:
    peft = pytest.importorskip("peft")
    base, served = tiny(1), tiny(2)
    model = peft.get_peft_model(base, peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    for name, param in model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(param, std=0.1)  # a trained adapter (B starts at zero)
    names = dict(trainer_weights(ACCELERATOR, model))
    assert all("lora_" not in n and "base_layer" not in n and not n.startswith("base_model") for n in names)
    assert set(names) == {n for n, _ in served.named_parameters()}
    # what was handed over is the merged q_proj (kept after the adapters are unmerged again)
    q = "model.layers.0.self_attn.q_proj.weight"
    base_q = model.base_model.model.model.layers[0].self_attn.q_proj.base_layer.weight
    assert not torch.equal(names[q], base_q)
    assert not any(getattr(m, "merged", False) for m in model.modules())


def test_sleep_wake_and_recorded_token_ids() -> None:
    llm = FakeLLM(torch.nn.Linear(2, 2))
    engine = _engine(llm)
    engine.sleep()
    engine.sleep()  # once asleep, stays asleep
    engine.wake()
    engine.wake()
    assert llm.events == ["sleep1", "wake"]

    policy = object.__new__(VLLMRolloutPolicy)
    policy.name = "vllm:test"
    output = SimpleNamespace(prompt_token_ids=[1, 2, 3], outputs=[SimpleNamespace(
        text="<think>hmm</think>answer", token_ids=[7, 8, 9], finish_reason="stop")])
    reply = policy._reply(output, 0.5)
    assert reply.text == "answer" and reply.reasoning == "hmm"
    assert reply.extra["prompt_ids"] == [1, 2, 3] and reply.extra["completion_ids"] == [7, 8, 9]
