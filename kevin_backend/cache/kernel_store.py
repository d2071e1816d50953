"""What the backend and the runtime need of a kernel cache: `KernelStore`.

`store.KernelCache` is one (the user cache in front of the seed cache); the kevin pass looks
partitions up in it (and, in generate mode, the same task's kernels made elsewhere), stores what a generator decided and records misses as pending; the runtime
loads the kernels compiled code names by digest from it; the graph check keys its stored
outcomes by its fingerprint and takes the GPU lock of its judges under its folder.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from kevin_backend.cache.format import CacheEntry
from kevin_backend.cache.key import CacheKey
from kevin_backend.types import KernelTask

__all__ = ["KernelStore"]


class KernelStore(Protocol):
    """A kernel cache as the backend and the runtime use it."""

    @property
    def cache_dir(self) -> Path:
        """The cache's own folder (its judges' builds and GPU locks live under it)."""
        ...

    def get(self, key: CacheKey) -> CacheEntry | None:
        """The entry for `key`, None on a miss."""
        ...

    def get_digest(self, digest: str) -> CacheEntry | None:
        """The entry whose key has this digest, None on a miss."""
        ...

    def elsewhere(self, key: CacheKey) -> list[CacheEntry]:
        """The KERNEL entries for `key`'s task made for another GPU, torch or CUDA (known
        candidates that generate mode judges again before it searches)."""
        ...

    def put(self, entry: CacheEntry, replace: bool = False) -> bool:
        """Store `entry`; whether it was written."""
        ...

    def record_pending(self, key: CacheKey, task: KernelTask) -> bool:
        """Record a miss as a task to generate later; whether it was new."""
        ...

    def fingerprint(self) -> str:
        """Changes whenever what the cache holds changes."""
        ...
