"""Progress of `kevin bench` on stderr: a line when a model or task starts and when it ends, with
the time spent and an estimate of the time left."""

from __future__ import annotations

import sys
import time
from typing import TextIO

__all__ = ["Progress"]


class Progress:
    def __init__(self, total: int, stream: TextIO | None = None, enabled: bool = True) -> None:
        self.total = max(total, 1)
        self.done = 0
        self.stream = stream
        self.enabled = enabled
        self.began = time.perf_counter()
        self._item_began = self.began

    def _print(self, text: str) -> None:
        if self.enabled:
            print(text, file=self.stream or sys.stderr, flush=True)

    def start(self, label: str) -> None:
        self._item_began = time.perf_counter()
        self._print(f"[{self.done + 1}/{self.total}] {label} ...")

    def finish(self, label: str, summary: str) -> None:
        self.done += 1
        now = time.perf_counter()
        elapsed = now - self.began
        left = elapsed / self.done * (self.total - self.done)
        eta = f", ~{_duration(left)} left" if self.done < self.total else ""
        self._print(f"[{self.done}/{self.total}] {label}: {summary} ({_duration(now - self._item_began)}; "
                    f"{_duration(elapsed)} elapsed{eta})")


def _duration(seconds: float) -> str:
    seconds = max(0, int(round(seconds)))
    if seconds < 60:
        return f"{seconds}s"
    minutes, s = divmod(seconds, 60)
    return f"{minutes}m{s:02d}s" if minutes < 60 else f"{minutes // 60}h{minutes % 60:02d}m"
