"""Where a task's tensors are made: KernelBench's placement, in one step.

Published KernelBench problems make their inputs on the CPU (`torch.randn(4096, 16384)`); the
harness moves them to the GPU under test before anything runs. `placed_on(device)` makes them
there directly: inside it, torch's factory functions put their tensors on `device` (a device the
call names is replaced, an absent one supplied), and `Tensor.cuda()`, `Tensor.cpu()` and
`Tensor.to(device)` go to `device`. A task's `get_inputs()` run inside it returns its inputs on the
device under test, with the layouts the program gives them (a `.t()` stays a transpose, an
`.expand()` a broadcast), without gigabytes generated on the CPU and copied over.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
from torch.overrides import TorchFunctionMode

__all__ = ["placed_on"]


# Factory functions whose `device=` a task may name: made on the device under test instead.
_FACTORIES = frozenset({
    "randn", "rand", "randint", "randperm", "empty", "zeros", "ones", "full", "arange", "linspace", "logspace",
    "tensor", "as_tensor", "eye", "empty_strided", "normal", "randn_like", "rand_like", "randint_like",
    "zeros_like", "ones_like", "full_like", "empty_like", "bernoulli", "tril_indices", "triu_indices",
})


class placed_on(TorchFunctionMode):
    """Inside this mode, torch's factory functions make their tensors on `device` (a device the
    call names is replaced, an absent one supplied) and `Tensor.cuda()` / `Tensor.to(device)`
    go to `device`: a task's `get_inputs()` then makes its inputs where they will be used, in
    one step (no gigabytes generated on the CPU and copied over)."""

    def __init__(self, device: torch.device | str) -> None:
        super().__init__()
        self.device = torch.device(device)

    def __torch_function__(self, func: Any, types: Any, args: Sequence[Any] = (), kwargs: dict[str, Any] | None = None) -> Any:
        kwargs = dict(kwargs or {})
        if func in _TORCH_FACTORIES:
            kwargs["device"] = self.device
        elif func is torch.Tensor.cuda or func is torch.Tensor.cpu:
            return torch.Tensor.to(args[0], self.device)
        elif func is torch.Tensor.to:
            args, kwargs = _retarget_to(args, kwargs, self.device)
        return func(*args, **kwargs)


_TORCH_FACTORIES = frozenset(getattr(torch, n) for n in _FACTORIES if hasattr(torch, n))


def _retarget_to(args: Sequence[Any], kwargs: dict[str, Any], device: torch.device) -> tuple[Sequence[Any], dict[str, Any]]:
    """`t.to(...)` with any device it names replaced by `device` (dtypes and flags kept)."""
    out = [args[0]]
    for a in args[1:]:
        if isinstance(a, (str, torch.device)) and _is_device(a):
            a = device
        out.append(a)
    if "device" in kwargs and kwargs["device"] is not None:
        kwargs["device"] = device
    return out, kwargs


def _is_device(value: Any) -> bool:
    if isinstance(value, torch.device):
        return True
    try:
        torch.device(value)
    except (RuntimeError, TypeError):
        return False
    return True
