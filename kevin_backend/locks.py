"""One file lock for the project: builds of one folder, the precompiled header, timings on a GPU."""

from __future__ import annotations

import contextlib
import fcntl
from pathlib import Path
from typing import Iterator

__all__ = ["file_lock"]


@contextlib.contextmanager
def file_lock(path: str | Path) -> Iterator[None]:
    """Holds an exclusive lock on `path` (created if missing) against other threads and processes;
    the kernel releases it if the process dies."""
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
