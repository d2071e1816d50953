"""`kevin cache ls|info|show|rm|clear|prune|export|import|revalidate`: inspect and manage the kernel
cache (`revalidate` lives in revalidate_cmd.py).

Entries are named by digest prefix, matched against the user and the seed entries; a prefix that
matches nothing or more than one digest, or `rm` of a read-only seed entry, is a usage error (exit
2) and nothing is changed. Every
usage error (a missing action, a bad prefix, no --yes, an archive path that cannot be used) is one
`kevin: error: ...` line and exit 2; a cache operation that fails is exit 1. Nothing to clear or
to prune is not an error.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from kevin_backend.cli.cache_access import cache_errors, resolve_prefix, table
from kevin_backend.cli.main import EXIT_FAILED, EXIT_OK, EXIT_USAGE, CommandError
from kevin_backend.cli.revalidate_cmd import add_parser as add_revalidate
from kevin_backend.config import Config

if TYPE_CHECKING:  # the cache's modules import torch: imported when an action runs, not to parse its arguments
    from kevin_backend.cache.format import CacheEntry
    from kevin_backend.cache.key import VersionTarget
    from kevin_backend.cache.store import KernelCache
    from kevin_backend.cache.store_reports import EntryInfo, PruneReport, VersionGroup

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
    group.set_defaults(handler=_missing_action)
    actions = group.add_subparsers(title="actions", metavar="ACTION")

    ls = actions.add_parser(
        "ls", parents=common, help="list entries, then what GPU and versions the seed cache serves"
    )
    ls.add_argument("--json", action="store_true", help="print JSON instead of a table")
    ls.set_defaults(handler=_ls)

    info = actions.add_parser(
        "info",
        parents=common,
        help="the caches' folders, this machine's GPU and versions, and which ones each cache serves",
        description="Where the user and seed caches are, this machine's GPU, torch and CUDA, and how many "
        "entries each cache holds per GPU, torch and CUDA version (and key schema), with whether a lookup "
        "here can find them.",
    )
    info.add_argument("--json", action="store_true", help="print JSON")
    info.set_defaults(handler=_info)

    show = actions.add_parser("show", parents=common, help="print one entry: key, metadata, sources")
    show.add_argument("prefix", metavar="DIGEST_PREFIX")
    show.set_defaults(handler=_show)

    rm = actions.add_parser("rm", parents=common, help="remove user entries")
    rm.add_argument("prefixes", metavar="DIGEST_PREFIX", nargs="+")
    rm.set_defaults(handler=_rm)

    clear = actions.add_parser("clear", parents=common, help="remove every user entry")
    clear.add_argument("--yes", action="store_true", help="confirm (required when there is something to remove)")
    clear.set_defaults(handler=_clear)

    prune = actions.add_parser(
        "prune",
        parents=common,
        help="remove user entries made for other torch/CUDA versions or GPUs (--dry-run lists them)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=_PRUNE_HELP,
    )
    prune.add_argument("--dry-run", action="store_true", help="list what would be removed and why; remove nothing")
    prune.add_argument(
        "--gpu",
        metavar="NAME",
        help="keep only entries for this GPU name, as `kevin cache info` lists it (default: this machine's GPU; "
        "without a visible GPU, entries for every GPU are kept)",
    )
    prune.add_argument("--torch", metavar="VERSION", help="keep entries for this torch version (default: this torch's)")
    prune.add_argument(
        "--cuda",
        metavar="VERSION",
        help="keep entries for this CUDA version (default: the one torch was built with; a torch without CUDA "
        "compares none)",
    )
    prune.set_defaults(handler=_prune)

    export = actions.add_parser("export", parents=common, help="write entries to a .tar.gz")
    export.add_argument("file", metavar="FILE", type=Path)
    export.add_argument("prefixes", metavar="DIGEST", nargs="*", help="entries to export (default: all user entries)")
    export.set_defaults(handler=_export)

    import_ = actions.add_parser("import", parents=common, help="add the entries of a .tar.gz made by export")
    import_.add_argument("file", metavar="FILE", type=Path)
    import_.add_argument("--replace", action="store_true", help="overwrite entries that already exist")
    import_.set_defaults(handler=_import)

    add_revalidate(actions, common)


_ACTIONS = "ls, info, show, rm, clear, prune, export, import, revalidate"

_PRUNE_HELP = """\
Remove the user entries that no lookup on this machine can find, and forget the pending misses
recorded for them: entries made for another torch version, CUDA version or GPU than this
machine's, or by an older kevin_backend (an older key schema or entry format). A torch or CUDA
upgrade orphans every entry made before it; this is how to reclaim them. Counts are printed per
reason; --dry-run lists each entry that would go and why, and removes nothing.

