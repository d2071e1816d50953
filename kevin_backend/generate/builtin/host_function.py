"""The host function of a built-in program, `kevin_run`: every input's sizes and strides checked
(a kernel never runs on inputs it was not written for), the outputs allocated, the kernels
launched on the current stream, one launch per kernel (split-build friendly).

    host = HostWriter(plan, variant, vectorizable).text()
"""

from __future__ import annotations

import torch

from kevin_backend.generate.builtin.codegen import C_TYPES, TORCH_DTYPES
from kevin_backend.generate.builtin.final_reduction import FinalReductionWriter, returned_order
from kevin_backend.generate.builtin.plan import Kind, Plan
from kevin_backend.generate.builtin.variant_fit import pointwise_width
from kevin_backend.generate.builtin.variants import Variant

__all__ = ["HostWriter", "aligned_pointers", "launch_args", "returned", "output_names"]


def output_names(plan: Plan) -> list[str]:
    """The host function's tensor for each of the plan's outputs: `out{j}`, the j-th returned
    (a final reduction's per-row values go into the workspace `rowvals` instead)."""
    order = returned_order(plan)
    return ["rowvals" if plan.final is not None and k == plan.final.loss else f"out{order.index(k)}"
            for k in range(len(plan.outputs))]


def launch_args(plan: Plan) -> str:
    """A kernel's arguments in the host function: the inputs' and outputs' pointers (a plan with
    a final reduction writes its per-row values into the workspace `rowvals`)."""
    return ", ".join([*(f"reinterpret_cast<const {C_TYPES[i.dtype]}*>({i.var}.data_ptr())" for i in plan.inputs),
                      *(f"reinterpret_cast<{C_TYPES[o.dtype]}*>({name}.data_ptr())" for name, o in zip(output_names(plan), plan.outputs))])


def aligned_pointers(plan: Plan, nbytes: int) -> str:
    """C condition: every input's and output's data `nbytes`-aligned (a rows plan's per-element
    operands only: its per-row values are read one at a time)."""
    return " && ".join([*(f"reinterpret_cast<uintptr_t>({i.var}.data_ptr()) % {nbytes} == 0" for i in plan.inputs
                          if not plan.is_rows or i.kind is Kind.FULL),
                        *(f"reinterpret_cast<uintptr_t>({name}.data_ptr()) % {nbytes} == 0" for name, o in zip(output_names(plan), plan.outputs)
                          if not plan.is_rows or o.kind is Kind.FULL)])


def returned(plan: Plan) -> list[tuple[tuple[int, ...], torch.dtype]]:
    """(shape, dtype) of each tensor the program returns, in order: the plan's outputs, a final
    reduction's scalar in its per-row values' place, and its count where the task returns it."""
    final = plan.final
    if final is None:
        return [(o.shape, o.dtype) for o in plan.outputs]
    return [((), final.dtype) if k in (-1, final.loss) else (plan.outputs[k].shape, plan.outputs[k].dtype)
            for k in returned_order(plan)]


