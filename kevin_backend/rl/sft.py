"""The warm start: supervised fine-tuning on a writer's demonstrations before the first GRPO batch.

A model that never writes a program the judge accepts scores 0 on every reply; every group of
equal rewards has zero advantages, and GRPO learns nothing. The warm start first teaches the
policy to imitate a writer that does produce accepted kernels (distillation), in exactly the
conversations the rollouts will send it, so the first batch already has rewards to compare.

    samples = builtin_demonstrations(tasks, tokenizer, config.sft, config.rollout, gpu, capability)
    steps, report = run_warm_start(model, samples, config.sft, accelerator=acc, pad_id=pad, seed=0)

Demonstrations (`source: builtin`) are searches of the built-in writer (`generate/builtin/`)
through the generator's own engine, with the rollouts' settings (prompt budget, target GPU) and
the trained model's tokenizer counting tokens, so each prompt is the one a rollout turn sends:
`trajectories` first turns (the writer starts trajectory i at its variant i) and, with `turns` >
1, its later replies after a verdict of "correct" whose timings are made up from a hash of the
program (`AssumedCorrectJudge`: no GPU is needed, and the writer's next choice depends only on
the timings it reads). Each turn becomes a `Sample` the way a rollout turn does
(`samples.sample_from_record`: the chat-templated prompt, the reply re-tokenized from its text
and ended with the end-of-sequence token), so the masking is the GRPO samples' own: prompt and
padding positions carry exactly zero loss and gradient, only the reply tokens are learned.

The loss of a step is the mean negative log-likelihood over the step's reply tokens (all
processes together), at temperature 1. The warm start has its own AdamW (GRPO's optimizer state
and learning-rate schedule start fresh after it) and runs once per run: the trainer records it in
its state and checkpoints it, so a resumed run never repeats it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import logging
import math
import random
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch

from kevin_backend.generate.engine import Engine
from kevin_backend.generate.policy import EarlierTurn, Message, Reply, Sampling
from kevin_backend.judge.result import JudgeResult, JudgeTimings, Reason, Stage
from kevin_backend.rl.train_config import RolloutSettings, SFTSettings, TrainConfigError
from kevin_backend.rl.loss import kept_logits, sequence_logprobs, token_logprobs
from kevin_backend.rl.rollout import search_config
from kevin_backend.rl.samples import Batch, Sample, collate, micro_batches, sample_from_record
from kevin_backend.rl.schedule import lr_factor
from kevin_backend.rl.tasks import TrainTask

__all__ = [
    "AssumedCorrectJudge",
    "builtin_demonstrations",
    "sft_loss",
    "reply_token_stats",
    "evaluate_demonstrations",
    "SFTStep",
    "SFTReport",
    "run_warm_start",
]

log = logging.getLogger("kevin_backend.rl")


@dataclass(frozen=True)
class AssumedCorrectJudge:
    """A verdict of "correct" for every program, with timings made up from a hash of its text:
    eager `eager_ms`, Inductor 0.8 x eager, the program 0.5-1.3 x eager. Only for demonstrations
    of later turns, where what matters is what the writer does with a verdict, not the verdict."""

    eager_ms: float = 1.0

    def judge(self, task_source: str, candidate_source: str) -> JudgeResult:
        fraction = int(hashlib.sha256(candidate_source.encode()).hexdigest()[:8], 16) / 0xFFFFFFFF
        timings = JudgeTimings(kernel_ms=self.eager_ms * (0.5 + 0.8 * fraction), eager_ms=self.eager_ms,
                               inductor_ms=0.8 * self.eager_ms, trials=1)
        return JudgeResult(Stage.TIMING, Reason.ACCEPTED, timings=timings)


class _Writer:
    """The built-in writer, counting tokens with the trained model's tokenizer (as the rollouts'
    policy does, so the engine cuts long conversations at the same turns)."""

    name = "builtin"

    def __init__(self, tokenizer: Any) -> None:
        from kevin_backend.generate.builtin.builtin_policy import BuiltinPolicy

        self.writer = BuiltinPolicy()
        self.tokenizer = tokenizer

    def count_tokens(self, text: str) -> int:
        return len(self.tokenizer.encode(text, add_special_tokens=False))

    def generate(self, conversations: Sequence[Sequence[Message]], sampling: Sampling) -> list[Reply]:
        return self.writer.generate(conversations, sampling)

    def generate_after(self, conversations: Sequence[Sequence[Message]], earlier: Sequence[Sequence[EarlierTurn]],
                       sampling: Sampling) -> list[Reply]:
        return self.writer.generate_after(conversations, earlier, sampling)


def builtin_demonstrations(tasks: Sequence[TrainTask], tokenizer: Any, settings: SFTSettings,
                           rollout: RolloutSettings, gpu: str = "", capability: str = "") -> list[Sample]:
    """The built-in writer's replies to `tasks` as training samples (see the module doc), each
    (prompt, reply) pair once, in task order. Tasks the writer declines are skipped (logged); a
    TrainConfigError when it declines them all."""
    search = dataclasses.replace(search_config(rollout), trajectories=settings.trajectories, turns=settings.turns,
                                 judge_workers=1)
    writer = _Writer(tokenizer)
    samples: list[Sample] = []
    seen: set[tuple[tuple[int, ...], tuple[int, ...]]] = set()
    declined: list[str] = []
    for task in tasks:
        engine = Engine(writer, AssumedCorrectJudge(), search, gpu=gpu, capability=capability)
        result = engine.search(task.source, name=task.name)
        kept = 0
        for record in result.records:
            if record.step.reply.finish_reason == "declined" or not record.step.reply.ok:
                continue
            sample = sample_from_record(record, task.name, tokenizer, group=f"sft:{task.name}")
            key = (sample.prompt_ids, sample.completion_ids)
            if key in seen:
                continue
            seen.add(key)
            samples.append(sample)
            kept += 1
        if not kept:
            declined.append(f"{task.name} ({result.stopped})")
    if declined:
        log.warning("the built-in writer wrote no demonstration for %d task(s): %s", len(declined), "; ".join(declined))
    if not samples:
        raise TrainConfigError("sft.source: the built-in writer declined every training task, so there is nothing to "
                               "imitate (it writes pointwise chains and reductions; see "
                               "kevin_backend/generate/builtin/)")
    longest = max(len(s.completion_ids) for s in samples)
    if longest > rollout.max_tokens:
        log.warning("the longest demonstration reply has %d tokens, more than rollout.max_tokens (%d): rollouts "
                    "will cut such replies", longest, rollout.max_tokens)
    return samples


# ---------------------------------------------------------------------------------------------
# the loss and its measures


def sft_loss(logprobs: torch.Tensor, loss_mask: torch.Tensor, tokens_in_step: float) -> tuple[torch.Tensor, float]:
    """The micro-batch's share of a step's loss: the negative log-likelihood summed over its
    reply tokens (weighted by `loss_mask`), divided by the reply tokens of the whole step, so the
    micro-batches' gradients add up to the step's mean. Positions whose mask is 0 (prompt,
    padding, fillers) are cut out with `torch.where`: exactly zero gradient whatever their value.
    Returns (loss, the summed negative log-likelihood)."""
    if tokens_in_step <= 0:
        raise ValueError(f"tokens_in_step must be > 0, got {tokens_in_step}")
    mask = loss_mask.to(logprobs.device)
    nll = torch.where(mask != 0, -logprobs * mask, torch.zeros_like(logprobs)).sum()
    return nll / tokens_in_step, float(nll.detach())


def reply_token_stats(model: Any, batch: Batch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per row of `batch`, without gradients: the summed negative log-likelihood of its reply
    tokens, how many of them are the model's most likely next token (teacher forcing), and how
    many reply tokens it has."""
    with torch.no_grad():
        logits, targets, first, last = kept_logits(model, batch)
        mask = batch.loss_mask[:, first:last].to(logits.device) != 0
        logprobs = token_logprobs(logits, targets)
        hits = (logits.argmax(dim=-1) == targets) & mask
        nll = torch.where(mask, -logprobs, torch.zeros_like(logprobs)).sum(dim=1)
        return nll.cpu(), hits.sum(dim=1).cpu(), mask.sum(dim=1).cpu()


