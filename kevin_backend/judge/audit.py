"""The candidate's forward under the judge's audit: every aten op it dispatches is recorded, from
Python or from C++ host code alike, and a forward that ran PyTorch compute (anything but
allocation, views, metadata and fills) fails: the kernel must compute the task itself.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from kevin_backend.judge.attribution import Verdict, candidate_failure, error
from kevin_backend.judge.judged_run import Run, sync
from kevin_backend.measure.compare import output_list

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


def candidate_forward(run: Run, values: Sequence[Any], phase: str = "candidate") -> list[Any]:
    """The candidate's forward on `values`, audited; raises Verdict on its failures."""
    run.phase(phase)
    audit = Audit()
    run.candidate_ran = True
    try:
        with torch.no_grad(), audit:
            got = output_list(run.model(*values))
        sync(run.device)
    except Exception as exc:  # noqa: BLE001 - the candidate's failure, whatever it is
        raise Verdict(candidate_failure(run, "forward", exc)) from None
    if audit.computed:
        raise Verdict(error("PYTORCH_COMPUTE", "run", "forward ran PyTorch compute ops: " + ", ".join(audit.computed[:10])))
    return got
