"""The final reduction: cross-entropy's mean (or sum) over the rows, after the rows kernel wrote
each row's loss into a workspace (`rowvals`): one block of 1024 threads, a fixed order, so the
scalar is the same from run to run (cuda/final_reduction.cuh). Where the task also returns the
count of targets not ignored (a training step's total weight), the same launch stores it.

    writer = FinalReductionWriter(plan)
    writer.kernel(), writer.launch()
"""

from __future__ import annotations

from kevin_backend.generate.builtin.codegen import C_TYPES, cuda_code
from kevin_backend.generate.builtin.plan import FinalReduce, Plan

__all__ = ["FinalReductionWriter", "returned_order", "final_names"]


def returned_order(plan: Plan) -> list[int]:
    """The program's returned tensors as indices of the plan's outputs, in order: -1 is a final
    reduction's count (its loss stands where the per-row loss is in the outputs)."""
    order = list(range(len(plan.outputs)))
    if plan.final is not None and plan.final.count_at is not None:
        order.insert(plan.final.count_at, -1)
    return order


def final_names(plan: Plan) -> tuple[str, str | None]:
    """The returned tensors a final reduction writes: its scalar, and the count's (or None)."""
    assert plan.final is not None
    order = returned_order(plan)
    return f"out{order.index(plan.final.loss)}", f"out{order.index(-1)}" if -1 in order else None


class FinalReductionWriter:
    """`kevin_final` for a plan with a final reduction, and its launch in the host function."""

    def __init__(self, plan: Plan) -> None:
        assert plan.final is not None
        self.plan, self.final = plan, plan.final

    def kernel(self) -> str:
        """Their sum, over the count of rows whose target is not ignored for a mean (NaN when
        every target is, as PyTorch's); that count also stored where the task returns it."""
        final: FinalReduce = self.final
        target = next(i for i in self.plan.inputs if i.var == final.target)
        stride = target.read_stride[0]
        returned = final.count_at is not None
        count = f"cnt += (p_t[r * {stride}LL] != {final.ignore}LL) ? 1.0f : 0.0f;" if final.op == "mean" or returned else ""
        return cuda_code("final_reduction.cuh", ctype=C_TYPES[final.dtype], rows=self.plan.rows, count=count,
                         result="acc / cnt" if final.op == "mean" else "acc",
                         count_param=f", {C_TYPES[final.dtype]}* __restrict__ p_cnt" if returned else "",
                         store_count=" kevin_st(p_cnt, 0, cnt);" if returned else "")

    def launch(self) -> str:
        """The host function's launch of `kevin_final`, after the rows kernel's."""
        result, count = final_names(self.plan)
        ctype = C_TYPES[self.final.dtype]
        count_ptr = f", reinterpret_cast<{ctype}*>({count}.data_ptr())" if count else ""
        return (f"\n    kevin_final<<<(unsigned)1, 1024, 0, stream>>>(reinterpret_cast<const float*>(rowvals.data_ptr()), "
                f"reinterpret_cast<const int64_t*>({self.final.target}.data_ptr()), "
                f"reinterpret_cast<{ctype}*>({result}.data_ptr()){count_ptr});")
