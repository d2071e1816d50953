"""Values passed between the judge and a candidate's process without the candidate entering the
judge's process: inputs in memory the judge owns and shares, outputs read back by the judge.

    arena = Arena(nbytes, device, folder)                 # the judge's: a GPU buffer or a file
    descs, views = place(values, arena, offset)           # the values copied in, with their layouts
    values = wrap(descs, arenas)                           # (the candidate's process) the same memory
    descs = export_outputs(outputs, ...)                   # (the candidate's process) where they are
    outputs = OutputReader(device, folder).read(descs)     # the judge: checked, copied, its own

Every tensor keeps its sizes, strides and storage offset (its whole storage is copied, so
broadcasts, transposes and offsets arrive as the task makes them); inputs that share a storage
share it in the arena too. A description is JSON: a description the candidate's process sends is
checked before anything is read (dtype known, sizes and strides non-negative integers, the extent
inside the memory it names, a file name without a path).

On a GPU the memory is shared through CUDA IPC (`cuda_ipc.py`); on a CPU through files in a
folder of the judge's, mapped by both processes.
"""

from __future__ import annotations

import itertools
import os
import stat
from pathlib import Path
from typing import Any, Sequence

import torch

__all__ = ["Arena", "OutputReader", "SharedValueError", "arena_bytes", "export_outputs", "open_arena", "place", "views_at",
           "wrap"]

_ALIGN = 256
_DTYPES = {str(d).removeprefix("torch."): d for d in (
    torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.int16, torch.int8,
    torch.uint8, torch.bool, torch.complex64, torch.complex128, torch.float8_e4m3fn, torch.float8_e5m2)}
_IDS = itertools.count()


class SharedValueError(ValueError):
    """A description that does not describe memory it may name (the candidate's failure when it sent it)."""


def _storage_bytes(t: torch.Tensor) -> torch.Tensor:
    """The tensor's whole storage as uint8 (no copy)."""
    storage = t.untyped_storage()
    flat = torch.empty(0, dtype=torch.uint8, device=t.device)
    flat.set_(storage, 0, (storage.nbytes(),), (1,))
    return flat


