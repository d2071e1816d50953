"""Where a plan's 16-bit values are rounded: only where stored, explicitly cast, or where a rounding
can change a discrete outcome (`relax_rounding`).

    plan = relax_rounding(plan)     # what every kernel family writes
"""

from __future__ import annotations

import dataclasses
import re
from typing import Sequence

import torch

from kevin_backend.generate.builtin.codegen import ROUNDING, VALUE_NAME
from kevin_backend.generate.builtin.plan import INDEXED, Plan

__all__ = ["relax_rounding"]


# Ops whose result jumps where its operand crosses a value (comparisons, where's condition, floor,
# ceil, round, trunc, sign, isnan, xlogy's test of 0, fmod): an operand computed without eager's
# rounding may land on the other side of the jump, so it keeps every rounding eager makes.
_JUMPS = re.compile(r"[<>=!]=|[<>?]|\b(?:floorf|ceilf|truncf|rintf|fmodf|kevin_sign|kevin_isnan|kevin_isinf|kevin_xlogy)\b")


def relax_rounding(plan: Plan) -> Plan:
    """The plan with its 16-bit pointwise values kept in float within the kernel, as Inductor's
    generated code keeps them, rounded only where stored (and where an explicit cast rounds).
    Eager rounds each op's result; the judge's bound is against the float64 result and eager's own
    distance from it, which one rounding at the end never exceeds, and the roundings cost a
    conversion each (a SiLU-add-sigmoid over bf16 on the H200 spent more time converting than
    reading). Values whose rounding can change a discrete outcome keep it, and so do all the values
    they are computed from: operands of comparisons and the like (`_JUMPS`) and of index reductions
    (argmax of rounded values picks the first of a tie that unrounded values would break)."""
    starts: list[str] = []
    for n in plan.nodes:
        if n.reduction in INDEXED and n.operand:
            starts.append(n.operand)
        elif n.expr and n.reduction is None and _JUMPS.search(n.expr):
            starts.extend(VALUE_NAME.findall(n.expr))
    # through reductions too: a reduced value compared (x == x.amax(...)) rounds what it reduces
    keep = _upstream(plan, starts)
    relaxed = tuple(dataclasses.replace(n, dtype=torch.float32)
                    if n.dtype in ROUNDING and n.reduction is None and n.alias_of is None and n.pick is None and n.var not in keep
                    else n for n in plan.nodes)
    return dataclasses.replace(plan, nodes=relaxed)


def _upstream(plan: Plan, starts: Sequence[str]) -> set[str]:
    """The plan's values `starts` and every value they are computed from, through reductions'
    operands too."""
    by_var = {n.var: n for n in plan.nodes}
    found: set[str] = set()
    stack = list(starts)
    while stack:
        v = stack.pop()
        node = by_var.get(v)
        if node is None or v in found:
            continue
        found.add(v)
        if node.reduction is None:
            stack.extend(VALUE_NAME.findall(node.alias_of or node.expr or ""))
        elif node.operand:
            stack.append(node.operand)
    return found
