"""The policy-gradient loss: GRPO's clipped objective with clip-higher and Dr. GRPO's constant
length normalization, and the log-probs it needs.

For a completion token with log-prob `logp` under the weights being trained, `old` under the
weights that produced the batch, and its sample's advantage A:

    ratio = exp(logp - old)
    token_loss = -min(ratio * A, clip(ratio, 1 - clip_low, 1 + clip_high) * A) + kl_coef * KL
    loss = sum of token_loss over every completion token of the step / (length_norm * samples)

* clip-higher (0.2 / 0.28): a token whose probability rises on a good sample may rise further
  than one on a bad sample may fall, which keeps exploration alive (DAPO, used by Kevin-32B).
* Dr. GRPO: dividing each sample's loss by its own length would weigh a token of a short reply
  more than a token of a long one (and favour long wrong replies); a constant divisor (the
  longest allowed reply) keeps every token's weight equal.
* KL: the k3 estimator exp(ref - logp) - (ref - logp) - 1 against a frozen reference; Kevin-32B
  used coefficient 0 (no reference model at all).

Log-probs are taken of the sampling distribution (logits / temperature), the one the replies
were drawn from. Only positions whose `loss_mask` is non-zero reach the loss (`torch.where`, so
a prompt, feedback or padding position gets exactly zero gradient whatever its value).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from kevin_backend.rl.samples import Batch

__all__ = ["LossSettings", "LossStats", "token_logprobs", "sequence_logprobs", "clipped_loss"]


@dataclass(frozen=True)
class LossSettings:
    clip_low: float = 0.2
    clip_high: float = 0.28
    kl_coef: float = 0.0
    length_norm: int = 16384

    def __post_init__(self) -> None:
        if not 0.0 <= self.clip_low < 1.0 or self.clip_high < 0.0:
            raise ValueError("clip range must have 0 <= clip_low < 1 and clip_high >= 0, "
                             f"got {self.clip_low}, {self.clip_high}")
        if self.length_norm < 1:
            raise ValueError(f"length_norm must be >= 1, got {self.length_norm}")


@dataclass(frozen=True)
class LossStats:
    """What one micro-batch's loss was made of (summed over its tokens; divide by `tokens`)."""

    loss: float  # the value backpropagated (already divided by length_norm * samples)
    tokens: float  # completion tokens (weighted)
    policy_sum: float  # sum of the policy term over tokens
    kl_sum: float  # sum of the KL term over tokens (0 without a reference)
    clipped_sum: float  # tokens where the clipped branch was taken
    ratio_sum: float
    ratio_max: float


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """log p(target) under softmax(logits / temperature), in float32: [..., V], [...] -> [...]."""
    scaled = logits.float() / temperature
    picked = scaled.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    return picked - torch.logsumexp(scaled, dim=-1)


def _accepts_logits_to_keep(model: Any) -> bool:
    try:
        params = inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return False
    if "logits_to_keep" in params:
        return True
    # DDP / DeepSpeed (`.module`) and peft (`get_base_model`) forward **kwargs to the model inside
    inner = getattr(model, "module", None)
    if isinstance(inner, torch.nn.Module) and inner is not model:
        return _accepts_logits_to_keep(inner)
    base = getattr(model, "get_base_model", None)
    if callable(base):
        return _accepts_logits_to_keep(base())
    return False


def kept_logits(model: Any, batch: Batch) -> tuple[torch.Tensor, torch.Tensor, int, int]:
    """The model's logits on the range of `batch` that holds completions (the LM head runs only
    there) and the next tokens they predict: (logits [B, last - first, V], targets, first, last)."""
    device = next(model.parameters()).device
    input_ids = batch.input_ids.to(device)
    first, last = batch.keep()
    kwargs: dict[str, Any] = {"input_ids": input_ids, "attention_mask": batch.attention_mask.to(device), "use_cache": False}
    if _accepts_logits_to_keep(model):
        kwargs["logits_to_keep"] = torch.arange(first, last, device=device)
        logits = model(**kwargs).logits
    else:
        logits = model(**kwargs).logits[:, first:last]
    return logits, input_ids[:, first + 1: last + 1], first, last


def sequence_logprobs(model: Any, batch: Batch, temperature: float) -> torch.Tensor:
    """Log-probs [B, T - 1] of each next token under `model` (position p: token p + 1); zero at
    positions no completion needs."""
    logits, targets, first, last = kept_logits(model, batch)
    width = batch.input_ids.shape[1] - 1
    return F.pad(token_logprobs(logits, targets, temperature), (first, width - last))


def clipped_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    settings: LossSettings,
    samples_in_step: float,
    ref_logprobs: torch.Tensor | None = None,
) -> tuple[torch.Tensor, LossStats]:
    """The loss of one micro-batch as its share of the whole step's loss: summed over its
    completion tokens and divided by `length_norm * samples_in_step` (the samples of the whole
    gradient step, not of this micro-batch), so the micro-batches' gradients add up to the step's.
    Across processes whose gradients are averaged, `samples_in_step` is the batch's samples over
    the processes (it need not be whole).

    `logprobs`, `old_logprobs`, `loss_mask` (and `ref_logprobs`): [B, T - 1]; `advantages`: [B]."""
    if samples_in_step <= 0:
        raise ValueError(f"samples_in_step must be > 0, got {samples_in_step}")
    device = logprobs.device
    mask = loss_mask.to(device)
    active = mask != 0
    old = old_logprobs.to(device)
    adv = advantages.to(device).unsqueeze(-1)
    # masked positions: the log-ratio is pinned to 0 (no overflow, no gradient)
    log_ratio = torch.where(active, logprobs - old, torch.zeros_like(logprobs))
    ratio = torch.exp(log_ratio)
    unclipped = ratio * adv
    clipped = torch.clamp(ratio, 1.0 - settings.clip_low, 1.0 + settings.clip_high) * adv
    policy = -torch.minimum(unclipped, clipped)
    per_token = policy
    kl = torch.zeros_like(policy)
    if settings.kl_coef > 0.0:
        if ref_logprobs is None:
            raise ValueError("kl_coef > 0 needs the reference log-probs")
        delta = torch.where(active, ref_logprobs.to(device) - logprobs, torch.zeros_like(logprobs))
        kl = torch.exp(delta) - delta - 1.0
        per_token = per_token + settings.kl_coef * kl
    weighted = torch.where(active, per_token * mask, torch.zeros_like(per_token))
    loss = weighted.sum() / (settings.length_norm * samples_in_step)
    with torch.no_grad():
        took_clip = active & (clipped < unclipped)
        stats = LossStats(
            loss=float(loss.detach()),
            tokens=float(mask.sum()),
            policy_sum=float(torch.where(active, policy * mask, torch.zeros_like(policy)).sum()),
            kl_sum=float(torch.where(active, kl * mask, torch.zeros_like(kl)).sum()),
            clipped_sum=float((took_clip.float() * mask).sum()),
            ratio_sum=float(torch.where(active, ratio * mask, torch.zeros_like(ratio)).sum()),
            ratio_max=float(ratio[active].max()) if bool(active.any()) else 1.0,
        )
    return loss, stats
