"""The built-in writer as a `Policy`: it reads the task from the conversation like a model would,
writes a kernel, and refines it from the judge's feedback.

    policy = BuiltinPolicy()
    replies = policy.generate(conversations, Sampling())    # one reply per conversation

Trajectories start at different variants (`preferred_order` ranks them for the task's shape), so
a batch explores in parallel. Each later turn reads the trajectory's earlier turns as data (a
`TurnReader`: the variant each reply wrote, by name, in its `Reply.extra["variant"]`, and the
judge's kernel time for it), keeps the fastest correct one, and tries the untried variant most
like it: the same vector choice first, then the nearest thread count. When every variant has been
tried it writes the best again. Its summary lists every variant measured so far, for whoever
reads the conversation, by number (the variant's position in its list, as its program's docstring
and kernel name carry it).

A task that is one matmul with its epilogue, a chain of them, or one with a reduction after it or
ops computing its left operand, or a convolution with its epilogue (`gemm_plan.plan_gemm`), where
its CUTLASS GEMM runs (`builtin_support.gemm_available`), gets that kernel, its tilings searched the same way
(`gemm_plan.gemm_turn`; a convolution of few input channels: its direct kernel's variants first,
`direct_conv.py`; a float32 one's implicit GEMM declined where the task message says cuDNN
computes float32 convolutions in TF32: `prompts.numerics_in`; a float32 GEMM's TF32 tilings
tried where it says cuBLAS computes float32 matmuls in TF32). A task it cannot write (see
`planner.plan_task`) gets a reply without
code that says why, with `finish_reason="declined"`, which ends that trajectory.

It is `Foreseeing`: while a turn is judged, `foresee` says the programs each trajectory would write
next whatever the verdict (the turn's variant rejected, or the fastest yet), so the search has them
built in the background and the next turn finds its build done. For a GEMM, whose builds take a
minute, that is every tiling the trajectory has not tried (`gemm_plan.gemm_ahead`), from the
first turn on: they build side by side while the first is judged.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from functools import lru_cache
from typing import Callable, Sequence

from kevin_backend.generate.builtin.builtin_support import direct_available, gemm_available
from kevin_backend.generate.builtin.gemm_plan import GEMM_PLANS, AnyGemm, DirectConv, GemmChain, GemmHead, GemmTail, gemm_ahead, gemm_turn, plan_gemm
from kevin_backend.generate.builtin.plan import Declined, Plan
from kevin_backend.generate.builtin.planner import plan_task
from kevin_backend.generate.builtin.program import write_program
from kevin_backend.generate.builtin.variant_ranking import PLAIN, preferred_order
from kevin_backend.generate.builtin.variants import Variant, variant_number, variants_for
from kevin_backend.generate.policy import EarlierTurn, Message, Reply, Sampling
from kevin_backend.generate.prompts import numerics_in

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

    def _one(self, messages: list[Message], index: int, history: list[tuple[str, float | None]]) -> Reply:
        source = task_from_messages(messages)
        if source is None:
            return Reply("I found no task program (a python block defining Model) in the conversation.",
                         finish_reason="declined")
        plan = _plan(source)
        if isinstance(plan, Declined):
            gemm = _gemm_here(source, _tf32(messages))
            if isinstance(gemm, GEMM_PLANS):
                return _gemm_reply(source, gemm, index, history)
            why = plan.reason + (f"; as a GEMM: {gemm.reason}" if isinstance(gemm, Declined) else "")
            return Reply(f"The built-in writer does not take this task: {why}.", finish_reason="declined")
        variants = {v.name: v for v in variants_for(plan)}
        history = [(name, ms) for name, ms in history if name in variants]  # (this writer's variants of this family)

        def number(name: str) -> int:  # the number the texts carry
            return variant_number(plan, name)

        choice, why = _choose(variants, history, index, preferred_order(plan), number)
        variant = variants[choice]
        kind = "row" if plan.is_rows else "pointwise"
        program = _program(source, plan, variant, number(choice))
        measured = f" Measured so far (variant:ms, x not accepted): {_format_history(history, number)}." if history else ""
        text = (f"A fused {kind} kernel for {len(plan.ops)} ops ({', '.join(dict.fromkeys(plan.ops))}), {variant.describe()}.\n\n"
                f"```python\n{program}```\n\nSummary: variant {number(choice)} ({variant.describe()}); {why}.{measured}")
        return Reply(text, completion_tokens=len(text) // 4, extra={"variant": choice})


    def foresee(self, conversations: Sequence[Sequence[Message]], earlier: Sequence[Sequence[EarlierTurn]],
                turns_left: int | None = None) -> list[str]:
        """The programs each trajectory writes next if this turn's variant (the last of `earlier[i]`,
        its verdict unknown) is rejected, if it is the fastest so far, and if it is correct but
        slower than the fastest: the next turn's program is one of them whatever the judge says.
        A GEMM's: every tiling the `turns_left` next turns can reach (`gemm_ahead`)."""
        programs: list[str] = []
        if turns_left is not None and turns_left < 1:
            return programs
        for index, (messages, turns) in enumerate(zip(conversations, earlier, strict=True)):
            source = task_from_messages(list(messages))
            plan = _plan(source) if source is not None else None
            gemm = _gemm_here(source, _tf32(messages)) if isinstance(plan, Declined) else None  # type: ignore[arg-type]
            if gemm is not None:  # (a GEMM: every tiling not tried yet)
                if isinstance(gemm, GEMM_PLANS):
                    # (before its first turn: that turn's program, as `generate` writes it)
                    later = gemm_ahead(source, gemm, _history(turns), index, turns_left) if turns else [gemm_turn(source, gemm, index, [])[1]]  # type: ignore[arg-type]
                    programs += [p for p in later if p not in programs]
                continue
            if plan is None or isinstance(plan, Declined) or not turns:
                continue
            variants = {v.name: v for v in variants_for(plan)}
            past = [(name, ms) for name, ms in _history(turns[:-1]) if name in variants]
            current = turns[-1].reply.extra.get("variant")
            if current not in variants:
                continue
            timed = [ms for _, ms in past if ms is not None]
            outcomes = [None, min(timed, default=1.0) / 2] + ([min(timed) * 2] if timed else [])

            def number(name: str) -> int:
                return variant_number(plan, name)

            for ms in outcomes:
                choice, _ = _choose(variants, [*past, (current, ms)], index, preferred_order(plan), number)
                program = _program(source, plan, variants[choice], number(choice))  # type: ignore[arg-type]
                if program not in programs:
                    programs.append(program)
        return programs


