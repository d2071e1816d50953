"""The learning-rate schedule the trainer and the warm start share.

    LambdaLR(optimizer, lambda step: lr_factor(step, warmup, total, "cosine"))
"""

from __future__ import annotations

import math

__all__ = ["lr_factor"]


def lr_factor(step: int, warmup: int, total: int, schedule: str) -> float:
    """The learning-rate multiplier at optimizer step `step` (0-based): linear warm-up over
    `warmup` steps, then constant, or a linear or cosine decay reaching 0 at step `total`."""
    if warmup and step < warmup:
        return (step + 1) / warmup
    if schedule == "constant":
        return 1.0
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    if schedule == "linear":
        return 1.0 - progress
    return 0.5 * (1.0 + math.cos(math.pi * progress))
