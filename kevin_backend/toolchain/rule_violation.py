"""One static rule broken: the rule's id, where in the program, and what was found."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["RuleViolation"]


@dataclass(frozen=True)
class RuleViolation:
    """One static rule broken, where, and why the rule exists."""

    rule: str  # short id, e.g. "no-try-except"
    where: str  # "python:12" or "cuda:30" (source and line) or "" when global
    message: str

    def __str__(self) -> str:
        at = f" ({self.where})" if self.where else ""
        return f"[{self.rule}]{at} {self.message}"

    def as_dict(self) -> dict[str, Any]:
        return {"rule": self.rule, "where": self.where, "message": self.message}