What is kept: entries for this machine's GPU (its name and compute capability), this torch
version and the CUDA version torch was built with. --gpu, --torch and --cuda replace those (to
prune a shared cache for another machine, say).

Without a visible GPU (a CPU-only machine, CUDA_VISIBLE_DEVICES empty) this machine cannot say
which GPU's entries it will use: entries are then compared by torch and CUDA version only,
whatever GPU they were made for, unless --gpu NAME is given (a name as `kevin cache info` lists
it, e.g. "NVIDIA H200"; any capability of that name). A torch built without CUDA compares no CUDA
version unless --cuda is given. Entries made for CPU tensors are never removed for their GPU.

The seed cache shipped with the package is read-only and never pruned; `kevin cache info` and
`kevin cache ls` say which GPU and versions it serves. Entries whose metadata cannot be read, or
that a newer kevin_backend wrote, are left in place and listed.
"""


def _missing_action(args: argparse.Namespace, config: Config) -> int:
    raise CommandError(f"`kevin cache` needs an action: {_ACTIONS} (see `kevin cache --help`)", EXIT_USAGE)


# -- formatting ------------------------------------------------------------------------------


def _ops_summary(ops: tuple[str, ...], limit: int = 4) -> str:
    names = list(dict.fromkeys(op.removeprefix("aten.").removesuffix(".default") for op in ops))
    text = ", ".join(names[:limit])
    return text + (f" +{len(names) - limit}" if len(names) > limit else "")


def _speedup(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def _fraction(value: float | None) -> str:
    """The kernel's share of the GPU's copy bandwidth (its judge record's roofline), "-" unknown."""
    return "-" if value is None else f"{value:.0%}"


def _this_machine() -> str:
    """This machine's GPU, torch and CUDA in words."""
    from kevin_backend.cache.key import DeviceInfo

    device = DeviceInfo.detect("cuda")
    gpu = f"{device.name} ({device.capability})" if device.capability else "no GPU visible"
    cuda = f"CUDA {device.cuda_version}" if device.cuda_version else "torch built without CUDA"
    return f"{gpu}, torch {device.torch_version}, {cuda}"


def _usable_here(group: VersionGroup, target: VersionTarget) -> str:
    """Whether a lookup under `target` can find the group's entries, in words."""
    found = target.mismatch(group.key_fields())
    if found is not None:
        return f"no: {found[1]}"
    if target.gpu is None and group.gpu != "cpu":
        return "versions match; no GPU visible to compare"
    return "yes"


def _seed_lines(cache: KernelCache, groups: list[VersionGroup], target: VersionTarget) -> list[str]:
    """'the seed cache serves ...' lines: each GPU and version pair, and whether it serves here."""
    if cache.seed_dir is None:
        return ["seed cache: disabled"]
    seed = [g for g in groups if g.source == "seed"]
    if not seed:
        return [f"seed cache ({cache.seed_dir}): no entries"]
    lines = ["the seed cache serves:"]
    for group in seed:
        lines.append(f"  {group.describe()}: {group.entries} entries; usable here: {_usable_here(group, target)}")
    lines.append(f"this machine: {_this_machine()}")
    return lines


# -- actions ---------------------------------------------------------------------------------


@cache_errors
def _ls(args: argparse.Namespace, cache: KernelCache) -> int:
    from kevin_backend.cache.key import VersionTarget
    from kevin_backend.measure.roofline import record_fraction

    infos = cache.entries()
    if args.json:
        print(json.dumps([{**info.as_dict(), "roofline_fraction": record_fraction(info.entry.judge_record)
                           if info.entry is not None else None} for info in infos], indent=2))
        return EXIT_OK
    if not infos:
        seed = cache.seed_dir if cache.seed_dir is not None else "disabled"
        print(f"no cache entries (user cache: {cache.cache_dir}; seed cache: {seed})")
        return EXIT_OK
    rows = [["DIGEST", "KIND", "SOURCE", "VS INDUCTOR", "ROOFLINE", "CREATED", "OPS"]]
    for info in infos:
        if info.error is not None:
            rows.append([info.digest[:12], "corrupt", info.source, "-", "-", "-", f"error: {info.error}"])
            continue
        speedup = (info.entry.speedup_vs_inductor if info.entry is not None
                   else info.timings.speedup_vs_inductor if info.timings is not None else None)
        kind = info.kind.value if info.kind is not None else "?"
        roofline = record_fraction(info.entry.judge_record) if info.entry is not None else None
        rows.append([info.digest[:12], kind, info.source, _speedup(speedup), _fraction(roofline), info.created,
                     _ops_summary(info.ops)])
    print(table(rows))
    print()
    print("\n".join(_seed_lines(cache, cache.versions(), VersionTarget.this_machine())))
    return EXIT_OK


@cache_errors
def _info(args: argparse.Namespace, cache: KernelCache) -> int:
    from kevin_backend.cache.key import DeviceInfo, VersionTarget

    target = VersionTarget.this_machine()
    groups = cache.versions()
    user_entries = sum(g.entries for g in groups if g.source == "user")
    pending = len(cache.pending())
    if args.json:
        device = DeviceInfo.detect("cuda")
        data = {
            "user_cache": str(cache.cache_dir),
            "seed_cache": None if cache.seed_dir is None else str(cache.seed_dir),
            "machine": {"gpu": device.name if device.capability else None, "capability": device.capability or None,
                        "torch": device.torch_version, "cuda": device.cuda_version or None},
            "versions": [{**g.as_dict(), "usable_here": _usable_here(g, target)} for g in groups],
            "pending": pending,
        }
        print(json.dumps(data, indent=2))
        return EXIT_OK
    print(f"user cache: {cache.cache_dir} ({user_entries} entries, {pending} pending misses)")
    if cache.seed_dir is None:
        print("seed cache: disabled")
    else:
        seed_entries = sum(g.entries for g in groups if g.source == "seed")
        print(f"seed cache: {cache.seed_dir} (read-only, {seed_entries} entries)")
    print(f"this machine: {_this_machine()}")
    if groups:
        rows = [["SOURCE", "ENTRIES", "GPU", "TORCH", "CUDA", "SCHEMA", "USABLE HERE"]]
        for g in groups:
            gpu = g.gpu + (f" ({g.capability})" if g.capability else "")
            rows.append([g.source, str(g.entries), gpu, g.torch_version or "?", g.cuda_version or "-", str(g.schema),
                         _usable_here(g, target)])
        print()
        print(table(rows))
    unusable = sum(g.entries for g in groups if g.source == "user" and target.mismatch(g.key_fields()) is not None)
    if unusable:
        print(f"\n{unusable} user entries cannot be used here: `kevin cache prune --dry-run` lists them")
    return EXIT_OK


def _print_entry(entry: CacheEntry, info: EntryInfo) -> None:
    from kevin_backend.cache.disk_format import entry_metadata

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


@cache_errors
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


@cache_errors
def _rm(args: argparse.Namespace, cache: KernelCache) -> int:
    from kevin_backend.cache.errors import ReadOnlyEntryError

    infos = cache.entries()
    digests = list(dict.fromkeys(resolve_prefix(infos, prefix) for prefix in args.prefixes))
    user = {info.digest for info in infos if info.source == "user"}
    seed_only = [digest for digest in digests if digest not in user]
    if seed_only:  # a usage error like a bad prefix: said before anything is removed
        raise CommandError(f"{'entry' if len(seed_only) == 1 else 'entries'} {', '.join(seed_only)} "
                           f"{'is' if len(seed_only) == 1 else 'are'} in the read-only seed cache ({cache.seed_dir}) "
                           "and cannot be removed; --no-seed (or KEVIN_SEED_CACHE=0) ignores the seed cache", EXIT_USAGE)
    status = EXIT_OK
    for digest in digests:
        try:
            removed = cache.remove(digest)
        except ReadOnlyEntryError as exc:  # its user entry removed by someone else since we listed
            print(f"kevin: error: {exc}", file=sys.stderr)
            status = EXIT_USAGE
            continue
        if removed:
            print(f"removed {digest}")
        else:  # removed by someone else since we listed
            print(f"kevin: error: entry {digest} is gone already", file=sys.stderr)
            status = EXIT_FAILED
    return status


@cache_errors
def _clear(args: argparse.Namespace, cache: KernelCache) -> int:
    count = sum(1 for info in cache.entries() if info.source == "user")
    if not count:
        cache.clear()  # sweeps what crashed writers left, if anything
        print(f"nothing to clear: no user entries in {cache.cache_dir}")
        return EXIT_OK
    if not args.yes:
        raise CommandError(
            f"this would remove {count} user entries from {cache.cache_dir}; run again with --yes",
            EXIT_USAGE,
        )
    removed = cache.clear()
    print(f"removed {removed} entries from {cache.cache_dir}")
    return EXIT_OK


_REASONS = {
    "torch": "for another torch",
    "cuda": "for another CUDA",
    "gpu": "for another GPU",
    "schema": "from an older kevin_backend",
    "format": "in an older entry format",
}


def _reason_counts(report: PruneReport, items: tuple[tuple[str, str, str], ...]) -> str:
    return ", ".join(f"{n} {_REASONS.get(what, what)}" for what, n in sorted(report.counts(items).items()))


@cache_errors
def _prune(args: argparse.Namespace, cache: KernelCache) -> int:
    from kevin_backend.cache.key import VersionTarget

    target = VersionTarget.this_machine(gpu=args.gpu, torch_version=args.torch, cuda_version=args.cuda)
    report = cache.prune(target, dry_run=args.dry_run)
    gpu_note = ""
    if target.gpu is None:
        gpu_note = " (no GPU visible: entries for every GPU are kept; --gpu NAME keeps one GPU's)"
    print(f"keeping entries for: {target.describe()}{gpu_note}")
    total = len(report.removed) + len(report.kept)
    verb = "would remove" if report.dry_run else "removed"
    if report.removed:
        print(f"{verb} {len(report.removed)} of {total} user entries ({_reason_counts(report, report.removed)}):")
        for digest, _, why in report.removed:
            print(f"  {digest[:12]}  {why}")
    else:
        print(f"nothing to prune: {total} user entries, all usable here")
    pending_total = len(report.pending_removed) + len(report.pending_kept)
    if report.pending_removed:
        forget = "would forget" if report.dry_run else "forgot"
        print(f"{forget} {len(report.pending_removed)} of {pending_total} pending misses "
              f"({_reason_counts(report, report.pending_removed)}):")
        for digest, _, why in report.pending_removed:
            print(f"  {digest[:12]}  {why}")
    if report.left:
        print(f"left in place: {len(report.left)} folders prune does not judge:")
        for digest, why in report.left:
            print(f"  {digest[:12]}  {why}")
    kept = "would keep" if report.dry_run else "kept"
    print(f"{kept} {len(report.kept)} user entries and {len(report.pending_kept)} pending misses")
    seed = [g for g in cache.versions() if g.source == "seed"]
    if seed:
        served = "; ".join(f"{g.entries} for {g.describe()}" for g in seed)
        matching = sum(g.entries for g in seed if target.mismatch(g.key_fields()) is None)
        print(f"seed cache (read-only, never pruned): {served}; {matching} of them match what is kept")
    return EXIT_OK


@cache_errors
def _export(args: argparse.Namespace, cache: KernelCache) -> int:
    digests = None
    if args.prefixes:
        infos = cache.entries()
        digests = list(dict.fromkeys(resolve_prefix(infos, prefix) for prefix in args.prefixes))
    count = cache.export(args.file, digests)
    print(f"exported {count} entries to {args.file}")
    return EXIT_OK


@cache_errors
def _import(args: argparse.Namespace, cache: KernelCache) -> int:
    """An archive is code from elsewhere: an entry whose programs break the static rules is
    refused (named, with its rules), the others are imported."""
    from kevin_backend.runtime.registry import entry_violations

    entries, rejected = cache.read_archive(args.file)
    for digest, entry in list(entries.items()):
        broken = entry_violations(entry)
        if broken:
            del entries[digest]
            rejected.append((digest, "its programs break the static rules: " + "; ".join(broken)))
    report = cache.add_entries(entries, rejected, replace=args.replace)
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
