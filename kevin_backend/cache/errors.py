"""The cache's errors (one module, so the store and the archive code share them)."""

from __future__ import annotations

__all__ = ["KernelCacheError", "ReadOnlyEntryError", "UnsafeArchiveError", "ArchiveError"]


class KernelCacheError(Exception):
    """A cache operation could not be done; the message says why."""


class ReadOnlyEntryError(KernelCacheError):
    """The operation would modify the seed cache, which is read-only."""


class UnsafeArchiveError(KernelCacheError):
    """An archive holds paths that would escape the cache (absolute, `..`, links); nothing is imported."""


class ArchiveError(KernelCacheError):
    """The archive path given cannot be used as asked: an import of a file that is missing, a
    folder, empty, not an archive or a damaged one; an export into a folder that does not exist
    or onto a folder. The message names the path and what is wrong (a usage error for the CLI)."""
