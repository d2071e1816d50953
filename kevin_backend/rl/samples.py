"""Turns into training samples: tokens, loss masks, returns and advantages, padded batches.

Every turn of every trajectory is one sample. Its prompt is the conversation the engine sent
that turn (`TurnRecord.messages`: system, task, and each earlier turn as its code and summary
plus the judge's feedback), rendered with the tokenizer's chat template with the assistant's turn
opened, exactly as the policy saw it. Its completion is the reply the model wrote:

    [system][task][assistant: earlier code + summary][user: feedback] ... <assistant opened> | reply tokens
    \\_____________________________ masked (no loss) ______________________________/   \\_ loss _/

Only the completion carries loss: the earlier turns inside the prompt were rewritten by the engine
(chain of thought dropped) and the feedback was written by the judge, so neither is the model's
own sampled text at this point. The completion tokens are the ones the model sampled when the
policy recorded them (`Reply.extra["completion_ids"]`: the trainer's own policies do); a reply
from elsewhere (a trajectory log) is re-tokenized from its text and reasoning.

`collate` pads on the right: with a causal model, tokens after a sequence's end cannot change its
log-probs, and the masks keep pad positions out of the loss, so padding changes nothing.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

import torch

from kevin_backend.generate.engine import TurnRecord
from kevin_backend.generate.policy import Message, Reply
from kevin_backend.rl.returns import discounted_returns, group_advantages

__all__ = [
    "Sample",
    "Batch",
    "render_prompt",
    "completion_text",
    "sample_from_record",
    "samples_from_log",
    "with_advantages",
    "collate",
    "micro_batches",
]


@dataclass(frozen=True)
class Sample:
    """One turn of one trajectory, ready to train on."""

    task: str
    group: str  # one search: its samples are compared with each other (a task may recur in a batch)
    trajectory: int
    turn: int
    prompt_ids: tuple[int, ...]
    completion_ids: tuple[int, ...]
    text: str  # the completion as the model wrote it (reasoning included), for the monitors
    score: float  # the judge's score of this turn
    correct: bool
    speedup: float | None  # over eager, when correct
    finish_reason: str  # "stop", "length", ...
    ret: float = 0.0  # discounted return (filled by `with_advantages`)
    advantage: float = 0.0
    weight: float = 1.0  # 0 for a filler that keeps a step's sample count fixed (no loss, no gradient)

    @property
    def length(self) -> int:
        return len(self.prompt_ids) + len(self.completion_ids)


def render_prompt(tokenizer: Any, messages: Sequence[Message]) -> str:
    """The prompt text: the chat template with the assistant's turn opened (as the policies send it)."""
    return tokenizer.apply_chat_template([dict(m) for m in messages], tokenize=False, add_generation_prompt=True)


def completion_text(reply: Reply, prompt: str = "") -> str:
    """The reply as the model wrote it, rebuilt from its answer and reasoning: the reasoning in
    `<think>` tags first, unless the chat template already opened the tag in the prompt (QwQ's
    does), in which case the completion starts inside it."""
    if not reply.reasoning:
        return reply.text
    if prompt.rstrip().endswith("<think>"):
        return f"{reply.reasoning}\n</think>\n\n{reply.text}"
    return f"<think>\n{reply.reasoning}\n</think>\n\n{reply.text}"


def _eos_id(tokenizer: Any) -> int | None:
    return tokenizer.eos_token_id


def _completion_ids(tokenizer: Any, reply: Reply, prompt: str) -> tuple[tuple[int, ...], str]:
    recorded = reply.extra.get("completion_ids") if reply.extra else None
    if recorded is not None:
        ids = tuple(int(t) for t in recorded)  # type: ignore[union-attr]
        return ids, tokenizer.decode(list(ids), skip_special_tokens=True)
    text = completion_text(reply, prompt)
    ids = list(tokenizer(text, add_special_tokens=False).input_ids)
    eos = _eos_id(tokenizer)
    if reply.finish_reason == "stop" and eos is not None:
        ids.append(eos)  # the model chose to stop: that token is part of what it did
    return tuple(ids), text


def sample_from_record(record: TurnRecord, task: str, tokenizer: Any, group: str | None = None) -> Sample:
    """The sample of one turn of the search `group` (default: the task's name) on `task`;
    return and advantage not yet set."""
    reply = record.step.reply
    recorded_prompt = reply.extra.get("prompt_ids") if reply.extra else None
    prompt = render_prompt(tokenizer, record.messages)
    if recorded_prompt is not None:
        prompt_ids = tuple(int(t) for t in recorded_prompt)  # type: ignore[union-attr]
    else:
        prompt_ids = tuple(tokenizer(prompt, add_special_tokens=False).input_ids)
    completion_ids, text = _completion_ids(tokenizer, reply, prompt)
    return Sample(
        task=task,
        group=task if group is None else group,
        trajectory=record.trajectory,
        turn=record.turn,
        prompt_ids=prompt_ids,
        completion_ids=completion_ids,
        text=text,
        score=float(record.score),
        correct=record.correct,
        speedup=record.speedup,
        finish_reason=reply.finish_reason,
    )


