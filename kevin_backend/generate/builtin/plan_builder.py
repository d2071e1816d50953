"""The state of the walk that builds a Plan from a traced graph (`PlanBuilder`), and the layout
arithmetic its handlers (plan_handlers.py) share: a layout broadcast to a shape, a view that
keeps elements in place, a broadcast layout seen in the iteration space."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx as fx

from kevin_backend.generate.builtin.graph_nodes import node_value, tensor_args
from kevin_backend.generate.builtin.ops import Unsupported
from kevin_backend.generate.builtin.plan import FinalReduce, Kind, Plan, PlanInput, PlanNode, PlanOutput, numel

__all__ = ["PlanBuilder", "Viewing", "aligned", "view_layout", "into_space"]


@dataclass
class Viewing:
    """A value outside the iteration space, until a view brings it in (`PlanBuilder.viewing`)."""

    space: tuple[int, ...]  # the value's shape
    layouts: dict[fx.Node, tuple[tuple[int, ...], tuple[int, ...]]]  # each input it reads: (shape, strides) in that space
    members: list[int]  # indices of the plan nodes computing it
    why: str  # the reason to give if no view brings it into the iteration space


class PlanBuilder:
    """The state of the walk over a traced graph that builds a Plan: each call_function node goes
    to the handler of its kind (`plan_handlers.HANDLERS`: an item of a tuple, a reduction, a view,
    masked_fill, a pointwise op), which adds its PlanNode and records the value's name and kind.

    An input whose own shape does not broadcast to the iteration space may still be read through
    views that only add, drop or expand size-1 dimensions (a per-channel vector seen as [C, 1, 1]
    against [N, C, H, W]), also after pointwise work in its own smaller space (a norm's
    1 / sqrt(var + eps) on [C], then viewed). Until such a view brings it into the iteration
    space, a value is "viewing" (`viewing`): its space, the layout there of every input it reads,
    and the plan nodes that compute it (their kind is known once the view is)."""

    def __init__(self, shape: tuple[int, ...], reducing: bool, reduced: tuple[int, ...] = ()) -> None:
        self.shape = shape
        self.reduced = reduced or (len(shape) - 1,)  # R
        self.reducing = reducing  # a row plan
        self.indices: set[fx.Node] = set()  # int64 positions (index reductions): outputs only
        self.targets: set[fx.Node] = set()  # int64 inputs: read only as class targets (nll_loss_forward)
        self.final: tuple[fx.Node, FinalReduce] | None = None
        self.final_count: fx.Node | None = None  # the final reduction's total weight, where the task returns it
        self.spaces: dict[fx.Node, tuple[int, ...]] = {}  # FULL values seen in another shape of the same order
        self.kinds: dict[fx.Node, Kind] = {}
        self.names: dict[fx.Node, str] = {}
        self.nodes: list[PlanNode] = []
        self.ops: list[str] = []  # every aten op of the graph once, in graph order
        self.viewing: dict[fx.Node, Viewing] = {}
        self.views: dict[fx.Node, tuple[tuple[int, ...], tuple[int, ...]]] = {}  # input placeholder: how the kernel reads it

    def kind_of_shape(self, s: tuple[int, ...]) -> Kind:
        shape = self.shape
        if len(s) > len(shape) or any(a not in (1, b) for a, b in zip(reversed(s), reversed(shape))):
            raise Unsupported(f"a value of shape {list(s)} does not broadcast to the iteration space {list(shape)}")
        padded = (1,) * (len(shape) - len(s)) + tuple(s)
        return Kind.FULL if any(padded[d] == shape[d] != 1 for d in self.reduced) else Kind.ROW

    def add_input(self, ph: fx.Node, index: int, t: torch.Tensor) -> None:
        self.names[ph] = f"in{index}"
        if t.dtype is torch.int64:
            self.targets.add(ph)
        try:
            self.kinds[ph] = self.kind_of_shape(tuple(t.shape))
        except Unsupported as exc:
            self.viewing[ph] = Viewing(tuple(t.shape), {ph: (tuple(t.shape), tuple(t.stride()))}, [], str(exc))

    def read_through(self, ph: fx.Node, last: fx.Node, layout: tuple[tuple[int, ...], tuple[int, ...]]) -> None:
        """Input `ph` read through a chain of views ending at `last` (`_fold_input_views`): the
        chain's value is the input, laid out as `layout` in the iteration space."""
        self.viewing.pop(ph, None)
        kind = self.kind_of_shape(layout[0])
        self.views[ph] = layout
        self.kinds[ph] = self.kinds[last] = kind
        self.names[last] = self.names[ph]

    def cols_of(self, shape: tuple[int, ...]) -> int:
        return numel(tuple(shape[d] for d in self.reduced))

    def value(self, arg: Any) -> str:
        """The C name of an operand in the iteration space."""
        if arg in self.viewing:
            raise Unsupported(self.viewing[arg].why)
        if arg in self.indices:
            raise Unsupported("an index reduction's positions are read by another op (the built-in writer only returns them)")
        if arg in self.targets:
            raise Unsupported("an int64 input read as a value (the built-in writer reads int64 inputs only as "
                              "cross-entropy's class targets)")
        if not isinstance(arg, fx.Node) or arg not in self.names:
            raise Unsupported(f"an operand the writer cannot read: {arg}")
        return self.names[arg]

    def viewed(self, node: fx.Node) -> list[fx.Node]:
        """The operands of `node` still outside the iteration space."""
        return [a for a in tensor_args(node) if a in self.viewing]

    def finish(self, placeholders: list[fx.Node], metas: list[Any], outs: list[fx.Node]) -> Plan:
        shape = self.shape
        for node, view in self.viewing.items():
            if not view.members and node.op == "placeholder" and node not in self.views:
                raise Unsupported(view.why)
        inputs = []
        for i, (ph, t) in enumerate(zip(placeholders, metas)):
            view = self.views.get(ph)
            kind = self.kinds[ph] if view is None else self.kind_of_shape(view[0])
            inputs.append(PlanInput(f"in{i}", i, t.dtype, tuple(t.shape), tuple(t.stride()), kind, view))
        outputs = []
        rows = numel(tuple(shape[d] for d in range(len(shape)) if d not in self.reduced))
        final = self.final[1] if self.final is not None else None
        if self.final is not None and self.final[0] not in outs:
            raise Unsupported("a cross-entropy's loss that is not returned")
        for at, o in enumerate(outs):
            if final is not None and o is self.final[0]:  # type: ignore[index]
                final = dataclasses.replace(final, loss=len(outputs))
                outputs.append(PlanOutput(self.names[o], torch.float32, (rows,), Kind.ROW))
                continue
            if final is not None and o is self.final_count:
                final = dataclasses.replace(final, count_at=at)
                continue
            if o not in self.names or o.op == "placeholder":
                raise Unsupported("an output that is an input or unknown")
            v = node_value(o)
            if o in self.viewing:
                raise Unsupported(f"an output of shape {list(v.shape)} in an iteration space of {list(shape)}")  # type: ignore[union-attr]
            kind = self.kinds[o]
            out_shape = tuple(v.shape)  # type: ignore[union-attr]
            if kind is Kind.FULL and out_shape != shape and self.spaces.get(o) != out_shape:
                raise Unsupported(f"an output of shape {list(out_shape)} in an iteration space of {list(shape)}")
            if kind is Kind.ROW and self.reducing and numel(out_shape) != rows:
                raise Unsupported(f"a row output of shape {list(out_shape)}")
            if kind is Kind.ROW and not self.reducing and out_shape != shape:
                raise Unsupported(f"an output of shape {list(out_shape)} in an iteration space of {list(shape)}")
            index = o in self.indices and v.dtype is torch.int64  # type: ignore[union-attr]
            if v.dtype not in (torch.float32, torch.float16, torch.bfloat16) and not index:  # type: ignore[union-attr]
                raise Unsupported(f"an output of dtype {v.dtype}")  # type: ignore[union-attr]
            outputs.append(PlanOutput(self.names[o], v.dtype, out_shape, kind))  # type: ignore[union-attr]
        nodes = self.nodes
        if not self.reducing:  # a pointwise kernel computes every value per element
            nodes = [dataclasses.replace(n, kind=Kind.FULL) for n in nodes]
        reduced = self.reduced if self.reducing and self.reduced != (len(shape) - 1,) else ()
        return Plan(tuple(inputs), tuple(nodes), tuple(outputs), shape, tuple(self.ops), reduced, final)


