"""What a kernel writer can handle: op support declarations used by the partitioner.

A writer (a model policy or the built-in writer) declares the aten ops it can write kernels for
through an `OpSupport`. The partitioner (`backend/partition.py`) checks the structural rules
itself (graph inputs, mutation, randomness, symbolic sizes); the declaration only answers "can
you write this op?", always with a reason, and which reductions may share a kernel. The writer
registry (`writers.py`) says which declaration each writer makes.
"""

from __future__ import annotations

from typing import Hashable, Protocol, runtime_checkable

import torch
import torch.fx as fx

__all__ = ["OpSupport", "GeneralOpSupport", "op_name", "VIEW_OPS", "MATMUL_OPS"]

aten = torch.ops.aten
prims = torch.ops.prims


def op_name(node: fx.Node) -> str:
    """`aten.relu.default` for an aten node; the callable's name otherwise."""
    target = node.target
    if isinstance(target, torch._ops.OpOverload):
        return str(target)
    return getattr(target, "__name__", str(target))


@runtime_checkable
class OpSupport(Protocol):
    """A writer's declaration of the ops it can write kernels for."""

    name: str

    def supports(self, node: fx.Node) -> tuple[bool, str]:
        """(True, "") when the writer can handle `node`'s op; (False, why) otherwise."""
        ...

    def reduction_key(self, node: fx.Node) -> Hashable | None:
        """What a reduction node must share with every other reduction of its kernel, for a
        writer that takes one kind of reduction per kernel; None for a node that is no such
        reduction, and for every node of a writer that does not key its reductions. The
        partitioner never puts two reductions of different keys in one partition."""
        ...


# Ops that only reinterpret or copy memory: they never count as compute in a partition.
VIEW_OPS = frozenset(
    {
        aten.view.default,
        aten._unsafe_view.default,
        aten.reshape.default,
        aten.permute.default,
        aten.transpose.int,
        aten.t.default,
        aten.expand.default,
        aten.squeeze.dim,
        aten.squeeze.dims,
        aten.squeeze.default,
        aten.unsqueeze.default,
        aten.slice.Tensor,
        aten.select.int,
        aten.split.Tensor,
        aten.split_with_sizes.default,
        aten.unbind.int,
        aten.alias.default,
        aten.clone.default,
    }
)

_REDUCTIONS = frozenset(
    {
        aten.sum.dim_IntList,
        aten.sum.default,
        aten.mean.dim,
        aten.mean.default,
        aten.amax.default,
        aten.amin.default,
        aten.max.dim,
        aten.min.dim,
        aten.var.correction,
        aten.var_mean.correction,
        aten.prod.dim_int,
        aten.logsumexp.default,
        aten._softmax.default,
        aten._log_softmax.default,
        aten.native_layer_norm.default,
        aten.argmax.default,
        aten.argmin.default,
    }
)

MATMUL_OPS = frozenset(
    {
        aten.mm.default,
        aten.addmm.default,
        aten.bmm.default,
        aten.baddbmm.default,
    }
)

_EXTRA = frozenset(
    {
        aten.cat.default,
        aten.where.self,
        aten.clamp.default,
        aten.clamp.Tensor,
        aten._to_copy.default,
        prims.convert_element_type.default,
        aten.scalar_tensor.default,
        aten.full.default,
        aten._softmax_backward_data.default,
        aten._log_softmax_backward_data.default,
        aten.native_layer_norm_backward.default,
        aten.threshold_backward.default,
        aten.gelu_backward.default,
        aten.sigmoid_backward.default,
        aten.tanh_backward.default,
        aten.silu_backward.default,
    }
)


class GeneralOpSupport:
    """What a general kernel-writing model (Kevin-32B) is asked to write: pointwise ops,
    reductions and norms, matrix products with their epilogues, and the views between them.

    Convolutions, attention kernels, indexing and scatter ops, and anything else stay with
    Inductor (cuDNN / cuBLAS / Inductor's own templates): they are not declared here.
    """

    name = "general"

    def __init__(self, matmul: bool = True) -> None:
        self.matmul = matmul

    def supports(self, node: fx.Node) -> tuple[bool, str]:
        target = node.target
        if not isinstance(target, torch._ops.OpOverload):
            return False, f"{op_name(node)} is not an aten op"
        if torch.Tag.pointwise in target.tags:
            return True, ""
        if target in VIEW_OPS or target in _REDUCTIONS or target in _EXTRA:
            return True, ""
        if target in MATMUL_OPS:
            return (True, "") if self.matmul else (False, f"{target} (matmul) not declared by '{self.name}'")
        return False, f"{target} not declared by writer '{self.name}'"

    def reduction_key(self, node: fx.Node) -> Hashable | None:
        """None: a general writer takes any reductions together in one kernel."""
        return None
