"""What the built-in writer reads from a task, as data: a `Plan` for one of its kernels, or why not.

    plan = plan_task(task_source)        # (planner.py) a Plan, or Declined(reason)

Every value of a plan has a *kind*:

    FULL  varies along a reduced dimension of the iteration space S (its last one when nothing
          is reduced)
    ROW   constant along every reduced dimension: a reduction's result, or an input of size 1
          there

A plan without reductions is a **pointwise** kernel over prod(S) elements. A plan with
reductions is a **row** kernel. Every reduction of a plan reduces the same dimensions R of S
(any of them: the last, a middle one, several, all). A "row" is one position in the kept
dimensions, and its "columns" are the positions in R. The kernel reads each row one pass per
reduction, or once when the row fits in registers, then writes the FULL outputs. Index
reductions (`argmax`, `argmin`, `max.dim`, `min.dim`) carry each value's position in the
row. Cross-entropy's `nll_loss_forward` reads its int64 class targets as a row input: each
row's loss is a *pick*, the log-probability at the target's column, and a `final` reduction
over the rows (mean over the targets not ignored, or sum) makes the scalar.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

import torch

__all__ = ["Kind", "Reduction", "PlanInput", "PlanNode", "PlanOutput", "Plan", "Declined", "DTYPES", "INDEXED", "CENTERED",
           "FinalReduce", "online_partner", "numel"]

DTYPES = {torch.float32: "float", torch.float16: "__half", torch.bfloat16: "__nv_bfloat16", torch.bool: "bool"}


class Kind(str, enum.Enum):
    FULL = "full"
    ROW = "row"


class Reduction(str, enum.Enum):
    SUM = "sum"
    MEAN = "mean"
    AMAX = "amax"
    AMIN = "amin"
    VAR = "var"  # needs the mean first: two passes
    VAR_MEAN = "var_mean"
    STD = "std"  # the square root of VAR
    ARGMAX = "argmax"  # the position of the first largest value (NaN counts as largest)
    ARGMIN = "argmin"
    MAX_DIM = "max_dim"  # (values, indices): AMAX and ARGMAX at once
    MIN_DIM = "min_dim"


# Reductions whose result (or one of whose results) is a position: an int64 value.
INDEXED = (Reduction.ARGMAX, Reduction.ARGMIN, Reduction.MAX_DIM, Reduction.MIN_DIM)
# Reductions that need the row's mean first (two passes, or a mean and squares kept in registers).
CENTERED = (Reduction.VAR, Reduction.VAR_MEAN, Reduction.STD)


@dataclass(frozen=True)
class PlanInput:
    var: str  # C name of the pointer argument
    index: int  # position among the task's inputs
    dtype: torch.dtype
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    kind: Kind
    view: tuple[tuple[int, ...], tuple[int, ...]] | None = None  # read through a view: (shape, strides)

    @property
    def read_shape(self) -> tuple[int, ...]:
        """The shape the kernel reads the input as (its view's, when the task views it first)."""
        return self.view[0] if self.view else self.shape

    @property
    def read_stride(self) -> tuple[int, ...]:
        return self.view[1] if self.view else self.stride


@dataclass(frozen=True)
class PlanNode:
    var: str  # C name of the value
    kind: Kind
    expr: str | None  # the C float expression (pointwise); None for reductions and inputs' loads
    reduction: Reduction | None = None
    operand: str | None = None  # the reduced value's var (reductions)
    correction: float = 0.0  # var / var_mean
    dtype: torch.dtype = torch.float32  # the value's dtype in the graph (rounded to it when half)
    alias_of: str | None = None  # views and getitem: the same value under another node
    pick: tuple[str, str] | None = None  # (FULL value, ROW index): the value at the index's column (ROW)


@dataclass(frozen=True)
class FinalReduce:
    """A reduction over the rows after the row kernel (cross-entropy's mean over the targets):
    the plan's output `loss` is then the per-row value (float32, one per row), and a last launch
    reduces it to the scalar the task returns in its place. The task may also return the count
    of rows whose target is not ignored (nll_loss_forward's total weight, which a training step
    keeps for its backward), a scalar the last launch writes too, returned at `count_at`."""
    op: str  # "mean": the sum over the rows whose target is not `ignore`, over their count; "sum"
    target: str  # the int64 targets' input var
    ignore: int  # the ignored class index
    dtype: torch.dtype  # the scalar's dtype (and the count's)
    loss: int = 0  # the per-row loss's index in the plan's outputs
    count_at: int | None = None  # the count's index among the returned tensors; None: not returned


@dataclass(frozen=True)
class PlanOutput:
    var: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    kind: Kind


@dataclass(frozen=True)
class Plan:
    inputs: tuple[PlanInput, ...]
    nodes: tuple[PlanNode, ...]  # topological order
    outputs: tuple[PlanOutput, ...]
    shape: tuple[int, ...]  # the iteration space S
    ops: tuple[str, ...]  # every aten op of the graph once, in graph order (views too; tuple items are none), for reports
    reduced: tuple[int, ...] = ()  # R: the dimensions of S every reduction reduces (sorted); () = the last one
    final: FinalReduce | None = None  # a reduction over the rows after the row kernel (cross-entropy)

    @property
    def picks(self) -> tuple[PlanNode, ...]:
        return tuple(n for n in self.nodes if n.pick is not None)

    @property
    def reductions(self) -> tuple[PlanNode, ...]:
        return tuple(n for n in self.nodes if n.reduction is not None)

    @property
    def is_rows(self) -> bool:
        return bool(self.reductions)

    @property
    def reduced_dims(self) -> tuple[int, ...]:
        return self.reduced or ((len(self.shape) - 1,) if self.shape else ())

    @property
    def kept_dims(self) -> tuple[int, ...]:
        return tuple(d for d in range(len(self.shape)) if d not in self.reduced_dims)

    @property
    def over_last(self) -> bool:
        """Whether the row is the last dimension of S (a row is contiguous in a contiguous S)."""
        return self.reduced_dims == ((len(self.shape) - 1,) if self.shape else ())

    @property
    def cols(self) -> int:
        return numel(tuple(self.shape[d] for d in self.reduced_dims)) if self.shape else 1

    @property
    def rows(self) -> int:
        return numel(tuple(self.shape[d] for d in self.kept_dims))

    @property
    def numel(self) -> int:
        return self.rows * self.cols


@dataclass(frozen=True)
class Declined:
    reason: str

    def __bool__(self) -> bool:
        return False


def numel(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def online_partner(plan: Plan, red: PlanNode) -> PlanNode | None:
    """The sum a max reduction can share one read of the row with (online softmax): the next
    reduction, a SUM of exp(a - m) where m is this max of a. None otherwise."""
    if red.reduction is not Reduction.AMAX or red.operand is None:
        return None
    reductions = list(plan.reductions)
    at = reductions.index(red)
    if at + 1 >= len(reductions) or reductions[at + 1].reduction is not Reduction.SUM:
        return None
    partner = reductions[at + 1]
    by_var = {n.var: n for n in plan.nodes}
    exp = by_var.get(partner.operand or "")
    found = re.fullmatch(r"expf\((v\d+)\)", exp.expr or "") if exp is not None and exp.alias_of is None else None
    diff = by_var.get(found.group(1)) if found else None
    if diff is None or diff.alias_of is not None or diff.expr != f"{red.operand} - {red.var}":
        return None
    return partner
