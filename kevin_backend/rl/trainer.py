"""The training loop: multi-turn GRPO on the judge's rewards.

    trainer = Trainer(TrainConfig.from_yaml("configs/train/tiny.yaml"))
    trainer.resume()          # from the newest checkpoint in run_dir, when there is one
    trainer.train()           # until config.batches batches are done

With an `sft` section, `train` first runs the warm start (`warm_start`, `sft.py`): supervised
fine-tuning on the built-in writer's demonstrations, once per run (recorded in the state and
checkpointed as batch 0, so a resumed run skips it).

One batch (`train_batch`) reads like the recipe:

  1. tasks: the next `tasks_per_batch` tasks in the seeded order, split across processes
  2. rollouts: the generator's loop (trajectories x turns) with the current weights
  3. samples: one per turn, prompt masked; returns within trajectories, advantages within tasks
  4. old log-probs (and reference log-probs when kl_coef > 0) of the sampled replies
  5. `steps_per_batch` optimizer steps: the first on-policy, the next off-policy against (4)
  6. metrics (JSONL + TensorBoard); a checkpoint every `checkpoint_every` batches

Scale comes from `accelerate`: the same code runs on one CPU, one GPU with LoRA, or 8 GPUs under
`accelerate launch` with DeepSpeed ZeRO-3 or FSDP2 (configs/accelerate/). Each process rolls out
its share of the batch's tasks and trains on its own samples; gradients are averaged across
processes, and every process's loss is scaled so the average is the loss of the whole batch.
Each process trains on the same number of samples per step (trajectories x turns x its tasks;
a search that stopped early is topped up with zero-weight fillers), because gradient
accumulation under DeepSpeed needs a fixed number of micro-batches per step.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from kevin_backend.generate.judging import Judging
from kevin_backend.rl.checkpoint import TrainerState, export_model, latest_checkpoint, load_checkpoint, save_checkpoint
from kevin_backend.rl.train_config import TrainConfig, TrainConfigError
from kevin_backend.rl.loss import LossSettings, LossStats, clipped_loss, sequence_logprobs
from kevin_backend.rl.metrics import BatchMetrics, MetricsWriter, StepStats, rollout_stats
from kevin_backend.rl.rollout import LivePolicy, Rollouts, make_judge, search_config
from kevin_backend.rl.samples import Batch, Sample, collate, micro_batches, sample_from_record, with_advantages
from kevin_backend.rl.schedule import lr_factor
from kevin_backend.rl.sft import SFTReport, SFTStep, builtin_demonstrations, run_warm_start
from kevin_backend.rl.tasks import TaskSampler, TrainTask, load_tasks

__all__ = ["Trainer", "lr_factor", "make_accelerator"]

log = logging.getLogger("kevin_backend.rl")

_EXPECTED_DISTRIBUTED = {
    "none": ("NO",),
    "ddp": ("NO", "MULTI_GPU", "MULTI_CPU"),
    "deepspeed": ("DEEPSPEED",),
    "fsdp": ("FSDP",),
}


def _tasks_per_process(config: TrainConfig, processes: int) -> int:
    return -(-config.grpo.tasks_per_batch // processes)


def _micro_batches_per_step(config: TrainConfig, processes: int) -> int:
    samples = _tasks_per_process(config, processes) * config.samples_per_task
    return -(-samples // config.grpo.micro_batch_size)


def make_accelerator(config: TrainConfig) -> Any:
    """The `accelerate.Accelerator` for this run: gradient accumulation over the fixed number of
    micro-batches of a step, bf16 when asked, and a check that the launcher set up the
    distributed back-end the config expects."""
    from accelerate import Accelerator

    accelerator = Accelerator(mixed_precision="bf16" if config.precision == "bf16" else "no")
    # set once the launcher's process count is known (DeepSpeed reads it at `prepare`)
    accelerator.gradient_accumulation_steps = _micro_batches_per_step(config, accelerator.num_processes)
    actual = accelerator.distributed_type.name
    if actual not in _EXPECTED_DISTRIBUTED[config.distributed]:
        how = (f"accelerate launch --config_file {config.accelerate_config} -m kevin_backend train --config ..."
               if config.accelerate_config else "accelerate launch with a matching --config_file")
        raise TrainConfigError(f"distributed: the config expects {config.distributed!r} but this process runs under "
                               f"{actual}; start it with `{how}`")
    plugin = getattr(accelerator.state, "deepspeed_plugin", None)
    if plugin is not None:  # values the DeepSpeed JSON leaves to the trainer ("auto")
        ds = plugin.deepspeed_config
        ds["train_micro_batch_size_per_gpu"] = config.grpo.micro_batch_size
        ds["gradient_accumulation_steps"] = accelerator.gradient_accumulation_steps
        ds["gradient_clipping"] = config.optim.grad_clip
    return accelerator


class Trainer:
    """One training run (see the module doc). `judge` replaces the judge the config names (a
    test's scoring function); `accelerator` replaces the one built from the config."""

    def __init__(self, config: TrainConfig, *, judge: Judging | None = None, accelerator: Any = None) -> None:
        from accelerate.utils import set_seed

        self.config = config
        self.run_dir = Path(config.run_dir)
        self.accelerator = accelerator if accelerator is not None else make_accelerator(config)
        acc = self.accelerator
        sharded = config.distributed in ("deepspeed", "fsdp") and acc.num_processes > 1
        if config.rollout.engine == "transformers" and sharded and config.grpo.tasks_per_batch % acc.num_processes:
            # generate on sharded weights is collective: every process must make the same calls
            raise TrainConfigError(f"grpo.tasks_per_batch ({config.grpo.tasks_per_batch}) must be a multiple of the "
                                   f"{acc.num_processes} processes when transformers generates on {config.distributed} "
                                   "shards")
        # the tasks first: a wrong folder should fail before a 32B model is loaded
        self.tasks: list[TrainTask] = load_tasks(config.tasks)
        self.sampler = TaskSampler(self.tasks, config.seed)
        set_seed(config.seed)  # python, numpy, torch (every device): model init and LoRA init
        self.tokenizer, model = self._load_model()
        self.reference = self._load_reference()
        params = [p for p in model.parameters() if p.requires_grad]
        o = config.optim
        optimizer = torch.optim.AdamW(params, lr=o.lr, betas=o.betas, eps=o.eps, weight_decay=o.weight_decay)
        total = config.batches * config.grpo.steps_per_batch
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda step: lr_factor(step, o.warmup_steps, total, o.schedule))
        # The scheduler is stepped here once per optimizer step (not prepared: accelerate would
        # step it once per process), and saved with the checkpoints.
        self.model, self.optimizer = acc.prepare(model, optimizer)
        acc.register_for_checkpointing(self.scheduler)
        self.loss_settings = LossSettings(config.grpo.clip_low, config.grpo.clip_high, config.grpo.kl_coef,
                                          config.length_norm)
        pad = self.tokenizer.pad_token_id
        self.pad_id = pad if pad is not None else self.tokenizer.eos_token_id
        self.state = TrainerState(config_digest=config.digest())
        self.judge = judge if judge is not None else make_judge(config.judge, self.run_dir)
        self._vllm: Any = None
        self._vllm_synced_at: int | None = 0  # the optimizer step whose weights the engine holds
        gpu, capability = self._target()
        self.rollouts = Rollouts(
            self._policy(), self.judge, search_config(config.rollout), gpu=gpu, capability=capability,
            log_dir=self.run_dir / "trajectories" if config.log_trajectories else None,
            fence_replies=config.judge.kind == "synthetic" and judge is None,
        )
        self.writer = MetricsWriter(self.run_dir, config.monitor.tensorboard) if acc.is_main_process else None
        self.sft_report: SFTReport | None = None  # set when this trainer ran the warm start

    # -- set-up --------------------------------------------------------------------------------

    def _load_dtype(self) -> torch.dtype:
        cfg = self.config
        # bf16 weights where fp32 masters live elsewhere (DeepSpeed's optimizer) or are not
        # trained (LoRA's frozen base); otherwise fp32 weights with bf16 compute (autocast/FSDP).
        if cfg.precision == "bf16" and (cfg.model.lora is not None or cfg.distributed == "deepspeed"):
            return torch.bfloat16
        return torch.float32

    def _load_model(self) -> tuple[Any, Any]:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        cfg = self.config.model
        try:
            tokenizer = AutoTokenizer.from_pretrained(cfg.tokenizer or cfg.path)
            extra = {"attn_implementation": cfg.attn_implementation} if cfg.attn_implementation else {}
            model = AutoModelForCausalLM.from_pretrained(cfg.path, dtype=self._load_dtype(), **extra)
        except (OSError, ValueError) as exc:
            raise TrainConfigError(f"model.path: cannot load {cfg.path!r}: {exc}") from exc
        if not getattr(tokenizer, "chat_template", None):
            raise TrainConfigError(f"model.tokenizer: the tokenizer of {cfg.tokenizer or cfg.path!r} "
                                   "has no chat template")
        if cfg.gradient_checkpointing:
            # non-reentrant: works with frozen inputs (LoRA) and with ZeRO-3's parameter hooks
            if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.x's name
                model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
            else:
                model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        if cfg.lora is not None:
            from peft import LoraConfig, get_peft_model

            lora = cfg.lora
            model = get_peft_model(model, LoraConfig(
                task_type="CAUSAL_LM", r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                target_modules=list(lora.target_modules)))
        return tokenizer, model

    def _load_reference(self) -> Any:
        """The frozen reference of the KL term: none when kl_coef is 0; with LoRA, the base model
        itself (adapters switched off); otherwise a second copy of the starting weights."""
        if self.config.grpo.kl_coef == 0.0 or self.config.model.lora is not None:
            return None
        from transformers import AutoModelForCausalLM

        cfg = self.config.model
        extra = {"attn_implementation": cfg.attn_implementation} if cfg.attn_implementation else {}
        reference = AutoModelForCausalLM.from_pretrained(cfg.path, dtype=self._load_dtype(), **extra)
        reference.requires_grad_(False)
        return reference.eval().to(self.accelerator.device)

    def _target(self) -> tuple[str, str]:
        r = self.config.rollout
        gpu, capability = r.gpu, r.capability
        if self.config.judge.kind == "kernelbench" and torch.cuda.is_available():
            major, minor = torch.cuda.get_device_capability()
            gpu = gpu or torch.cuda.get_device_name()
            capability = capability or f"{major}.{minor}"
        return gpu, capability

    def _policy(self) -> Any:
        cfg = self.config
        if cfg.rollout.engine == "vllm":
            from kevin_backend.rl.vllm_sync import VLLMRollouts

            self._vllm = VLLMRollouts(cfg.model.path, cfg.rollout.vllm, seed=cfg.seed + self.accelerator.process_index,
                                      dtype="bfloat16" if cfg.precision == "bf16" else "auto")
            return self._vllm.policy
        return LivePolicy(self.accelerator.unwrap_model(self.model), self.tokenizer,
                          batch_size=cfg.rollout.generation_batch_size)

    # -- checkpoints ---------------------------------------------------------------------------

    def resume(self, checkpoint: str | Path | None = None) -> bool:
        """Continue from `checkpoint` (default: the newest in run_dir); False when there is none."""
        folder = Path(checkpoint) if checkpoint is not None else latest_checkpoint(self.run_dir)
        if folder is None:
            return False
        state = load_checkpoint(self.accelerator, folder)
        if state.config_digest and state.config_digest != self.state.config_digest:
            log.warning("resuming %s with a changed config (digest %s, was %s)", folder,
                        self.state.config_digest, state.config_digest)
        self.sampler.load_state_dict(state.sampler)
        self.state = dataclasses.replace(state, config_digest=self.state.config_digest)
        self._vllm_synced_at = None  # the engine holds the starting weights, not the checkpoint's
        log.info("resumed from %s after %d batches", folder, state.batch)
        return True

    def save(self) -> Path:
        state = dataclasses.replace(self.state, sampler=self.sampler.state_dict())
        return save_checkpoint(self.accelerator, self.run_dir, state, self.config.keep_checkpoints)

    # -- the loop ------------------------------------------------------------------------------

    def warm_start(self, on_step: Callable[[SFTStep], None] | None = None) -> SFTReport | None:
        """The `sft` warm start, when the config has one and this run has not done it yet: the
        demonstrations, the fine-tuning, its metrics (metrics.jsonl lines of kind "sft" and
        "sft_summary", TensorBoard's sft/), then a checkpoint after 0 batches that records it.
        A run resumed after batches trained without it does not run it (that would change the
        policy mid-run); None when nothing ran."""
        settings = self.config.sft
        if settings is None or self.state.sft_done:
            return None
        if self.state.batch > 0:
            log.warning("not running the sft warm start: this run resumed after %d batches trained without it",
                        self.state.batch)
            return None
        gpu, capability = self._target()
        samples = builtin_demonstrations(self.tasks, self.tokenizer, settings, self.config.rollout, gpu, capability)
        log.info("sft warm start: %d demonstrations of %d tasks", len(samples), len({s.task for s in samples}))

        def step(record: SFTStep) -> None:
            if self.writer is not None:
                self.writer.write_sft(record)
            if on_step is not None:
                on_step(record)

        _, report = run_warm_start(self.model, samples, settings, accelerator=self.accelerator, pad_id=self.pad_id,
                                   seed=self.config.seed, on_step=step)
        if self.writer is not None:
            self.writer.write_sft_summary(report)
        log.info("sft warm start done: loss %.4g -> %.4g, exact replies %.2f -> %.2f", report.loss_before,
                 report.loss_after, report.exact_before, report.exact_after)
        self.state = dataclasses.replace(self.state, sft_done=True, sft_steps=report.steps)
        self._vllm_synced_at = None  # the engine holds the weights from before the warm start
        self.sft_report = report
        self.save()
        return report

    def train(self, batches: int | None = None,
              on_batch: Callable[[BatchMetrics], None] | None = None,
              on_sft: Callable[[SFTStep], None] | None = None) -> list[BatchMetrics]:
        """Train until `batches` (default config.batches) batches are done in all; checkpoints
        every `checkpoint_every` batches and at the end; once config.batches are done, the final
        weights go to run_dir/final. The warm start comes first when due (`warm_start`, whose
        steps `on_sft` sees); `on_batch` sees each batch's metrics."""
        until = self.config.batches if batches is None else batches
        self.warm_start(on_sft)
        history = []
        every = self.config.checkpoint_every
        while self.state.batch < until:
            history.append(self.train_batch())
            if on_batch is not None:
                on_batch(history[-1])
            if (every and self.state.batch % every == 0) or self.state.batch == until:
                self.save()
        if self.state.batch >= self.config.batches:
            export_model(self.accelerator, self.model, self.tokenizer, self.run_dir / "final")
        return history

    def close(self) -> None:
        """Close the TensorBoard writer (metrics.jsonl is flushed line by line anyway)."""
        if self.writer is not None:
            self.writer.close()

    def train_batch(self) -> BatchMetrics:
        cfg = self.config
        batch = self.state.batch
        began = time.perf_counter()
        # 1. tasks: this process's share of the batch, in the seeded order
        tasks, first = self._my_tasks(self.sampler.take(cfg.grpo.tasks_per_batch))
        # 2. rollouts with the current weights
        results = self._rollouts(tasks, batch, first)
        # 3. samples: returns within trajectories, advantages within tasks; a fixed count per process
        samples: list[Sample] = []
        for index, (task, result) in enumerate(zip(tasks, results), start=first):
            if result.incomplete:  # the judge's or the server's failure: no fair rewards, no samples
                log.warning("batch %d: task %s left out: %s", batch, task.name, result.incomplete)
                continue
            samples.extend(sample_from_record(r, task.name, self.tokenizer, group=f"{index}:{task.name}")
                           for r in result.records)
        samples = self._top_up(with_advantages(samples, cfg.grpo.gamma, cfg.grpo.advantage))
        rolled = time.perf_counter()
        # 4. the log-probs of the replies under the weights that wrote them (and the reference's)
        batches = [collate(m, self.pad_id) for m in micro_batches(samples, cfg.grpo.micro_batch_size)]
        old = [self._logprobs(b) for b in batches]
        ref = [self._reference_logprobs(b) for b in batches] if cfg.grpo.kl_coef > 0 else [None] * len(batches)
        # 5. gradient steps: the first on-policy, the next off-policy against `old`
        share = self._samples_per_process(samples)
        steps = [self._gradient_step(i, batches, old, ref, share) for i in range(cfg.grpo.steps_per_batch)]
        self.state = dataclasses.replace(self.state, batch=batch + 1, sampler=self.sampler.state_dict())
        # 6. metrics
        metrics = self._metrics(samples, steps, len(tasks), rolled - began, time.perf_counter() - rolled)
        if self.writer is not None:
            self.writer.write(metrics)
        log.info("batch %d: score %.3f, correct %.2f, loss %.4g", metrics.batch, metrics.mean_score,
                 metrics.correct_rate, steps[0].loss)
        return metrics

    def _my_tasks(self, tasks: Sequence[TrainTask]) -> tuple[list[TrainTask], int]:
        """A contiguous share of the batch's tasks for this process, and its first index."""
        acc = self.accelerator
        per = _tasks_per_process(self.config, acc.num_processes)
        first = acc.process_index * per
        return list(tasks[first: first + per]), first

    def _rollouts(self, tasks: Sequence[TrainTask], batch: int, first: int) -> list[Any]:
        if self._vllm is not None:
            from kevin_backend.rl.vllm_sync import trainer_weights

            self._vllm.wake()
            if self._vllm_synced_at != self.state.optimizer_step:
                self._vllm.load(trainer_weights(self.accelerator, self.model))
                self._vllm_synced_at = self.state.optimizer_step
        try:
            return self.rollouts.run(tasks, batch, self.config.seed, self.accelerator.process_index, first)
        finally:
            if self._vllm is not None:
                self._vllm.sleep()

    def _top_up(self, samples: list[Sample]) -> list[Sample]:
        """`samples` plus zero-weight fillers up to this process's fixed count per step."""
        want = _tasks_per_process(self.config, self.accelerator.num_processes) * self.config.samples_per_task
        if len(samples) > want:  # pragma: no cover - the engine never returns more turns than asked
            raise RuntimeError(f"{len(samples)} samples for {want} slots")
        filler = Sample(task="(filler)", group="(filler)", trajectory=-1, turn=0, prompt_ids=(self.pad_id,),
                        completion_ids=(self.pad_id,), text="", score=0.0, correct=False, speedup=None,
                        finish_reason="filler", weight=0.0)
        return samples + [filler] * (want - len(samples))

    def _samples_per_process(self, samples: Sequence[Sample]) -> float:
        """The divisor's sample count for this process: the real samples of the whole batch (all
        processes; fillers do not count) over the processes, so that the average of the
        processes' losses, which is what their averaged gradients follow, is the batch's loss
        sum / (length_norm * samples) whatever the split."""
        acc = self.accelerator
        real = sum(1 for s in samples if s.weight > 0)
        if acc.num_processes > 1:
            from accelerate.utils import gather_object

            real = sum(gather_object([real]))
        return max(real, 1) / acc.num_processes

    def _logprobs(self, batch: Batch) -> torch.Tensor:
        self.model.eval()
        with torch.no_grad(), self.accelerator.autocast():
            return sequence_logprobs(self.model, batch, self.config.rollout.temperature).detach()

    def _reference_logprobs(self, batch: Batch) -> torch.Tensor:
        with torch.no_grad(), self.accelerator.autocast():
            if self.reference is not None:
                return sequence_logprobs(self.reference, batch, self.config.rollout.temperature)
            unwrapped = self.accelerator.unwrap_model(self.model)  # LoRA: the base without adapters
            unwrapped.eval()
            with unwrapped.disable_adapter():
                return sequence_logprobs(self.model, batch, self.config.rollout.temperature)

    def _gradient_step(self, index: int, batches: Sequence[Batch], old: Sequence[torch.Tensor],
                       ref: Sequence[torch.Tensor | None], samples: float) -> StepStats:
        """One optimizer step over all micro-batches of the batch (gradients accumulated)."""
        acc, cfg = self.accelerator, self.config
        accumulation = acc.gradient_accumulation_steps
        if len(batches) != accumulation:  # pragma: no cover - fixed by _top_up
            raise RuntimeError(f"{len(batches)} micro-batches for {accumulation} accumulation steps")
        self.model.train()
        lr = float(self.scheduler.get_last_lr()[0])
        parts: list[LossStats] = []
        grad_norm = clipped = None
        for micro, old_lp, ref_lp in zip(batches, old, ref):
            with acc.accumulate(self.model):
                with acc.autocast():
                    logprobs = sequence_logprobs(self.model, micro, cfg.rollout.temperature)
                loss, stats = clipped_loss(logprobs, old_lp, micro.advantages, micro.loss_mask, self.loss_settings,
                                           samples_in_step=samples, ref_logprobs=ref_lp)
                parts.append(stats)
                # accelerate divides by the accumulation steps; the loss is already the
                # micro-batch's share of the step's, so undo that division
                acc.backward(loss * accumulation)
                if acc.sync_gradients:
                    # the total norm before clipping (DeepSpeed clips inside its step, with
                    # gradient_clipping set from optim.grad_clip, and reports its own norm)
                    norm = acc.clip_grad_norm_(self.model.parameters(), cfg.optim.grad_clip)
                    grad_norm = None if norm is None else float(norm)
                    clipped = self._grad_norm() if acc.num_processes == 1 else None
                self.optimizer.step()
                if acc.sync_gradients:
                    self.scheduler.step()
                self.optimizer.zero_grad()
        self.state = dataclasses.replace(self.state, optimizer_step=self.state.optimizer_step + 1)
        return self._step_stats(index, parts, grad_norm, clipped, lr)

    def _grad_norm(self) -> float:
        grads = [p.grad for p in self.model.parameters() if p.grad is not None]
        if not grads:
            return 0.0
        return float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g.float()) for g in grads])))

    def _step_stats(self, index: int, parts: Sequence[LossStats], grad_norm: float | None,
                    clipped: float | None, lr: float) -> StepStats:
        from accelerate.utils import gather_object

        mine = [(sum(p.loss for p in parts), sum(p.tokens for p in parts), sum(p.policy_sum for p in parts),
                 sum(p.kl_sum for p in parts), sum(p.clipped_sum for p in parts), sum(p.ratio_sum for p in parts),
                 max((p.ratio_max for p in parts), default=1.0))]
        every = gather_object(mine) if self.accelerator.num_processes > 1 else mine
        tokens = sum(e[1] for e in every) or 1.0
        return StepStats(
            index=index,
            loss=sum(e[0] for e in every) / len(every),  # processes' gradients are averaged
            policy_loss=sum(e[2] for e in every) / tokens,
            kl=sum(e[3] for e in every) / tokens if self.config.grpo.kl_coef > 0 else None,
            clip_fraction=sum(e[4] for e in every) / tokens,
            ratio_mean=sum(e[5] for e in every) / tokens,
            ratio_max=max(e[6] for e in every),
            grad_norm=grad_norm,
            grad_norm_clipped=clipped,
            lr=lr,
        )

    def _metrics(self, samples: Sequence[Sample], steps: Sequence[StepStats], tasks: int, rollout_seconds: float,
                 train_seconds: float) -> BatchMetrics:
        from accelerate.utils import gather_object

        stats = [rollout_stats(samples, self.config.monitor)]
        real = [s for s in samples if s.weight > 0]
        if self.accelerator.num_processes > 1:  # weigh each process's figures by its samples
            stats = gather_object(stats)
            counts = gather_object([len(real)])
            tasks = sum(gather_object([tasks]))
        else:
            counts = [len(real)]
        total = sum(counts) or 1

        def mean(key: str) -> float | None:
            # the speedup is a mean over correct replies: weigh it by those
            weights = [c * s["correct_rate"] if key == "mean_speedup" else c for s, c in zip(stats, counts)]
            pairs = [(s[key], w) for s, w in zip(stats, weights) if s[key] is not None and w]
            if not pairs:
                return None
            return sum(v * c for v, c in pairs) / sum(c for _, c in pairs)

        return BatchMetrics(
            batch=self.state.batch,
            optimizer_step=self.state.optimizer_step,
            tasks=tasks,
            samples=total,
            mean_score=mean("mean_score") or 0.0,
            correct_rate=mean("correct_rate") or 0.0,
            mean_speedup=mean("mean_speedup"),
            best_score=max(s["best_score"] for s in stats),
            mean_return=mean("mean_return") or 0.0,
            reply_tokens=mean("reply_tokens") or 0.0,
            truncated_rate=mean("truncated_rate") or 0.0,
            not_opener_rate=mean("not_opener_rate"),
            repetition_rate=mean("repetition_rate") or 0.0,
            rollout_seconds=rollout_seconds,
            train_seconds=train_seconds,
            steps=tuple(steps),
        )
