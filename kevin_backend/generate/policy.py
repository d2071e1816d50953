"""The `Policy` protocol: whatever writes kernel replies for a batch of conversations.

A policy is a model behind some interface (an OpenAI-compatible server such as
`vllm serve cognition-ai/Kevin-32B`, an in-process vLLM engine, transformers `generate`), the
built-in writer, or a replay of scripted replies in tests. The generator's loop calls it once per
turn with every live trajectory's conversation:

    replies = policy.generate([messages_1, messages_2, ...], Sampling(temperature=0.9))

and gets one `Reply` per conversation, in order. A policy that wants the judge's numbers rather
than the prose written for a language model (the built-in writer) is a `TurnReader`: the loop
then calls `generate_after(conversations, earlier, sampling)`, with each trajectory's earlier
turns as data (`EarlierTurn`: its own reply and the judge's `JudgeResult`), all of them, however
many the conversation had to drop. A policy that can say, without a model call, the programs it may
write in the coming turns is `Foreseeing`: the loop has them built while it judges the turn at
hand. A policy that counts its model's tokens is a `TokenCounter`:
the loop cuts conversations at the token budget by its count. Reasoning models put their chain of thought in a
separate field or inside `<think>...</think>`; a policy returns it apart from the answer
(`split_reasoning`), so the loop can drop it from later turns' context.

A policy raises `PolicyError` (with a message naming the problem: server down, unknown model,
timeout) when it cannot answer at all; a reply that failed alone carries `error` instead.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Protocol, Sequence, runtime_checkable

from kevin_backend.judge.result import JudgeResult

__all__ = ["Message", "Sampling", "Reply", "Policy", "PolicyError", "EarlierTurn", "TurnReader", "Foreseeing",
           "TokenCounter", "split_reasoning"]

Message = dict[str, str]  # {"role": "system" | "user" | "assistant", "content": "..."}


@dataclass(frozen=True)
class Sampling:
    """Sampling settings; the defaults follow the Kevin-32B recipe."""

    temperature: float = 0.9
    top_p: float = 1.0
    max_tokens: int = 16384
    seed: int | None = None
    stop: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, object]:
        return {"temperature": self.temperature, "top_p": self.top_p, "max_tokens": self.max_tokens,
                "seed": self.seed, "stop": list(self.stop)}


@dataclass(frozen=True)
class Reply:
    text: str  # the answer, without the chain of thought
    reasoning: str = ""  # the chain of thought, when the model wrote one
    prompt_tokens: int = 0
    completion_tokens: int = 0
    seconds: float = 0.0  # wall time of the request (shared by a batch's replies)
    finish_reason: str = "stop"  # "stop", "length", "error"
    error: str = ""  # why this reply failed, when it did (the others of the batch may not have)
    extra: dict[str, object] = field(default_factory=dict)  # policy-specific details (model name, ...)

    @property
    def ok(self) -> bool:
        return not self.error


class PolicyError(RuntimeError):
    """The policy cannot answer at all; the message says why and what to check."""


@runtime_checkable
class Policy(Protocol):
    name: str

    def generate(self, conversations: Sequence[Sequence[Message]], sampling: Sampling) -> list[Reply]:
        """One reply per conversation, in order."""
        ...


@runtime_checkable
class TokenCounter(Protocol):
    """A policy's ability to count its model's tokens: the loop cuts conversations at the token
    budget by its count instead of the approximate one (`prompts.approx_tokens`)."""

    def count_tokens(self, text: str) -> int:
        """The number of tokens `text` takes in the model's prompt."""
        ...


@dataclass(frozen=True)
class EarlierTurn:
    """One earlier turn of a trajectory, as data: the policy's own reply (with what it put into
    `Reply.extra`) and the judge's verdict on it (None when the reply held no program)."""

    reply: Reply
    result: JudgeResult | None


@runtime_checkable
class TurnReader(Protocol):
    """A policy that reads its trajectories' earlier turns as data beside the messages."""

    name: str

    def generate(self, conversations: Sequence[Sequence[Message]], sampling: Sampling) -> list[Reply]:
        """One reply per conversation, each a first turn."""
        ...

    def generate_after(self, conversations: Sequence[Sequence[Message]], earlier: Sequence[Sequence[EarlierTurn]],
                       sampling: Sampling) -> list[Reply]:
        """One reply per conversation, in order; `earlier[i]` holds every earlier turn of
        conversation i's trajectory, oldest first."""
        ...


@runtime_checkable
class Foreseeing(Protocol):
    """A policy that can say, cheaply and without asking a model, which programs it may write in
    the coming turns (a writer that walks a list of variants: the next ones). The search has them
    built in the background while it judges the turn at hand, so that a later turn finds its
    build done; a program it never writes costs a build and nothing else."""

    def foresee(self, conversations: Sequence[Sequence[Message]], earlier: Sequence[Sequence[EarlierTurn]],
                turns_left: int | None = None) -> list[str]:
        """Programs (as a reply's code block holds them) the trajectories may write next, given
        `conversations` and each trajectory's turns so far (`earlier[i]`, this turn's reply last,
        its verdict not known yet: None); empty when it cannot tell. `turns_left`: how many turns
        the search takes after those in `earlier` (None: not known), so that nothing is foreseen
        that no turn can write."""
        ...


_THINK = re.compile(r"<think>(.*?)(?:</think>|$)", re.S)


def split_reasoning(text: str, reasoning: str | None = None) -> tuple[str, str]:
    """(answer, reasoning) from a reply: `reasoning` when the server returned it in its own field,
    else the `<think>` blocks of `text` (an unclosed one runs to the end, as when a reply is cut
    at its token limit). A reply that opens with reasoning but whose `<think>` tag was consumed by
    the chat template ends it with a lone `</think>`; that prefix is reasoning too."""
    if reasoning:
        return text.strip(), reasoning.strip()
    if "<think>" not in text and "</think>" in text:
        head, _, tail = text.partition("</think>")
        return tail.strip(), head.strip()
    thoughts = [m.group(1).strip() for m in _THINK.finditer(text)]
    answer = _THINK.sub("", text).strip()
    return answer, "\n\n".join(t for t in thoughts if t)
