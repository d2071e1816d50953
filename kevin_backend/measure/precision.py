"""The precision a task's own arithmetic gives each output: a float32 output whose values went
through a 16-bit rounding on their way (a bfloat16 matmul's result converted to float32 and scaled,
as a mixed-precision training step's backward has it) is only as precise as that rounding, and the
comparison holds it to the 16-bit dtype's bound (`compare.py`), not to float32's.

The exact reference runs the task in float64 and rounds nowhere in between, so eager's own error on
such an output is a 16-bit one: up to 2^-8 of each element, past float32's capped bound (2e-3 of
the element and the output's scale). On the backward GEMMs of `kevin bench`'s GPT-2 in bfloat16,
eager's own output failed that bound at 3 to 53 of 512 elements (seeds 1 to 3), and a kernel
rounding once where eager rounds twice was refused.

    precision = output_precision(model, inputs)   # per output: torch.bfloat16, torch.float16 or None

The model runs on meta copies of its parameters and inputs (no memory, no arithmetic), followed op
by op by a dispatch mode (`carried_precision`): a floating tensor carries the
narrowest 16-bit dtype any op on its way rounded to. An op rounds when it writes a 16-bit result,
unless it only moves or selects values of its inputs' own dtype (views, copies, concatenation,
indexing, max and min, a sign or ReLU). The task's inputs carry nothing: their float64 copies are
exact. A task that cannot run on the meta device (a value read back to Python) gets None: each
output its own dtype's bound, as before.
"""

from __future__ import annotations

import contextlib
import copy
import logging
from typing import Any, Iterator, Sequence

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.weak import WeakTensorKeyDictionary

log = logging.getLogger(__name__)

__all__ = ["Carried", "carried_precision", "output_precision", "task_precision", "SIXTEEN_BIT"]

SIXTEEN_BIT = (torch.bfloat16, torch.float16)  # narrowest first: bfloat16 keeps 8 significant bits, float16 11

# Ops that give back values of their inputs (moved, selected, or with their sign changed) when the
# output has the inputs' dtype: no rounding of their own (by the name of the op's overload packet).
_EXACT = frozenset("""
    clone _to_copy copy copy_ contiguous cat stack index index_select gather take select slice narrow split split_with_sizes
    unbind chunk permute expand expand_as transpose t squeeze unsqueeze view reshape _unsafe_view as_strided flatten
    unflatten constant_pad_nd flip roll repeat where masked_fill masked_fill_ fill fill_ zeros_like ones_like empty_like
    full full_like zero_ neg abs relu relu_ sign max min amax amin maximum minimum clamp clamp_min clamp_max sort topk
    ceil floor round trunc scatter index_put index_put_ slice_scatter select_scatter diagonal tril triu lift_fresh
    detach alias empty empty_strided new_empty new_zeros new_full
""".split())


def _narrower(a: torch.dtype | None, b: torch.dtype | None) -> torch.dtype | None:
    if a is None or b is None:
        return a if b is None else b
    return a if SIXTEEN_BIT.index(a) <= SIXTEEN_BIT.index(b) else b


class Carried(TorchDispatchMode):
    """The dispatch mode that follows the roundings (module docstring)."""

    def __init__(self) -> None:
        super().__init__()
        self.carried: WeakTensorKeyDictionary = WeakTensorKeyDictionary()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        inputs = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor) and t.is_floating_point()]
        came: torch.dtype | None = None
        for t in inputs:
            came = _narrower(came, self.carried.get(t))
        moved = getattr(func, "is_view", False) or func.overloadpacket.__name__ in _EXACT
        for t in tree_leaves(out):
            if not isinstance(t, torch.Tensor) or not t.is_floating_point():
                continue
            mark = came
            if t.dtype in SIXTEEN_BIT and not (moved and all(x.dtype == t.dtype for x in inputs)):
                mark = _narrower(mark, t.dtype)
            if mark is not None:
                self.carried[t] = _narrower(self.carried.get(t), mark)
        return out

    def of(self, outputs: Sequence[Any]) -> tuple[torch.dtype | None, ...]:
        """Per output: the 16-bit dtype whose rounding it carries where that is narrower than its
        own dtype, else None (its own dtype's bound applies)."""
        found: list[torch.dtype | None] = []
        for t in outputs:
            mark = self.carried.get(t) if isinstance(t, torch.Tensor) and t.is_floating_point() else None
            wider = mark is not None and t.dtype not in SIXTEEN_BIT and t.element_size() > mark.itemsize
            found.append(mark if wider else None)
        return tuple(found)


@contextlib.contextmanager
def carried_precision() -> Iterator[Carried]:
    """Follow the roundings of the ops run inside (module docstring); `.of(outputs)` after."""
    mode = Carried()
    with mode:
        yield mode


def output_precision(model: torch.nn.Module, values: Sequence[Any]) -> tuple[torch.dtype | None, ...] | None:
    """Per output of `model` on `values`, the 16-bit dtype whose rounding it carries (`Carried.of`),
    from a run on meta copies of the model's parameters and buffers and of the inputs (their
    shapes, strides and dtypes); None where the model does not run there."""
    from kevin_backend.measure.compare import output_list

    state = [*model.parameters(), *model.buffers()]
    memo: dict[int, Any] = {id(t): _meta(t) for t in state}
    try:
        ghost = copy.deepcopy(model, memo)
        inputs = [_meta(v) if isinstance(v, torch.Tensor) else v for v in values]
        with torch.no_grad(), carried_precision() as carried:
            outputs = output_list(ghost(*inputs))
        return carried.of(outputs)
    except Exception as exc:  # noqa: BLE001 - an op without a meta kernel, a value read back: no finding
        log.debug("no output precision from a meta run: %s: %s", type(exc).__name__, exc)
        return None


def task_precision(task: Any, values: Sequence[Any]) -> tuple[torch.dtype | None, ...] | None:
    """`output_precision` of a KernelBench task's `Model`, built on the meta device (no memory for
    its parameters) from its `get_init_inputs()`; None where it cannot be built or run there."""
    try:
        with torch.device("meta"):
            model = task.Model(*task.get_init_inputs())
    except Exception as exc:  # noqa: BLE001
        log.debug("no output precision: the task's model is not built on the meta device: %s: %s", type(exc).__name__, exc)
        return None
    return output_precision(model, values)


def _meta(t: torch.Tensor) -> torch.Tensor:
    """`t`'s shape, strides and dtype on the meta device (a parameter stays a parameter)."""
    ghost = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta")
    return torch.nn.Parameter(ghost, requires_grad=t.requires_grad) if isinstance(t, torch.nn.Parameter) else ghost
