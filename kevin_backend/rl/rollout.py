"""Rollouts: the generator's own multi-turn loop (`generate/engine.py`), run with the model being
trained as the policy and the judge as the reward.

    rollouts = Rollouts(LivePolicy(model, tokenizer), make_judge(config.judge, run_dir), search)
    results = rollouts.run(tasks, batch=12, seed=seed)      # one SearchResult per task

Nothing about the loop is reimplemented here: the engine builds each turn's conversation
(earlier chain of thought dropped, summaries and feedback kept), calls the policy once per turn
for all trajectories, judges the replies and records every turn as a `TurnRecord` (which
`samples.py` turns into training samples). Training rollouts use neither beam nor patience: every
trajectory runs every turn, so each task yields trajectories x turns samples.

`LivePolicy` generates with transformers from the very model object the optimizer updates, so
every rollout sees the current weights; it records the exact prompt and completion token ids in
`Reply.extra`, so the trainer computes log-probs of the tokens that were sampled, not of a
re-tokenization of the decoded text. For large models, `vllm_sync.py` provides the same with a
vLLM engine whose weights are copied from the trainer after each batch.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Sequence

import torch

from kevin_backend.generate.engine import Engine, SearchConfig, SearchResult
from kevin_backend.generate.judging import Judging
from kevin_backend.generate.log import TrajectoryLog
from kevin_backend.generate.policy import Message, Policy, Reply, Sampling, split_reasoning
from kevin_backend.rl.train_config import JudgeSettings, RolloutSettings
from kevin_backend.rl.synthetic import FencedPolicy, TargetStringJudge
from kevin_backend.rl.tasks import TrainTask

__all__ = ["LivePolicy", "Rollouts", "make_judge", "search_config", "rollout_seed"]


class LivePolicy:
    """A `Policy` over the model being trained (transformers `generate`), recording token ids.

    Prompt rendering and token counting are `TransformersPolicy`'s (the same chat template and
    checks as `kevin generate --policy hf:PATH`); generation runs here because the trainer needs
    what that policy does not return: the sampled token ids. The model is put in eval mode for
    the call and back in its previous mode after; sampling runs under a forked RNG seeded with
    `sampling.seed`, so rollouts do not disturb (and are not disturbed by) the training RNG."""

    def __init__(self, model: Any, tokenizer: Any, batch_size: int = 8) -> None:
        from kevin_backend.generate.hf_policy import TransformersPolicy

        self._view = TransformersPolicy(model, tokenizer, batch_size=batch_size)
        self.model = model
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        self.name = f"live:{getattr(model, 'name_or_path', '') or type(model).__name__}"
        self.eos_ids = self._view.eos_ids  # the same stop and pad tokens as the generate unit's policy
        self.pad_id = self._view.pad_id

    def render(self, messages: Sequence[Message]) -> str:
        return self._view.render(messages)

    def count_tokens(self, text: str) -> int:
        return self._view.count_tokens(text)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def generate(self, conversations: Sequence[Sequence[Message]], sampling: Sampling) -> list[Reply]:
        prompts = [self.render(m) for m in conversations]
        was_training = self.model.training
        devices = [self.device.index or 0] if self.device.type == "cuda" else []
        replies: list[Reply] = []
        self.model.eval()
        try:
            with torch.random.fork_rng(devices=devices), torch.no_grad():
                if sampling.seed is not None:
                    torch.manual_seed(sampling.seed)
                for start in range(0, len(prompts), self.batch_size):
                    replies.extend(self._batch(prompts[start: start + self.batch_size], sampling))
        finally:
            self.model.train(was_training)
        return replies

    def _batch(self, prompts: list[str], sampling: Sampling) -> list[Reply]:
        import time

        began = time.perf_counter()
        inputs = self.tokenizer(prompts, return_tensors="pt", padding=True, padding_side="left",
                                add_special_tokens=False).to(self.device)
        output = self.model.generate(
            **inputs, max_new_tokens=sampling.max_tokens, do_sample=True, temperature=sampling.temperature,
            top_p=sampling.top_p, top_k=0, pad_token_id=self.pad_id, eos_token_id=self.eos_ids,
        )
        seconds = time.perf_counter() - began
        width = inputs["input_ids"].shape[1]
        replies = []
        for row in range(output.shape[0]):
            prompt_ids = inputs["input_ids"][row][inputs["attention_mask"][row].bool()].tolist()
            generated = output[row, width:].tolist()
            # a row ends at its first end-of-sequence token (kept: stopping is the model's choice);
            # what follows is padding
            end = next((i for i, t in enumerate(generated) if t in self.eos_ids or t == self.pad_id), None)
            if end is None:
                completion, finish = generated, "length" if len(generated) >= sampling.max_tokens else "stop"
            else:
                completion, finish = generated[: end + (1 if generated[end] in self.eos_ids else 0)], "stop"
            answer, reasoning = split_reasoning(self.tokenizer.decode(completion, skip_special_tokens=True))
            replies.append(Reply(
                text=answer, reasoning=reasoning, prompt_tokens=len(prompt_ids), completion_tokens=len(completion),
                seconds=seconds, finish_reason=finish,
                extra={"model": self.name, "prompt_ids": prompt_ids, "completion_ids": completion},
            ))
        return replies


def make_judge(settings: JudgeSettings, run_dir: Path) -> Judging:
    """The reward: the real judge (needs a CUDA GPU) or the synthetic stand-in."""
    if settings.kind == "synthetic":
        return TargetStringJudge(settings.target, settings.per_hit, settings.max_speedup)
    from kevin_backend.judge.judge import Judge
    from kevin_backend.judge.sandbox import RunConfig

    build_dir = Path(settings.build_dir) if settings.build_dir else Path(run_dir) / "builds"
    return Judge(build_dir, RunConfig(trials=settings.trials))


def search_config(settings: RolloutSettings) -> SearchConfig:
    """The engine's settings for training rollouts: every trajectory runs every turn (no patience,
    no stop at the roofline: the trainer's batches need whole trajectories)."""
    sampling = Sampling(temperature=settings.temperature, top_p=settings.top_p, max_tokens=settings.max_tokens)
    return SearchConfig(trajectories=settings.trajectories, turns=settings.turns, beam=None, patience=None,
                        roofline_stop=None,
                        max_prompt_tokens=settings.max_prompt_tokens, sampling=sampling,
                        judge_workers=settings.judge_workers)


