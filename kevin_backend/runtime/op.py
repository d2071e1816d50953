"""Runtime: the custom op `kevin::launch` that runs a cached kernel in place of its partition.

    torch.ops.kevin.launch(key: str, inputs: list[Tensor], check_sizes: bool) -> list[Tensor]

The op is defined when this module is imported (the package imports it), so Inductor code cached
on disk and loaded by a fresh process finds it. `key` is the cache key's digest; the kernel is
looked up in this process's registry (`registry.py`) and, on a miss, loaded from the kernel
caches the backend has used (or the default one). Its fake implementation runs the task's
reference program on fake tensors, so output shapes follow symbolic sizes too.

The kernel itself decides, call by call, whether it takes the inputs or its partition's Inductor
code does (`registry.LoadedKernel`); each output has one memory format, contiguous or channels-last
as the reference's output for the verified inputs (`LoadedKernel.output_formats`), in the fake and
the real implementation alike.
"""

from __future__ import annotations

from typing import Any

import torch

from kevin_backend.runtime.registry import fresh_outputs, loaded_kernels, lookup

__all__ = ["launch"]

_LIB = torch.library.Library("kevin", "DEF")
_TAGS = tuple(t for t in (getattr(torch.Tag, "needs_exact_strides", None),) if t is not None)
_LIB.define("launch(str key, Tensor[] inputs, bool check_sizes) -> Tensor[]", tags=_TAGS)


def launch(key: str, inputs: list[torch.Tensor], check_sizes: bool = True) -> list[torch.Tensor]:
    kernel = loaded_kernels.get(key)
    return (kernel or lookup(key))(inputs, check_sizes)


def _launch_fake(key: str, inputs: list[torch.Tensor], check_sizes: bool = True) -> list[torch.Tensor]:
    return fresh_outputs(lookup(key), inputs)


_LIB.impl("launch", launch, "CompositeExplicitAutograd")
torch.library.register_fake("kevin::launch", _launch_fake, lib=_LIB)

_PLAIN = (torch.Tensor, torch.nn.Parameter)
# looked up once: they run on every call
_dispatch_modes = torch._C._len_torch_dispatch_stack
_function_modes = torch._C._len_torch_function_stack
_functorch_transforms = torch._C._are_functorch_transforms_active
_grad_enabled = torch._C.is_grad_enabled


class _DirectLaunch(torch._ops.OpOverload):
    """`torch.ops.kevin.launch.default`, as Inductor's code calls it: straight to `launch` when
    nothing could intercept the call on its way through the dispatcher (no dispatch or function
    mode such as fake tensors or tracing, no functorch transform, only plain tensors, no gradient
    to record). That saves the dispatcher's round trip into Python, a few microseconds a call;
    every other call goes through the dispatcher as any op's does."""

    def __call__(self, /, *args: Any, **kwargs: Any) -> Any:
        if kwargs or len(args) != 3 or _dispatch_modes() or _function_modes() or _functorch_transforms():
            return self._op(*args, **kwargs)
        key, inputs, check_sizes = args
        grad = _grad_enabled()
        kernel = loaded_kernels.get(key)
        # symbolic sizes (check_sizes): the inputs compared with the verified ones first
        if kernel is not None and len(inputs) == len(kernel.inputs) and (not check_sizes or kernel.accepts(inputs)):
            out = kernel.direct(inputs, grad)
            if out is not None:
                return out
        for t in inputs:
            if type(t) not in _PLAIN or (grad and t.requires_grad):
                return self._op(*args)
        return launch(key, inputs, check_sizes)


torch.ops.kevin.launch.default.__class__ = _DirectLaunch