class HostWriter:
    """`kevin_run` for a plan and variant. `vectorizable`: the program has a vector kernel beside
    the scalar one, launched where the pointers are 16-byte aligned; `launches`: a family's own
    launches (the tiled kernel's, a split plan's workspaces and launches)."""

    def __init__(self, plan: Plan, variant: Variant, vectorizable: bool, launches: str | None = None) -> None:
        self.plan, self.variant, self.vectorizable, self.launches = plan, variant, vectorizable, launches
        self.first = plan.inputs[0].var

    def checks(self) -> list[str]:
        """Each input's device, dtype, sizes and strides, as the program was written for."""
        checks = []
        for i in self.plan.inputs:
            sizes = ", ".join(str(s) for s in i.shape)
            strides = ", ".join(str(s) for s in i.stride)
            checks.append(
                f'    TORCH_CHECK({i.var}.is_cuda() && {i.var}.scalar_type() == {TORCH_DTYPES.get(i.dtype, "torch::kBool")} && '
                f'{i.var}.sizes() == torch::IntArrayRef({{{sizes}}}) && {i.var}.strides() == torch::IntArrayRef({{{strides}}}), '
                f'"kevin kernel: input {i.index} must be {str(i.dtype).replace("torch.", "")} of sizes [{sizes}] and strides [{strides}]");'
            )
        return checks

    def allocations(self) -> list[str]:
        """The returned tensors (and a final reduction's per-row values)."""
        allocs = []
        for k, (shape, dtype) in enumerate(returned(self.plan)):
            sizes = ", ".join(str(s) for s in shape)
            allocs.append(f"    auto out{k} = torch::empty({{{sizes}}}, {self.first}.options().dtype({TORCH_DTYPES[dtype]}));")
        if self.plan.final is not None:  # the per-row values, reduced by the last launch
            allocs.append(f"    auto rowvals = torch::empty({{{self.plan.rows}}}, {self.first}.options().dtype(torch::kFloat32));")
        return allocs

    def aligned(self) -> str:
        """C condition: the vector path's 16-byte aligned data."""
        return aligned_pointers(self.plan, 16)

    def rows_launch(self) -> str:
        """The rows kernel's grid (a cluster's blocks per row, or per `rows_per_block` rows
        across memory) and launch."""
        plan, variant, casted = self.plan, self.variant, launch_args(self.plan)
        if variant.cluster > 1 and variant.columns:  # `rows_per_block` rows a cluster
            rpb = max(1, variant.rows_per_block)
            block = variant.threads * rpb
            head = f"    const long long blocks = ({plan.rows}LL + {rpb} - 1) / {rpb} * {variant.cluster};\n"
        elif variant.cluster > 1:  # a cluster per row: the grid is the rows' clusters
            block = variant.threads
            head = f"    const long long blocks = {plan.rows}LL * {variant.cluster};\n"
        else:
            rpb = max(1, variant.rows_per_block)
            block = variant.threads * rpb
            head = f"    const long long blocks = ({plan.rows}LL + {rpb} - 1) / {rpb};\n"
        if variant.cluster > 8:  # beyond the portable cluster size: allowed kernel by kernel
            head += "".join(f"    cudaFuncSetAttribute({k}, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);\n"
                            for k in ("kevin_rows", *(("kevin_rows_vec",) if self.vectorizable else ())))
        if not self.vectorizable:
            return head + f"    kevin_rows<<<(unsigned)blocks, {block}, 0, stream>>>({casted});"
        return (head + f"    if ({self.aligned()}) {{\n"
                f"        kevin_rows_vec<<<(unsigned)blocks, {block}, 0, stream>>>({casted});\n    }} else {{\n"
                f"        kevin_rows<<<(unsigned)blocks, {block}, 0, stream>>>({casted});\n    }}")

    def pointwise_launch(self) -> str:
        """The pointwise kernel's grid-stride launch (at most 2^30 blocks), vector or scalar."""
        plan, variant, casted = self.plan, self.variant, launch_args(self.plan)
        per = variant.threads * variant.items
        scalar = (f"        const long long blocks = std::min<long long>(({plan.numel}LL + {per} - 1) / {per}, 1LL << 30);\n"
                  f"        kevin_pointwise<<<(unsigned)blocks, {variant.threads}, 0, stream>>>({casted});")
        if not self.vectorizable:
            return f"    {{\n{scalar}\n    }}"
        vec = (f"        const long long blocks = std::min<long long>(({plan.numel // pointwise_width(plan)}LL + {per} - 1) / {per}, 1LL << 30);\n"
               f"        kevin_pointwise_vec<<<(unsigned)blocks, {variant.threads}, 0, stream>>>({casted});")
        return f"    if ({self.aligned()}) {{\n{vec}\n    }} else {{\n{scalar}\n    }}"

    def text(self) -> str:
        plan = self.plan
        if self.launches is not None:
            launch = self.launches
        elif plan.is_rows:
            launch = self.rows_launch()
        else:
            launch = self.pointwise_launch()
        after = FinalReductionWriter(plan).launch() if plan.final is not None else ""
        params = ", ".join(f"torch::Tensor {i.var}" for i in plan.inputs)
        count = len(returned(plan))
        ret = "out0" if count == 1 else "{" + ", ".join(f"out{k}" for k in range(count)) + "}"
        returns = "torch::Tensor" if count == 1 else "std::vector<torch::Tensor>"
        return (
            f"{returns} kevin_run({params}) {{\n" + "\n".join(self.checks()) + "\n"
            f"    const c10::cuda::CUDAGuard guard({self.first}.device());\n"
            f"    cudaStream_t stream = c10::cuda::getCurrentCUDAStream({self.first}.get_device()).stream();\n"
            + "\n".join(self.allocations()) + "\n" + launch + after + "\n"
            f"    return {ret};\n}}\n"
        )
