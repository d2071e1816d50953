"""Helper processes end with the process that started them (kevin_backend/lifeline.py): killed
from outside, where the signal reaches that process alone, a `kevin prewarm` leaves no worker
searching on, and a helper's own process group goes with it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from test_prewarm import plugin_env, task_program  # noqa: F401 (plugin_env: the fixture)

# The parent: starts a helper in a session of its own (as the judge's pool and the builder do),
# which calls die_with_parent and starts a grandchild in its group; prints both pids, then waits.
_PARENT = r'''
import subprocess, sys, time
helper = subprocess.Popen([sys.executable, "-c", """
import subprocess, sys, time
from kevin_backend.lifeline import die_with_parent
die_with_parent(0.1)
grandchild = subprocess.Popen(["sleep", "120"])
print(grandchild.pid, flush=True)
time.sleep(120)
"""], stdout=subprocess.PIPE, text=True, start_new_session=True)
print(helper.pid, helper.stdout.readline().strip(), flush=True)
time.sleep(120)
'''


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (exited, not yet reaped by init) counts as gone
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def _gone_within(pids: list[int], seconds: float) -> bool:
    deadline = time.time() + seconds
    while time.time() < deadline:
        if not any(_alive(p) for p in pids):
            return True
        time.sleep(0.1)
    return False


def _children(pid: int) -> list[int]:
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        found += [int(c) for c in (task / "children").read_text().split()]
    return found


def test_a_helper_and_its_group_end_when_its_parent_is_killed() -> None:
    parent = subprocess.Popen([sys.executable, "-c", _PARENT], stdout=subprocess.PIPE, text=True)
    helper, grandchild = (int(p) for p in parent.stdout.readline().split())  # type: ignore[union-attr]
    try:
        assert _alive(helper) and _alive(grandchild)
        time.sleep(0.5)
        assert _alive(helper) and _alive(grandchild)  # (while the parent lives, nothing ends)
        parent.kill()  # SIGKILL to the parent alone: no handler of its runs
        parent.wait()
        assert _gone_within([helper, grandchild], 10.0)
    finally:
        for pid in (helper, grandchild):
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_a_prewarm_killed_alone_leaves_no_worker_searching(tmp_path: Path, plugin_env: Path) -> None:
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    (tasks / "task0.py").write_text(task_program(0))
    command = [sys.executable, "-m", "kevin_backend.cli.main", "--cache-dir", str(tmp_path / "cache"), "prewarm",
               "--tasks", str(tasks), "--generator", "prewarm_helpers:stuck", "--workers", "1"]
    main = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
    workers: list[int] = []
    try:
        deadline = time.time() + 120
        while not workers and time.time() < deadline and main.poll() is None:
            workers = [c for c in _children(main.pid) if "gpu_worker" in Path(f"/proc/{c}/cmdline").read_text()]
            time.sleep(0.2)
        assert workers, "the prewarm started no worker"
        time.sleep(3)  # the worker is in its search (300 s)
        assert all(_alive(w) for w in workers)
        main.kill()  # as `timeout` or `kill PID` would: the prewarm alone
        main.wait()
        assert _gone_within(workers, 10.0), "the worker went on searching after the prewarm was killed"
    finally:
        os.killpg(main.pid, signal.SIGKILL) if main.poll() is None else None
        for pid in workers:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