@lru_cache(maxsize=256)
def _gemm_plan(source: str, tf32: tuple[bool, bool]) -> AnyGemm | Declined:
    return plan_gemm(source, conv_tf32=tf32[0], matmul_tf32=tf32[1])


def _tf32(messages: Sequence[Message]) -> tuple[bool, bool]:
    """Whether the task's message says cuDNN computes float32 convolutions in TF32, and cuBLAS
    float32 matmuls (its key's `cudnn_tf32` and `matmul_tf32`; one it does not state: no)."""
    said = numerics_in(messages)
    return said.get("cudnn_tf32", False), said.get("matmul_tf32", False)


def _gemm_here(source: str, tf32: tuple[bool, bool]) -> AnyGemm | Declined | None:
    """The GEMM writer's plan of `source` where its kernels run here (`tf32`: `plan_gemm`'s
    `conv_tf32` and `matmul_tf32`):
    any with CUTLASS's headers (`gemm_available`); without them, a direct convolution alone (its
    implicit GEMM's variants dropped: `direct_available`); else None."""
    if gemm_available():
        return _gemm_plan(source, tf32)
    if direct_available():
        plan = _gemm_plan(source, tf32)
        if isinstance(plan, DirectConv):
            return dataclasses.replace(plan, fallback=None)
    return None


