"""The base the built-in writer's kernel families share: emitting a kernel's lines, the C names and
types of a plan's values, the code of its pointwise nodes, the offsets of a rows plan's tensors,
and the fixed device code read from the `.cuh` templates beside this file.

    code = cuda_code("row_reduce.cuh", op="add", ...)    # a template with its holes filled
    writer = KernelWriter(plan)                         # a family's writer extends it

Every value is computed in float (ops.py); a value's C name is its plan var (`v3`, `v1_0`, an
input's `in0`), its pointer `p_<var>`, an output's `p_out<k>`.
"""

from __future__ import annotations

import re
import string
from functools import lru_cache
from pathlib import Path
from typing import Callable, Sequence

import torch

from kevin_backend.generate.builtin.index_math import contiguous_strides, layout_in_space, row_col_offsets
from kevin_backend.generate.builtin.plan import Kind, Plan, PlanNode

__all__ = ["C_TYPES", "TORCH_DTYPES", "VECTOR_DTYPES", "ROUNDING", "COMPENSATE_AFTER", "VALUE_NAME", "cuda_code", "indented",
           "node_code", "closure", "references", "row_values", "narrow_indices", "RowOffsets", "KernelWriter"]

C_TYPES = {torch.float32: "float", torch.float16: "__half", torch.bfloat16: "__nv_bfloat16", torch.bool: "bool", torch.int64: "int64_t"}
TORCH_DTYPES = {torch.float32: "torch::kFloat32", torch.float16: "torch::kFloat16", torch.bfloat16: "torch::kBFloat16",
                torch.int64: "torch::kInt64"}
# Types a vector access reads and writes (16 bytes: 4 floats, 8 halves).
VECTOR_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
# The rounding of a 16-bit value (device_helpers.cuh).
ROUNDING = {torch.float16: "kevin_round_half", torch.bfloat16: "kevin_round_bf16"}
# Values one thread adds in a row beyond which its sum is compensated (Kahan).
COMPENSATE_AFTER = 2048

# A name in a node's code: a value (v3, v1_0) or an input (in0).
VALUE_NAME = re.compile(r"\b(v\d+(?:_\d+|_pick)?|in\d+)\b")

_TEMPLATES = Path(__file__).parent / "cuda"


@lru_cache(maxsize=None)
def _template(name: str) -> string.Template:
    """A `.cuh` template, its leading notes (lines starting `//:`) dropped: programs get the code."""
    lines = (_TEMPLATES / name).read_text().splitlines(keepends=True)
    while lines and lines[0].startswith("//:"):
        lines.pop(0)
    return string.Template("".join(lines))


def cuda_code(name: str, **holes: object) -> str:
    """The device code of template `name` with its named holes (`${op}`) filled, after a blank line
    (each piece of a program's device code starts on a line of its own)."""
    return "\n" + _template(name).substitute(holes)


def indented(lines: Sequence[str], depth: int) -> str:
    """`lines` as one text, each line after the first starting `depth` spaces in (the first sits
    where the caller's text puts it)."""
    return ("\n" + " " * depth).join(lines)


def node_code(node: PlanNode) -> str:
    """A pointwise node's C statement: its value in float, rounded to its 16-bit dtype (a view, the
    value it aliases)."""
    if node.alias_of is not None:
        return f"{'int64_t' if node.dtype is torch.int64 else 'float'} {node.var} = {node.alias_of};"
    assert node.expr is not None
    rounding = ROUNDING.get(node.dtype)
    expr = f"{rounding}({node.expr})" if rounding and not node.expr.startswith(f"{rounding}(") else node.expr
    return f"float {node.var} = {expr};"


def closure(plan: Plan, targets: list[str], available: set[str]) -> list[PlanNode]:
    """The pointwise nodes needed for `targets`, in order, skipping values in `available`."""
    by_var = {n.var: n for n in plan.nodes}
    needed: set[str] = set()
    stack = list(targets)
    while stack:
        v = stack.pop()
        if v in needed or v in available or v not in by_var:
            continue
        node = by_var[v]
        if node.reduction is not None:
            continue
        needed.add(v)
        stack.extend(VALUE_NAME.findall(node.alias_of or node.expr or ""))
    return [n for n in plan.nodes if n.var in needed]


