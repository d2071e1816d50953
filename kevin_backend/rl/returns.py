"""Rewards to advantages: discounted returns within a trajectory, normalization within a task.

Every turn is its own sample, rewarded with the judge's score of that turn's kernel (0 when the
reply had no code or broke a rule: `JudgeResult.score` already is). A turn is also credited with
what the turns it led to achieved, discounted (Kevin-32B: gamma 0.4), because a turn whose kernel
failed but whose feedback let the next turn succeed was a useful turn:

    R_t = sum_{i >= t} gamma^(i - t) * s_i

Advantages compare each sample with every other sample of the same task (all turns of all
trajectories of that task form one group): A = R - mean(R), optionally divided by std(R). A group
whose returns are all equal carries no signal and gets zero advantages (never a division by zero).
"""

from __future__ import annotations

import math
from typing import Sequence

__all__ = ["discounted_returns", "group_advantages", "STD_FLOOR"]

STD_FLOOR = 1e-6  # a group whose returns spread less than this counts as all equal


def discounted_returns(scores: Sequence[float], gamma: float) -> list[float]:
    """R_t = sum_{i>=t} gamma^(i-t) * scores[i], for the turns of one trajectory in order.

    >>> [round(r, 3) for r in discounted_returns([0.0, 0.3, 1.3], 0.4)]
    [0.328, 0.82, 1.3]
    """
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"gamma must be in [0, 1], got {gamma}")
    out = [0.0] * len(scores)
    running = 0.0
    for t in range(len(scores) - 1, -1, -1):
        running = float(scores[t]) + gamma * running
        out[t] = running
    return out


def group_advantages(returns: Sequence[float], mode: str = "mean_std") -> list[float]:
    """The advantages of one group (one task's samples): R - mean, divided by the population
    standard deviation in mode "mean_std". Equal returns (or a group of one) give zeros."""
    if mode not in ("mean", "mean_std"):
        raise ValueError(f"advantage mode must be 'mean' or 'mean_std', got {mode!r}")
    if not returns:
        return []
    values = [float(r) for r in returns]
    if any(not math.isfinite(v) for v in values):
        raise ValueError(f"returns must be finite, got {values}")
    mean = math.fsum(values) / len(values)
    centered = [v - mean for v in values]
    std = math.sqrt(math.fsum(c * c for c in centered) / len(values))
    if std < STD_FLOOR:
        return [0.0] * len(values)
    if mode == "mean":
        return centered
    return [c / std for c in centered]
