"""Cross-entropy's last step as Inductor decomposes it, found in a graph and folded back into the
one `nll_loss_forward` the planner reads (`DecomposedNll`).

    found = match_decomposed_nll(gather_node)    # the pattern around a gather, or None
    fold_decomposed_nll(graph)                   # each pattern replaced by nll_loss_forward
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx as fx

from kevin_backend.generate.builtin.graph_nodes import node_value

__all__ = ["DecomposedNll", "match_decomposed_nll", "fold_decomposed_nll"]

aten = torch.ops.aten


@dataclass(frozen=True)
class DecomposedNll:
    """Cross-entropy's last step as Inductor's decompositions hand it to the backend, instead of
    one `nll_loss_forward`:

        safe  = where(ne(targets, ignore), targets, 0)              # int64, [N]
        pick  = squeeze(gather(log_probs, 1, unsqueeze(safe, 1)), 1)
        loss  = where(ne(targets, ignore), -pick, 0)                # reduction "none"
        total = sum(loss)                                           # "sum"
        mean  = total / sum(ne(targets, ignore)).to(dtype)          # "mean"

    (the zeros are `scalar_tensor(0)` or, after Inductor's own passes, `full([], 0)`)."""

    log_probs: fx.Node
    targets: fx.Node
    ignore: int
    reduction: int  # nll_loss_forward's: 0 none, 1 mean, 2 sum
    result: fx.Node  # the loss: `loss`, `total` or `mean` above
    nodes: frozenset[fx.Node]  # every node of the pattern (the log-probabilities' not)
    count: fx.Node | None = None  # a mean's `sum(ne(targets, ignore)).to(dtype)`: nll_loss_forward's total weight


def _is_zero_scalar(node: Any) -> bool:
    """A 0-d zero made in the graph: scalar_tensor(0) or full([], 0)."""
    if not isinstance(node, fx.Node):
        return False
    if node.target is aten.scalar_tensor.default:
        return node.args[0] == 0
    if node.target is aten.full.default:
        return list(node.args[0]) == [] and node.args[1] == 0
    return False


def _ignore_mask(node: Any, targets: fx.Node | None = None) -> tuple[fx.Node, int] | None:
    """ne(targets, ignore_index) as (targets, ignore_index); None for anything else."""
    if not (isinstance(node, fx.Node) and node.target is aten.ne.Scalar and isinstance(node.args[0], fx.Node)
            and isinstance(node.args[1], int) and not isinstance(node.args[1], bool)):
        return None
    return None if targets is not None and node.args[0] is not targets else (node.args[0], node.args[1])


def _sole_user(node: fx.Node, target: Any) -> fx.Node | None:
    users = list(node.users)
    return users[0] if len(users) == 1 and users[0].target is target else None


def match_decomposed_nll(gather: fx.Node) -> DecomposedNll | None:
    """The pattern of `DecomposedNll` around `gather`, or None when any part differs."""
    if gather.target is not aten.gather.default or len(gather.args) != 3 or gather.kwargs.get("sparse_grad"):
        return None
    log_probs, dim, index = gather.args
    lp = node_value(log_probs)
    if lp is None or lp.dim() != 2 or dim not in (1, -1) or lp.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        return None
    if not isinstance(index, fx.Node) or index.target is not aten.unsqueeze.default or index.args[1] not in (1, -1):
        return None
    safe = index.args[0]
    if not isinstance(safe, fx.Node) or safe.target is not aten.where.self or not _is_zero_scalar(safe.args[2]):
        return None
    mask, targets = safe.args[0], safe.args[1]
    found = _ignore_mask(mask)
    t = node_value(targets)
    if found is None or found[0] is not targets or t is None or t.dtype is not torch.int64 or tuple(t.shape) != (lp.shape[0],):
        return None
    ignore = found[1]
    squeeze = _sole_user(gather, aten.squeeze.dim)
    neg = _sole_user(squeeze, aten.neg.default) if squeeze is not None and squeeze.args[1] in (1, -1) else None
    loss = _sole_user(neg, aten.where.self) if neg is not None else None
    if loss is None or loss.args[1] is not neg or _ignore_mask(loss.args[0], targets) != (targets, ignore) \
            or not _is_zero_scalar(loss.args[2]):
        return None
    nodes = {mask, safe.args[2], safe, index, gather, squeeze, neg, loss.args[0], loss.args[2], loss}
    reduction, result, counted = 0, loss, None
    total = _sole_user(loss, aten.sum.default)
    if total is not None and len(total.args) == 1:
        reduction, result = 2, total
        nodes.add(total)
        mean = _sole_user(total, aten.div.Tensor)
        count = mean.args[1] if mean is not None and mean.args[0] is total else None
        if isinstance(count, fx.Node) and count.target is torch.ops.prims.convert_element_type.default \
                and isinstance(count.args[0], fx.Node) and count.args[0].target is aten.sum.default \
                and len(count.args[0].args) == 1 and _ignore_mask(count.args[0].args[0], targets) == (targets, ignore):
            reduction, result, counted = 1, mean, count
            nodes |= {mean, count, count.args[0], count.args[0].args[0]}
    return DecomposedNll(log_probs, targets, ignore, reduction, result, frozenset(nodes), counted)  # type: ignore[arg-type]


def _weight_read(graph: fx.Graph, found: DecomposedNll, dtype: torch.dtype) -> bool:
    """Whether `found`'s count is read beyond its mean, all after the mean (so the total weight,
    made where the mean was, comes first), in the log-probabilities' dtype."""
    count = found.count
    value = node_value(count) if count is not None else None
    if count is None or value is None or value.dtype != dtype:
        return False
    others = [u for u in count.users if u not in found.nodes]
    order = {n: i for i, n in enumerate(graph.nodes)}
    return bool(others) and all(order[u] > order[found.result] for u in others)


def fold_decomposed_nll(graph: fx.Graph) -> int:
    """Each `DecomposedNll` in `graph` replaced by the `nll_loss_forward` it came from (a partition's
    task, traced, reads like the backend's graph); the pattern's nodes are left for dead-code
    elimination. A mean's count of targets not ignored, read elsewhere too (a training step keeps
    it for the backward), becomes the total weight the same call returns, where its dtype is the
    log-probabilities' (nll_loss_forward's). Returns how many were folded."""
    folded = 0
    for node in list(graph.nodes):
        found = match_decomposed_nll(node) if node.target is aten.gather.default else None
        if found is None:
            continue
        args = (found.log_probs, found.targets, None, found.reduction, found.ignore)
        with graph.inserting_before(found.result):
            nll = graph.call_function(aten.nll_loss_forward.default, args)
            item = graph.call_function(operator.getitem, (nll, 0))
        lp = node_value(found.log_probs)
        assert lp is not None
        loss = torch.empty((lp.shape[0],) if found.reduction == 0 else (), dtype=lp.dtype, device="meta")
        nll.meta["val"], item.meta["val"] = (loss, torch.empty((), dtype=lp.dtype, device="meta")), loss  # (loss, total weight)
        found.result.replace_all_uses_with(item)
        if _weight_read(graph, found, lp.dtype):
            with graph.inserting_after(item):
                weight = graph.call_function(operator.getitem, (nll, 1))
            weight.meta["val"] = nll.meta["val"][1]
            found.count.replace_all_uses_with(weight)  # type: ignore[union-attr]
        folded += 1
    return folded