def references(nodes: Sequence[PlanNode], extra: Sequence[str] = ()) -> set[str]:
    """The values and inputs that `nodes` (their code, or the value they reduce) and the `extra`
    expressions read."""
    used: set[str] = set()
    for text in [*(n.alias_of or n.expr or n.operand or "" for n in nodes), *extra]:
        used.update(VALUE_NAME.findall(text))
    return used


def row_values(plan: Plan, available: set[str], pick: Callable[[PlanNode], list[str]] | None = None) -> list[str]:
    """The code of the ROW pointwise values whose operands are all `available` (added to it), each
    once per row, in an order that computes every operand first. With `pick`, a pick node's code
    (`pick(node)`) once every reduction is known."""
    out: list[str] = []
    progress = True
    while progress:
        progress = False
        for n in plan.nodes:
            if (pick is not None and n.pick is not None and n.var not in available
                    and all(r.var in available for r in plan.reductions)):
                out.extend(pick(n))
                available.add(n.var)
                progress = True
            elif n.kind is Kind.ROW and n.reduction is None and n.pick is None and n.var not in available:
                if all(r in available for r in VALUE_NAME.findall(n.alias_of or n.expr or "")):
                    out.append(node_code(n))
                    available.add(n.var)
                    progress = True
    return out


def narrow_indices(plan: Plan, kernel: str) -> str:
    """The kernel with 32-bit index math (a 64-bit division or product costs several 32-bit
    ones) when every index stays far below 2^31: the elements (with a grid's stride on top)
    and each input's offsets."""
    limit = 1 << 30
    if plan.numel < limit and all(sum((n - 1) * abs(st) for n, st in zip(i.read_shape, i.read_stride)) < limit
                                  for i in plan.inputs):
        kernel = re.sub(r"\b(\d+)LL\b", r"\1", re.sub(r"\blong long\b", "int", kernel))
    return kernel


class RowOffsets:
    """Every tensor's offset in a rows kernel, split into a row part (its position in the kept
    dimensions: computed once per row, divisions included, as `<var>_ro`) and a column part (per
    element: a multiplication, or a division per reduced dimension that does not merge with its
    neighbour), so a strided or broadcast input costs no division per element where its reduced
    dimensions merge. The output's, `out`, is the contiguous layout of the iteration space."""

    def __init__(self, plan: Plan, output: bool) -> None:
        self.parts: dict[str, tuple[str, str]] = {i.var: row_col_offsets(layout_in_space(i, plan.shape), plan) for i in plan.inputs}
        if output:
            self.parts["out"] = row_col_offsets(contiguous_strides(plan.shape), plan)

    def declarations(self) -> list[str]:
        """The row parts, computed once per row."""
        return [f"const long long {var}_ro = {row_part};" for var, (row_part, _) in self.parts.items() if row_part != "0"]

    def at(self, var: str, col: str = "c") -> str:
        """C expression: the offset of `var`'s element at column `col` of the row."""
        row_part, part = self.parts[var]
        part = re.sub(r"\bc\b", col, part)
        if row_part == "0":
            return part
        return f"{var}_ro + {part}" if part != "0" else f"{var}_ro"


class KernelWriter:
    """The base of a kernel family's writer: the plan (its 16-bit values already relaxed), the
    kernel body's lines in the order they run, and the parameters every kernel takes."""

    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self.lines: list[str] = []

    def emit(self, *lines: str) -> None:
        self.lines.extend(lines)

    def parameters(self) -> tuple[str, str]:
        """(the inputs' pointer parameters, the outputs'), each a C parameter list."""
        plan = self.plan
        ins = ", ".join(f"const {C_TYPES[i.dtype]}* __restrict__ p_{i.var}" for i in plan.inputs)
        outs = ", ".join(f"{C_TYPES[o.dtype]}* __restrict__ p_out{k}" for k, o in enumerate(plan.outputs))
        return ins, outs

    def narrow(self, kernel: str) -> str:
        return narrow_indices(self.plan, kernel)
