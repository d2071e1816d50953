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
"""

from __future__ import annotations

import errno
import functools
import hashlib
import importlib.resources
import json
import logging
import os
import re
import shutil
import sqlite3
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, Callable, Final, Iterator, TypeVar

import diskcache

from kevin_backend.cache.archive import ImportReport, read_archive, write_archive
from kevin_backend.cache.format import CacheEntry, EntryKind, PendingTask, Timings
from kevin_backend.cache.errors import ArchiveError, KernelCacheError, ReadOnlyEntryError, UnsafeArchiveError
from kevin_backend.cache.key import SCHEMA_VERSION, CacheKey, VersionTarget
from kevin_backend.config import Config
from kevin_backend.types import KernelTask

__all__ = [
    "ENTRY_FORMAT",
    "KernelCache",
    "EntryInfo",
    "ImportReport",
    "PruneReport",
    "VersionGroup",
    "KernelCacheError",
    "ArchiveError",
    "ReadOnlyEntryError",
    "UnsafeArchiveError",
    "default_seed_dir",
    "entry_metadata",
    "is_digest",
    "serialize_entry",
    "deserialize_entry",
    "serialize_pending",
    "deserialize_pending",
]

log = logging.getLogger("kevin_backend")

# Version of the files in an entry folder (meta.json's "format"). Bump when they change shape.
ENTRY_FORMAT: Final = 1

TASK_FILE: Final = "task.py"
KERNEL_FILE: Final = "kernel.py"
META_FILE: Final = "meta.json"
_ENTRY_FILES: Final = (TASK_FILE, KERNEL_FILE, META_FILE)
_PENDING_FILES: Final = (TASK_FILE, META_FILE)

_DIGEST_RE: Final = re.compile(r"[0-9a-f]{32}")
# Writers that keep losing the race to other writers of the same key give up after this many tries.
_INSTALL_ATTEMPTS: Final = 32
# Reads of a folder that concurrent writers keep swapping give up (as a miss) after this many tries.
_READ_ATTEMPTS: Final = 5
# Entries are source code and JSON; a bigger archive member is not one of ours.
_MAX_MEMBER_BYTES: Final = 16 * 1024 * 1024
# Temporary folders older than this are left over from a crashed writer; clear() removes them.
_STALE_TEMP_SECONDS: Final = 3600.0


class _Corrupt(Exception):
    """An entry folder (or archive group) that cannot be trusted; the message names the problem."""


def is_digest(text: str) -> bool:
    """True when `text` has the shape of a CacheKey digest (32 lowercase hex digits)."""
    return _DIGEST_RE.fullmatch(text) is not None


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


# ---------------------------------------------------------------------------------------------
# Serialization: entry <-> files. The same functions serve folders, archives and validation.


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _dump_json(data: dict[str, Any]) -> bytes:
    # NaN/inf are allowed (Python reads them back): a judge record with a NaN error must not make
    # a put fail.
    return (json.dumps(data, indent=2, sort_keys=True) + "\n").encode()


def entry_metadata(entry: CacheEntry) -> dict[str, Any]:
    """The entry's metadata as written to meta.json (without the file hashes).

    The speedups are stored as well as the raw timings so that a person reading meta.json (or a
    tool that does not load the package) sees them directly; they are recomputed on load.
    """
    timings = entry.timings
    return {
        "format": ENTRY_FORMAT,
        "key": entry.key.as_dict(),
        "kind": entry.kind.value,
        "task": entry.task.as_dict(),
        "timings": {
            **timings.as_dict(),
            "speedup_vs_eager": timings.speedup_vs_eager,
            "speedup_vs_inductor": timings.speedup_vs_inductor,
        },
        "policy": entry.policy,
        "judge_record": entry.judge_record,
        "created": entry.created,
        "reason": entry.reason,
    }


def _with_hashes(meta: dict[str, Any], sources: dict[str, bytes]) -> dict[str, bytes]:
    meta = {**meta, "files": {name: _sha256(data) for name, data in sources.items()}}
    return {**sources, META_FILE: _dump_json(meta)}


def _entry_files(entry: CacheEntry) -> dict[str, bytes]:
    sources = {TASK_FILE: entry.task.source.encode()}
    if entry.kind is EntryKind.KERNEL:
        assert entry.kernel_source is not None  # CacheEntry.__post_init__ guarantees it
        sources[KERNEL_FILE] = entry.kernel_source.encode()
    return _with_hashes(entry_metadata(entry), sources)


def _pending_files(pending: PendingTask) -> dict[str, bytes]:
    meta = {
        "format": ENTRY_FORMAT,
        "key": pending.key.as_dict(),
        "task": pending.task.as_dict(),
        "recorded": pending.recorded,
    }
    return _with_hashes(meta, {TASK_FILE: pending.task.source.encode()})


def _parse_meta(files: dict[str, bytes], digest: str) -> tuple[dict[str, Any], CacheKey]:
    """meta.json's dict and key, checked against the format version and the folder's digest."""
    raw = files.get(META_FILE)
    if raw is None:
        raise _Corrupt(f"{META_FILE} is missing")
    try:
        meta = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise _Corrupt(f"{META_FILE} is not valid JSON ({exc})") from None
    if not isinstance(meta, dict):
        raise _Corrupt(f"{META_FILE} does not hold a JSON object")
    if meta.get("format") != ENTRY_FORMAT:
        raise _Corrupt(f"entry format {meta.get('format')!r}, this version reads format {ENTRY_FORMAT}")
    try:
        key = CacheKey.from_dict(meta["key"])
    except (KeyError, TypeError, ValueError) as exc:
        raise _Corrupt(f"the key in {META_FILE} is malformed ({type(exc).__name__}: {exc})") from None
    if key.schema != SCHEMA_VERSION:
        raise _Corrupt(f"stale entry: key schema {key.schema}, this version uses schema {SCHEMA_VERSION}")
    if key.digest != digest:
        raise _Corrupt(f"the key in {META_FILE} has digest {key.digest}, not the folder's {digest}")
    return meta, key


def _checked_sources(files: dict[str, bytes], meta: dict[str, Any], names: tuple[str, ...]) -> dict[str, str]:
    """The source files, each verified against the sha256 recorded in meta.json."""
    recorded = meta.get("files")
    if not isinstance(recorded, dict) or set(recorded) != set(names):
        listed = sorted(recorded) if isinstance(recorded, dict) else recorded
        raise _Corrupt(f"{META_FILE} lists files {listed!r}, expected {sorted(names)}")
    sources: dict[str, str] = {}
    for name in names:
        data = files.get(name)
        if data is None:
            raise _Corrupt(f"{name} is missing")
        if _sha256(data) != recorded[name]:
            raise _Corrupt(f"{name} does not match the sha256 in {META_FILE} (truncated or edited)")
        try:
            sources[name] = data.decode()
        except UnicodeDecodeError:
            raise _Corrupt(f"{name} is not UTF-8 text") from None
    return sources


def _parse_entry(files: dict[str, bytes], digest: str) -> CacheEntry:
    """The entry stored in `files` (name -> bytes); raises _Corrupt naming the first problem."""
    meta, key = _parse_meta(files, digest)
    try:
        kind = EntryKind(meta["kind"])
        names = (TASK_FILE, KERNEL_FILE) if kind is EntryKind.KERNEL else (TASK_FILE,)
        sources = _checked_sources(files, meta, names)
        judge_record = meta["judge_record"]
        if judge_record is not None and not isinstance(judge_record, dict):
            raise TypeError("judge_record must be an object or null")
        return CacheEntry(
            key=key,
            kind=kind,
            task=KernelTask.from_dict(meta["task"], sources[TASK_FILE]),
            kernel_source=sources.get(KERNEL_FILE),
            timings=Timings.from_dict(meta["timings"]),
            policy=str(meta["policy"]),
            judge_record=judge_record,
            created=str(meta["created"]),
            reason=str(meta["reason"]),
        )
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise _Corrupt(f"{META_FILE} does not match the entry schema ({type(exc).__name__}: {exc})") from None


def _parse_pending(files: dict[str, bytes], digest: str) -> PendingTask:
    meta, key = _parse_meta(files, digest)
    sources = _checked_sources(files, meta, (TASK_FILE,))
    try:
        task = KernelTask.from_dict(meta["task"], sources[TASK_FILE])
        return PendingTask(key=key, task=task, recorded=str(meta["recorded"]))
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise _Corrupt(f"{META_FILE} does not match the pending schema ({type(exc).__name__}: {exc})") from None


# ---------------------------------------------------------------------------------------------
# Folder primitives.

_T = TypeVar("_T")


def serialize_entry(entry: CacheEntry) -> dict[str, bytes]:
    """An entry as the files of its folder (to send it between processes or machines)."""
    return _entry_files(entry)


def deserialize_entry(files: dict[str, bytes], digest: str) -> CacheEntry:
    """The entry those files hold; raises ValueError when they do not read back as `digest`."""
    try:
        return _parse_entry(files, digest)
    except _Corrupt as exc:
        raise ValueError(f"entry {digest} does not read back: {exc}") from None


def serialize_pending(pending: PendingTask) -> dict[str, bytes]:
    return _pending_files(pending)


def deserialize_pending(files: dict[str, bytes], digest: str) -> PendingTask:
    try:
        return _parse_pending(files, digest)
    except _Corrupt as exc:
        raise ValueError(f"pending task {digest} does not read back: {exc}") from None


def _read_folder(folder: Path, names: tuple[str, ...]) -> tuple[dict[str, bytes], bool] | None:
    """The files of `folder` among `names`, and whether the folder was swapped while we read.

    None when the folder does not exist. The files are opened relative to one open handle on the
    folder, so they all come from the same folder even if a concurrent `put(replace=True)` or
    `remove` renames it away meanwhile; the second value tells the caller that happened (the path
    no longer names the folder we read), so a failure to parse is a race, not corruption.
    (POSIX only: dir_fd and O_DIRECTORY.)
    """
    try:
        dir_fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    except FileNotFoundError:
        return None
    except NotADirectoryError:
        raise _Corrupt("not a folder") from None
    except OSError as exc:
        raise _Corrupt(f"cannot open the folder ({exc})") from None
    try:
        def opener(name: str, flags: int) -> int:
            return os.open(name, flags, dir_fd=dir_fd)

        files: dict[str, bytes] = {}
        for name in names:
            try:
                with open(name, "rb", opener=opener) as handle:
                    files[name] = handle.read()
            except FileNotFoundError:
                continue
            except OSError as exc:
                raise _Corrupt(f"cannot read {name} ({exc})") from None
        try:
            swapped = os.stat(folder).st_ino != os.fstat(dir_fd).st_ino
        except FileNotFoundError:
            swapped = True
        return files, swapped
    finally:
        os.close(dir_fd)


def _load_folder(
    folder: Path, names: tuple[str, ...], parse: Callable[[dict[str, bytes], str], _T]
) -> _T | None:
    """Parse the folder; None when it does not exist; raises _Corrupt.

    A folder that fails to parse only counts as corrupt if it stayed in place while we read it;
    if a concurrent writer swapped it, read again (the new folder is complete). Under endless
    churn, give up quietly with None: a miss is harmless, a false corruption warning is not.
    """
    for _ in range(_READ_ATTEMPTS):
        snapshot = _read_folder(folder, names)
        if snapshot is None:
            return None
        files, swapped = snapshot
        try:
            return parse(files, folder.name)
        except _Corrupt:
            if not swapped:
                raise
    log.debug("kernel cache folder %s kept changing while being read; treated as a miss", folder)
    return None


def _load_entry_folder(folder: Path) -> CacheEntry | None:
    return _load_folder(folder, _ENTRY_FILES, _parse_entry)


def _load_pending_folder(folder: Path) -> PendingTask | None:
    return _load_folder(folder, _PENDING_FILES, _parse_pending)


def _peek_key(folder: Path) -> tuple[CacheKey | None, str]:
    """The key a folder's meta.json records, read leniently (any schema, any entry format, files
    unchecked), and a problem: "" when the entry's format is this version's, otherwise why the
    folder cannot be read (key None) or is of another format (key set).

    For telling what an entry was made for (`prune`, `versions`) even when it cannot be used.
    """
    try:
        raw = (folder / META_FILE).read_bytes()
    except FileNotFoundError:
        return None, f"{META_FILE} is missing"
    except OSError as exc:
        return None, f"cannot read {META_FILE} ({exc.strerror or exc})"
    try:
        meta = json.loads(raw)
        key = CacheKey.from_dict(meta["key"])
    except (UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError) as exc:
        return None, f"{META_FILE} holds no readable key ({type(exc).__name__})"
    fmt = meta.get("format")
    if fmt != ENTRY_FORMAT:
        return key, f"entry format {fmt!r} (this version reads format {ENTRY_FORMAT})"
    return key, ""


def _format_is_older(folder: Path) -> bool:
    """True when the folder's meta.json names an entry format older than ENTRY_FORMAT."""
    try:
        fmt = json.loads((folder / META_FILE).read_bytes()).get("format")
    except (OSError, ValueError, AttributeError):
        return False
    return isinstance(fmt, int) and fmt < ENTRY_FORMAT


