"""The `KernelGenerator` protocol: how the backend asks for a kernel on a cache miss.

The backend's `generate` mode calls `generate(task, key)` for each partition missing from the
cache (`backend/kevin_pass.py`: the `generator` option's value, else `generator.default_generator`,
a `SearchGenerator`). A generator returns a `CacheEntry`: a KERNEL entry (a verified kernel that
beat Inductor) or an INDUCTOR entry (nothing did); the backend stores it and swaps KERNEL winners
in. A generator that raises is a fallback to Inductor for that partition, never a failed compile;
one that raises `PolicyError` (its model cannot answer) is not asked again in that compile; one
that raises `SearchIncomplete` (the judge could not finish: its own failure, memory among them)
leaves the task pending for `kevin prewarm`, no decision stored.

A generator may also say where its last `generate` call spent its time (`AccountedGenerator`);
the compile report shows it beside each partition's search time. One told which tasks come after
the first of a compile (`ForeseeingGenerator`) may start their builds meanwhile.
"""

from __future__ import annotations

from typing import Any, Protocol, Sequence, runtime_checkable

from kevin_backend.cache.format import CacheEntry
from kevin_backend.cache.key import CacheKey
from kevin_backend.types import KernelTask

__all__ = ["KernelGenerator", "AccountedGenerator", "ForeseeingGenerator"]


@runtime_checkable
class KernelGenerator(Protocol):
    name: str

    def generate(self, task: KernelTask, key: CacheKey) -> CacheEntry:
        """A verified decision for `task` on the device `key` names."""
        ...


@runtime_checkable
class AccountedGenerator(Protocol):
    """A generator's account of its last `generate` call's search."""

    def search_account(self) -> dict[str, Any] | None:
        """Where the last search spent its time: `writer_seconds` (the policy's calls),
        `judge_seconds` (the verdicts), `retime_seconds` (the winner re-timed against Inductor),
        `turns` and `candidates`; None when that call made no search."""
        ...


@runtime_checkable
class ForeseeingGenerator(Protocol):
    """A generator told, before a compile's first search, which tasks it will be asked next."""

    def foresee(self, tasks: Sequence[KernelTask], keys: Sequence[CacheKey]) -> None:
        """Prepare for `tasks` (searched after the present one, each under its key in `keys`: the
        device and the numerics): build what their first turns need, in the background; returns
        at once. A failure here is met, and reported, when the task is searched."""
        ...
