"""Process-wide counters for observability and tests: the backend's decisions and the runtime's
calls, `counters.expect(hits=1, fallbacks=0)`."""

from __future__ import annotations

import threading
from collections import Counter

__all__ = ["Counters", "counters"]


class Counters:
    """Process-wide counters for observability and tests: `counters.expect(hits=1, fallbacks=0)`."""

    NAMES = (
        "compiles",
        "graphs",
        "partitions",
        "hits",
        "generated",
        "misses",
        "pending_recorded",
        "inductor_winners",
        "skipped",
        "fallbacks",
        "dropped",  # kernels left out because their graph ran slower with them
        "graph_checks",  # graphs timed with and without their kernels
        "graph_checks_stored",  # graphs whose stored outcome was reused
        "graph_checks_confirmed",  # stored outcomes that kept kernels, timed again in another process
        "compile_fallbacks",
        "runtime_loads",
        "runtime_size_fallbacks",
        "runtime_errors",
        "runtime_inductor_calls",  # calls served by Inductor's code for a partition (inputs its kernel does not take)
        "runtime_inductor_errors",  # partitions whose Inductor code failed: their reference ran eagerly
    )

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._values: Counter[str] = Counter()

    def add(self, name: str, n: int = 1) -> None:
        if name not in self.NAMES:
            raise KeyError(f"unknown counter {name!r}")
        with self._lock:
            self._values[name] += n

    def __getitem__(self, name: str) -> int:
        if name not in self.NAMES:
            raise KeyError(f"unknown counter {name!r}")
        return self._values[name]

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return {n: self._values[n] for n in self.NAMES}

    def reset(self) -> None:
        with self._lock:
            self._values.clear()

    def expect(self, **expected: int) -> None:
        """Assert counter values; the error lists every mismatch."""
        got = self.snapshot()
        unknown = set(expected) - set(got)
        if unknown:
            raise KeyError(f"unknown counter(s) {sorted(unknown)}")
        wrong = {k: (v, got[k]) for k, v in expected.items() if got[k] != v}
        if wrong:
            text = ", ".join(f"{k}: expected {e}, got {g}" for k, (e, g) in wrong.items())
            raise AssertionError(f"counters differ: {text}")


counters = Counters()