def _aligned(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


def arena_bytes(values: Sequence[Any]) -> int:
    """Bytes `place` needs for `values` (each storage once, aligned)."""
    seen: dict[int, int] = {}
    for v in values:
        if isinstance(v, torch.Tensor):
            seen.setdefault(v.untyped_storage().data_ptr(), _aligned(v.untyped_storage().nbytes()))
    return sum(seen.values())


class Arena:
    """Memory of the judge's own that a candidate's process may map: a `cuda_ipc.DeviceBuffer` on a
    GPU, a file in `folder` on a CPU. Holds nothing but what is placed in it.

    Freed only when its maker and every process it was shared with are done with it (`hold` for
    each, `release` by each): a process that still maps it, alive, never sees its memory handed to
    anything else of the judge's."""

    def __init__(self, nbytes: int, device: torch.device, folder: Path, apart: str = "") -> None:
        self.id = next(_IDS)
        self.device = device
        self.nbytes = max(_ALIGN, _aligned(nbytes))
        self.holders = 1  # its maker
        self._buffer: Any = None
        if device.type == "cuda":
            from kevin_backend.judge.cuda_ipc import DeviceBuffer

            self._buffer = DeviceBuffer(self.nbytes, device, apart=apart)  # (an allowance of its own: `note_outside`)
            self.tensor = self._buffer.tensor
            self.desc = {"id": self.id, "kind": "cuda", "handle": self._buffer.handle.hex(), "nbytes": self.nbytes}
        else:
            name = f"arena-{os.getpid()}-{self.id}"
            path = folder / name
            with open(path, "wb") as f:
                f.truncate(self.nbytes)
            self.tensor = torch.from_file(str(path), shared=True, size=self.nbytes, dtype=torch.uint8)
            self.desc = {"id": self.id, "kind": "file", "name": name, "nbytes": self.nbytes}
            self._path = path

    def hold(self) -> None:
        self.holders += 1

    def release(self) -> None:
        """One holder done with it; the last one frees it."""
        self.holders -= 1
        if self.holders <= 0:
            self.close()

    def close(self) -> None:
        self.tensor = None  # type: ignore[assignment]
        if self._buffer is not None:
            self._buffer.free()
            self._buffer = None
        elif getattr(self, "_path", None) is not None:
            self._path.unlink(missing_ok=True)
            self._path = None


def place(values: Sequence[Any], arena: Arena, offset: int = 0) -> tuple[list[dict[str, Any]], list[Any]]:
    """Copy `values` into `arena` from byte `offset`: their descriptions (for the candidate's
    process) and the judge's own views of the same memory (same layouts)."""
    chunks: dict[int, int] = {}
    descs: list[dict[str, Any]] = []
    views: list[Any] = []
    at = offset
    for v in values:
        if not isinstance(v, torch.Tensor):
            descs.append({"kind": "value", "value": v})
            views.append(v)
            continue
        key = v.untyped_storage().data_ptr()
        nbytes = v.untyped_storage().nbytes()
        if key not in chunks:
            if at + nbytes > arena.nbytes:
                raise ValueError(f"the values need more than the arena's {arena.nbytes} bytes")
            chunks[key] = at
            if nbytes:
                arena.tensor[at:at + nbytes].copy_(_storage_bytes(v))
            at += _aligned(nbytes)
        start = chunks[key]
        desc = {"kind": "tensor", "arena": arena.id, "offset": start, "nbytes": nbytes,
                "dtype": str(v.dtype).removeprefix("torch."), "size": list(v.shape), "stride": list(v.stride()),
                "storage_offset": v.storage_offset()}
        descs.append(desc)
        views.append(_view(arena.tensor, desc))
    return descs, views


def _view(memory: torch.Tensor, desc: dict[str, Any]) -> torch.Tensor:
    """The described tensor over `memory` (a uint8 tensor of its own storage, from offset 0)."""
    dtype = _DTYPES[desc["dtype"]]
    start, nbytes = desc["offset"], desc["nbytes"]
    size = dtype.itemsize
    if nbytes == 0:
        return torch.empty(desc["size"], dtype=dtype, device=memory.device)
    if start % size or memory.numel() % size:
        raise SharedValueError("a shared tensor is not aligned to its element size")
    return torch.as_strided(memory.view(dtype), desc["size"], desc["stride"], start // size + desc["storage_offset"])


def views_at(descs: Sequence[dict[str, Any]], memory: torch.Tensor, base: int) -> list[Any]:
    """The values `place` described from byte `base` of an arena, over `memory` instead (a copy of
    the arena's bytes from `base` on: the judge's own, out of the candidate's reach)."""
    return [d["value"] if d["kind"] == "value" else _view(memory, {**d, "offset": d["offset"] - base}) for d in descs]


def open_arena(desc: dict[str, Any], device: torch.device, folder: Path) -> torch.Tensor:
    """(The candidate's process) an arena the judge shared, as a uint8 tensor."""
    if desc["kind"] == "cuda":
        from kevin_backend.judge.cuda_ipc import open_handle, tensor_at

        pointer, size = open_handle(bytes.fromhex(desc["handle"]), device)
        return tensor_at(pointer, min(size, desc["nbytes"]), device)
    return torch.from_file(str(folder / desc["name"]), shared=True, size=desc["nbytes"], dtype=torch.uint8)


def wrap(descs: Sequence[dict[str, Any]], arenas: dict[int, torch.Tensor]) -> list[Any]:
    """(The candidate's process) the values `place` described, over the opened arenas."""
    return [d["value"] if d["kind"] == "value" else _view(arenas[d["arena"]], d) for d in descs]


def _extent(size: Sequence[int], stride: Sequence[int]) -> int:
    if any(n == 0 for n in size):
        return 0
    return 1 + sum((n - 1) * s for n, s in zip(size, stride))


def export_outputs(outputs: Sequence[Any], device: torch.device, folder: Path, tag: str,
                   handles: dict[int, tuple[bytes, int]], copies: list[Any]) -> list[dict[str, Any]]:
    """(The candidate's process) where each output is: on a GPU its allocation's IPC handle (cached
    per allocation in `handles`) and offset, on a CPU a file of its bytes in `folder`. An output in
    memory the process did not allocate (an input it returns) is copied first: the copies go into
    `copies`, to be kept until the judge has read them, and are finished before this returns."""
    descs = []
    copied = False
    for k, out in enumerate(outputs):
        if not isinstance(out, torch.Tensor):
            descs.append({"kind": "value", "value": out if isinstance(out, (int, float, bool, str, type(None))) else repr(out)})
            continue
        desc: dict[str, Any] = {"kind": "tensor", "dtype": str(out.dtype).removeprefix("torch."), "size": list(out.shape),
                                "stride": list(out.stride())}
        if out.device.type == "cuda" and out.numel():
            from kevin_backend.judge.cuda_ipc import IpcError, address_range, export_handle

            base, size = address_range(out.data_ptr())
            if base not in handles or handles[base][1] != size:
                try:
                    handles[base] = (export_handle(base)[0], size)
                except IpcError:  # memory this process did not allocate (an input it returns): a copy of its own
                    out = torch.as_strided(out, out.shape, out.stride()).clone(memory_format=torch.preserve_format)
                    copies.append(out)
                    copied = True
                    base, size = address_range(out.data_ptr())
                    handles[base] = (export_handle(base)[0], size)
                    desc["stride"] = list(out.stride())
            desc.update(handle=handles[base][0].hex(), offset=out.data_ptr() - base)
        elif out.numel():
            extent = _extent(out.shape, out.stride())
            flat = torch.as_strided(out.detach(), (extent,), (1,), out.storage_offset()).cpu().contiguous()
            name = f"out-{tag}-{k}"
            with open(folder / name, "wb") as f:
                f.write(flat.view(torch.uint8).numpy().tobytes())
            desc.update(file=name, device=str(out.device))
        else:
            desc.update(device=str(out.device))
        descs.append(desc)
    if copied:  # (the judge reads as soon as the reply comes: a copy still queued would show what its block held before)
        torch.cuda.synchronize(device)
    return descs


class OutputReader:
    """The judge's side of a candidate's outputs: each description checked, the memory it names
    mapped (GPU allocations once each, unmapped by `close`) and copied into the judge's own tensor."""

    def __init__(self, device: torch.device, folder: Path) -> None:
        self.device = device
        self.folder = folder
        self.opened: dict[bytes, tuple[int, int]] = {}

    def read(self, descs: Any, copy: bool = True) -> list[Any]:
        """The described outputs: copies of the judge's own, or (not `copy`; a GPU's outputs only)
        views of the process's memory, valid while it is mapped and for reading at once."""
        if not isinstance(descs, list):
            raise SharedValueError("the outputs' description is not a list")
        return [self._one(d, copy) for d in descs]

    def claimed_bytes(self, descs: Any) -> int:
        """The bytes the tensors in `descs` span, as described (malformed descriptions count 0)."""
        total = 0
        for d in descs if isinstance(descs, list) else []:
            dtype = _DTYPES.get(d.get("dtype")) if isinstance(d, dict) else None  # type: ignore[arg-type]
            size, stride = (d.get("size"), d.get("stride")) if isinstance(d, dict) else (None, None)
            if dtype is not None and _ints(size) and _ints(stride) and len(size) == len(stride):
                total += _extent(size, stride) * dtype.itemsize
        return total

    def _one(self, d: Any, copy: bool = True) -> Any:
        if not isinstance(d, dict) or d.get("kind") not in ("tensor", "value"):
            raise SharedValueError(f"an output description is not understood: {str(d)[:200]}")
        if d["kind"] == "value":
            return d.get("value")
        dtype = _DTYPES.get(d.get("dtype"))  # type: ignore[arg-type]
        size, stride = d.get("size"), d.get("stride")
        if dtype is None or not _ints(size) or not _ints(stride) or len(size) != len(stride):
            raise SharedValueError(f"an output's dtype, sizes or strides are not valid: {str(d)[:200]}")
        count = _extent(size, stride)
        nbytes = count * dtype.itemsize
        if count == 0:
            return torch.empty(size, dtype=dtype, device=self.device)
        if "handle" in d and self.device.type == "cuda":
            return self._from_gpu(d, dtype, size, stride, nbytes, copy)
        if "file" in d:
            return self._from_file(d, dtype, size, stride, nbytes)
        raise SharedValueError("an output names no memory the judge can read")

    def _from_gpu(self, d: dict[str, Any], dtype: torch.dtype, size: list[int], stride: list[int], nbytes: int,
                  copy: bool = True) -> torch.Tensor:
        from kevin_backend.judge.cuda_ipc import open_handle, tensor_at

        try:
            handle = bytes.fromhex(str(d["handle"]))
        except ValueError:
            raise SharedValueError("an output's memory handle is not hex") from None
        offset = d.get("offset")
        if not isinstance(offset, int) or isinstance(offset, bool) or offset < 0 or offset % dtype.itemsize:
            raise SharedValueError(f"an output's offset is not valid: {offset!r}")
        if handle not in self.opened:
            self.opened[handle] = open_handle(handle, self.device)
        pointer, size_bytes = self.opened[handle]
        if offset + nbytes > size_bytes:
            raise SharedValueError(f"an output claims {nbytes} bytes at offset {offset} of an allocation of {size_bytes}")
        flat = tensor_at(pointer + offset, nbytes, self.device).view(dtype)
        view = torch.as_strided(flat, size, stride)
        return view.clone() if copy else view

    def _from_file(self, d: dict[str, Any], dtype: torch.dtype, size: list[int], stride: list[int], nbytes: int) -> torch.Tensor:
        name = d["file"]
        if not isinstance(name, str) or "/" in name or name.startswith("."):
            raise SharedValueError(f"an output's file name is not valid: {str(name)[:100]}")
        fd = os.open(self.folder / name, os.O_RDONLY | os.O_NOFOLLOW)
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode) or info.st_size != nbytes:
                raise SharedValueError(f"an output's file holds {info.st_size} bytes, not {nbytes}")
            data = bytearray()
            while len(data) < nbytes:
                chunk = os.read(fd, nbytes - len(data))
                if not chunk:
                    break
                data.extend(chunk)
        finally:
            os.close(fd)
        flat = torch.frombuffer(data, dtype=dtype).to(self.device)
        return torch.as_strided(flat, size, stride).clone()

    def close(self) -> None:
        if self.opened:
            from kevin_backend.judge.cuda_ipc import close_opened

            torch.cuda.synchronize(self.device)
            for pointer, _ in self.opened.values():
                try:
                    close_opened(pointer)
                except Exception:  # noqa: BLE001 - the mapping goes with the process anyway
                    pass
            self.opened.clear()


def _ints(values: Any) -> bool:
    return isinstance(values, list) and len(values) <= 16 and all(
        isinstance(v, int) and not isinstance(v, bool) and 0 <= v < (1 << 48) for v in values)
