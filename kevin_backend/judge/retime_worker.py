"""The re-timing: a search's winning kernel against Inductor's code for the same task, in
interleaved rounds, orchestrated by this process, which never runs the kernel.

    python -m kevin_backend.judge.retime_worker < job.json     # prints one JSON line: the outcome

The job is a `job.RetimeJob`, one JSON line with the parent's token beside it; the parent is
`decide.retime_in_sandbox`. The kernel runs in a process of its own (`candidate_process.py`,
mode "launch": `torch.ops.kevin.launch.default(key, inputs, False)`, the call a graph compiled
with static shapes makes for a kept kernel, through the runtime's `LoadedKernel`), and Inductor's
code for the task in another process of the judge's (mode "reference", the task's reference
compiled by `torch.compile`, static shapes, called as `measure/inductor.inductor_function` says),
so both are called the same way and neither can reach this process or the other. The phases this
process announces say whose failure a death was (`decide.RETIME_CANDIDATE_PHASES` are the
kernel's).

What a time is (`timing_phase.timed_batch`): the wall-clock time, by this process's clock, from
asking a side for one call per input slot, back to back, to its reply after the device is
synchronised, divided by the calls. Every round refills the slots with fresh values from the
task's own generator; the slots together are twice the L2 cache where memory allows. Each round
one of the kernel's calls, chosen after its reply, is compared with Inductor's output on the same
inputs and read again: a kernel that skips calls, answers before its work is done, or raised and
left the runtime running its reference, fails. The whole measurement holds the judge's GPU lock
exclusively. The kernel's build comes from the judge's build cache.
"""

from __future__ import annotations

import json
import secrets
import shutil
import sys
import time
import traceback
from typing import Any, Callable

import torch

from kevin_backend.judge.attribution import CUDA_FAULTS, Verdict
from kevin_backend.judge.candidate_process import Launcher, RemoteModel, shared_folder
from kevin_backend.judge.decide import RETIME_CANDIDATE_PHASES
from kevin_backend.judge.job import RetimeJob
from kevin_backend.judge.timing_phase import fill, make_slots, slot_bytes, slot_memory, timed_batch, timed_output_wrong
from kevin_backend.judge.shared_values import arena_bytes
from kevin_backend.locks import gpu_hold
from kevin_backend.measure.memory import MemoryLedger
from kevin_backend.measure.inputs import fingerprint, make_input_set
from kevin_backend.measure.precision import task_precision
from kevin_backend.types import load_program

PROTOCOL = ("{rounds} rounds after a warm-up round; per round, {trials} calls back to back on fresh input slots ({cold}), "
            "each side in a process of its own, timed by the judge's clock from the request to the reply; kernel through "
            "kevin::launch (check_sizes=False), Inductor: {inductor} ({backend})")


class _Ended(Exception):
    def __init__(self, outcome: dict[str, Any]) -> None:
        super().__init__(outcome.get("feedback", ""))
        self.outcome = outcome


def _kernel_failure(feedback: str) -> dict[str, Any]:
    return {"status": "kernel", "feedback": feedback}


def _judge_failure(reason: str, feedback: str) -> dict[str, Any]:
    return {"status": "judge", "reason": reason, "feedback": feedback}


class _Phases:
    def __init__(self, announce: Callable[[str], None]) -> None:
        self.announce = announce
        self.current = "setup"
        self.kernel_ran = False

    def __call__(self, name: str) -> None:
        self.current = name
        if name in ("kernel-warmup", "retime-kernel"):
            self.kernel_ran = True
        self.announce(name)


