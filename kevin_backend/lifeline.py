"""Helper processes that end with the process that started them.

    die_with_parent()        # first thing in a helper's main: a prewarm worker, a judge worker, a build

`kevin prewarm`, a compile in generate mode and `kevin bench` start helper processes: GPU workers
that search, judge workers that run candidates, build workers that compile. Killed from outside
(a scheduler's time limit, `timeout`, `kill PID`: the signal reaches that process alone), the
parent leaves them running: a search for minutes more, on the GPU the user's next job then
shares. So each helper watches its parent and, once that has gone, ends itself and the process
group it leads (its own compilers and workers). The watch is a thread comparing `os.getppid()`
with the parent it started under, not PR_SET_PDEATHSIG, which fires when the parent's *thread*
that started the helper ends: the judge's pool starts a worker from whichever thread ran the job
before, and the builder from its pool's threads.
"""

from __future__ import annotations

import os
import signal
import threading
import time

__all__ = ["die_with_parent"]

POLL_S = 0.5


def die_with_parent(poll_s: float = POLL_S) -> None:
    """From now on, this process ends within `poll_s` of its parent: it kills the process group
    it leads, if it leads one, then exits with status 1. A process whose parent is already gone
    (adopted by init) is left alone."""
    parent = os.getppid()
    if parent == 1:
        return

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(poll_s)
        try:
            if os.getpgid(0) == os.getpid():  # (its compilers and workers that stayed in its group)
                os.killpg(0, signal.SIGKILL)
        finally:
            os._exit(1)

    threading.Thread(target=watch, name="kevin-lifeline", daemon=True).start()
