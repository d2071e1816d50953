"""How much GPU memory one process holds, as the driver counts it (NVML), read from outside
that process: what a candidate's process says of itself is never asked.

    process_gpu_bytes(pid, device)   # bytes, or None where NVML or the count is not available

The driver's count covers everything the process holds on the device: its context, torch's
caching allocator (blocks in use and cached), and memory it allocated past torch. The device is
found by its UUID, so CUDA_VISIBLE_DEVICES' renumbering does not matter. NVML is reached through
ctypes (`libnvidia-ml.so.1`, installed with the driver); where it is missing the answer is None
and the caller keeps to what it can see itself.
"""

from __future__ import annotations

import ctypes
import threading
from typing import Any

__all__ = ["process_gpu_bytes"]

_LOCK = threading.Lock()
_STATE: dict[str, Any] = {}
_SUCCESS, _INSUFFICIENT_SIZE = 0, 7
_NOT_AVAILABLE = (1 << 64) - 1


class _ProcessInfo(ctypes.Structure):  # nvmlProcessInfo_t (v2 and v3 of the call share it)
    _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong),
                ("gpuInstanceId", ctypes.c_uint), ("computeInstanceId", ctypes.c_uint)]


def _nvml() -> Any:
    """The library, initialised once; None where it cannot be loaded or started."""
    with _LOCK:
        if "lib" not in _STATE:
            try:
                lib = ctypes.CDLL("libnvidia-ml.so.1")
                lib.nvmlInit_v2.restype = ctypes.c_int
                ok = lib.nvmlInit_v2() == _SUCCESS
                _STATE["lib"] = lib if ok else None
            except (OSError, AttributeError):
                _STATE["lib"] = None
        return _STATE["lib"]


def _handle(lib: Any, device: Any) -> Any:
    import torch

    uuid = str(torch.cuda.get_device_properties(device).uuid)
    key = f"handle-{uuid}"
    if key not in _STATE:
        handle = ctypes.c_void_p()
        name = uuid if uuid.startswith(("GPU-", "MIG-")) else f"GPU-{uuid}"
        status = lib.nvmlDeviceGetHandleByUUID(name.encode(), ctypes.byref(handle))
        _STATE[key] = handle if status == _SUCCESS else None
    return _STATE[key]


def process_gpu_bytes(pid: int, device: Any) -> int | None:
    """Bytes process `pid` holds on `device` (a torch device), as the driver counts them: 0 when it
    holds nothing there, None when the count cannot be read (no NVML, no permission, a driver that
    does not report per-process memory)."""
    lib = _nvml()
    if lib is None:
        return None
    try:
        handle = _handle(lib, device)
    except Exception:  # noqa: BLE001 - no UUID for the device: no count
        return None
    if handle is None:
        return None
    for name in ("nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetComputeRunningProcesses_v2"):
        function = getattr(lib, name, None)
        if function is None:
            continue
        count = ctypes.c_uint(0)
        status = function(handle, ctypes.byref(count), None)
        if status == _SUCCESS:
            return 0  # no process holds memory there
        if status != _INSUFFICIENT_SIZE:
            return None
        count.value = count.value * 2 + 8  # room for processes that start meanwhile
        infos = (_ProcessInfo * count.value)()
        if function(handle, ctypes.byref(count), infos) != _SUCCESS:
            return None
        for info in infos[:count.value]:
            if info.pid == pid:
                return None if info.usedGpuMemory == _NOT_AVAILABLE else int(info.usedGpuMemory)
        return 0
    return None
