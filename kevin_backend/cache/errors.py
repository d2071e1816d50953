"""The cache's errors (one module, so the store, the folder operations, the entry format and the
archive code share them)."""

from __future__ import annotations

__all__ = ["KernelCacheError", "ReadOnlyEntryError", "UnsafeArchiveError", "ArchiveError", "CorruptFolderError"]


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


class CorruptFolderError(Exception):
    """An entry folder (or archive group) that cannot be trusted; the message names the problem.

    Internal to the cache: a lookup skips such a folder with a warning, `put` turns it into a
    ValueError, an import reports it; it never reaches a caller of `KernelCache` as itself."""
