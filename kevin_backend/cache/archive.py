"""Cache archives: `kevin cache export` writes entry folders into a .tar.gz, `kevin cache
import` reads them back. Nothing is extracted to disk: members are read into memory and checked
(no absolute paths, `..` or links; only the files an entry has; a size limit), and a file that
is not such an archive is refused with one line naming it and the problem. What the folders
hold is validated by the store (`store.py`, with `disk_format.py`), exactly as a lookup validates
a folder.
"""

from __future__ import annotations

import io
import os
import re
import tarfile
import time
import uuid
import zlib
from pathlib import Path, PurePosixPath
from typing import Callable, Collection, Final

from kevin_backend.cache.errors import ArchiveError, KernelCacheError, UnsafeArchiveError

__all__ = ["check_archive_file", "member_parts", "read_archive", "write_archive"]


def member_parts(member: tarfile.TarInfo) -> tuple[str, ...]:
    """The member's path components; raises UnsafeArchiveError for anything that could escape."""
    name = member.name
    if name.startswith("/") or "\\" in name or re.match(r"[A-Za-z]:", name):
        raise UnsafeArchiveError(f"archive member {name!r} has an absolute or non-POSIX path")
    parts = PurePosixPath(name).parts
    if ".." in parts:
        raise UnsafeArchiveError(f"archive member {name!r} points outside the archive (..)")
    if not (member.isfile() or member.isdir()):
        raise UnsafeArchiveError(f"archive member {name!r} is a link or special file")
    return parts


# The first bytes of the formats `tarfile.open(..., "r:*")` reads.
_ARCHIVE_MAGIC: Final = ((b"\x1f\x8b", "gzip"), (b"BZh", "bzip2"), (b"\xfd7zXZ\x00", "xz"))


def check_archive_file(path: Path) -> None:
    """Raise ArchiveError, naming `path` and the problem, unless it looks like an archive."""
    if not path.exists():
        raise ArchiveError(f"cannot import {path}: no such file")
    if path.is_dir():
        raise ArchiveError(f"cannot import {path}: it is a folder, not a .tar.gz made by `kevin cache export`")
    try:
        with open(path, "rb") as handle:
            head = handle.read(512)
    except OSError as exc:
        raise ArchiveError(f"cannot import {path}: cannot read it ({exc.strerror or exc})") from None
    if not head:
        raise ArchiveError(f"cannot import {path}: the file is empty, not a .tar.gz made by `kevin cache export`")
    if any(head.startswith(magic) for magic, _ in _ARCHIVE_MAGIC) or head[257:262] == b"ustar":
        return
    try:
        head.decode()
        looks = "it is text"
    except UnicodeDecodeError:
        looks = "it has no gzip, bzip2, xz or tar header"
    raise ArchiveError(f"cannot import {path}: not a .tar.gz made by `kevin cache export` ({looks})")


def _archive_problem(path: Path, exc: BaseException) -> ArchiveError:
    """An ArchiveError for a failure of tarfile on `path`, in one line."""
    text = str(exc)
    if isinstance(exc, EOFError) or "end-of-stream" in text or "unexpected end" in text:
        return ArchiveError(f"cannot import {path}: the archive is truncated")
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if lines and lines[0].startswith("file could not be opened successfully"):
        # tarfile tried every method; the one the file's header names says what went wrong
        try:
            with open(path, "rb") as handle:
                head = handle.read(8)
        except OSError:
            head = b""
        kind = next((name for magic, name in _ARCHIVE_MAGIC if head.startswith(magic)), "tar")
        method = {"gzip": "gz", "bzip2": "bz2", "xz": "xz", "tar": "tar"}[kind]
        said = next((line.split(":", 1)[1].strip() for line in lines if line.startswith(f"- method {method}:")), "")
        detail = f" ({said})" if said else ""
        return ArchiveError(f"cannot import {path}: {kind} data that is not a tar archive, or a damaged one{detail}")
    return ArchiveError(f"cannot import {path}: the archive is damaged ({lines[0] if lines else type(exc).__name__})")


