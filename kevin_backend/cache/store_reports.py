"""What the store's listings and maintenance return: the entries listed (`KernelCache.entries`),
the entries per GPU and versions (`versions`), what an import did (`import_`) and what a prune
removed and kept (`prune`). Plain frozen records; `kevin cache` prints them, as text or JSON."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kevin_backend.cache.format import CacheEntry, EntryKind, Timings
from kevin_backend.cache.key import CacheKey, VersionTarget

__all__ = ["EntryInfo", "ImportReport", "PruneReport", "VersionGroup"]


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


@dataclass(frozen=True)
class ImportReport:
    """What `KernelCache.import_()` did with each entry of an archive."""

    imported: tuple[str, ...] = ()  # digests written
    skipped: tuple[str, ...] = ()  # digests already present and kept (replace=False)
    rejected: tuple[tuple[str, str], ...] = ()  # (digest or member name, problem); never imported

    @property
    def ok(self) -> bool:
        return not self.rejected