def _gemm_reply(source: str, plan: AnyGemm, index: int, history: list[tuple[str, float | None]]) -> Reply:
    choice, program, why = gemm_turn(source, plan, index, history)
    measured = [f"{name}: {'x' if ms is None else f'{ms:.4f}'}" for name, ms in history]
    what = ("A direct convolution with its whole epilogue in one kernel" if isinstance(plan, DirectConv) else
            "A chain of CUTLASS GEMMs" if isinstance(plan, GemmChain) else
            "A CUTLASS GEMM with its epilogue and my own kernels around it" if isinstance(plan, (GemmTail, GemmHead)) else
            "A CUTLASS GEMM with its epilogue")
    text = (f"{what} ({plan.describe()}), {choice}.\n\n```python\n{program}```\n\n"
            f"Summary: {choice}; {why}." + (f" Measured so far (ms, x not accepted): {'; '.join(measured)}." if measured else ""))
    return Reply(text, completion_tokens=len(text) // 4, extra={"variant": choice})


def _program(source: str, plan: Plan, variant: Variant, number: int) -> str:
    """The program the writer replies with for `variant` of `source`'s plan (the same text every
    time: a build made ahead of its turn is the one the turn finds)."""
    digest = hashlib.sha256(source.encode()).hexdigest()[:10]
    kind = "row" if plan.is_rows else "pointwise"
    doc = f"Written by kevin's built-in writer: {kind} kernel, {variant.describe()}, variant {number}."
    return write_program(plan, variant, name=f"kevin_builtin_{digest}_{number}", doc=doc)


def _format_history(history: list[tuple[str, float | None]], number: Callable[[str], int]) -> str:
    """Each variant once, by number, with its best time (a variant written again is not a new
    measurement)."""
    best: dict[str, float | None] = {}
    for v, ms in history:
        if ms is not None and (best.get(v) is None or ms < best[v]):  # type: ignore[operator]
            best[v] = ms
        else:
            best.setdefault(v, None)
    return ", ".join(f"{number(v)}:{ms:.6g}" if ms is not None else f"{number(v)}:x" for v, ms in best.items())


def _history(earlier: Sequence[EarlierTurn]) -> list[tuple[str, float | None]]:
    """(variant name, the judge's kernel milliseconds when correct, else None) for each earlier
    turn that wrote a variant of this writer."""
    out: list[tuple[str, float | None]] = []
    for turn in earlier:
        variant = turn.reply.extra.get("variant")
        if not isinstance(variant, str):
            continue
        result = turn.result
        ms = result.timings.kernel_ms if result is not None and result.correct else None
        out.append((variant, ms))
    return out


def _choose(variants: dict[str, Variant], history: list[tuple[str, float | None]], index: int, order: Sequence[str],
            number: Callable[[str], int]) -> tuple[str, str]:
    """The next variant's name. `order` ranks the variants by what usually pays for this task's
    shape (`preferred_order`): trajectories start at different places in it, and untried variants
    are taken in it; once timings arrive, a knob whose other setting was already measured slower
    than the best is tried last. (`number`: a variant's number, for the reasons' text and to break
    ties between equal times, as the list's order does.)"""
    order = list(order)
    rank = {v: k for k, v in enumerate(order)}
    if not history:
        start = order[index % len(order)]
        return start, "the plain first kernel" if start == PLAIN else "a first kernel (another variant than the plain one)"
    timed = [(ms, number(v), v) for v, ms in history if ms is not None]
    tried = {v for v, _ in history}
    untried = sorted((v for v in variants if v not in tried), key=lambda v: rank.get(v, len(order) + number(v)))
    if not timed:
        if not untried:
            return history[-1][0], "no variant has been correct"
        return untried[0], f"variant {number(history[-1][0])} was not accepted; trying another"
    best_ms, _, best = min(timed)
    if not untried:
        return best, f"every variant tried; keeping the fastest, variant {number(best)} at {best_ms:.4g} ms"
    ref = variants[best]

    def slower_knob(name: str) -> bool:
        v = variants[name]
        for ms, _, t in timed:
            other = variants[t]
            if ms > best_ms and ((v.vector != ref.vector and other.vector == v.vector) or (v.cache != ref.cache and other.cache == v.cache)):
                return True
        return False

    untried.sort(key=lambda v: (slower_knob(v), rank.get(v, len(order) + number(v))))
    return untried[0], f"best so far variant {number(best)} at {best_ms:.4g} ms; next, variant {number(untried[0])}"
