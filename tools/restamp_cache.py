"""Make a user cache that holds the seed cache's entries (or another cache's, `--from DIR`) as a
user on another torch sees them: each entry copied with its key's torch version replaced, so that
none is usable here and every kernel entry is a known candidate for `kevin cache revalidate` (the
GPU check of revalidation, where a second torch cannot be installed).

    python tools/restamp_cache.py CACHE_DIR 2.13.0 [--from SOURCE_CACHE_DIR]
    kevin cache --cache-dir CACHE_DIR --no-seed revalidate

Prints the kernel entries' new digests, the fastest (by the seed's recorded speed-up) first, with
that speed-up and the shape of the first input.
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from kevin_backend.cache.format import EntryKind
from kevin_backend.cache.store import KernelCache, default_seed_dir


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("cache_dir", type=Path, help="the user cache to fill (created if missing)")
    parser.add_argument("torch_version", help="the torch version the copied keys name")
    parser.add_argument("--from", dest="source", type=Path, default=None,
                        help="copy this user cache's entries (default: the packaged seed cache)")
    args = parser.parse_args()
    root = default_seed_dir() if args.source is None else args.source / "entries"
    if not root.is_dir():
        raise SystemExit(f"no cache entries in {root}")
    source = KernelCache(args.cache_dir / "unread", root)  # read as a seed: nothing is written there
    target = KernelCache(args.cache_dir, None)
    kernels = []
    for folder in sorted(root.iterdir()):
        entry = source.get_digest(folder.name) if folder.is_dir() else None
        if entry is None:
            continue
        moved = dataclasses.replace(entry, key=dataclasses.replace(entry.key, torch_version=args.torch_version))
        if not target.put(moved):
            raise SystemExit(f"{moved.digest} is already in {args.cache_dir}")
        if entry.kind is EntryKind.KERNEL:
            shape = "x".join(map(str, entry.key.inputs[0].shape))
            kernels.append((entry.timings.speedup_vs_inductor, moved.digest, shape))
    for speedup, digest, shape in sorted(kernels, reverse=True):
        print(digest[:12], f"{speedup:.3f}", shape)


if __name__ == "__main__":
    main()
