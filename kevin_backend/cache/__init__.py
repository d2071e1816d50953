"""The kernel cache: keys, entries, and the on-disk store (user cache in front of the seed cache)."""

from kevin_backend.cache.entry import CacheEntry, EntryKind, PendingTask, Timings, now_iso
from kevin_backend.cache.key import SCHEMA_VERSION, CacheKey, DeviceInfo, make_key
from kevin_backend.cache.store import (
    ENTRY_FORMAT,
    EntryInfo,
    ImportReport,
    KernelCache,
    KernelCacheError,
    ReadOnlyEntryError,
    UnsafeArchiveError,
    default_seed_dir,
    entry_metadata,
    is_digest,
)

__all__ = [
    "SCHEMA_VERSION",
    "DeviceInfo",
    "CacheKey",
    "make_key",
    "EntryKind",
    "Timings",
    "CacheEntry",
    "PendingTask",
    "now_iso",
    "ENTRY_FORMAT",
    "EntryInfo",
    "ImportReport",
    "KernelCache",
    "KernelCacheError",
    "ReadOnlyEntryError",
    "UnsafeArchiveError",
    "default_seed_dir",
    "entry_metadata",
    "is_digest",
]
