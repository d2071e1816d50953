"""GPU memory shared between the judge and a candidate's process, through the CUDA driver's IPC.

    buf = DeviceBuffer(nbytes, device)       # the judge's own allocation (nothing else lives in it)
    handle = buf.handle                      # 64 bytes another process opens
    view = open_handle(handle, device)       # (in that process) the same memory, as a uint8 tensor

A candidate's process sees only what the judge shares with it: each shared buffer is an
allocation of its own (`cuMemAlloc`), never a block of the caching allocator, whose segments hold
the judge's other tensors. What the candidate shares back (its outputs) is opened here and read
only after its extent is checked against the allocation the driver reports
(`checked_region`): a claimed offset or size cannot make the judge read outside it.

The driver is reached through ctypes (`libcuda.so.1`); the calls act on the current context,
the primary context torch made current for the device.
"""

from __future__ import annotations

import ctypes
import threading
from typing import Any

import torch

from kevin_backend.measure.memory import note_outside

__all__ = ["IpcError", "DeviceBuffer", "address_range", "export_handle", "open_handle", "close_opened", "tensor_at"]

_LOCK = threading.Lock()
_DRIVER: list[Any] = []


_OUT_OF_MEMORY = 2  # CUDA_ERROR_OUT_OF_MEMORY


class IpcError(RuntimeError):
    """A driver call for shared memory failed (its error name in the message)."""


class _Handle(ctypes.Structure):
    _fields_ = [("reserved", ctypes.c_char * 64)]


def _driver() -> Any:
    with _LOCK:
        if not _DRIVER:
            lib = ctypes.CDLL("libcuda.so.1")
            for name, args in (
                ("cuMemAlloc_v2", [ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t]),
                ("cuMemFree_v2", [ctypes.c_uint64]),
                ("cuMemGetAddressRange_v2", [ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_size_t), ctypes.c_uint64]),
                ("cuIpcGetMemHandle", [ctypes.POINTER(_Handle), ctypes.c_uint64]),
                ("cuIpcOpenMemHandle_v2", [ctypes.POINTER(ctypes.c_uint64), _Handle, ctypes.c_uint]),
                ("cuIpcCloseMemHandle", [ctypes.c_uint64]),
                ("cuGetErrorName", [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]),
            ):
                function = getattr(lib, name)
                function.argtypes = args
                function.restype = ctypes.c_int
            _DRIVER.append(lib)
        return _DRIVER[0]


def _check(status: int, what: str) -> None:
    if status != 0:
        name = ctypes.c_char_p()
        _driver().cuGetErrorName(status, ctypes.byref(name))
        raise IpcError(f"{what} failed: {(name.value or b'?').decode()} ({status})")


def _current(device: torch.device) -> None:
    """The device's primary context made current on this thread (torch's own)."""
    torch.cuda.set_device(device)
    torch.cuda.current_stream(device)  # initialises the context if this thread has none
    torch.empty(1, device=device)


class _Span:
    """A raw device range as `__cuda_array_interface__`, so torch wraps it without a copy."""

    def __init__(self, pointer: int, nbytes: int) -> None:
        self.__cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1", "data": (pointer, False),
                                         "version": 3, "strides": None, "stream": None}


def tensor_at(pointer: int, nbytes: int, device: torch.device) -> torch.Tensor:
    """A uint8 tensor over `nbytes` of device memory at `pointer` (no copy; the memory is not owned)."""
    if nbytes == 0:
        return torch.empty(0, dtype=torch.uint8, device=device)
    return torch.as_tensor(_Span(pointer, nbytes), device=device)


class DeviceBuffer:
    """An allocation of the judge's own, outside torch's caching allocator, shareable with another
    process (`share`: its IPC handle made) or not; freed by `free()`."""

    def __init__(self, nbytes: int, device: torch.device, share: bool = True, apart: str = "") -> None:
        _current(device)
        self.device = device
        self.nbytes = max(int(nbytes), 256)
        pointer = ctypes.c_uint64()
        status = _driver().cuMemAlloc_v2(ctypes.byref(pointer), self.nbytes)
        if status == _OUT_OF_MEMORY:  # torch's cache may hold what the driver lacks: released, once more
            torch.cuda.empty_cache()
            status = _driver().cuMemAlloc_v2(ctypes.byref(pointer), self.nbytes)
        if status == _OUT_OF_MEMORY:  # (the judge's allocation: RESOURCE, as torch's own would be)
            raise torch.OutOfMemoryError(f"allocating {self.nbytes / 2**30:.2f} GiB of shared GPU memory: out of memory")
        _check(status, f"allocating {self.nbytes} bytes")
        self.pointer = pointer.value
        self.apart = apart  # memory with an allowance of its own (`note_outside`)
        note_outside(device, self.nbytes, apart)  # (the judge's memory ledger counts it with torch's)
        self.tensor = tensor_at(self.pointer, self.nbytes, device)
        self.handle = b""
        if not share:
            return
        handle = _Handle()
        _check(_driver().cuIpcGetMemHandle(ctypes.byref(handle), self.pointer), "sharing a buffer")
        self.handle = ctypes.string_at(ctypes.addressof(handle), 64)

    def free(self) -> None:
        if self.pointer:
            torch.cuda.synchronize(self.device)
            self.tensor = None  # type: ignore[assignment]
            _check(_driver().cuMemFree_v2(self.pointer), "freeing a shared buffer")
            self.pointer = 0
            note_outside(self.device, -self.nbytes, self.apart)


def address_range(pointer: int) -> tuple[int, int]:
    """(base, size) of the allocation that holds `pointer`."""
    base, size = ctypes.c_uint64(), ctypes.c_size_t()
    _check(_driver().cuMemGetAddressRange_v2(ctypes.byref(base), ctypes.byref(size), pointer), "finding an allocation")
    return base.value, size.value


def export_handle(pointer: int) -> tuple[bytes, int]:
    """(IPC handle of the allocation holding `pointer`, `pointer`'s byte offset in it)."""
    base, _ = address_range(pointer)
    handle = _Handle()
    _check(_driver().cuIpcGetMemHandle(ctypes.byref(handle), base), "sharing an output")
    return ctypes.string_at(ctypes.addressof(handle), 64), pointer - base


def open_handle(handle: bytes, device: torch.device) -> tuple[int, int]:
    """(pointer, size) of another process's allocation, mapped here (`close_opened` unmaps it)."""
    if len(handle) != 64:
        raise IpcError(f"a memory handle is 64 bytes, not {len(handle)}")
    _current(device)
    raw = _Handle()
    ctypes.memmove(ctypes.addressof(raw), handle, 64)
    pointer = ctypes.c_uint64()
    _check(_driver().cuIpcOpenMemHandle_v2(ctypes.byref(pointer), raw, 1), "opening a shared buffer")
    _, size = address_range(pointer.value)
    return pointer.value, size


def close_opened(pointer: int) -> None:
    _check(_driver().cuIpcCloseMemHandle(pointer), "closing a shared buffer")