def _digest_folders(root: Path | None) -> list[Path]:
    """Entry folders under `root`, by name; skips temporaries (dot names) and package files."""
    if root is None:
        return []
    try:
        children = list(root.iterdir())
    except (FileNotFoundError, NotADirectoryError):
        return []
    return sorted(child for child in children if is_digest(child.name) and child.is_dir())


def _write_file(path: Path, data: bytes) -> None:
    with open(path, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())


def _rename_if_absent(src: Path, dst: Path) -> bool:
    """Rename the folder `src` to `dst`; False when `dst` is taken (rename never merges folders)."""
    try:
        os.rename(src, dst)
        return True
    except OSError as exc:
        if exc.errno in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR):
            return False
        raise


def _move_aside(path: Path) -> Path | None:
    """Rename `path` to a hidden name in the same folder (atomic); None when it does not exist."""
    aside = path.with_name(f".old-{path.name}-{uuid.uuid4().hex[:12]}")
    try:
        os.rename(path, aside)
    except FileNotFoundError:
        return None
    return aside


def _delete(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def _install_folder(
    parent: Path,
    name: str,
    files: dict[str, bytes],
    replace: bool,
    load_existing: Callable[[Path], object | None],
) -> bool:
    """Atomically make `parent/name` a folder holding exactly `files`; True if this call wrote it.

    The folder is built under a temporary name in `parent` (same file system) and renamed into
    place: readers see no folder or a complete one, and of several concurrent writers exactly one
    rename wins. Without `replace`, a sound existing folder is kept (False); a corrupt one is
    replaced. With `replace`, the existing folder is renamed aside, the new one renamed in, and
    the old one deleted; if another writer slips in between, the loop moves theirs aside too.
    """
    parent.mkdir(parents=True, exist_ok=True)
    final = parent / name
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{name}-", dir=parent))
    try:
        os.chmod(tmp, 0o755)  # mkdtemp makes it private; cache folders are ordinary readable files
        for file_name, data in files.items():
            _write_file(tmp / file_name, data)
        for _ in range(_INSTALL_ATTEMPTS):
            if _rename_if_absent(tmp, final):
                return True
            if not replace:
                try:
                    if load_existing(final) is not None:
                        return False
                    continue  # it vanished (a concurrent replace or remove): try again
                except _Corrupt as exc:
                    log.warning("replacing corrupt kernel cache folder %s: %s", final, exc)
            aside = _move_aside(final)
            try:
                if _rename_if_absent(tmp, final):
                    return True
            finally:
                if aside is not None:
                    _delete(aside)
        raise KernelCacheError(f"could not write {final}: concurrent writers kept replacing it")
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def _remove_folder(path: Path) -> bool:
    """Remove a folder atomically from readers' point of view (rename aside, then delete)."""
    aside = _move_aside(path)
    if aside is None:
        return False
    _delete(aside)
    return True


def _sweep_stale_temporaries(parent: Path) -> None:
    """Delete temporary folders left by writers that crashed (old enough not to be in use)."""
    cutoff = time.time() - _STALE_TEMP_SECONDS
    try:
        children = list(parent.iterdir())
    except FileNotFoundError:
        return
    for child in children:
        if child.name.startswith((".tmp-", ".old-")):
            try:
                if child.stat().st_mtime < cutoff:
                    _delete(child)
            except FileNotFoundError:
                pass


@functools.lru_cache(maxsize=None)
def _seed_fingerprint(seed_dir: str) -> str:
    """A hash of the seed entries' names and meta.json bytes (which hold the sources' sha256).

    Computed once per process and seed folder: the seed is read-only while the package runs.
    """
    digest = hashlib.sha256()
    for folder in _digest_folders(Path(seed_dir)):
        digest.update(folder.name.encode() + b"\0")
        try:
            digest.update((folder / META_FILE).read_bytes())
        except OSError:
            digest.update(b"<unreadable>")
        digest.update(b"\0")
    return digest.hexdigest()[:16]


# ---------------------------------------------------------------------------------------------
# Public types.


@dataclass(frozen=True)
class EntryInfo:
    """One entry folder as listed by `KernelCache.entries()`.

    Corrupt folders are listed too (with `error` set and the other fields empty) so that a person
    can see and remove them; `entry` is the loaded entry when the folder is sound.
    """

    digest: str
    source: str  # "user" | "seed"
    path: Path
    kind: EntryKind | None = None
    ops: tuple[str, ...] = ()
    policy: str = ""
    created: str = ""
    timings: Timings | None = None
    error: str | None = None
    entry: CacheEntry | None = field(default=None, repr=False, compare=False)

    @property
    def ok(self) -> bool:
        return self.error is None

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready summary (what `kevin cache ls --json` prints)."""
        timings = None
        if self.timings is not None:
            timings = {
                **self.timings.as_dict(),
                "speedup_vs_eager": self.timings.speedup_vs_eager,
                "speedup_vs_inductor": self.timings.speedup_vs_inductor,
            }
        return {
            "digest": self.digest,
            "source": self.source,
            "path": str(self.path),
            "kind": self.kind.value if self.kind is not None else None,
            "ops": list(self.ops),
            "policy": self.policy,
            "created": self.created,
            "timings": timings,
            "error": self.error,
        }


@dataclass(frozen=True)
class VersionGroup:
    """How many entries of one source (user, seed) were made for one GPU and torch/CUDA pair."""

    source: str
    gpu: str
    capability: str
    torch_version: str
    cuda_version: str
    schema: int
    entries: int

    def key_fields(self) -> CacheKey:
        """A key with this group's GPU and versions (and no task), for `VersionTarget.mismatch`."""
        return CacheKey("", (), self.gpu, self.capability, self.torch_version, self.cuda_version, self.schema)

    def describe(self) -> str:
        gpu = self.gpu + (f" ({self.capability})" if self.capability else "")
        cuda = f"CUDA {self.cuda_version}" if self.cuda_version else "no CUDA"
        return f"{gpu}, torch {self.torch_version or '?'}, {cuda}, key schema {self.schema}"

    def as_dict(self) -> dict[str, Any]:
        return {
            "source": self.source, "gpu": self.gpu, "capability": self.capability, "torch": self.torch_version,
            "cuda": self.cuda_version, "schema": self.schema, "entries": self.entries,
        }


@dataclass(frozen=True)
class PruneReport:
    """What `KernelCache.prune()` removed (or, on a dry run, would remove) and what it kept.

    Each removed item is (digest, what, why): `what` is VersionTarget.mismatch's category
    ("schema", "format", "torch", "cuda", "gpu"), `why` says it in words. `left` are folders
    prune does not judge (unreadable metadata, a newer kevin_backend's key): (digest, why).
    """

    target: VersionTarget
    dry_run: bool
    removed: tuple[tuple[str, str, str], ...] = ()
    kept: tuple[str, ...] = ()
    left: tuple[tuple[str, str], ...] = ()
    pending_removed: tuple[tuple[str, str, str], ...] = ()
    pending_kept: tuple[str, ...] = ()

    def counts(self, items: tuple[tuple[str, str, str], ...] | None = None) -> dict[str, int]:
        """Removed entries (or `items`) per category."""
        counts: dict[str, int] = {}
        for _, what, _ in self.removed if items is None else items:
            counts[what] = counts.get(what, 0) + 1
        return counts


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
            "speedup_vs_inductor": entry.timings.speedup_vs_inductor,
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
            except _Corrupt as exc:
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
            for folder in _digest_folders(root):
                info = self._describe(folder, source)
                if info is not None:
                    infos.append(info)
        return sorted(infos, key=lambda info: (info.source != "user", info.created, info.digest))

    @staticmethod
    def _describe(folder: Path, source: str) -> EntryInfo | None:
        try:
            entry = _load_entry_folder(folder)
        except (_Corrupt, OSError) as exc:
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

    # -- writes --------------------------------------------------------------------------------

    def put(self, entry: CacheEntry, replace: bool = False) -> bool:
        """Store `entry` in the user cache; True if written.

        An existing sound entry is kept unless `replace` (then False); a corrupt one is replaced.
        Raises ValueError for an entry that would not read back (e.g. a judge_record that is not
        JSON, or a key of another schema version).
        """
        try:
            files = _entry_files(entry)
        except (TypeError, ValueError, UnicodeEncodeError) as exc:
            raise ValueError(f"cache entry {entry.digest} cannot be serialized: {exc}") from exc
        try:
            _parse_entry(files, entry.digest)
        except _Corrupt as exc:
            raise ValueError(f"cache entry {entry.digest} would not read back: {exc}") from None
        written = _install_folder(self._entries_dir, entry.digest, files, replace, _load_entry_folder)
        if written:
            self._note_change(entry.digest, self._summary(entry))
        return written

    def remove(self, digest: str) -> bool:
        """Remove a user entry; False if there is none. Raises ReadOnlyEntryError for a seed entry."""
        _check_digest(digest)
        if _remove_folder(self._entries_dir / digest):
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
        removed = sum(_remove_folder(folder) for folder in _digest_folders(self._entries_dir))
        _sweep_stale_temporaries(self._entries_dir)
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
            for folder in _digest_folders(root):
                key, _ = _peek_key(folder)
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
            key, problem = _peek_key(folder)
            if key is None:
                return problem  # unreadable: left
            found = target.mismatch(key)
            if found is not None and found[0] == "newer":
                return found[1]
            if found is None and problem:
                return ("format", problem) if _format_is_older(folder) else problem
            return found

        outcome: dict[str, list[Any]] = {"removed": [], "kept": [], "left": [], "pending_removed": [], "pending_kept": []}
        for kind, root in (("", self._entries_dir), ("pending_", self._pending_dir)):
            for folder in _digest_folders(root):
                verdict = judge(folder)
                if verdict is None:
                    outcome[f"{kind}kept"].append(folder.name)
                elif isinstance(verdict, str):
                    outcome["left"].append((folder.name, verdict))
                else:
                    outcome[f"{kind}removed"].append((folder.name, *verdict))
                    if not dry_run and _remove_folder(folder) and not kind:
                        self._note_change(folder.name, None)
        if not dry_run:
            _sweep_stale_temporaries(self._entries_dir)
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
        files = _pending_files(PendingTask(key=key, task=task))
        return _install_folder(self._pending_dir, key.digest, files, False, _load_pending_folder)

    def pending(self) -> list[PendingTask]:
        """The recorded misses, oldest first; corrupt records are skipped with a warning."""
        tasks: list[PendingTask] = []
        for folder in _digest_folders(self._pending_dir):
            try:
                task = _load_pending_folder(folder)
            except (_Corrupt, OSError) as exc:
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
        except (_Corrupt, OSError) as exc:
            log.warning("skipping corrupt pending task %s: %s", digest, exc)
            return None

    def remove_pending(self, digest: str) -> bool:
        """Forget a recorded miss; False if there was none."""
        _check_digest(digest)
        return _remove_folder(self._pending_dir / digest)

    # -- sharing -------------------------------------------------------------------------------

    def export(self, path: Path, digests: list[str] | None = None) -> int:
        """Write entries to a .tar.gz of `<digest>/` folders; returns how many.

        `digests=None` exports every sound user entry; named digests are looked up like `get`
        (user, then seed), and an unknown or corrupt one raises KernelCacheError. Each entry is
        validated and re-serialized, so the archive never carries a corrupt entry.
        """
        if digests is None:
            entries = []
            for folder in _digest_folders(self._entries_dir):
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
        write_archive(Path(path), {entry.digest: _entry_files(entry) for entry in entries})
        return len(entries)

    def import_(self, path: Path, replace: bool = False) -> ImportReport:
        """Add the entries of an archive made by `export` to the user cache.

        Nothing is extracted to disk: members are read into memory, every entry is validated
        exactly like a lookup validates a folder, and sound ones go through `put`. Bad entries
        are reported and never imported. An archive with an unsafe member (absolute path, `..`,
        link) is refused as a whole with UnsafeArchiveError: it was not made by `export`. A file
        that is missing, not an archive, damaged, or an archive holding no entry folder at all
        raises ArchiveError naming the file and the problem; nothing is imported then.
        """
        path = Path(path)
        try:
            groups, problems = read_archive(path, is_digest, _ENTRY_FILES, _MAX_MEMBER_BYTES)
        except UnsafeArchiveError as exc:
            raise UnsafeArchiveError(f"refusing {path}: {exc}") from None

        imported: list[str] = []
        skipped: list[str] = []
        rejected = [(name, problem) for name, problem in problems.items() if name not in groups]
        for digest, files in groups.items():
            if digest in problems:
                rejected.append((digest, problems[digest]))
                continue
            try:
                entry = _parse_entry(files, digest)
            except _Corrupt as exc:
                rejected.append((digest, str(exc)))
                continue
            (imported if self.put(entry, replace=replace) else skipped).append(digest)
        return ImportReport(tuple(imported), tuple(skipped), tuple(rejected))