def samples_from_log(lines: Iterable[Mapping[str, Any]], tokenizer: Any) -> list[Sample]:
    """Samples from trajectory-log lines (`generate/log.py`): searches run earlier, by any
    policy. The replies are re-tokenized from their text, so use these for off-policy training
    or evaluation only: the stored old log-probs will be the trainer's own."""
    samples = []
    for line in lines:
        if line.get("reply_error"):
            continue
        reply = Reply(text=line.get("reply") or "", reasoning=line.get("reasoning") or "",
                      finish_reason=line.get("finish_reason") or "stop")
        prompt = render_prompt(tokenizer, line["messages"])
        completion_ids, text = _completion_ids(tokenizer, reply, prompt)
        speedup = line.get("speedup_vs_eager") if line.get("correct") else None
        samples.append(Sample(
            task=str(line["task"]),
            group=f"{line.get('run', '')}/{line['task']}",  # one search of one log
            trajectory=int(line["trajectory"]),
            turn=int(line["turn"]),
            prompt_ids=tuple(tokenizer(prompt, add_special_tokens=False).input_ids),
            completion_ids=completion_ids,
            text=text,
            score=float(line.get("score") or 0.0),
            correct=bool(line.get("correct")),
            speedup=speedup,
            finish_reason=reply.finish_reason,
        ))
    return samples


def with_advantages(samples: Sequence[Sample], gamma: float, mode: str) -> list[Sample]:
    """`samples` with `ret` (discounted within each trajectory, turns in order) and `advantage`
    (normalized over all samples of the same group: one search on one task) filled in; order kept."""
    trajectories: dict[tuple[str, int], list[int]] = defaultdict(list)
    for i, s in enumerate(samples):
        trajectories[(s.group, s.trajectory)].append(i)
    returns = [0.0] * len(samples)
    for indices in trajectories.values():
        indices.sort(key=lambda i: samples[i].turn)
        turns = [samples[i].turn for i in indices]
        if turns != list(range(turns[0], turns[0] + len(turns))):
            raise ValueError(f"trajectory {samples[indices[0]].trajectory} of {samples[indices[0]].group} "
                             f"has turns {turns}: a gap or a duplicate (returns need every turn)")
        for i, r in zip(indices, discounted_returns([samples[i].score for i in indices], gamma)):
            returns[i] = r
    groups: dict[str, list[int]] = defaultdict(list)
    for i, s in enumerate(samples):
        groups[s.group].append(i)
    advantages = [0.0] * len(samples)
    for indices in groups.values():
        for i, a in zip(indices, group_advantages([returns[i] for i in indices], mode)):
            advantages[i] = a
    return [dataclasses.replace(s, ret=r, advantage=a) for s, r, a in zip(samples, returns, advantages)]


@dataclass(frozen=True)
class Batch:
    """Padded tensors for one forward pass. Position p of `loss_mask` (width T - 1) weighs the
    log-prob of token p + 1 given tokens 0..p: 1 on the completion (times the sample's weight),
    0 on the prompt and the padding."""

    input_ids: torch.Tensor  # [B, T] long
    attention_mask: torch.Tensor  # [B, T] long
    loss_mask: torch.Tensor  # [B, T - 1] float
    advantages: torch.Tensor  # [B] float
    completion_tokens: torch.Tensor  # [B] long

    @property
    def size(self) -> int:
        return int(self.input_ids.shape[0])

    def keep(self) -> tuple[int, int]:
        """[first, last) of the predicting positions any completion needs: a forward pass can
        skip the LM head on the rest (long prompts)."""
        any_row = self.loss_mask.abs().sum(dim=0) > 0
        if not bool(any_row.any()):
            return 0, 1
        nz = torch.nonzero(any_row).flatten()
        return int(nz[0]), int(nz[-1]) + 1


def collate(samples: Sequence[Sample], pad_id: int, width: int | None = None) -> Batch:
    """A right-padded batch (to `width` tokens when given, else the longest sample)."""
    if not samples:
        raise ValueError("cannot collate an empty batch")
    longest = max(s.length for s in samples)
    width = longest if width is None else width
    if width < longest:
        raise ValueError(f"width {width} is shorter than the longest sample ({longest} tokens)")
    ids = torch.full((len(samples), width), pad_id, dtype=torch.long)
    attention = torch.zeros((len(samples), width), dtype=torch.long)
    mask = torch.zeros((len(samples), width - 1), dtype=torch.float32)
    for row, s in enumerate(samples):
        tokens = s.prompt_ids + s.completion_ids
        ids[row, : len(tokens)] = torch.tensor(tokens, dtype=torch.long)
        attention[row, : len(tokens)] = 1
        start = len(s.prompt_ids) - 1  # the position that predicts the first completion token
        if s.completion_ids:
            if start < 0:
                raise ValueError("a sample needs at least one prompt token before its completion")
            mask[row, start: start + len(s.completion_ids)] = s.weight
    return Batch(
        input_ids=ids,
        attention_mask=attention,
        loss_mask=mask,
        advantages=torch.tensor([s.advantage for s in samples], dtype=torch.float32),
        completion_tokens=torch.tensor([len(s.completion_ids) for s in samples], dtype=torch.long),
    )


def micro_batches(samples: Sequence[Sample], size: int) -> list[list[Sample]]:
    """`samples` in runs of `size`, in order (the last may be shorter)."""
    return [list(samples[i: i + size]) for i in range(0, len(samples), size)]
