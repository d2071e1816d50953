"""`VLLMPolicy`: replies from a vLLM engine in this process (`vllm.LLM`), every conversation of
a turn in one `llm.chat` call so the engine batches them.

    policy = VLLMPolicy("cognition-ai/Kevin-32B", tensor_parallel_size=4)
    replies = policy.generate(conversations, Sampling(temperature=0.9, seed=1))

vLLM is optional (`pip install 'kevin_backend[vllm]'`) and imported only when a policy is built.
Where a server is already running, `OpenAIPolicy` talks to it instead.
"""

from __future__ import annotations

import time
from typing import Any, Sequence

from kevin_backend.generate.policy import Message, PolicyError, Reply, Sampling, split_reasoning

__all__ = ["VLLMPolicy"]


def _import_vllm() -> Any:
    try:
        import vllm
    except ImportError as exc:
        raise PolicyError(
            "VLLMPolicy needs vLLM, which is not installed: pip install 'kevin_backend[vllm]' "
            "(or pip install vllm); or serve the model with `vllm serve` and use OpenAIPolicy"
        ) from exc
    return vllm


class VLLMPolicy:
    """A `Policy` over an in-process `vllm.LLM`.

    `model` is a model name or folder, loaded with `tensor_parallel_size` GPUs and any further
    `vllm.LLM` arguments (`max_model_len=`, `gpu_memory_utilization=`, ...); or pass a built
    engine as `llm=`. Conversation i of a batch is sampled with seed `sampling.seed + i` (see
    `OpenAIPolicy` for why). vLLM's offline API does not parse reasoning, so it is split from the
    text (`<think>` tags). A batch the engine rejects as a whole (a prompt longer than the
    context) is retried one conversation at a time, so only the bad ones carry `error`."""

    def __init__(
        self,
        model: str | None = None,
        *,
        tensor_parallel_size: int = 1,
        llm: Any = None,
        **engine_args: Any,
    ) -> None:
        self._vllm = _import_vllm()
        if llm is None:
            if not model:
                raise ValueError("VLLMPolicy needs a model name or folder, or a built engine as llm=")
            llm = self._vllm.LLM(model=model, tensor_parallel_size=tensor_parallel_size, **engine_args)
        self.llm = llm
        self.name = f"vllm:{model or getattr(llm, 'model', 'engine')}"

    def count_tokens(self, text: str) -> int:
        """Exact: the engine's tokenizer."""
        return len(self.llm.get_tokenizer().encode(text, add_special_tokens=False))

    def _params(self, sampling: Sampling, index: int) -> Any:
        return self._vllm.SamplingParams(
            temperature=sampling.temperature,  # 0 is greedy in vLLM
            top_p=sampling.top_p,
            max_tokens=sampling.max_tokens,
            seed=None if sampling.seed is None else sampling.seed + index,
            stop=list(sampling.stop) or None,
        )

    def generate(self, conversations: Sequence[Sequence[Message]], sampling: Sampling) -> list[Reply]:
        if not conversations:
            return []
        batch = [list(messages) for messages in conversations]
        params = [self._params(sampling, i) for i in range(len(batch))]
        began = time.perf_counter()
        try:
            outputs = self.llm.chat(batch, sampling_params=params, use_tqdm=False)
        except ValueError:
            # vLLM validates every prompt before it runs any; find the bad ones one by one.
            return [self._one(messages, p) for messages, p in zip(batch, params)]
        seconds = time.perf_counter() - began
        return [self._reply(output, seconds) for output in outputs]

    def _one(self, messages: list[Message], params: Any) -> Reply:
        began = time.perf_counter()
        try:
            (output,) = self.llm.chat([messages], sampling_params=[params], use_tqdm=False)
        except ValueError as exc:
            return Reply(text="", finish_reason="error", seconds=time.perf_counter() - began,
                         error=f"vLLM rejected the conversation: {exc}", extra={"model": self.name})
        return self._reply(output, time.perf_counter() - began)

    def _reply(self, output: Any, seconds: float) -> Reply:
        completion = output.outputs[0]
        text, reasoning = split_reasoning(completion.text)
        return Reply(
            text=text,
            reasoning=reasoning,
            prompt_tokens=len(output.prompt_token_ids or ()),
            completion_tokens=len(completion.token_ids),
            seconds=seconds,
            finish_reason=completion.finish_reason or "stop",
            extra={"model": self.name},
        )
