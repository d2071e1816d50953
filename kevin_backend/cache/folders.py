"""Folder operations of the cache: a folder of files written, replaced, read and removed so that
a reader, in this process or another, sees either no folder or a complete one.

A folder is built under a temporary name beside its final place (same file system) and renamed
into it; a replaced or removed folder is first renamed aside to a hidden name, then deleted.
Readers open the folder once and read its files relative to that handle, and notice when a
concurrent writer swapped it meanwhile. Nothing here knows what the files mean: the caller
passes the parser (`disk_format.py` for entries and pending tasks), whose CorruptFolderError
marks a folder that cannot be trusted. POSIX only (dir_fd, O_DIRECTORY).
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
import tempfile
import time
import uuid
from pathlib import Path
from typing import Callable, Final, TypeVar

from kevin_backend.cache.errors import CorruptFolderError, KernelCacheError
from kevin_backend.cache.key import is_digest

__all__ = [
    "digest_folders",
    "install_folder",
    "load_folder",
    "read_folder",
    "remove_folder",
    "sweep_stale_temporaries",
]

log = logging.getLogger("kevin_backend")

# Writers that keep losing the race to other writers of the same key give up after this many tries.
_INSTALL_ATTEMPTS: Final = 32
# Reads of a folder that concurrent writers keep swapping give up (as a miss) after this many tries.
_READ_ATTEMPTS: Final = 5
# Temporary folders older than this are left over from a crashed writer; sweep_stale_temporaries
# (run by the store's clear and prune) removes them.
_STALE_TEMP_SECONDS: Final = 3600.0

_T = TypeVar("_T")


def read_folder(folder: Path, names: tuple[str, ...]) -> tuple[dict[str, bytes], bool] | None:
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
        raise CorruptFolderError("not a folder") from None
    except OSError as exc:
        raise CorruptFolderError(f"cannot open the folder ({exc})") from None
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
                raise CorruptFolderError(f"cannot read {name} ({exc})") from None
        try:
            swapped = os.stat(folder).st_ino != os.fstat(dir_fd).st_ino
        except FileNotFoundError:
            swapped = True
        return files, swapped
    finally:
        os.close(dir_fd)


def load_folder(
    folder: Path, names: tuple[str, ...], parse: Callable[[dict[str, bytes], str], _T]
) -> _T | None:
    """Parse the folder; None when it does not exist; raises CorruptFolderError.

    A folder that fails to parse only counts as corrupt if it stayed in place while we read it;
    if a concurrent writer swapped it, read again (the new folder is complete). Under endless
    churn, give up quietly with None: a miss is harmless, a false corruption warning is not.
    """
    for _ in range(_READ_ATTEMPTS):
        snapshot = read_folder(folder, names)
        if snapshot is None:
            return None
        files, swapped = snapshot
        try:
            return parse(files, folder.name)
        except CorruptFolderError:
            if not swapped:
                raise
    log.debug("kernel cache folder %s kept changing while being read; treated as a miss", folder)
    return None


def digest_folders(root: Path | None) -> list[Path]:
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


def install_folder(
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
                except CorruptFolderError as exc:
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


def remove_folder(path: Path) -> bool:
    """Remove a folder atomically from readers' point of view (rename aside, then delete)."""
    aside = _move_aside(path)
    if aside is None:
        return False
    _delete(aside)
    return True


def sweep_stale_temporaries(parent: Path) -> None:
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

