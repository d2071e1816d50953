"""Reading a traced aten graph: the reductions and views the built-in writer knows, and what a
node's value, tensor operands, op name and reduced dimensions are."""

from __future__ import annotations

from typing import Any

import torch
import torch.fx as fx

from kevin_backend.generate.builtin.plan import Reduction

__all__ = ["REDUCTIONS", "VIEWS", "MOVES", "FOLDABLE", "node_value", "tensor_args", "op_name", "reduced_dims"]

aten = torch.ops.aten

REDUCTIONS = {
    aten.sum.dim_IntList: Reduction.SUM,
    aten.sum.default: Reduction.SUM,
    aten.mean.dim: Reduction.MEAN,
    aten.mean.default: Reduction.MEAN,
    aten.amax.default: Reduction.AMAX,
    aten.amin.default: Reduction.AMIN,
    aten.max.default: Reduction.AMAX,
    aten.min.default: Reduction.AMIN,
    aten.var.correction: Reduction.VAR,
    aten.var_mean.correction: Reduction.VAR_MEAN,
    aten.std.correction: Reduction.STD,
    aten.argmax.default: Reduction.ARGMAX,
    aten.argmin.default: Reduction.ARGMIN,
    aten.max.dim: Reduction.MAX_DIM,
    aten.min.dim: Reduction.MIN_DIM,
}

# Views that keep a ROW value a ROW value, or a FULL value in place.
VIEWS = {aten.view.default, aten._unsafe_view.default, aten.reshape.default, aten.unsqueeze.default,
         aten.squeeze.dim, aten.squeeze.default, aten.squeeze.dims, aten.expand.default, aten.alias.default}
# Views that move an input's dimensions: taken only straight from an input (`planner.fold_input_views`).
MOVES = {aten.permute.default, aten.transpose.int, aten.t.default}
FOLDABLE = {aten.view.default, aten.unsqueeze.default, aten.squeeze.dim, aten.squeeze.default, aten.squeeze.dims,
            aten.expand.default, aten.alias.default} | MOVES


def node_value(node: Any) -> torch.Tensor | None:
    """The tensor a node makes (its meta value), None for anything else."""
    v = node.meta.get("val") if isinstance(node, fx.Node) else None
    return v if isinstance(v, torch.Tensor) else None


def tensor_args(node: fx.Node) -> list[fx.Node]:
    """A node's operands that are nodes (args and kwargs), in order."""
    return [a for a in (*node.args, *node.kwargs.values()) if isinstance(a, fx.Node)]


def op_name(node: fx.Node) -> str:
    """`aten.<op>.<overload>` of a node's target (its str for anything else), for reasons and reports."""
    target = node.target
    return f"aten.{target._opname}.{target._overloadname}" if hasattr(target, "_opname") else str(target)


def reduced_dims(node: fx.Node, ndim: int) -> tuple[int, ...]:
    """The dimensions a reduction node reduces, sorted and non-negative (all of them when its
    dimension argument is absent, None or empty, as torch reads it)."""
    target = node.target
    if target in (aten.sum.default, aten.mean.default, aten.max.default, aten.min.default):
        dims: Any = None
    elif target in (aten.var.correction, aten.var_mean.correction, aten.std.correction):
        dims = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
    elif target in (aten.argmax.default, aten.argmin.default, aten.max.dim, aten.min.dim):
        dims = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
    else:
        dims = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
    if dims is None or (isinstance(dims, (list, tuple)) and not dims):
        return tuple(range(ndim))
    dims = [dims] if isinstance(dims, int) else list(dims)
    return tuple(sorted({d % ndim for d in dims})) if ndim else ()
