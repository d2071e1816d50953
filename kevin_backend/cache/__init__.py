"""The kernel cache: keys, entries, and the on-disk store (user cache in front of the seed cache)."""

from kevin_backend.cache.disk_format import ENTRY_FORMAT, entry_metadata
from kevin_backend.cache.errors import ArchiveError, KernelCacheError, ReadOnlyEntryError, UnsafeArchiveError
from kevin_backend.cache.format import CacheEntry, EntryKind, PendingTask, Timings, now_iso
from kevin_backend.cache.key import (
    SCHEMA_VERSION,
    CacheKey,
    DeviceInfo,
    VersionTarget,
    default_numerics,
    is_digest,
    make_key,
    numerics_settings,
)
from kevin_backend.cache.store import KernelCache, default_seed_dir
from kevin_backend.cache.store_reports import EntryInfo, ImportReport, PruneReport, VersionGroup

__all__ = [
    "SCHEMA_VERSION",
    "DeviceInfo",
    "CacheKey",
    "make_key",
    "numerics_settings",
    "default_numerics",
    "VersionTarget",
    "EntryKind",
    "Timings",
    "CacheEntry",
    "PendingTask",
    "now_iso",
    "ENTRY_FORMAT",
    "EntryInfo",
    "ImportReport",
    "PruneReport",
    "VersionGroup",
    "ArchiveError",
    "KernelCache",
    "KernelCacheError",
    "ReadOnlyEntryError",
    "UnsafeArchiveError",
    "default_seed_dir",
    "entry_metadata",
    "is_digest",
]
