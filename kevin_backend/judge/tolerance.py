"""How close is close enough, by dtype (KernelBench's: 1e-4 for float32, 1e-2 for half types),
on both absolute and relative error. One table for the judge and the backend's smoke runs."""

from __future__ import annotations

import torch

__all__ = ["tolerance"]

_TOLERANCE = {torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 1e-2, torch.float64: 1e-6}


def tolerance(dtype: torch.dtype) -> float:
    return _TOLERANCE.get(dtype, 1e-4)
