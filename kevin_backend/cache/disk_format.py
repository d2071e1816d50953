"""The on-disk format of a cache folder: the files an entry or a pending task is stored as, and
how they are read back and checked.

An entry folder holds task.py (the task's source), kernel.py (KERNEL entries only) and
meta.json (the rest of the entry, the format version and the sha256 of each source file); a
pending task's folder holds task.py and meta.json. The same functions turn entries into files
and back for folders, archives and validation, so all three agree byte for byte. A set of files
that cannot be trusted (wrong format version, stale key schema, a digest that is not the
folder's, a source that does not match its recorded sha256) raises CorruptFolderError naming the
first problem.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Final

from kevin_backend.cache.errors import CorruptFolderError
from kevin_backend.cache.format import CacheEntry, EntryKind, PendingTask, Timings
from kevin_backend.cache.key import SCHEMA_VERSION, CacheKey
from kevin_backend.types import KernelTask

__all__ = [
    "ENTRY_FORMAT",
    "TASK_FILE",
    "KERNEL_FILE",
    "META_FILE",
    "ENTRY_FILES",
    "PENDING_FILES",
    "entry_metadata",
    "serialize_entry",
    "serialize_pending",
    "parse_entry",
    "parse_pending",
    "deserialize_entry",
    "deserialize_pending",
    "peek_key",
    "format_is_older",
]

# Version of the files in an entry folder (meta.json's "format"). Bump when they change shape.
ENTRY_FORMAT: Final = 1

TASK_FILE: Final = "task.py"
KERNEL_FILE: Final = "kernel.py"
META_FILE: Final = "meta.json"
ENTRY_FILES: Final = (TASK_FILE, KERNEL_FILE, META_FILE)
PENDING_FILES: Final = (TASK_FILE, META_FILE)


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


def serialize_entry(entry: CacheEntry) -> dict[str, bytes]:
    """An entry as the files of its folder (what a folder, an archive and another process get)."""
    sources = {TASK_FILE: entry.task.source.encode()}
    if entry.kind is EntryKind.KERNEL:
        assert entry.kernel_source is not None  # CacheEntry.__post_init__ guarantees it
        sources[KERNEL_FILE] = entry.kernel_source.encode()
    return _with_hashes(entry_metadata(entry), sources)


def serialize_pending(pending: PendingTask) -> dict[str, bytes]:
    """A pending task as the files of its folder."""
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
        raise CorruptFolderError(f"{META_FILE} is missing")
    try:
        meta = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CorruptFolderError(f"{META_FILE} is not valid JSON ({exc})") from None
    if not isinstance(meta, dict):
        raise CorruptFolderError(f"{META_FILE} does not hold a JSON object")
    if meta.get("format") != ENTRY_FORMAT:
        raise CorruptFolderError(f"entry format {meta.get('format')!r}, this version reads format {ENTRY_FORMAT}")
    try:
        key = CacheKey.from_dict(meta["key"])
    except (KeyError, TypeError, ValueError) as exc:
        raise CorruptFolderError(f"the key in {META_FILE} is malformed ({type(exc).__name__}: {exc})") from None
    if key.schema != SCHEMA_VERSION:
        raise CorruptFolderError(f"stale entry: key schema {key.schema}, this version uses schema {SCHEMA_VERSION}")
    if key.digest != digest:
        raise CorruptFolderError(f"the key in {META_FILE} has digest {key.digest}, not the folder's {digest}")
    return meta, key


def _checked_sources(files: dict[str, bytes], meta: dict[str, Any], names: tuple[str, ...]) -> dict[str, str]:
    """The source files, each verified against the sha256 recorded in meta.json."""
    recorded = meta.get("files")
    if not isinstance(recorded, dict) or set(recorded) != set(names):
        listed = sorted(recorded) if isinstance(recorded, dict) else recorded
        raise CorruptFolderError(f"{META_FILE} lists files {listed!r}, expected {sorted(names)}")
    sources: dict[str, str] = {}
    for name in names:
        data = files.get(name)
        if data is None:
            raise CorruptFolderError(f"{name} is missing")
        if _sha256(data) != recorded[name]:
            raise CorruptFolderError(f"{name} does not match the sha256 in {META_FILE} (truncated or edited)")
        try:
            sources[name] = data.decode()
        except UnicodeDecodeError:
            raise CorruptFolderError(f"{name} is not UTF-8 text") from None
    return sources


def parse_entry(files: dict[str, bytes], digest: str) -> CacheEntry:
    """The entry stored in `files` (name -> bytes); raises CorruptFolderError naming the first problem."""
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
        raise CorruptFolderError(f"{META_FILE} does not match the entry schema ({type(exc).__name__}: {exc})") from None


def parse_pending(files: dict[str, bytes], digest: str) -> PendingTask:
    """The pending task stored in `files`; raises CorruptFolderError naming the first problem."""
    meta, key = _parse_meta(files, digest)
    sources = _checked_sources(files, meta, (TASK_FILE,))
    try:
        task = KernelTask.from_dict(meta["task"], sources[TASK_FILE])
        return PendingTask(key=key, task=task, recorded=str(meta["recorded"]))
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        problem = f"{META_FILE} does not match the pending schema ({type(exc).__name__}: {exc})"
        raise CorruptFolderError(problem) from None


def deserialize_entry(files: dict[str, bytes], digest: str) -> CacheEntry:
    """The entry those files hold; raises ValueError when they do not read back as `digest`."""
    try:
        return parse_entry(files, digest)
    except CorruptFolderError as exc:
        raise ValueError(f"entry {digest} does not read back: {exc}") from None


def deserialize_pending(files: dict[str, bytes], digest: str) -> PendingTask:
    """The pending task those files hold; raises ValueError when they do not read back as `digest`."""
    try:
        return parse_pending(files, digest)
    except CorruptFolderError as exc:
        raise ValueError(f"pending task {digest} does not read back: {exc}") from None


def peek_key(folder: Path) -> tuple[CacheKey | None, str]:
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


def format_is_older(folder: Path) -> bool:
    """True when the folder's meta.json names an entry format older than ENTRY_FORMAT."""
    try:
        fmt = json.loads((folder / META_FILE).read_bytes()).get("format")
    except (OSError, ValueError, AttributeError):
        return False
    return isinstance(fmt, int) and fmt < ENTRY_FORMAT