@dataclass(frozen=True)
class DemoScores:
    loss: float  # mean negative log-likelihood per reply token
    token_accuracy: float  # share of reply tokens that are the model's argmax
    exact: float  # share of demonstrations whose every reply token is the argmax (see SFTReport)


def evaluate_demonstrations(model: Any, samples: Sequence[Sample], pad_id: int, micro_batch_size: int = 8,
                            autocast: Callable[[], Any] | None = None) -> DemoScores:
    """How well `model` (in eval mode for the call) reproduces the demonstrations' replies."""
    was_training = model.training
    model.eval()
    nll = hits = tokens = exact = 0.0
    try:
        for chunk in micro_batches(list(samples), micro_batch_size):
            with autocast() if autocast is not None else contextlib.nullcontext():
                row_nll, row_hits, row_tokens = reply_token_stats(model, collate(chunk, pad_id))
            nll += float(row_nll.sum())
            hits += float(row_hits.sum())
            tokens += float(row_tokens.sum())
            exact += float(((row_hits == row_tokens) & (row_tokens > 0)).sum())
    finally:
        model.train(was_training)
    return DemoScores(nll / max(tokens, 1.0), hits / max(tokens, 1.0), exact / max(len(samples), 1))


# ---------------------------------------------------------------------------------------------
# the loop


@dataclass(frozen=True)
class SFTStep:
    """One optimizer step of the warm start (a metrics.jsonl line of kind "sft")."""

    step: int  # 1-based
    loss: float  # mean negative log-likelihood per reply token of the step (all processes)
    tokens: int  # reply tokens of the step
    demonstrations: int
    grad_norm: float  # before clipping
    lr: float
    seconds: float

    def as_dict(self) -> dict[str, Any]:
        return {"kind": "sft", **dataclasses.asdict(self)}


