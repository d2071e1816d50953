"""A stand-in judge for runs without a GPU: it rewards replies for containing a target string.

The real judge needs a GPU to build and time a kernel; the training loop around it does not.
`TargetStringJudge` answers like the real one (a `JudgeResult` whose score is the Kevin score,
0.3 * correct + speedup * correct), but decides from the text alone: a candidate with no
occurrence of `target` is "wrong" (score 0); each occurrence adds `per_hit` to its "speedup"
(capped). A tiny random model can learn to write the target more often within a few dozen
steps, which is what the CPU test of `kevin train` checks.

The engine judges only code it finds in a ```python block, and a tiny model writes none:
`FencedPolicy` hands the engine each reply wrapped in such a block (the tokens trained on stay
the model's own: the sample is built from the recorded completion ids, not from this text).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Sequence

from kevin_backend.generate.policy import Message, Policy, Reply, Sampling
from kevin_backend.judge.result import JudgeResult, JudgeTimings, Mismatch, Reason, Stage

__all__ = ["TargetStringJudge", "FencedPolicy"]


@dataclass(frozen=True)
class TargetStringJudge:
    target: str
    per_hit: float = 0.5
    max_speedup: float = 5.0
    eager_ms: float = 1.0

    def __post_init__(self) -> None:
        if not self.target:
            raise ValueError("the synthetic judge needs a non-empty target string")

    def judge(self, task_source: str, candidate_source: str) -> JudgeResult:
        hits = candidate_source.count(self.target)
        if hits == 0:
            miss = Mismatch(output=0, max_abs_error=1.0, max_rel_error=1.0, bad_elements=1, total_elements=1,
                            first_bad_index=(0,), expected=1.0, got=0.0, trial=0)
            return JudgeResult(Stage.CORRECTNESS, Reason.MISMATCH, feedback=f"no {self.target!r} in the reply",
                               mismatch=miss)
        speedup = min(self.max_speedup, self.per_hit * hits)
        timings = JudgeTimings(kernel_ms=self.eager_ms / speedup, eager_ms=self.eager_ms,
                               inductor_ms=self.eager_ms, trials=1)
        return JudgeResult(Stage.TIMING, Reason.ACCEPTED, timings=timings)


class FencedPolicy:
    """`policy` with each reply's text wrapped in a ```python block (see the module doc)."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self.name = f"{policy.name}+fenced"

    def generate(self, conversations: Sequence[Sequence[Message]], sampling: Sampling) -> list[Reply]:
        replies = self.policy.generate(conversations, sampling)
        return [dataclasses.replace(r, text=f"```python\n{r.text}\n```") if r.ok else r for r in replies]

    def __getattr__(self, name: str) -> Any:  # count_tokens, render, ... of the wrapped policy
        if name == "policy":
            raise AttributeError(name)
        return getattr(self.policy, name)
