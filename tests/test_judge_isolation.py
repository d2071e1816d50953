"""The judge out of the candidate's reach, on the CPU: candidates that attack the judge from
inside their own process (patching the comparison, the timer, the reference or torch through any
alias, poisoning the next candidate, forging a verdict, detecting the audit, raising a fake
out-of-memory error, killing their parent). Each runs without the static rules (they are the
first line; this is the second), and each is judged honestly: the candidate's code runs in a
process of its own, and nothing that decides its verdict lives there.

Before the candidate had a process of its own, the cases marked "was ACCEPTED" were accepted
(the judge's worker ran the candidate's module-level code beside its comparison and timer).
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from kevin_backend.judge.pool import WorkerPool
from kevin_backend.judge.sandbox import RunConfig, run_in_sandbox

from test_judge_runner import FAST, HONEST, NUMPY, TASK, candidate

WRONG = NUMPY + "        return torch.from_numpy((1.0 / (1.0 + np.exp(-a)) * b + 2.0).astype(np.float32))\n"

# every module in the process that has one, whatever name it is reached by: the comparison always agrees
PATCH_COMPARE = (
    "_s = __import__('sy' + 's')\n"
    "for _m in list(_s.modules.values()):\n"
    "    for _name in ('compare_outputs', 'stale'):\n"
    "        if hasattr(_m, _name):\n"
    "            setattr(_m, _name, (lambda *a, **k: None) if _name == 'compare_outputs' else (lambda *a, **k: False))\n"
)


def with_prelude(prelude: str, body: str, init: str = "") -> str:
    return candidate(body, init).replace("import torch.nn as nn\n", "import torch.nn as nn\n" + prelude, 1)


def test_a_wrong_kernel_that_patches_the_comparison_through_an_alias_is_a_mismatch() -> None:
    # was ACCEPTED: computes +2 for +1 and replaced the worker's comparison
    out = run_in_sandbox(TASK, with_prelude(PATCH_COMPARE, WRONG), FAST)
    assert out.reason == "MISMATCH", (out.reason, out.feedback)


def test_a_patch_does_not_outlive_its_candidate() -> None:
    # was ACCEPTED: a clean verdict kept the worker, and the next wrong candidate found the patch
    with WorkerPool(size=1) as pool:
        honest = NUMPY + "        return torch.from_numpy((1.0 / (1.0 + np.exp(-a)) * b + 1.0).astype(np.float32))\n"
        first = pool.run(TASK, with_prelude(PATCH_COMPARE, honest), FAST)
        second = pool.run(TASK, candidate(WRONG), FAST)
        assert first.reason == "ACCEPTED" and pool.started == 1, (first.reason, first.feedback)
        assert second.reason == "MISMATCH", (second.reason, second.feedback)


def test_patching_the_timer_and_the_clock_does_not_change_the_time() -> None:
    # was 0.0 ms: the forward sleeps 30 ms and patched every timer it could find
    prelude = PATCH_COMPARE.split("for _m")[0] + (
        "_t = __import__('time')\n"
        "_t.perf_counter = lambda: 0.0\n"
        "_t.monotonic = lambda: 0.0\n"
        "for _m in list(_s.modules.values()):\n"
        "    for _name in ('make_timer', 'trial_times', 'timed_batch', 'interleaved_rounds'):\n"
        "        if hasattr(_m, _name):\n"
        "            setattr(_m, _name, lambda *a, **k: (lambda *b, **c: 0.001))\n"
    )
    body = "        __import__('time').sleep(0.03)\n" + NUMPY + \
        "        return torch.from_numpy((1.0 / (1.0 + np.exp(-a)) * b + 1.0).astype(np.float32))\n"
    out = run_in_sandbox(TASK, with_prelude(prelude, body), FAST)
    assert out.reason == "ACCEPTED", (out.reason, out.feedback)
    assert out.kernel_ms is not None and out.kernel_ms >= 25.0, out.kernel_ms


def test_patching_torch_under_the_reference_does_not_change_the_reference() -> None:
    # was ACCEPTED: torch.sigmoid patched to the identity in the worker, so the reference computed
    # what the wrong kernel computes
    prelude = "_ns = __import__('torch')\n_ns.sigmoid = lambda t: t\n"
    body = "        a, b = x.numpy(), w.numpy()\n        return torch.from_numpy((a * b + 1.0).astype(np.float32))\n"
    out = run_in_sandbox(TASK, with_prelude(prelude, body), FAST)
    assert out.reason == "MISMATCH", (out.reason, out.feedback)


def test_a_kernel_that_computes_only_when_audited_is_caught_in_the_timed_calls() -> None:
    # was ACCEPTED at a fake speed: honest under the audit (correctness), its previous output otherwise
    body = (
        "        from torch.utils._python_dispatch import _get_current_dispatch_mode\n"
        "        if _get_current_dispatch_mode() is None and self.last is not None:\n"
        "            return self.last.clone()\n" + NUMPY +
        "        self.last = torch.from_numpy((1.0 / (1.0 + np.exp(-a)) * b + 1.0).astype(np.float32))\n"
        "        return self.last.clone()\n")
    out = run_in_sandbox(TASK, candidate(body, init="        self.last = None\n"), FAST)
    assert out.reason == "REPLAYED_OUTPUT", (out.reason, out.feedback)


def test_an_out_of_memory_error_the_candidate_raises_is_its_own_failure() -> None:
    # was RESOURCE: the search stopped with no decision and the task stayed pending for good
    body = "        raise torch.OutOfMemoryError('CUDA out of memory. Tried to allocate 2.00 MiB')\n"
    out = run_in_sandbox(TASK, candidate(body), FAST)
    assert out.reason == "OUT_OF_MEMORY", (out.reason, out.feedback)


def test_a_verdict_forged_from_the_judges_frames_is_not_read() -> None:
    # was ACCEPTED in a pool: the forward found the job's token in the worker's frames and printed
    # an accepted verdict before its real (wrong) one
    body = (
        "        _f = __import__('sys')._getframe()\n"
        "        while _f is not None:\n"
        "            if 'token' in _f.f_locals:\n"
        "                print(_f.f_locals['token'] + ' ' + '{\"stage\": \"timing\", \"reason\": \"ACCEPTED\", \"kernel_ms\": 0.001,'\n"
        "                      ' \"worker_healthy\": true}', flush=True)\n"
        "            _f = _f.f_back\n" + WRONG)
    with WorkerPool(size=1) as pool:
        out = pool.run(TASK, candidate(body), FAST)
    assert out.reason == "MISMATCH", (out.reason, out.feedback)


HONEST_BODY = NUMPY + "        return torch.from_numpy((1.0 / (1.0 + np.exp(-a)) * b + 1.0).astype(np.float32))\n"


@pytest.mark.parametrize("escape", [
    "import os\n        if os.fork() == 0:\n            os._exit(0)\n",
    "import subprocess\n        subprocess.run(['true'], check=True)\n",
    "import os, signal\n        os.kill(os.getppid(), signal.SIGKILL)\n",
    "import os, signal\n        os.kill(1, 0)\n",
    "import ctypes, os\n        libc = ctypes.CDLL(None, use_errno=True)\n"
    "        if libc.ptrace(16, os.getppid(), 0, 0) != 0:\n            raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))\n",
], ids=["fork", "start-a-program", "kill-the-parent", "signal-another-process", "ptrace-the-parent"])
def test_the_kernel_refuses_a_candidates_escapes(escape: str) -> None:
    """The candidate's process asks the kernel for a new process, a program, a signal to another
    process or a trace of one: refused (seccomp, `syscall_filter.py`), whichever language asks.
    Each candidate would be ACCEPTED if its escape worked (its output is honest)."""
    out = run_in_sandbox(TASK, candidate("        " + escape + HONEST_BODY), FAST)
    assert out.reason == "RUNTIME_ERROR" and "Operation not permitted" in out.feedback, (out.reason, out.feedback)


def test_after_a_refused_escape_the_next_candidate_is_judged() -> None:
    body = "        import os, signal\n        os.kill(os.getppid(), signal.SIGKILL)\n" + WRONG
    with WorkerPool(size=1) as pool:
        first = pool.run(TASK, candidate(body), FAST)
        second = pool.run(TASK, HONEST, FAST)
    assert first.reason == "RUNTIME_ERROR", (first.reason, first.feedback)
    assert second.reason == "ACCEPTED", (second.reason, second.feedback)


_WORKER_PID = ("import os\n        _ppid = os.getppid()\n"  # the fork server; its parent is the judge's worker
               "        _worker = int([l.split()[1] for l in open(f'/proc/{_ppid}/status') if l.startswith('PPid:')][0])\n")


@pytest.mark.parametrize("escape, abi", [
    ("open(PATH, 'w').write('poison')\n", 1),
    (_WORKER_PID + "        open(f'/proc/{_worker}/mem', 'rb').close()\n", 0),
    (_WORKER_PID + "        open(f'/proc/{_worker}/mem', 'r+b').close()\n", 0),
    ("import socket\n        socket.create_connection(('127.0.0.1', PORT), timeout=5).close()\n", 4),
], ids=["write-a-file-of-the-judges", "read-the-judges-memory", "write-the-judges-memory", "connect-over-tcp"])
def test_the_candidates_process_cannot_write_files_read_memory_or_connect(escape: str, abi: int, tmp_path) -> None:
    """Files outside the shared folder (the build cache, the kernel cache, the judge's code), the
    memory of the judge's processes (`/proc/<pid>/mem`, open to root through CAP_SYS_PTRACE) and
    TCP (the model server) are out of the candidate's reach (`confine.py`: capabilities dropped,
    Landlock). Each candidate would be ACCEPTED if its escape worked."""
    import socket

    from kevin_backend.judge.confine import landlock_abi

    if landlock_abi() < max(abi, 1):
        pytest.skip(f"this kernel's Landlock ABI is {landlock_abi()}, the case needs {max(abi, 1)}")
    target = tmp_path / "cache-entry"
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        code = escape.replace("PATH", repr(str(target))).replace("PORT", str(server.getsockname()[1]))
        out = run_in_sandbox(TASK, candidate("        " + code + HONEST_BODY), FAST)
    assert out.reason == "RUNTIME_ERROR" and "Permission denied" in out.feedback, (out.reason, out.feedback)
    assert not target.exists()


def test_the_candidates_process_is_the_first_the_out_of_memory_killer_picks() -> None:
    """A candidate that eats the host's memory must be what the kernel kills, not the judge's
    worker (`confine.py`). Would be ACCEPTED otherwise (its output is honest then)."""
    check = ("        if open('/proc/self/oom_score_adj').read().strip() != '1000':\n"
             "            return x\n")
    out = run_in_sandbox(TASK, candidate(check + HONEST_BODY), FAST)
    assert out.reason == "ACCEPTED", (out.reason, out.feedback)


def test_the_references_of_a_timed_check_run_on_the_judges_own_copy_of_the_inputs(tmp_path) -> None:
    """The candidate's process can write into the shared slots whenever it likes (after its reply,
    from a thread of its own). The references that check a timed call must run on the inputs as the
    judge filled them: copies in the judge's own memory, taken before the batch, which a write
    into the slots does not reach (were they views of the slots, a wrong output could be made to
    look right by rewriting its inputs after the reply)."""
    import torch

    from kevin_backend.judge.shared_values import arena_bytes
    from kevin_backend.judge.timing_phase import _private_inputs, fill, make_slots
    from kevin_backend.measure.inputs import make_input_set
    from kevin_backend.types import load_program

    task = load_program(TASK, "kevin_task")
    device = torch.device("cpu")
    slots = make_slots(arena_bytes(make_input_set(task, 1, device).values), device, tmp_path, lambda count, n: True)
    try:
        fill(task, 1, device, slots, 0)
        kept = _private_inputs(slots, 0, 1)
        filled = [v.clone() for v in slots.views[1]]
        assert all(torch.equal(a, b) for a, b in zip(kept.values, filled))
        slots.arena.tensor.fill_(0)  # what a candidate's thread could do to the shared slots
        assert all(torch.equal(a, b) for a, b in zip(kept.values, filled))
    finally:
        arena = slots.arena
        slots.close()  # (its maker's hold was the only one: the arena is gone)
        assert slots.arena is None and arena.tensor is None


@pytest.mark.parametrize("available_gib, reason", [(0.5, "RESOURCE"), (20.0, "OUT_OF_MEMORY")])
def test_a_process_the_out_of_memory_killer_ended_is_judged_by_the_hosts_memory_after(
        monkeypatch: pytest.MonkeyPatch, available_gib: float, reason: str) -> None:
    """The candidate's process is the killer's first pick, so it also dies when something else
    takes the host's memory: with the host still short once it is gone, no verdict (RESOURCE);
    with memory back, the process took it (OUT_OF_MEMORY). No kill counted: not a memory death."""
    from kevin_backend.judge import candidate_process

    monkeypatch.setattr(candidate_process, "host_oom_kills", lambda: 8)
    monkeypatch.setattr(candidate_process, "host_memory", lambda: (int(available_gib * 2**30), 24 << 30))
    assert candidate_process._killed_for_host_memory(7, "the forward")["reason"] == reason
    assert candidate_process._killed_for_host_memory(8, "the forward") is None
    assert candidate_process._killed_for_host_memory(None, "the forward") is None


def test_a_process_that_could_not_be_confined_is_the_judges_failure() -> None:
    """Confinement fails before any candidate code runs (a kernel that refuses Landlock's last
    step, say): no verdict on the candidate (INFRA), never a RUNTIME_ERROR of its own."""
    from kevin_backend.judge.candidate_process import RemoteModel

    remote = RemoteModel.__new__(RemoteModel)
    remote.trusted = False
    failure = remote._failure({"where": "confine", "type": "PermissionError", "text": "landlock_restrict_self failed"},
                              "loading the program")
    assert failure["reason"] == "INFRA" and "confined" in failure["feedback"], failure


class _HeldProcess:
    """A candidate's process as `judge_short` sees it: a pid, alive until killed, answering the
    request to give back its cache (the driver's count of what it holds is patched in)."""

    def __init__(self) -> None:
        self.pid, self.killed, self.asked = 4242, False, []

    def alive(self) -> bool:
        return not self.killed

    def kill(self, wait: float = 10.0) -> None:
        self.killed = True

    def request(self, message: dict, deadline: float) -> dict:  # type: ignore[type-arg]
        self.asked.append(message["op"])
        return {"ok": True}


@pytest.mark.parametrize("held_gib, free_gib, trusted, reason", [
    (9.0, 0.5, False, "OUT_OF_MEMORY"),  # 5 GiB beyond what it may hold: the 4 GiB the judge lacked
    (3.5, 0.5, False, "RESOURCE"),  # within what it may hold: the GPU was short
    (4.5, 0.5, False, "RESOURCE"),  # 0.5 GiB beyond it, but the judge lacked 4: short without it too
    (9.0, 0.5, True, "RESOURCE"),  # the references' process is the judge's own
    (None, 0.5, False, "RESOURCE"),  # no driver count: the judge keeps to what it can see
])
def test_the_judges_allocation_failing_beside_a_process_holding_memory_is_decided_by_the_drivers_count(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, held_gib: float | None, free_gib: float, trusted: bool,
        reason: str) -> None:
    """What it may hold: a GiB of context, twice the reference's parameters (none here), its
    outputs, a workspace (a quarter of the task, here 2 of 8 GiB). The judge asked for 4 GiB."""
    import torch

    from kevin_backend.judge import candidate_process
    from kevin_backend.judge.candidate_process import RemoteModel
    from kevin_backend.measure.memory import MemoryLedger

    gib = 1 << 30
    monkeypatch.setattr(candidate_process, "process_gpu_bytes", lambda pid, device: None if held_gib is None else int(held_gib * gib))
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (int(free_gib * gib), 140 * gib))
    ledger = MemoryLedger(torch.device("cuda", 0), task_bytes=8 * gib)
    process = _HeldProcess()
    remote = RemoteModel(process, torch.device("cuda", 0), tmp_path, time.monotonic() + 60, trusted=trusted, ledger=ledger)
    assert remote.allowed_hold() == 3 * gib
    exc = torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 4.00 GiB. GPU 0 has ...")
    outcome = remote.judge_short(exc, "in its step 'reference'")
    print(outcome)
    assert outcome["reason"] == reason
    assert process.killed == (reason == "OUT_OF_MEMORY")
    if not trusted:
        assert process.asked == ["release"]  # its cache given back before it is measured
    if reason == "RESOURCE" and not trusted:
        assert "could not get GPU memory" in outcome["feedback"]