@dataclass(frozen=True)
class SFTReport:
    """The warm start as a whole (a metrics.jsonl line of kind "sft_summary"). The measures are
    taken on every demonstration with teacher forcing. Demonstrations that share a prompt (the
    writer's variants of a first turn) differ from their first token on, and only one of them
    can be the model's argmax there: with k variants per prompt, at most 1/k of those count as
    exact, and their loss cannot fall below log(k) per reply."""

    demonstrations: int
    tasks: int
    steps: int
    epochs: float  # passes over the demonstrations
    longest_reply: int  # tokens
    loss_before: float
    loss_after: float
    token_accuracy_before: float
    token_accuracy_after: float
    exact_before: float
    exact_after: float
    seconds: float

    def as_dict(self) -> dict[str, Any]:
        return {"kind": "sft_summary", **dataclasses.asdict(self)}


def _order(count: int, seed: int, epoch: int) -> list[int]:
    order = list(range(count))
    random.Random(f"kevin-rl-sft:{seed}:{epoch}").shuffle(order)
    return order


def run_warm_start(model: Any, samples: Sequence[Sample], settings: SFTSettings, *, accelerator: Any, pad_id: int,
                   seed: int = 0, on_step: Callable[[SFTStep], None] | None = None) -> tuple[list[SFTStep], SFTReport]:
    """Fine-tune `model` (as prepared by `accelerator`: one process or DDP) on `samples`.

    Each step takes the next `batch_size` demonstrations of a seeded permutation per epoch; each
    process trains on a contiguous share, topped up with zero-weight fillers so every process
    runs the same number of micro-batches, and scales its loss so the averaged gradients are the
    mean over the step's reply tokens. Gradients are clipped to `grad_clip`; the learning rate
    follows warm-up and `schedule`."""
    if not samples:
        raise ValueError("no demonstrations to fine-tune on")
    acc = accelerator
    began = time.perf_counter()
    processes, rank = acc.num_processes, acc.process_index
    unwrapped = acc.unwrap_model(model)
    before = evaluate_demonstrations(unwrapped, samples, pad_id, settings.micro_batch_size, acc.autocast)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=settings.lr, weight_decay=settings.weight_decay)
    total = settings.total_steps(len(samples))
    per_process = -(-settings.batch_size // processes)
    filler = Sample(task="(filler)", group="(filler)", trajectory=-1, turn=0, prompt_ids=(pad_id,),
                    completion_ids=(pad_id,), text="", score=0.0, correct=False, speedup=None,
                    finish_reason="filler", weight=0.0)
    epoch, position = 0, 0
    history: list[SFTStep] = []
    model.train()
    for step in range(total):
        t0 = time.perf_counter()
        chosen: list[Sample] = []
        while len(chosen) < settings.batch_size:
            order = _order(len(samples), seed, epoch)
            take = min(settings.batch_size - len(chosen), len(order) - position)
            chosen.extend(samples[i] for i in order[position: position + take])
            position += take
            if position >= len(order):
                epoch, position = epoch + 1, 0
        tokens = sum(len(s.completion_ids) for s in chosen)  # every process knows the whole step
        mine = chosen[rank * per_process: (rank + 1) * per_process]
        mine += [filler] * (per_process - len(mine))
        lr = settings.lr * lr_factor(step, settings.warmup_steps, total, settings.schedule)
        for group in optimizer.param_groups:
            group["lr"] = lr
        parts = micro_batches(mine, settings.micro_batch_size)
        nll = 0.0
        for k, part in enumerate(parts):
            batch = collate(part, pad_id)
            # DDP: gradients are averaged once, on the last micro-batch's backward
            sync = contextlib.nullcontext() if k == len(parts) - 1 else acc.no_sync(model)
            with sync:
                with acc.autocast():
                    logprobs = sequence_logprobs(model, batch, 1.0)
                loss, part_nll = sft_loss(logprobs, batch.loss_mask, tokens / processes)
                loss.backward()
            nll += part_nll
        grad_norm = float(torch.nn.utils.clip_grad_norm_(params, settings.grad_clip))
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if processes > 1:
            from accelerate.utils import gather_object

            nll = sum(gather_object([nll]))
        record = SFTStep(step=step + 1, loss=nll / max(tokens, 1), tokens=tokens, demonstrations=len(chosen),
                         grad_norm=grad_norm, lr=lr, seconds=time.perf_counter() - t0)
        history.append(record)
        if on_step is not None:
            on_step(record)
        if not math.isfinite(record.loss):
            raise RuntimeError(f"the warm start's loss is {record.loss} at step {record.step}; lower sft.lr")
    after = evaluate_demonstrations(unwrapped, samples, pad_id, settings.micro_batch_size, acc.autocast)
    report = SFTReport(
        demonstrations=len(samples), tasks=len({s.task for s in samples}), steps=total,
        epochs=total * settings.batch_size / len(samples), longest_reply=max(len(s.completion_ids) for s in samples),
        loss_before=before.loss, loss_after=after.loss, token_accuracy_before=before.token_accuracy,
        token_accuracy_after=after.token_accuracy, exact_before=before.exact, exact_after=after.exact,
        seconds=time.perf_counter() - began,
    )
    return history, report
