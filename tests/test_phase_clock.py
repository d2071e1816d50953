"""A judged run's time limit, charged by whose phase is running (`judge/phases.py`): the
candidate's phases share one limit, each of the judge's own steps has its own, the whole run is
capped, and a stop is a hang only when the candidate's own time ran out. The worker's lines are
replayed on a clock the test moves."""

from __future__ import annotations

import os
import queue
import time
from pathlib import Path

import pytest

from kevin_backend.judge.phases import END, WHOLE_RUN_LIMITS, PhaseClock, follow


class Time:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_candidates_phases_share_the_limit_and_each_judge_step_has_its_own() -> None:
    t = Time()
    clock = PhaseClock(10.0, now=t)
    t.now = 8.0
    assert clock.left() == pytest.approx(2.0)  # the judge's start: 8 of its own 10 s
    clock.enter("load")
    assert clock.left() == pytest.approx(10.0)  # the candidate's time is untouched by the judge's start
    t.now = 15.0
    clock.enter("inputs")  # the candidate spent 7 s
    assert clock.left() == pytest.approx(10.0)
    t.now = 20.0
    clock.enter("candidate")
    assert clock.left() == pytest.approx(3.0)
    t.now = 23.0
    assert clock.left() == pytest.approx(0.0) and clock.candidates()


def test_the_whole_run_is_capped_and_a_stop_by_the_cap_is_the_judges() -> None:
    t = Time()
    clock = PhaseClock(10.0, now=t)
    for step, at in (("setup", 9.0), ("inputs", 18.0), ("reference", 27.0)):
        t.now = at
        clock.enter(step)
    clock.enter("candidate")
    assert clock.left() == pytest.approx(WHOLE_RUN_LIMITS * 10.0 - 27.0)
    t.now = WHOLE_RUN_LIMITS * 10.0
    assert clock.left() <= 0 and not clock.candidates()  # the candidate had 3 of its 10 s


def replay(t: Time, script: list[tuple[float, object]]):
    """A worker's lines: (seconds after the previous line, the line). Waiting past the next line's
    time raises queue.Empty after moving the clock by the wait."""
    lines = list(script)

    def next_line(seconds: float) -> object:
        if not lines or lines[0][0] > seconds:
            if lines:
                lines[0] = (lines[0][0] - seconds, lines[0][1])
            t.now += seconds
            raise queue.Empty
        delay, line = lines.pop(0)
        t.now += delay
        return line
    return next_line


@pytest.mark.parametrize("silent_in, hung", [("candidate", True), ("exact", False)])
def test_a_silent_worker_is_stopped_and_the_phase_it_fell_silent_in_says_whose(silent_in: str, hung: bool) -> None:
    t = Time()
    script = [(6.0, "tok phase setup"), (4.0, "tok phase load"), (1.0, "tok phase inputs"), (9.0, f"tok phase {silent_in}")]
    end = follow(replay(t, script), "tok", PhaseClock(10.0, now=t))
    assert end.timed_out and end.hung is hung and end.phase == silent_in and end.verdict is None
    # stopped when its own time ran out: the candidate had 1 s of load before; a judge step has 10 s
    assert t.now == pytest.approx(20.0 + (9.0 if hung else 10.0), abs=0.05)


def test_the_verdict_is_the_workers_token_line_and_an_end_is_no_verdict() -> None:
    t = Time()
    script = [(1.0, "tok phase candidate"), (1.0, 'other {"reason": "ACCEPTED"}'), (1.0, "printed by the kernel"),
              (1.0, 'tok {"reason": "MISMATCH"}')]
    end = follow(replay(t, script), "tok", PhaseClock(10.0, now=t))
    assert (end.verdict, end.phase, end.timed_out) == ({"reason": "MISMATCH"}, "candidate", False)
    end = follow(replay(t, [(1.0, "tok phase candidate"), (1.0, END)]), "tok", PhaseClock(10.0, now=t))
    assert (end.verdict, end.timed_out, end.hung) == (None, False, False)


LINGERING = '''
import json, subprocess, sys, time
token = json.loads(sys.stdin.readline())["token"]
child = subprocess.Popen(["sleep", "300"])
open(sys.argv[0] + ".pid", "w").write(str(child.pid))
print(f"{token} phase candidate", flush=True)
print(token + ' {"reason": "ACCEPTED"}', flush=True)
time.sleep(300)
'''


def test_a_worker_that_lingers_after_its_verdict_is_stopped_with_what_it_started(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from kevin_backend.judge import sandbox
    from kevin_backend.judge.job import Job

    (tmp_path / "lingering_worker.py").write_text(LINGERING)
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    monkeypatch.setattr(sandbox, "_EXIT_WAIT", 1.0)
    start = time.monotonic()
    end = sandbox.run_worker_process("lingering_worker", Job(task="", candidate="", seeds=(1,), trials=1, warmup=0), timeout=3.0)
    assert end.verdict == {"reason": "ACCEPTED"} and not end.timed_out
    assert time.monotonic() - start < 30
    child = int((tmp_path / "lingering_worker.py.pid").read_text())
    status = Path(f"/proc/{child}/status")
    for _ in range(100):  # (a killed process may take a moment to go on a loaded machine)
        if not status.exists() or "State:\tZ" in status.read_text():
            break
        time.sleep(0.1)
    else:
        raise AssertionError(f"the worker's child lives on: {status.read_text()[:200]}")


def test_a_worker_that_never_reads_a_large_job_is_stopped_at_its_clock(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from kevin_backend.judge import sandbox
    from kevin_backend.judge.job import Job

    (tmp_path / "deaf_worker.py").write_text("import time\ntime.sleep(300)\n")
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    start = time.monotonic()
    job = Job(task="x" * (1 << 20), candidate="", seeds=(1,), trials=1, warmup=0)  # a megabyte: more than a pipe holds
    end = sandbox.run_worker_process("deaf_worker", job, timeout=2.0)
    assert end.timed_out and not end.hung and end.phase == "start" and time.monotonic() - start < 30
