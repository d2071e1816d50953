"""The host/device split's one error: the source needs the whole build."""

from __future__ import annotations

__all__ = ["SplitError"]


class SplitError(ValueError):
    """The source needs the whole build (the message says what stopped the split)."""
