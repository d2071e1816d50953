"""`TransformersPolicy`: replies from a causal LM run in this process with transformers'
`generate` (a small model for tests and experiments, or a policy being trained).

    policy = TransformersPolicy("path/to/model")             # or a loaded model and its tokenizer
    replies = policy.generate(conversations, Sampling(temperature=0.0, max_tokens=512))

Prompts are the tokenizer's chat template with the assistant's turn opened; a batch is padded on
the left so every row's generation starts right after its own prompt. transformers is imported
when a policy is built, so the package needs it only where this policy is used.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any, Sequence

import torch

from kevin_backend.generate.policy import Message, PolicyError, Reply, Sampling, split_reasoning

__all__ = ["TransformersPolicy"]


class TransformersPolicy:
    """A `Policy` over a transformers causal LM.

    `model_or_path` is a model folder (or hub name, where the hub can be reached) or a loaded
    model; `tokenizer` defaults to the one saved with the model. `device` defaults to the loaded
    model's device, else CUDA when there is one. Conversations are generated `batch_size` at a
    time; a reply's `seconds` is the wall time of its batch.

    Sampling: temperature 0 is greedy decoding; otherwise temperature and top_p as given, with no
    top-k cut (OpenAI servers have none by default). A seed makes the batch reproducible without
    disturbing the caller's random state (generation runs under a forked RNG). Stop strings end a
    reply and, as on OpenAI servers, are not part of its text.

    One `generate` runs at a time (a lock): the model and the RNG are shared, and a test server
    may call in from several threads."""

    def __init__(
        self,
        model_or_path: Any,
        tokenizer: Any = None,
        device: str | torch.device | None = None,
        batch_size: int = 8,
        dtype: torch.dtype | str | None = None,
    ) -> None:
        try:
            import transformers
        except ImportError as exc:
            raise PolicyError(
                "TransformersPolicy needs transformers: pip install 'kevin_backend[hf]' (or pip install transformers)"
            ) from exc
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.batch_size = batch_size
        if isinstance(model_or_path, (str, Path)):
            source = str(model_or_path)
            self.device = torch.device(device) if device is not None else _default_device()
            if dtype is None:
                dtype = "auto" if self.device.type == "cuda" else torch.float32
            try:
                model = transformers.AutoModelForCausalLM.from_pretrained(source, dtype=dtype)
            except (OSError, ValueError) as exc:
                raise PolicyError(f"cannot load a causal LM from {source!r}: {exc}") from exc
            model.to(self.device)
        else:
            model = model_or_path
            source = str(getattr(model, "name_or_path", "") or type(model).__name__)
            self.device = torch.device(device) if device is not None else next(model.parameters()).device
            if device is not None:
                model.to(self.device)
        if tokenizer is None:
            try:
                tokenizer = transformers.AutoTokenizer.from_pretrained(source)
            except (OSError, ValueError) as exc:
                raise PolicyError(f"cannot load the tokenizer of {source!r}; pass `tokenizer=`: {exc}") from exc
        if not getattr(tokenizer, "chat_template", None):
            raise PolicyError(f"the tokenizer of {source!r} has no chat template; prompts are built from it")
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.name = f"transformers:{source}"
        eos = model.generation_config.eos_token_id
        eos_ids = set(eos if isinstance(eos, (list, tuple)) else [eos] if eos is not None else [])
        if tokenizer.eos_token_id is not None:
            eos_ids.add(tokenizer.eos_token_id)
        if not eos_ids:
            raise PolicyError(f"{source!r} names no end-of-sequence token; generation could not stop")
        self.eos_ids = sorted(eos_ids)  # generation stops at any of these
        pad = tokenizer.pad_token_id
        self.pad_id = pad if pad is not None else self.eos_ids[0]
        self._lock = threading.Lock()

    def render(self, messages: Sequence[Message]) -> str:
        """The prompt text of a conversation: the chat template with the assistant's turn opened."""
        return self.tokenizer.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=True)

    def count_tokens(self, text: str) -> int:
        """Exact: the model's own tokenizer (no special tokens added)."""
        return len(self.tokenizer.encode(text, add_special_tokens=False))

    def generate(self, conversations: Sequence[Sequence[Message]], sampling: Sampling) -> list[Reply]:
        prompts = [self.render(messages) for messages in conversations]
        replies: list[Reply] = []
        with self._lock, torch.random.fork_rng(devices=self._rng_devices()):
            if sampling.seed is not None:
                torch.manual_seed(sampling.seed)
            for start in range(0, len(prompts), self.batch_size):
                replies.extend(self._batch(prompts[start:start + self.batch_size], sampling))
        return replies

    def _batch(self, prompts: list[str], sampling: Sampling) -> list[Reply]:
        began = time.perf_counter()
        inputs = self.tokenizer(
            prompts, return_tensors="pt", padding=True, padding_side="left", add_special_tokens=False
        ).to(self.device)
        options: dict[str, Any] = {
            "max_new_tokens": sampling.max_tokens,
            "pad_token_id": self.pad_id,
            "eos_token_id": self.eos_ids,
        }
        if sampling.temperature > 0:
            options.update(do_sample=True, temperature=sampling.temperature, top_p=sampling.top_p, top_k=0)
        else:
            options.update(do_sample=False, temperature=None, top_p=None, top_k=None)
        if sampling.stop:
            options.update(stop_strings=list(sampling.stop), tokenizer=self.tokenizer)
        with torch.inference_mode():
            output = self.model.generate(**inputs, **options)
        seconds = time.perf_counter() - began
        width = inputs["input_ids"].shape[1]
        prompt_lengths = inputs["attention_mask"].sum(dim=1).tolist()
        terminal = set(self.eos_ids) | {self.pad_id}
        replies = []
        for row, prompt_tokens in zip(output[:, width:].tolist(), prompt_lengths):
            # A row ends at its first end-of-sequence token (counted, as servers count it); what
            # follows is padding, and a row stopped by a stop string is padded from there.
            end = next((i for i, token in enumerate(row) if token in terminal), None)
            if end is None:
                count, finish = len(row), "length" if len(row) >= sampling.max_tokens else "stop"
            else:
                count, finish = end + (1 if row[end] in self.eos_ids else 0), "stop"
            text = self.tokenizer.decode(row[:count], skip_special_tokens=True)
            if sampling.stop:
                cut = min((i for i in (text.find(s) for s in sampling.stop) if i >= 0), default=-1)
                if cut >= 0:
                    text, finish = text[:cut], "stop"
            answer, reasoning = split_reasoning(text)
            replies.append(Reply(
                text=answer, reasoning=reasoning, prompt_tokens=int(prompt_tokens), completion_tokens=count,
                seconds=seconds, finish_reason=finish, extra={"model": self.name},
            ))
        return replies

    def _rng_devices(self) -> list[int]:
        if self.device.type == "cuda":
            return [self.device.index if self.device.index is not None else torch.cuda.current_device()]
        return []


def _default_device() -> torch.device:
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
