"""The on-disk kernel cache: a read-write user cache in front of a read-only seed cache.

Layout of the user cache (`cache_dir`)::

    index/              a diskcache.Cache: "entry/<digest>" -> summary dict, "generation" -> int
    entries/<digest>/   task.py, kernel.py (KERNEL entries only), meta.json
    pending/<digest>/   task.py, meta.json: cache misses waiting for `kevin prewarm`

The seed cache is `<seed_dir>/<digest>/` with the same three files and no index.

The entry folders are the truth. They are plain files so that a person can read, diff and share
them; the index holds only summaries and the generation counter behind `fingerprint()`, and may be
missing or stale without harm. Every folder is built under a temporary name and renamed into
place, so a reader sees either no entry or a complete one. meta.json records the sha256 of the
source files, so truncation or a hand edit is detected and the entry is skipped, never used.

What the files of a folder hold is `disk_format.py`; how a folder is written, read and removed
safely is `folders.py`; this module is the store built on them (lookups, writes, pending tasks,
the fingerprint, export/import/prune) and `store_reports.py` holds what its listings return.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.resources
import logging
import sqlite3
import threading
from enum import Enum
from pathlib import Path
from typing import Any, Final, Iterator

import diskcache

from kevin_backend.cache.archive import read_archive, write_archive
from kevin_backend.cache.disk_format import (
    ENTRY_FILES,
    META_FILE,
    PENDING_FILES,
    format_is_older,
    parse_entry,
    parse_pending,
    peek_key,
    serialize_entry,
    serialize_pending,
)
from kevin_backend.cache.errors import CorruptFolderError, KernelCacheError, ReadOnlyEntryError, UnsafeArchiveError
from kevin_backend.cache.folders import (
    digest_folders,
    install_folder,
    load_folder,
    remove_folder,
    sweep_stale_temporaries,
)
from kevin_backend.cache.format import CacheEntry, EntryKind, PendingTask
from kevin_backend.cache.key import CacheKey, VersionTarget, is_digest
from kevin_backend.cache.store_reports import EntryInfo, ImportReport, PruneReport, VersionGroup
from kevin_backend.config import Config
from kevin_backend.types import KernelTask

__all__ = ["KernelCache", "default_seed_dir"]

log = logging.getLogger("kevin_backend")

# Entries are source code and JSON; a bigger archive member is not one of ours.
_MAX_MEMBER_BYTES: Final = 16 * 1024 * 1024


def _check_digest(digest: str) -> None:
    # Digests become path components: anything else could point outside the cache.
    if not is_digest(digest):
        raise ValueError(f"not a cache entry digest (32 lowercase hex digits): {digest!r}")


def default_seed_dir() -> Path | None:
    """The seed cache shipped with the package (`kevin_backend.kernels_cache`), or None if absent.

    pyproject.toml maps the repository's top-level `kernels_cache/` folder to that package when
    installed. In a source checkout that is not installed the package does not exist, so the
    folder next to the source tree is used instead.
    """
    try:
        root = importlib.resources.files("kevin_backend.kernels_cache")
    except ModuleNotFoundError:
        checkout = Path(__file__).resolve().parents[2] / "kernels_cache"
        return checkout if checkout.is_dir() else None
    # A zipped install has no folder to read entries from: no seed cache then.
    return root if isinstance(root, Path) and root.is_dir() else None


def _load_entry_folder(folder: Path) -> CacheEntry | None:
    return load_folder(folder, ENTRY_FILES, parse_entry)


def _load_pending_folder(folder: Path) -> PendingTask | None:
    return load_folder(folder, PENDING_FILES, parse_pending)


@functools.lru_cache(maxsize=None)
def _seed_fingerprint(seed_dir: str) -> str:
    """A hash of the seed entries' names and meta.json bytes (which hold the sources' sha256).

    Computed once per process and seed folder: the seed is read-only while the package runs.
    """
    digest = hashlib.sha256()
    for folder in digest_folders(Path(seed_dir)):
        digest.update(folder.name.encode() + b"\0")
        try:
            digest.update((folder / META_FILE).read_bytes())
        except OSError:
            digest.update(b"<unreadable>")
        digest.update(b"\0")
    return digest.hexdigest()[:16]


class _Default(Enum):
    SEED_DIR = "default seed dir"


# ---------------------------------------------------------------------------------------------
# The cache.


class KernelCache:
    """The user kernel cache in `cache_dir`, backed by the read-only seed cache in `seed_dir`.

    Lookups consult the user cache first, then the seed, so a user's own measurement on their
    machine overrides what shipped with the package. Writes go to the user cache only. Corrupt
    entries never raise from a lookup: they are skipped with a warning and the lookup continues.
    Safe to use from several processes at once (folders are installed by atomic rename).
    """

    def __init__(self, cache_dir: Path, seed_dir: Path | None | _Default = _Default.SEED_DIR) -> None:
        """`seed_dir` defaults to the packaged seed cache (`default_seed_dir()`); None disables it."""
        self.cache_dir = Path(cache_dir).expanduser()
        if seed_dir is _Default.SEED_DIR:
            seed_dir = default_seed_dir()
        self.seed_dir: Path | None = None if seed_dir is None else Path(seed_dir).expanduser()
        self._entries_dir = self.cache_dir / "entries"
        self._pending_dir = self.cache_dir / "pending"
        self._index_dir = self.cache_dir / "index"
        self._index: diskcache.Cache | None = None
        self._index_lock = threading.Lock()

    @classmethod
    def from_config(cls, config: Config) -> "KernelCache":
        return cls(config.cache_dir, default_seed_dir() if config.seed_cache else None)

    def __repr__(self) -> str:
        seed = str(self.seed_dir) if self.seed_dir is not None else None
        return f"KernelCache(cache_dir={str(self.cache_dir)!r}, seed_dir={seed!r})"

    def close(self) -> None:
        """Close the index's database connection (it reopens on demand)."""
        with self._index_lock:
            if self._index is not None:
                self._index.close()
                self._index = None

    def __enter__(self) -> "KernelCache":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- the index -----------------------------------------------------------------------------

    def _open_index(self, create: bool) -> diskcache.Cache | None:
        # Opened lazily so that constructing a cache (or reading an absent one) creates nothing.
        with self._index_lock:
            if self._index is None:
                if not create and not self._index_dir.is_dir():
                    return None
                self._index = diskcache.Cache(str(self._index_dir))
            return self._index

    def _note_change(self, digest: str | None, summary: dict[str, Any] | None) -> None:
        """Record a change of the user entries in the index: the summary and a new generation.

        Called after the folders changed; if the index cannot be written the folders (the truth)
        are still right, and fingerprint() still moves because it also reads the entries
        folder's mtime, so a warning is enough.
        """
        try:
            index = self._open_index(create=True)
            assert index is not None
            with index.transact():
                if digest is not None:
                    if summary is None:
                        index.delete(f"entry/{digest}")
                    else:
                        index.set(f"entry/{digest}", summary, tag="entry")
                else:
                    index.evict("entry")
                index.incr("generation", default=0)
        except (sqlite3.Error, OSError, diskcache.Timeout) as exc:
            log.warning("kernel cache index %s could not be updated (%s); entries are unaffected", self._index_dir, exc)

    def _generation(self) -> int:
        try:
            index = self._open_index(create=False)
            return 0 if index is None else int(index.get("generation", 0))
        except (sqlite3.Error, OSError, diskcache.Timeout, ValueError, TypeError):
            return -1

    @staticmethod
    def _summary(entry: CacheEntry) -> dict[str, Any]:
        return {
            "kind": entry.kind.value,
            "ops": list(entry.task.ops),
            "policy": entry.policy,
            "created": entry.created,
            "speedup_vs_inductor": entry.speedup_vs_inductor,
        }

    def fingerprint(self) -> str:
        """A short string that changes whenever the entries a lookup could return change.

        Cheap enough for every compile: the index's generation counter (bumped atomically by
        put/remove/clear/import), the entries folder's mtime (which also catches folders added or
        deleted by hand, or a lost index), and a hash of the seed cache computed once per process.
        Pending tasks are not part of it: recording a miss does not change what compiles.
        A put that finds the entry already there may still move it (its temporary folder touches
        the mtime): a spurious change costs a recompile, a missed one would reuse stale code.
        """
        try:
            mtime = self._entries_dir.stat().st_mtime_ns
        except FileNotFoundError:
            mtime = 0
        seed = _seed_fingerprint(str(self.seed_dir)) if self.seed_dir is not None else "no-seed"
        text = f"{self._generation()}:{mtime}:{seed}"
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    # -- lookups -------------------------------------------------------------------------------

    def _locations(self, digest: str) -> Iterator[tuple[str, Path]]:
        yield "user", self._entries_dir / digest
        if self.seed_dir is not None:
            yield "seed", self.seed_dir / digest

    def get(self, key: CacheKey) -> CacheEntry | None:
        """The entry for `key` (user cache, then seed), or None. Never raises for a bad entry."""
        return self.get_digest(key.digest)

    def get_digest(self, digest: str) -> CacheEntry | None:
        """The entry named `digest` (user cache, then seed), or None; corrupt ones are skipped."""
        _check_digest(digest)
        for source, folder in self._locations(digest):
            try:
                entry = _load_entry_folder(folder)
            except CorruptFolderError as exc:
                hint = f" (remove it with `kevin cache rm {digest[:12]}`)" if source == "user" else ""
                log.warning("skipping corrupt kernel cache entry %s: %s%s", folder, exc, hint)
                continue
            except OSError as exc:  # e.g. permission denied on the folder itself
                log.warning("skipping unreadable kernel cache entry %s: %s", folder, exc)
                continue
            if entry is not None:
                return entry
        return None

    def entries(self) -> list[EntryInfo]:
        """Every user and seed entry folder, user first; corrupt ones carry `error`."""
        infos: list[EntryInfo] = []
        for source, root in (("user", self._entries_dir), ("seed", self.seed_dir)):
            for folder in digest_folders(root):
                info = self._describe(folder, source)
                if info is not None:
                    infos.append(info)
        return sorted(infos, key=lambda info: (info.source != "user", info.created, info.digest))

    @staticmethod
    def _describe(folder: Path, source: str) -> EntryInfo | None:
        try:
            entry = _load_entry_folder(folder)
        except (CorruptFolderError, OSError) as exc:
            return EntryInfo(digest=folder.name, source=source, path=folder, error=str(exc))
        if entry is None:  # removed while we listed
            return None
        return EntryInfo(
            digest=entry.digest,
            source=source,
            path=folder,
            kind=entry.kind,
            ops=entry.task.ops,
            policy=entry.policy,
            created=entry.created,
            timings=entry.timings,
            entry=entry,
        )

    def elsewhere(self, key: CacheKey) -> list[CacheEntry]:
        """The KERNEL entries for `key`'s task made for another GPU, torch or CUDA version
        (`CacheKey.same_task`): known candidates to judge again here before any search. User
        entries first, then the seed's, newest first in each. Folders are told apart by their
        meta.json alone; only the matching ones are read in full (corrupt ones skipped)."""
        found: list[CacheEntry] = []
        for root in (self._entries_dir, self.seed_dir):
            entries = []
            for folder in digest_folders(root):
                other, problem = peek_key(folder)
                if other is None or problem or other == key or not other.same_task(key):
                    continue
                entry = self.get_digest(folder.name)
                if entry is not None and entry.kind is EntryKind.KERNEL and entry.key == other:
                    entries.append(entry)
            found += sorted(entries, key=lambda entry: entry.created, reverse=True)
        return found

    # -- writes --------------------------------------------------------------------------------

    def put(self, entry: CacheEntry, replace: bool = False) -> bool:
        """Store `entry` in the user cache; True if written.

        An existing sound entry is kept unless `replace` (then False); a corrupt one is replaced.
        Raises ValueError for an entry that would not read back (e.g. a judge_record that is not
        JSON, or a key of another schema version).
        """
        try:
            files = serialize_entry(entry)
        except (TypeError, ValueError, UnicodeEncodeError) as exc:
            raise ValueError(f"cache entry {entry.digest} cannot be serialized: {exc}") from exc
        try:
            parse_entry(files, entry.digest)
        except CorruptFolderError as exc:
            raise ValueError(f"cache entry {entry.digest} would not read back: {exc}") from None
        written = install_folder(self._entries_dir, entry.digest, files, replace, _load_entry_folder)
        if written:
            self._note_change(entry.digest, self._summary(entry))
        return written

    def remove(self, digest: str) -> bool:
        """Remove a user entry; False if there is none. Raises ReadOnlyEntryError for a seed entry."""
        _check_digest(digest)
        if remove_folder(self._entries_dir / digest):
            self._note_change(digest, None)
            return True
        if self.seed_dir is not None and (self.seed_dir / digest).exists():
            raise ReadOnlyEntryError(
                f"entry {digest} is in the read-only seed cache ({self.seed_dir}) and cannot be removed; "
                "disable the seed cache (seed_cache=False, KEVIN_SEED_CACHE=0) to ignore it"
            )
        return False

    def clear(self) -> int:
        """Remove every user entry (the seed and pending tasks are untouched); returns how many."""
        removed = sum(remove_folder(folder) for folder in digest_folders(self._entries_dir))
        sweep_stale_temporaries(self._entries_dir)
        if removed:
            self._note_change(None, None)
        return removed

    # -- versions ------------------------------------------------------------------------------

    def versions(self) -> list[VersionGroup]:
        """Entries per source and GPU/torch/CUDA/schema (what each serves); unreadable ones left out.

        Read from each folder's meta.json without checking its files, so entries of an older
        schema count too (under their schema)."""
        counts: dict[tuple[str, str, str, str, str, int], int] = {}
        for source, root in (("user", self._entries_dir), ("seed", self.seed_dir)):
            for folder in digest_folders(root):
                key, _ = peek_key(folder)
                if key is None:
                    continue
                group = (source, key.gpu, key.capability, key.torch_version, key.cuda_version, key.schema)
                counts[group] = counts.get(group, 0) + 1
        groups = [VersionGroup(*group, entries=count) for group, count in counts.items()]
        return sorted(groups, key=lambda g: (g.source != "user", -g.entries, g.gpu, g.torch_version, g.cuda_version))

    def prune(self, target: VersionTarget, dry_run: bool = False) -> PruneReport:
        """Remove the user entries and pending misses that no lookup under `target` can find:
        made for another torch, CUDA or GPU (`VersionTarget.mismatch`), or by an older
        kevin_backend (key schema or entry format). `dry_run` only reports them.

        The seed cache is read-only and never pruned. Folders whose metadata cannot be read, or
        that a newer kevin_backend wrote, are left in place and reported.
        """
        def judge(folder: Path) -> tuple[str, str] | None | str:
            key, problem = peek_key(folder)
            if key is None:
                return problem  # unreadable: left
            found = target.mismatch(key)
            if found is not None and found[0] == "newer":
                return found[1]
            if found is None and problem:
                return ("format", problem) if format_is_older(folder) else problem
            return found

        outcome: dict[str, list[Any]] = {"removed": [], "kept": [], "left": [], "pending_removed": [], "pending_kept": []}
        for kind, root in (("", self._entries_dir), ("pending_", self._pending_dir)):
            for folder in digest_folders(root):
                verdict = judge(folder)
                if verdict is None:
                    outcome[f"{kind}kept"].append(folder.name)
                elif isinstance(verdict, str):
                    outcome["left"].append((folder.name, verdict))
                else:
                    outcome[f"{kind}removed"].append((folder.name, *verdict))
                    if not dry_run and remove_folder(folder) and not kind:
                        self._note_change(folder.name, None)
        if not dry_run:
            sweep_stale_temporaries(self._entries_dir)
        return PruneReport(
            target=target,
            dry_run=dry_run,
            removed=tuple(outcome["removed"]),
            kept=tuple(outcome["kept"]),
            left=tuple(outcome["left"]),
            pending_removed=tuple(outcome["pending_removed"]),
            pending_kept=tuple(outcome["pending_kept"]),
        )

    # -- pending tasks -------------------------------------------------------------------------

    def record_pending(self, key: CacheKey, task: KernelTask) -> bool:
        """Remember a miss for `kevin prewarm`; True if newly recorded (idempotent otherwise)."""
        files = serialize_pending(PendingTask(key=key, task=task))
        return install_folder(self._pending_dir, key.digest, files, False, _load_pending_folder)

    def pending(self) -> list[PendingTask]:
        """The recorded misses, oldest first; corrupt records are skipped with a warning."""
        tasks: list[PendingTask] = []
        for folder in digest_folders(self._pending_dir):
            try:
                task = _load_pending_folder(folder)
            except (CorruptFolderError, OSError) as exc:
                log.warning("skipping corrupt pending task %s: %s", folder, exc)
                continue
            if task is not None:
                tasks.append(task)
        return sorted(tasks, key=lambda task: (task.recorded, task.digest))

    def get_pending(self, digest: str) -> PendingTask | None:
        """The recorded miss named `digest`, or None (also when its record is corrupt)."""
        _check_digest(digest)
        try:
            return _load_pending_folder(self._pending_dir / digest)
        except (CorruptFolderError, OSError) as exc:
            log.warning("skipping corrupt pending task %s: %s", digest, exc)
            return None

    def remove_pending(self, digest: str) -> bool:
        """Forget a recorded miss; False if there was none."""
        _check_digest(digest)
        return remove_folder(self._pending_dir / digest)

    # -- sharing -------------------------------------------------------------------------------

    def export(self, path: Path, digests: list[str] | None = None) -> int:
        """Write entries to a .tar.gz of `<digest>/` folders; returns how many.

        `digests=None` exports every sound user entry; named digests are looked up like `get`
        (user, then seed), and an unknown or corrupt one raises KernelCacheError. Each entry is
        validated and re-serialized, so the archive never carries a corrupt entry.
        """
        if digests is None:
            entries = []
            for folder in digest_folders(self._entries_dir):
                entry = self.get_digest(folder.name)
                if entry is not None:
                    entries.append(entry)
        else:
            entries = []
            for digest in dict.fromkeys(digests):
                entry = self.get_digest(digest)
                if entry is None:
                    raise KernelCacheError(f"no valid cache entry {digest} to export")
                entries.append(entry)
        write_archive(Path(path), {entry.digest: serialize_entry(entry) for entry in entries})
        return len(entries)

    def import_(self, path: Path, replace: bool = False) -> ImportReport:
        """Add the entries of an archive made by `export` to the user cache (`read_archive` then
        `add_entries`; a caller that vets the programs first calls the two itself)."""
        entries, rejected = self.read_archive(path)
        return self.add_entries(entries, rejected, replace)

    def read_archive(self, path: Path) -> tuple[dict[str, CacheEntry], list[tuple[str, str]]]:
        """The entries of an archive made by `export`, and (name, problem) for what is not one.

        Nothing is extracted to disk: members are read into memory, every entry is validated
        exactly like a lookup validates a folder. An archive with an unsafe member (absolute
        path, `..`, link) is refused as a whole with UnsafeArchiveError: it was not made by
        `export`. A file that is missing, not an archive, damaged, or an archive holding no entry
        folder at all raises ArchiveError naming the file and the problem.
        """
        path = Path(path)
        try:
            groups, problems = read_archive(path, is_digest, ENTRY_FILES, _MAX_MEMBER_BYTES)
        except UnsafeArchiveError as exc:
            raise UnsafeArchiveError(f"refusing {path}: {exc}") from None
        entries: dict[str, CacheEntry] = {}
        rejected = [(name, problem) for name, problem in problems.items() if name not in groups]
        for digest, files in groups.items():
            if digest in problems:
                rejected.append((digest, problems[digest]))
                continue
            try:
                entries[digest] = parse_entry(files, digest)
            except CorruptFolderError as exc:
                rejected.append((digest, str(exc)))
        return entries, rejected

    def add_entries(self, entries: dict[str, CacheEntry], rejected: list[tuple[str, str]] | None = None,
                    replace: bool = False) -> ImportReport:
        """Put sound entries read by `read_archive` (those `rejected` are reported, never put)."""
        imported: list[str] = []
        skipped: list[str] = []
        for digest, entry in entries.items():
            (imported if self.put(entry, replace=replace) else skipped).append(digest)
        return ImportReport(tuple(imported), tuple(skipped), tuple(rejected or ()))
