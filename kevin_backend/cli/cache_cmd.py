"""`kevin cache ls|show|rm|clear|export|import`: inspect and manage the kernel cache.

Entries are named by digest prefix, matched against the user and the seed entries; a prefix that
matches nothing or more than one digest is a usage error (exit 2) and nothing is changed.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from pathlib import Path
from typing import Callable, Iterable

from kevin_backend.cache.entry import CacheEntry
from kevin_backend.cache.store import (
    EntryInfo,
    KernelCache,
    KernelCacheError,
    ReadOnlyEntryError,
    default_seed_dir,
    entry_metadata,
)
from kevin_backend.cli.main import EXIT_FAILED, EXIT_OK, EXIT_USAGE, CommandError, Handler
from kevin_backend.config import Config

__all__ = ["register", "resolve_prefix"]


def register(subparsers: argparse._SubParsersAction, parents: list[argparse.ArgumentParser]) -> None:
    """Add the `cache` command group to the `kevin` parser."""
    seed = argparse.ArgumentParser(add_help=False)
    seed.add_argument(
        "--seed-dir",
        type=Path,
        default=argparse.SUPPRESS,
        metavar="DIR",
        help="read-only seed cache to consult instead of the packaged one",
    )
    common = [*parents, seed]
    group = subparsers.add_parser(
        "cache",
        parents=common,
        help="inspect and manage the kernel cache",
        description="Inspect and manage the kernel cache: the user cache, then the read-only seed cache.",
    )
    group.set_defaults(handler=_print_help(group))
    actions = group.add_subparsers(title="actions", metavar="ACTION")

    ls = actions.add_parser("ls", parents=common, help="list entries")
    ls.add_argument("--json", action="store_true", help="print JSON instead of a table")
    ls.set_defaults(handler=_ls)

    show = actions.add_parser("show", parents=common, help="print one entry: key, metadata, sources")
    show.add_argument("prefix", metavar="DIGEST_PREFIX")
    show.set_defaults(handler=_show)

    rm = actions.add_parser("rm", parents=common, help="remove user entries")
    rm.add_argument("prefixes", metavar="DIGEST_PREFIX", nargs="+")
    rm.set_defaults(handler=_rm)

    clear = actions.add_parser("clear", parents=common, help="remove every user entry")
    clear.add_argument("--yes", action="store_true", help="confirm (required)")
    clear.set_defaults(handler=_clear)

    export = actions.add_parser("export", parents=common, help="write entries to a .tar.gz")
    export.add_argument("file", metavar="FILE", type=Path)
    export.add_argument("prefixes", metavar="DIGEST", nargs="*", help="entries to export (default: all user entries)")
    export.set_defaults(handler=_export)

    import_ = actions.add_parser("import", parents=common, help="add the entries of a .tar.gz made by export")
    import_.add_argument("file", metavar="FILE", type=Path)
    import_.add_argument("--replace", action="store_true", help="overwrite entries that already exist")
    import_.set_defaults(handler=_import)


def _print_help(parser: argparse.ArgumentParser) -> Handler:
    def handler(args: argparse.Namespace, config: Config) -> int:
        parser.print_help(sys.stderr)
        return EXIT_USAGE

    return handler


def _cache_errors(handler: Callable[[argparse.Namespace, KernelCache], int]) -> Handler:
    """Open the cache the arguments name and turn cache failures into exit code 1."""

    @functools.wraps(handler)
    def wrapped(args: argparse.Namespace, config: Config) -> int:
        seed_dir = getattr(args, "seed_dir", None)
        if seed_dir is not None:
            cache = KernelCache(config.cache_dir, Path(seed_dir).expanduser())
        else:
            cache = KernelCache(config.cache_dir, default_seed_dir() if config.seed_cache else None)
        try:
            with cache:
                return handler(args, cache)
        except KernelCacheError as exc:
            raise CommandError(str(exc), EXIT_FAILED) from exc
        except OSError as exc:
            raise CommandError(f"{exc}", EXIT_FAILED) from exc

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


# -- formatting ------------------------------------------------------------------------------


def _ops_summary(ops: tuple[str, ...], limit: int = 4) -> str:
    names = list(dict.fromkeys(op.removeprefix("aten.").removesuffix(".default") for op in ops))
    text = ", ".join(names[:limit])
    return text + (f" +{len(names) - limit}" if len(names) > limit else "")


def _speedup(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def _table(rows: list[list[str]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    lines = []
    for row in rows:
        cells = [cell.ljust(width) for cell, width in zip(row, widths)] + [row[-1]]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


# -- actions ---------------------------------------------------------------------------------


@_cache_errors
def _ls(args: argparse.Namespace, cache: KernelCache) -> int:
    infos = cache.entries()
    if args.json:
        print(json.dumps([info.as_dict() for info in infos], indent=2))
        return EXIT_OK
    if not infos:
        seed = cache.seed_dir if cache.seed_dir is not None else "disabled"
        print(f"no cache entries (user cache: {cache.cache_dir}; seed cache: {seed})")
        return EXIT_OK
    rows = [["DIGEST", "KIND", "SOURCE", "VS INDUCTOR", "CREATED", "OPS"]]
    for info in infos:
        if info.error is not None:
            rows.append([info.digest[:12], "corrupt", info.source, "-", "-", f"error: {info.error}"])
            continue
        speedup = info.timings.speedup_vs_inductor if info.timings is not None else None
        kind = info.kind.value if info.kind is not None else "?"
        rows.append([info.digest[:12], kind, info.source, _speedup(speedup), info.created, _ops_summary(info.ops)])
    print(_table(rows))
    return EXIT_OK


def _print_entry(entry: CacheEntry, info: EntryInfo) -> None:
    meta = entry_metadata(entry)
    key = meta.pop("key")
    print(f"entry {entry.digest} ({info.source} cache: {info.path})")
    print("key:")
    print(json.dumps(key, indent=2, sort_keys=True))
    print("meta:")
    print(json.dumps(meta, indent=2, sort_keys=True))
    print("--- task.py ---")
    print(entry.task.source.rstrip("\n"))
    if entry.kernel_source is not None:
        print("--- kernel.py ---")
        print(entry.kernel_source.rstrip("\n"))


@_cache_errors
def _show(args: argparse.Namespace, cache: KernelCache) -> int:
    infos = cache.entries()
    digest = resolve_prefix(infos, args.prefix)
    located = [info for info in infos if info.digest == digest]  # user first, then seed
    usable = next((info for info in located if info.entry is not None), None)
    for info in located:
        if info.error is not None:
            print(f"corrupt {info.source} entry {info.path}: {info.error}", file=sys.stderr)
    if usable is None:
        return EXIT_FAILED
    assert usable.entry is not None
    _print_entry(usable.entry, usable)
    for info in located:
        if info is not usable and info.error is None:
            print(f"(also in the {info.source} cache at {info.path}; the {usable.source} entry is used)")
    return EXIT_OK


@_cache_errors
def _rm(args: argparse.Namespace, cache: KernelCache) -> int:
    infos = cache.entries()
    digests = list(dict.fromkeys(resolve_prefix(infos, prefix) for prefix in args.prefixes))
    status = EXIT_OK
    for digest in digests:
        try:
            removed = cache.remove(digest)
        except ReadOnlyEntryError as exc:
            print(f"kevin: error: {exc}", file=sys.stderr)
            status = EXIT_FAILED
            continue
        if removed:
            print(f"removed {digest}")
        else:  # removed by someone else since we listed
            print(f"kevin: error: entry {digest} is gone already", file=sys.stderr)
            status = EXIT_FAILED
    return status


@_cache_errors
def _clear(args: argparse.Namespace, cache: KernelCache) -> int:
    if not args.yes:
        count = sum(1 for info in cache.entries() if info.source == "user")
        raise CommandError(
            f"this would remove {count} user entries from {cache.cache_dir}; run again with --yes",
            EXIT_USAGE,
        )
    removed = cache.clear()
    print(f"removed {removed} entries from {cache.cache_dir}")
    return EXIT_OK


@_cache_errors
def _export(args: argparse.Namespace, cache: KernelCache) -> int:
    digests = None
    if args.prefixes:
        infos = cache.entries()
        digests = list(dict.fromkeys(resolve_prefix(infos, prefix) for prefix in args.prefixes))
    count = cache.export(args.file, digests)
    print(f"exported {count} entries to {args.file}")
    return EXIT_OK


@_cache_errors
def _import(args: argparse.Namespace, cache: KernelCache) -> int:
    if not args.file.is_file():
        raise CommandError(f"no such file: {args.file}", EXIT_FAILED)
    report = cache.import_(args.file, replace=args.replace)
    print(f"imported {len(report.imported)} entries into {cache.cache_dir}")
    for digest in report.imported:
        print(f"  imported {digest}")
    if report.skipped:
        print(f"skipped {len(report.skipped)} entries that already exist (use --replace to overwrite):")
        for digest in report.skipped:
            print(f"  skipped {digest}")
    for name, problem in report.rejected:
        print(f"kevin: error: rejected {name}: {problem}", file=sys.stderr)
    return EXIT_OK if report.ok else EXIT_FAILED
