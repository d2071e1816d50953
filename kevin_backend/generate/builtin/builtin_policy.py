"""The built-in writer as a `Policy`: it reads the task from the conversation like a model would,
writes a kernel, and refines it from the judge's feedback.

    policy = BuiltinPolicy()
    replies = policy.generate(conversations, Sampling())    # one reply per conversation

Trajectories start at different variants (`preferred_order` ranks them for the task's shape), so
a batch explores in parallel. Each later turn reads the trajectory's earlier turns as data (a
`TurnReader`: the variant each reply wrote, in its `Reply.extra`, and the judge's kernel time for
it), keeps the fastest correct one, and tries the untried variant most like it: the same vector
choice first, then the nearest thread count. When every variant has been tried it writes the best
again. Its summary lists every variant measured so far, for whoever reads the conversation.

A task it cannot write (see `planner.plan_task`) gets a reply without code that says why, with
`finish_reason="declined"`, which ends that trajectory.
"""

from __future__ import annotations

import hashlib
import re
from functools import lru_cache
from typing import Sequence

from kevin_backend.generate.builtin.plan import Declined, Plan
from kevin_backend.generate.builtin.planner import plan_task
from kevin_backend.generate.builtin.kernels import VARIANTS_POINTWISE, VARIANTS_ROWS, preferred_order, Variant, write_program
from kevin_backend.generate.policy import EarlierTurn, Message, Reply, Sampling

__all__ = ["BuiltinPolicy", "task_from_messages"]

_BLOCK = re.compile(r"```(?:python|py)?[ \t]*\n(.*?)```", re.S)


def task_from_messages(messages: Sequence[Message]) -> str | None:
    """The task program: the first python block of the first user message that defines Model."""
    for m in messages:
        if m["role"] != "user":
            continue
        for block in _BLOCK.findall(m["content"]):
            if re.search(r"^class Model\b", block, re.M):
                return block
    return None


@lru_cache(maxsize=256)
def _plan(source: str) -> Plan | Declined:
    return plan_task(source)


class BuiltinPolicy:
    name = "builtin"

    def generate(self, conversations: Sequence[Sequence[Message]], sampling: Sampling) -> list[Reply]:
        """First turns: no earlier turn is read from the messages."""
        return self.generate_after(conversations, [()] * len(conversations), sampling)

    def generate_after(self, conversations: Sequence[Sequence[Message]], earlier: Sequence[Sequence[EarlierTurn]],
                       sampling: Sampling) -> list[Reply]:
        return [self._one(list(c), i, _history(e)) for i, (c, e) in enumerate(zip(conversations, earlier, strict=True))]

    def count_tokens(self, text: str) -> int:
        return len(text) // 4

    def _one(self, messages: list[Message], index: int, history: list[tuple[int, float | None]]) -> Reply:
        source = task_from_messages(messages)
        if source is None:
            return Reply("I found no task program (a python block defining Model) in the conversation.",
                         finish_reason="declined")
        plan = _plan(source)
        if isinstance(plan, Declined):
            return Reply(f"The built-in writer does not take this task: {plan.reason}.", finish_reason="declined")
        variants = VARIANTS_ROWS if plan.is_rows else VARIANTS_POINTWISE
        choice, why = _choose(variants, history, index, preferred_order(plan))
        variant = variants[choice]
        digest = hashlib.sha256(source.encode()).hexdigest()[:10]
        kind = "row" if plan.is_rows else "pointwise"
        doc = f"Written by kevin's built-in writer: {kind} kernel, {variant.describe()}, variant {choice}."
        program = write_program(plan, variant, name=f"kevin_builtin_{digest}_{choice}", doc=doc)
        measured = f" Measured so far (variant:ms, x not accepted): {_format_history(history)}." if history else ""
        text = (f"A fused {kind} kernel for {len(plan.ops)} ops ({', '.join(dict.fromkeys(plan.ops))}), {variant.describe()}.\n\n"
                f"```python\n{program}```\n\nSummary: variant {choice} ({variant.describe()}); {why}.{measured}")
        return Reply(text, completion_tokens=len(text) // 4, extra={"variant": choice})


def _format_history(history: list[tuple[int, float | None]]) -> str:
    """Each variant once, with its best time (a variant written again is not a new measurement)."""
    best: dict[int, float | None] = {}
    for v, ms in history:
        if ms is not None and (best.get(v) is None or ms < best[v]):  # type: ignore[operator]
            best[v] = ms
        else:
            best.setdefault(v, None)
    return ", ".join(f"{v}:{ms:.6g}" if ms is not None else f"{v}:x" for v, ms in best.items())


def _history(earlier: Sequence[EarlierTurn]) -> list[tuple[int, float | None]]:
    """(variant, the judge's kernel milliseconds when correct, else None) for each earlier turn
    that wrote a variant of this writer."""
    out: list[tuple[int, float | None]] = []
    for turn in earlier:
        variant = turn.reply.extra.get("variant")
        if not isinstance(variant, int):
            continue
        result = turn.result
        ms = result.timings.kernel_ms if result is not None and result.correct else None
        out.append((variant, ms))
    return out


def _choose(variants: Sequence[Variant], history: list[tuple[int, float | None]], index: int,
            order: Sequence[int] | None = None) -> tuple[int, str]:
    """The next variant. `order` ranks the variants by what usually pays for this task's shape
    (`preferred_order`; default: the list's order, which puts vector loads, then threads and
    items per thread first; for rows, the row in registers): trajectories start at different
    places in it, and untried variants are taken in it; once timings arrive, a knob whose other
    setting was already measured slower than the best is tried last."""
    order = list(order) if order is not None else list(range(len(variants)))
    rank = {v: k for k, v in enumerate(order)}
    if not history:
        start = order[index % len(order)]
        return start, "the plain first kernel" if start == 0 else "a first kernel (another variant than the plain one)"
    timed = [(ms, v) for v, ms in history if ms is not None]
    tried = {v for v, _ in history}
    untried = sorted((i for i in range(len(variants)) if i not in tried), key=lambda i: rank.get(i, len(order) + i))
    if not timed:
        if not untried:
            return history[-1][0], "no variant has been correct"
        return untried[0], f"variant {history[-1][0]} was not accepted; trying another"
    best_ms, best = min(timed)
    if not untried:
        return best, f"every variant tried; keeping the fastest, variant {best} at {best_ms:.4g} ms"
    ref = variants[best]

    def slower_knob(i: int) -> bool:
        v = variants[i]
        for ms, t in timed:
            other = variants[t]
            if ms > best_ms and ((v.vector != ref.vector and other.vector == v.vector) or (v.cache != ref.cache and other.cache == v.cache)):
                return True
        return False

    untried.sort(key=lambda i: (slower_knob(i), rank.get(i, len(order) + i)))
    return untried[0], f"best so far variant {best} at {best_ms:.4g} ms; next, variant {untried[0]}"
