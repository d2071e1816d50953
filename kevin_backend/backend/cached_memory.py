"""Giving back the GPU memory this process's CUDA allocator caches but does not use, before a
generate-mode search's judges run.

    released = give_back_cached_memory()     # one CacheRelease per device that held a cache
    released[0].describe()                   # "cuda:0 gave back 126.0 GiB its allocator cached ..."

The judge runs every candidate, and the references, in processes of its own: they get GPU memory
from the device, not from this process. torch's caching allocator keeps the blocks a user's
program freed (a training step's activations, an earlier model's weights) reserved for this
process, so a device can look full to the judge's workers while this process uses a fraction of
what it holds; a task would then end RESOURCE (the judge could not get memory) for no reason of
its own. So once per compile, before the first search, the backend synchronises each device this
process holds a cache on and empties the allocator's cache (`torch.cuda.empty_cache`): what is in
use stays, what is only cached goes back to the device. The report records each device's
reserved bytes before and after.

A device this process never used holds no cache and is left alone (synchronising it would make
a CUDA context there); without CUDA, or before CUDA was initialised, there is nothing to give back.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["CacheRelease", "give_back_cached_memory"]

_GIB = float(1 << 30)


@dataclass(frozen=True)
class CacheRelease:
    """One device's allocator before and after its cache was emptied (bytes reserved by this
    process: in use plus cached)."""

    device: str
    reserved_before: int
    reserved_after: int
    allocated: int  # in use: what no release can give back

    @property
    def released(self) -> int:
        return max(0, self.reserved_before - self.reserved_after)

    def describe(self) -> str:
        return (f"{self.device} gave back {self.released / _GIB:.2f} GiB its allocator cached but did not use "
                f"(reserved {self.reserved_before / _GIB:.2f} -> {self.reserved_after / _GIB:.2f} GiB, "
                f"{self.allocated / _GIB:.2f} GiB in use)")

    def as_dict(self) -> dict[str, Any]:
        return {"device": self.device, "reserved_before": self.reserved_before, "reserved_after": self.reserved_after,
                "allocated": self.allocated, "released": self.released}


def give_back_cached_memory() -> tuple[CacheRelease, ...]:
    """Empty this process's CUDA allocator cache on every device where it holds one, after
    synchronising that device (a block freed while a kernel still used it is given back only once
    the kernel is done); one CacheRelease per such device, in device order."""
    cuda = _cuda()
    if not cuda.is_available() or not cuda.is_initialized():
        return ()
    held = [i for i in range(cuda.device_count()) if cuda.memory_reserved(i) > 0]
    before = {i: cuda.memory_reserved(i) for i in held}
    for i in held:
        cuda.synchronize(i)
        with cuda.device(i):
            cuda.empty_cache()
    return tuple(CacheRelease(f"cuda:{i}", before[i], cuda.memory_reserved(i), cuda.memory_allocated(i)) for i in held)


def _cuda() -> Any:
    """torch.cuda (a test stands a scripted allocator in its place)."""
    import torch

    return torch.cuda