def rollout_seed(seed: int, batch: int, task_index: int) -> int:
    """The sampling seed of one task's search in one batch (the engine adds 1000 per turn, vLLM
    adds the conversation's index): a function of the run's seed and the position only, so a
    resumed run samples what the uninterrupted run would have."""
    return (seed * 1_000_003 + batch * 7_919 + task_index * 104_729) % (2**31 - 1)


class Rollouts:
    """Searches with the training policy: one `Engine.search` per task."""

    def __init__(self, policy: Policy, judge: Judging, search: SearchConfig, *, gpu: str = "",
                 capability: str = "", log_dir: Path | None = None, fence_replies: bool = False) -> None:
        self.policy: Policy = FencedPolicy(policy) if fence_replies else policy
        self.judge = judge
        self.search = search
        self.gpu = gpu
        self.capability = capability
        self.log_dir = Path(log_dir) if log_dir is not None else None

    def run(self, tasks: Sequence[TrainTask], batch: int, seed: int, rank: int = 0,
            first_index: int = 0) -> list[SearchResult]:
        """One search per task, in order. `first_index` is the position of `tasks[0]` in the
        whole batch (across processes), so seeds do not depend on how tasks were split."""
        log = None
        if self.log_dir is not None:
            log = TrajectoryLog(self.log_dir / f"batch-{batch:06d}-rank{rank}.jsonl", run=f"batch-{batch:06d}")
        results = []
        for offset, task in enumerate(tasks):
            sampling = dataclasses.replace(self.search.sampling,
                                           seed=rollout_seed(seed, batch, first_index + offset))
            engine = Engine(self.policy, self.judge, dataclasses.replace(self.search, sampling=sampling),
                            on_record=log.write if log is not None else None, gpu=self.gpu,
                            capability=self.capability)
            results.append(engine.search(task.source, name=task.name))
        return results
