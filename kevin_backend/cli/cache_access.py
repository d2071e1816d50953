"""What the `kevin cache` actions share: opening the cache the arguments name (`cache_errors`),
naming entries by digest prefix (`resolve_prefix`) and printing a table (`table`)."""

from __future__ import annotations

import argparse
import functools
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable

from kevin_backend.cli.main import EXIT_FAILED, EXIT_USAGE, CommandError, Handler
from kevin_backend.config import Config

if TYPE_CHECKING:  # the cache's modules import torch: imported when an action runs, not to parse its arguments
    from kevin_backend.cache.store import KernelCache
    from kevin_backend.cache.store_reports import EntryInfo

__all__ = ["cache_errors", "resolve_prefix", "table"]


def cache_errors(handler: Callable[[argparse.Namespace, KernelCache], int]) -> Handler:
    """Open the cache the arguments name and turn cache failures into one error line: exit 2 for
    an archive path that cannot be used (ArchiveError), exit 1 for any other failure."""

    @functools.wraps(handler)
    def wrapped(args: argparse.Namespace, config: Config) -> int:
        from kevin_backend.cache.errors import ArchiveError, KernelCacheError
        from kevin_backend.cache.store import KernelCache, default_seed_dir

        seed_dir = getattr(args, "seed_dir", None)
        if seed_dir is not None:
            cache = KernelCache(config.cache_dir, Path(seed_dir).expanduser())
        else:
            cache = KernelCache(config.cache_dir, default_seed_dir() if config.seed_cache else None)
        try:
            with cache:
                return handler(args, cache)
        except ArchiveError as exc:
            raise CommandError(str(exc), EXIT_USAGE) from exc
        except KernelCacheError as exc:
            raise CommandError(str(exc), EXIT_FAILED) from exc
        except BrokenPipeError:  # stdout's reader is gone: `main` ends quietly
            raise
        except OSError as exc:
            where = f" {exc.filename}" if exc.filename else ""
            raise CommandError(f"cannot access{where}: {exc.strerror or exc}", EXIT_FAILED) from exc

    return wrapped


def resolve_prefix(infos: Iterable[EntryInfo], prefix: str) -> str:
    """The one digest among `infos` that starts with `prefix`; CommandError (usage) otherwise."""
    text = prefix.strip().lower()
    if not text or any(ch not in "0123456789abcdef" for ch in text):
        raise CommandError(f"{prefix!r} is not a digest prefix (hex digits)", EXIT_USAGE)
    matches = sorted({info.digest for info in infos if info.digest.startswith(text)})
    if not matches:
        raise CommandError(f"no cache entry matches {prefix!r} (see `kevin cache ls`)", EXIT_USAGE)
    if len(matches) > 1:
        shown = ", ".join(m[:16] for m in matches[:5]) + (", ..." if len(matches) > 5 else "")
        raise CommandError(
            f"prefix {prefix!r} is ambiguous: it matches {len(matches)} entries ({shown}); give more digits",
            EXIT_USAGE,
        )
    return matches[0]


def table(rows: list[list[str]]) -> str:
    """Rows as aligned columns, the first row the header; the last column is not padded."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    lines = []
    for row in rows:
        cells = [cell.ljust(width) for cell, width in zip(row, widths)] + [row[-1]]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)
