"""The dispatch audit: every aten op a forward dispatches is recorded, from Python or from C++ host
code alike, and a forward that ran PyTorch compute (anything but allocation, views, metadata and
fills) fails: the kernel must compute the task itself. The audit runs in the candidate's own
process (`candidate_worker.py`), on every correctness call and on one random call of every timed
batch; `candidate_forward` is the judge's side of a correctness call.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from kevin_backend.judge.attribution import Verdict, error

if TYPE_CHECKING:
    from kevin_backend.judge.judged_run import Run

__all__ = ["ALLOWED_OPS", "Audit", "candidate_forward"]

# What a candidate's forward may dispatch: allocation, views, metadata, and the fills that
# torch.zeros and friends are made of. Everything else is PyTorch computing for the candidate.
ALLOWED_OPS = frozenset(
    {
        "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "zeros", "zeros_like",
        "new_zeros", "ones", "ones_like", "new_ones", "full", "full_like", "new_full", "fill_", "zero_",
        "view", "_unsafe_view", "reshape", "as_strided", "permute", "transpose", "t", "unsqueeze", "squeeze",
        "expand", "slice", "select", "split", "split_with_sizes", "unbind", "chunk", "narrow", "alias",
        "detach", "lift_fresh", "_reshape_alias", "unflatten", "flatten", "view_as", "expand_as",
        "is_same_size", "sym_size", "sym_stride", "sym_numel", "sym_storage_offset", "_local_scalar_dense",
        "set_", "resize_", "record_stream", "clone", "copy_", "contiguous", "_to_copy",
    }
)


class Audit(TorchDispatchMode):
    """Records every aten op dispatched while active, from Python or from C++ host code alike."""

    def __init__(self) -> None:
        super().__init__()
        self.computed: list[str] = []

    def __torch_dispatch__(self, func: Any, types_: Any, args: Any = (), kwargs: Any = None) -> Any:
        # A fast build's operators are registered without a dispatch key (CompositeImplicitAutograd),
        # so this mode never sees them, only the aten ops their host code calls.
        name = func._schema.name.split("::")[-1]
        if name == "_to_copy" and _changes_dtype(args, kwargs):
            name = "_to_copy (a dtype conversion)"
        if name not in ALLOWED_OPS and name not in self.computed:
            self.computed.append(name)
        return func(*args, **(kwargs or {}))


def _changes_dtype(args: Any, kwargs: Any) -> bool:
    dtype = (kwargs or {}).get("dtype")
    return dtype is not None and isinstance(args[0], torch.Tensor) and dtype != args[0].dtype


def candidate_forward(run: Run, values: Sequence[Any], phase: str = "candidate",
                      after: tuple[int, ...] | None = None) -> list[Any]:
    """The candidate's forward on `values`, in its own process under the audit, on memory poisoned
    with NaN; raises Verdict on its failures. `after`: the inputs' fingerprints the reference left
    (a candidate must change its inputs as the reference does, and no more)."""
    from kevin_backend.measure.inputs import fingerprint

    run.phase(phase)
    run.candidate_ran = True
    got, inputs_after, computed = run.model.call(values, audit=True, poison=run.output_bytes)
    if computed:
        raise Verdict(error("PYTORCH_COMPUTE", "run", "forward ran PyTorch compute ops: " + ", ".join(computed[:10])))
    if after is not None:
        for k, (a, b) in enumerate(zip(fingerprint(inputs_after), after)):
            if a != b:
                raise Verdict(error("INPUT_MUTATED", "correctness", f"input {k} was changed by the forward"))
    return got