def add_folder(tar: tarfile.TarFile, folder: str, files: dict[str, bytes]) -> None:
    now = time.time()
    info = tarfile.TarInfo(folder)
    info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, now
    tar.addfile(info)
    for name, data in files.items():
        info = tarfile.TarInfo(f"{folder}/{name}")
        info.size, info.mode, info.mtime = len(data), 0o644, now
        tar.addfile(info, io.BytesIO(data))


def read_archive(path: Path, is_folder: Callable[[str], bool], file_names: Collection[str],
                 max_member_bytes: int) -> tuple[dict[str, dict[str, bytes]], dict[str, str]]:
    """The archive's entry folders (digest -> file name -> bytes) and the problems of members
    that are not part of a sound folder (folder digest or member name -> problem). A folder is
    an entry when `is_folder(name)`; it may hold only `file_names`, each at most
    `max_member_bytes`.

    Raises ArchiveError when the file cannot be read as an archive of entries, and
    UnsafeArchiveError for a member that could escape the cache. Nothing touches the disk.
    """
    check_archive_file(path)
    try:
        tar = tarfile.open(path, "r:*")
    except (tarfile.TarError, OSError, EOFError, zlib.error) as exc:
        raise _archive_problem(path, exc) from exc
    groups: dict[str, dict[str, bytes]] = {}
    problems: dict[str, str] = {}
    with tar:
        try:
            members = tar.getmembers()
        except (tarfile.TarError, OSError, EOFError, zlib.error) as exc:
            raise _archive_problem(path, exc) from exc
        parted = [(member, member_parts(member)) for member in members]
        if members and not any(parts and is_folder(parts[0]) for _, parts in parted):
            shown = ", ".join(repr(m.name) for m in members[:3]) + (", ..." if len(members) > 3 else "")
            raise ArchiveError(
                f"cannot import {path}: it holds no cache entries ({len(members)} members, e.g. {shown}; "
                "`kevin cache export` writes one folder per entry, named by its digest)"
            )
        for member, parts in parted:
            if not parts:
                continue
            folder = parts[0]
            if not is_folder(folder):
                problems.setdefault(member.name, "not inside an entry folder named by a digest")
                continue
            group = groups.setdefault(folder, {})
            if member.isdir():
                if len(parts) != 1:
                    problems.setdefault(folder, f"unexpected folder {member.name!r}")
                continue
            if len(parts) != 2 or parts[1] not in file_names:
                problems.setdefault(folder, f"unexpected file {member.name!r}")
                continue
            if member.size > max_member_bytes:
                problems.setdefault(folder, f"{member.name!r} is too large ({member.size} bytes)")
                continue
            handle = tar.extractfile(member)
            if handle is None:  # pragma: no cover - regular files always have data
                problems.setdefault(folder, f"cannot read {member.name!r}")
                continue
            try:
                group[parts[1]] = handle.read()
            except (tarfile.TarError, OSError, EOFError, zlib.error) as exc:
                raise _archive_problem(path, exc) from exc
    return groups, problems


def write_archive(path: Path, folders: dict[str, dict[str, bytes]]) -> None:
    """Write `folders` (name -> file name -> bytes) to the .tar.gz `path`, atomically: a
    temporary file beside it, then renamed. ArchiveError when `path` is a folder or its folder
    does not exist; KernelCacheError when it cannot be written."""
    path = Path(path)
    if path.is_dir():
        raise ArchiveError(f"cannot export to {path}: it is a folder; name the archive, e.g. {path / 'kernels.tar.gz'}")
    if not path.parent.is_dir():
        raise ArchiveError(f"cannot export to {path}: the folder {path.parent} does not exist")
    tmp = path.with_name(f".{path.name}.tmp-{uuid.uuid4().hex[:12]}")
    try:
        with tarfile.open(tmp, "w:gz") as tar:
            for name, files in folders.items():
                add_folder(tar, name, files)
        os.replace(tmp, path)
    except OSError as exc:
        raise KernelCacheError(f"cannot write {path}: {exc.strerror or exc}") from exc
    finally:
        tmp.unlink(missing_ok=True)