def aligned(shape: tuple[int, ...], stride: tuple[int, ...], space: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """A layout broadcast to `space` (trailing dimensions aligned; broadcast ones get stride 0)."""
    lead = len(space) - len(shape)
    shape, stride = (1,) * lead + tuple(shape), (0,) * lead + tuple(stride)
    return tuple(space), tuple(0 if size == 1 and full != 1 else st for size, st, full in zip(shape, stride, space))


def view_layout(shape: tuple[int, ...], stride: tuple[int, ...], out: tuple[int, ...],
                expand: bool) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """(shape, strides) of a view of a (shape, strides) layout as `out`, when the view keeps every
    element where it is: only size-1 dimensions added, dropped or expanded (stride 0); else None."""
    if expand:
        lead = len(out) - len(shape)
        if lead < 0:
            return None
        strides = []
        for d, size in enumerate(out):
            if d < lead:
                strides.append(0)
                continue
            src = shape[d - lead]
            if src not in (1, size):
                return None
            strides.append(0 if src == 1 else stride[d - lead])
        return out, tuple(strides)
    kept = [(size, st) for size, st in zip(shape, stride) if size != 1]
    if [size for size, _ in kept] != [size for size in out if size != 1]:
        return None
    it = iter(kept)
    return out, tuple(0 if size == 1 else next(it)[1] for size in out)


def into_space(strides: tuple[int, ...], shape: tuple[int, ...], space: tuple[int, ...],
               iteration: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """The layout in the iteration space of a tensor laid out as (`shape`, `strides`) broadcast
    to `space`, where `space` enumerates the iteration space's elements in order; None when torch
    cannot view it so."""
    full_shape, full_strides = aligned(shape, strides, space)
    try:
        meta = torch.empty_strided(full_shape, full_strides, device="meta").view(iteration)
    except RuntimeError:
        return None
    return tuple(iteration), tuple(meta.stride())