def run(job: RetimeJob, announce: Callable[[str], None] = lambda phase: None) -> dict[str, Any]:
    phase = _Phases(announce)
    phase("setup")
    try:
        return _run(job, phase)
    except _Ended as ended:
        return ended.outcome
    except Exception as exc:  # noqa: BLE001 - whose failure it is depends on whose code was running
        text = f"{type(exc).__name__}: {exc}"
        if isinstance(exc, torch.OutOfMemoryError):  # the judge held the kernel to its memory bound
            return _judge_failure("RESOURCE", f"no GPU memory in the re-timing's step '{phase.current}': {text}")
        if phase.kernel_ran and any(f in text.lower() for f in CUDA_FAULTS):
            return _kernel_failure(f"the GPU reported a fault after the kernel ran: {text}")
        if phase.current in RETIME_CANDIDATE_PHASES:
            return _kernel_failure(f"the kernel raised in its re-timing (step '{phase.current}'): {text}")
        return _judge_failure("INFRA", f"the re-timing failed in its step '{phase.current}': {text}\n"
                                       f"{traceback.format_exc(limit=4)}")


def _run(job: RetimeJob, phase: _Phases) -> dict[str, Any]:
    from kevin_backend.cache.key import apply_numerics

    if job.numerics:
        apply_numerics(dict(job.numerics))  # the settings the task's cache key names, as when it was judged
    device = torch.device(job.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda":
        if not torch.cuda.is_available():
            return _judge_failure("NO_GPU", "no CUDA GPU to re-time on")
        device = torch.device("cuda", torch.cuda.current_device() if device.index is None else device.index)
        torch.cuda.set_device(device)
    task = load_program(job.task, "kevin_task")
    launcher = Launcher(device, shared_folder())
    kernel = reference = slots = None
    try:
        deadline = time.monotonic() + 24 * 3600.0  # the parent kills this process at the job's time limit
        phase("load")
        kernel = RemoteModel(launcher.take(), device, launcher.folder, deadline, ledger=_ledger(task, device))
        kernel.load({"mode": "launch", "candidate": job.kernel, "task": job.task, "seed": job.seed,
                     "build_root": job.build_root, "arch": job.arch, "numerics": dict(job.numerics)})
        phase("setup")
        reference = RemoteModel(launcher.take(), device, launcher.folder, deadline, trusted=True)
        reference.load({"mode": "reference", "task": job.task, "seed": job.seed, "numerics": dict(job.numerics),
                        "compile_backend": job.compile_backend})
        phase("inputs")  # (shared: another worker's timing must not see it fill the GPU's memory)
        with gpu_hold(job.gpu_lock, shared=True):
            first = make_input_set(task, job.seed, device).values
            stride = arena_bytes(first)
            precision = task_precision(task, first)  # (what rounding the task leaves in each output: the check's bound)
            del first
            kernel.ledger.task_bytes = 2 * stride  # (its inputs and about as much output)
            kernel.ledger.output_bytes = stride
            slots = make_slots(stride, device, launcher.folder, lambda count, n: n <= slot_memory(device), private=False)
            kernel.share(slots.arena)
            reference.share(slots.arena)
        return _rounds(job, phase, device, task, kernel, reference, slots, precision)
    except Verdict as v:
        reason = v.outcome.get("reason", "")
        if reason in ("INFRA", "RESOURCE"):
            raise _Ended(_judge_failure(reason, v.outcome.get("feedback", ""))) from None
        raise _Ended(_kernel_failure(f"{reason}: {v.outcome.get('feedback', '')}")) from None
    except torch.OutOfMemoryError as exc:  # the worker's own allocation: the kernel's process may have held it
        if kernel is None:
            raise
        outcome = kernel.judge_short(exc, f"in the re-timing's step '{phase.current}'")
        if outcome["reason"] == "OUT_OF_MEMORY":
            raise _Ended(_kernel_failure(f"OUT_OF_MEMORY: {outcome['feedback']}")) from None
        raise
    finally:
        if slots is not None:
            slots.close()  # (the arena is freed once both processes are gone too)
        for process in (kernel, reference):
            if process is not None:
                process.close()
        launcher.close()
        shutil.rmtree(launcher.folder, ignore_errors=True)


def _rounds(job: RetimeJob, phase: _Phases, device: torch.device, task: Any, kernel: RemoteModel,
            reference: RemoteModel, slots: Any, precision: tuple[torch.dtype | None, ...] | None = None) -> dict[str, Any]:
    """Round 0 warms both up (Inductor compiles in its process); then `job.rounds` rounds, each on
    fresh values in every slot, the kernel and Inductor in alternating order; each round one of
    the kernel's calls, chosen after its reply, is compared with Inductor's on the same inputs."""
    kernel_ms: list[float] = []
    inductor_ms: list[float] = []
    how = ""
    phase("lock")  # waiting for the GPU: the judge's step, whatever the wait
    with torch.no_grad(), gpu_hold(job.gpu_lock, shared=False):
        for index in range(job.rounds + 1):
            phase("inputs")
            fill(task, job.seed, device, slots, index)
            before = fingerprint(slot_bytes(slots))
            sides = [("kernel", kernel, "launch"), ("inductor", reference, "inductor")]
            replies: dict[str, dict[str, Any]] = {}
            for name, remote, entry in (sides if index % 2 == 0 else sides[::-1]):
                phase("retime-kernel" if name == "kernel" else "retime-inductor")
                ms, replies[name] = timed_batch(device, remote, slots, entry, [])
                if index:
                    (kernel_ms if name == "kernel" else inductor_ms).append(ms)
            how = str(replies["inductor"].get("how", how))
            phase("check")
            if fingerprint(slot_bytes(slots)) != before:  # (a process that rewrites them could steer Inductor)
                raise _Ended(_kernel_failure("the kernel's process changed the timing's inputs"))
            _check(kernel, reference, replies, slots, precision)
    return {
        "status": "ok", "kernel_ms": kernel_ms, "inductor_ms": inductor_ms, "trials": slots.count, "device": str(device),
        "protocol": PROTOCOL.format(trials=slots.count, rounds=job.rounds, cold="cold" if slots.cold else "within L2",
                                    inductor=how, backend=job.compile_backend),
    }


def _check(kernel: RemoteModel, reference: RemoteModel, replies: dict[str, dict[str, Any]], slots: Any,
           precision: tuple[torch.dtype | None, ...] | None = None) -> None:
    """One random call of the kernel's batch against Inductor's on the same inputs, and the
    kernel still in use (a kernel that raised inside the runtime is disabled: its reference ran)."""
    disabled = replies["kernel"].get("disabled")
    if disabled:
        raise _Ended(_kernel_failure(f"the kernel raised in its re-timing and the runtime ran its reference: {disabled}"))
    j = secrets.randbelow(slots.count)
    got = kernel.read(replies["kernel"]["outputs"][j], "a timed call")
    want = reference.read(replies["inductor"]["outputs"][j], "Inductor's call")
    wrong = timed_output_wrong(kernel, replies["kernel"]["outputs"][j], got, want, None, j, precision)
    if wrong:
        raise _Ended(_kernel_failure(wrong))


def _ledger(task: Any, device: torch.device) -> MemoryLedger:
    """What the kernel's process may hold (`RemoteModel.allowed_hold`): the reference's parameters
    (counted on the meta device: nothing allocated); the task's size once its inputs are made."""
    ledger = MemoryLedger(device)
    try:
        with torch.device("meta"):
            model = task.Model(*task.get_init_inputs())
        ledger.params = sum(p.numel() * p.element_size() for p in model.parameters())
    except Exception:  # noqa: BLE001 - a task that cannot be built on meta: its context and workspace only
        pass
    return ledger


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def main() -> int:
    from kevin_backend.judge.fork_server import make_undumpable
    from kevin_backend.lifeline import die_with_parent

    die_with_parent()  # a killed search leaves no re-timing running
    make_undumpable()
    job, token = RetimeJob.from_json(sys.stdin.read())

    def announce(phase: str) -> None:
        print(f"{token} phase {phase}", flush=True)

    try:
        outcome = run(job, announce)
    except Exception as exc:  # noqa: BLE001 - outside every phase: the judge's own failure
        outcome = _judge_failure("INFRA", f"the re-timing failed: {type(exc).__name__}: {exc}")
    print(f"{token} {json.dumps(outcome, default=float)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
