"""One file lock for the project: builds of one folder, the precompiled header, work on a GPU.

    with file_lock(path):                 # exclusive (builds, the header, a timing)
    with file_lock(gpu_lock, shared=True):   # shared: a correctness run, alongside others
    with file_lock(gpu_lock):             # exclusive: a re-timing, with no correctness run beside it

Shared holders run together; an exclusive holder runs alone. A waiting exclusive locker goes
first: shared lockers that arrive after it wait until it is done, so a steady stream of
correctness runs cannot hold a re-timing back for ever (plain `flock` gives no such order).
"""

from __future__ import annotations

import contextlib
import fcntl
from pathlib import Path
from typing import Iterator

__all__ = ["file_lock", "gate_path", "gpu_hold", "gpu_lock_path"]


def gate_path(path: str | Path) -> Path:
    """The second file beside `path` that orders lockers (see `file_lock`)."""
    path = Path(path)
    return path.with_name(path.name + ".gate")


@contextlib.contextmanager
def _flock(path: str | Path, operation: int) -> Iterator[None]:
    with open(path, "a") as f:
        fcntl.flock(f, operation)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


@contextlib.contextmanager
def file_lock(path: str | Path, shared: bool = False) -> Iterator[None]:
    """Holds a lock on `path` (created if missing) against other threads and processes; the
    kernel releases it if the process dies.

    `shared=False` (the default): exclusive, no other holder of either kind. `shared=True`: held
    together with other shared holders, never with an exclusive one.

    Order: an exclusive locker first takes the gate file (`gate_path`) and keeps it until it is
    done; a shared locker passes through the gate (takes it and lets it go at once) before it
    takes `path`. So once an exclusive locker is waiting, later shared lockers queue behind it
    instead of overtaking it. Every lock is taken on its own open file, so holds on one path do
    not nest: a thread or process that holds `path` and asks for it again (exclusively, or shared
    while an exclusive locker waits at the gate) waits for itself. Release a hold before taking
    the next (the two kinds are never upgraded in place)."""
    gate = gate_path(path)
    if shared:
        with _flock(gate, fcntl.LOCK_EX):
            pass  # wait while an exclusive locker holds or waits at the gate
        with _flock(path, fcntl.LOCK_SH):
            yield
        return
    with _flock(gate, fcntl.LOCK_EX), _flock(path, fcntl.LOCK_EX):
        yield


def gpu_hold(path: str | Path | None, shared: bool) -> contextlib.AbstractContextManager[None]:
    """`file_lock(path, shared)`, or nothing held where no lock path is given (a job run alone)."""
    return file_lock(path, shared=shared) if path else contextlib.nullcontext()


def gpu_lock_path(build_root: str | Path, index: int | None) -> Path:
    """The GPU lock of every judge (and graph check) using the build folder `build_root`: one file
    per GPU, `gpu<index>.lock` (the current device's index for None)."""
    if index is None:
        import torch

        index = torch.cuda.current_device()
    return Path(build_root) / f"gpu{index}.lock"