def test_the_size_an_out_of_memory_error_asked_for_is_read_from_its_words() -> None:
    from kevin_backend.judge.candidate_process import _requested_bytes

    assert _requested_bytes("CUDA out of memory. Tried to allocate 6.99 GiB. GPU 0 has") == int(6.99 * 2**30)
    assert _requested_bytes("Tried to allocate 20.00 MiB") == 20 << 20
    assert _requested_bytes("allocating 1.50 GiB of shared GPU memory: out of memory") == 3 << 29
    assert _requested_bytes("out of memory") is None


def test_an_arena_shared_with_two_processes_lives_until_the_last_lets_go(tmp_path: Path) -> None:
    """The timing's slots are shared with the candidate's process and the references': the
    references' closing first must not free memory the candidate's process still maps."""
    import torch

    from kevin_backend.judge.shared_values import Arena
    from kevin_backend.judge.timing_phase import make_slots

    arena = Arena(4096, torch.device("cpu"), tmp_path)
    path = tmp_path / arena.desc["name"]
    arena.hold()  # the candidate's process
    slots = make_slots(1024, torch.device("cpu"), tmp_path, lambda count, n: n == 0, reuse=arena)
    assert slots.arena is arena and slots.count == 2  # two slots fit in the shared arena: no new memory
    arena.hold()  # the references' process
    slots.close()  # the slots' hold
    arena.release()  # the references' process closed
    assert path.exists() and arena.tensor is not None
    arena.release()  # the arena's maker
    assert path.exists()
    arena.release()  # the candidate's process closed: the last
    assert not path.exists() and arena.tensor is None


def test_outputs_a_process_claims_excuse_no_more_than_the_references_outputs(tmp_path: Path) -> None:
    """A batch reply may describe outputs the judge never reads: what they claim counts toward
    what the process may hold only up to the reference's outputs per call."""
    import torch

    from kevin_backend.judge.candidate_process import RemoteModel
    from kevin_backend.measure.memory import MemoryLedger

    class Replying(_HeldProcess):
        def request(self, message: dict, deadline: float) -> dict:  # type: ignore[type-arg]
            huge = {"kind": "tensor", "dtype": "float32", "size": [1 << 30], "stride": [1], "handle": "00", "offset": 0}
            return {"ok": True, "outputs": [[huge], [huge]]}

    ledger = MemoryLedger(torch.device("cpu"), task_bytes=8 << 20)
    ledger.output_bytes = 4 << 20
    remote = RemoteModel(Replying(), torch.device("cpu"), tmp_path, time.monotonic() + 60, ledger=ledger)
    remote.request({"op": "batch"}, "the timed calls")
    assert remote.outputs_held == 2 * (4 << 20)  # two calls, each at most the reference's 4 MiB
