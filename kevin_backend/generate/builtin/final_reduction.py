"""The final reduction: cross-entropy's mean (or sum) over the rows, after the rows kernel wrote
each row's loss into a workspace (`rowvals`): one block of 1024 threads, a fixed order, so the
scalar is the same from run to run (cuda/final_reduction.cuh).

    writer = FinalReductionWriter(plan)
    writer.kernel(), writer.launch()
"""

from __future__ import annotations

from kevin_backend.generate.builtin.codegen import C_TYPES, cuda_code
from kevin_backend.generate.builtin.plan import FinalReduce, Plan

__all__ = ["FinalReductionWriter"]


class FinalReductionWriter:
    """`kevin_final` for a plan with a final reduction, and its launch in the host function."""

    def __init__(self, plan: Plan) -> None:
        assert plan.final is not None
        self.plan, self.final = plan, plan.final

    def kernel(self) -> str:
        """Their sum, over the count of rows whose target is not ignored for a mean (NaN when
        every target is, as PyTorch's)."""
        final: FinalReduce = self.final
        target = next(i for i in self.plan.inputs if i.var == final.target)
        stride = target.read_stride[0]
        count = f"cnt += (p_t[r * {stride}LL] != {final.ignore}LL) ? 1.0f : 0.0f;" if final.op == "mean" else ""
        return cuda_code("final_reduction.cuh", ctype=C_TYPES[final.dtype], rows=self.plan.rows, count=count,
                         result="acc / cnt" if final.op == "mean" else "acc")

    def launch(self) -> str:
        """The host function's launch of `kevin_final`, after the rows kernel's."""
        return (f"\n    kevin_final<<<(unsigned)1, 1024, 0, stream>>>(reinterpret_cast<const float*>(rowvals.data_ptr()), "
                f"reinterpret_cast<const int64_t*>({self.final.target}.data_ptr()), "
                f"reinterpret_cast<{C_TYPES[self.final.dtype]}*>(out0.data_ptr()));")
