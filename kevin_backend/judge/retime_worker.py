"""The sandboxed side of the re-timing: a search's winning kernel against Inductor's code for the
same task, interleaved, in this (worker) process.

    python -m kevin_backend.judge.retime_worker < job.json     # prints one JSON line: the outcome

The job is a `job.RetimeJob`, one JSON line with the parent's token beside it; the parent is
`decide.retime_in_sandbox`. As in the judge's worker (`run_worker.py`), the kernel is generated
code: it runs only here, a crash or hang ends this process, and the phases this worker announces
say whose failure it was (`decide.RETIME_CANDIDATE_PHASES` are the kernel's; a CUDA fault's signs
are the judge's own, `attribution.CUDA_FAULTS`).

What each time includes (one protocol for both sides, the judge's own:
`timer.make_timer(..., queued=True)`): every trial starts with the L2 cache flushed, and all of a
round's trials are queued behind GPU work, so that each trial's CUDA events measure the GPU's time
for the call, not the host's. The host's part is left out on purpose: in a compiled model,
Inductor's wrappers are paid once per graph and a kernel's launch overlaps the GPU's work, so what
a partition's call costs on the host says nothing about the model; the graph-level check
(`backend/graph_check.py`) times whole graphs with and without the kernels, host included, and
drops a kernel whose host cost loses there. Timed with the host included, a kernel tied with
Inductor on a 0.5 ms task came out 2-6% faster from one H200 run to the next (the wrappers' cost
moving with the host's speed), enough to pass the margin.

  * the kernel: `torch.ops.kevin.launch.default(key, inputs, False)`, the call a graph compiled
    with static shapes makes for a kept kernel: the dispatcher, the runtime's `launch`, its
    `LoadedKernel` (the stride and alignment checks, the output bookkeeping) and the kernel's
    `ModelNew.forward` with its extension call (`runtime/op.py`, `runtime/registry.py`). A task whose inputs are not
    all tensors (no partition of a graph) calls `ModelNew` directly;
  * Inductor: the task's reference compiled by `torch.compile` (default mode, static shapes: the
    task's own sizes, as a model's first compile gets them). When Dynamo
    captures it as one graph, that graph's compiled code is called directly on the arguments
    Dynamo gave it (AOTAutograd's wrapper, Inductor's wrapper code and its kernels), without
    Dynamo's frame and guard check. A reference that Dynamo splits into several graphs (a graph
    break) is called through `torch.compile` as a whole, guards included.

Inputs: the judge's timing set (the task's own values under the judge's first seed, true
layouts). The whole interleaved measurement holds the judge's GPU lock exclusively, so no other
worker's correctness run or timing shares the GPU with it. The kernel's build comes from the
judge's build cache (it was built when the kernel was judged).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import sys
import traceback
from pathlib import Path
from typing import Any, Callable

import torch

from kevin_backend.judge.attribution import CUDA_FAULTS
from kevin_backend.judge.decide import RETIME_CANDIDATE_PHASES
from kevin_backend.judge.job import RetimeJob
from kevin_backend.measure.inductor import inductor_call
from kevin_backend.measure.interleave import interleaved_rounds
from kevin_backend.measure.inputs import make_input_set, to_device
from kevin_backend.measure.timer import make_timer
from kevin_backend.locks import gpu_hold
from kevin_backend.types import TensorSpec, load_program

PROTOCOL = ("per round: median of {trials} trials after {warmup} warm-up calls; {timing}; kernel through kevin::launch "
            "(check_sizes=False), Inductor: {inductor} ({backend})")
GPU_TIME = "each trial L2-flushed and queued behind GPU work (the GPU's time, the host's part left out)"
HOST_TIME = "each trial timed on the host (no GPU)"


_ALIGNMENT = 16  # the runtime runs the reference for an input that does not start 16-byte aligned


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
    from kevin_backend.runtime import op as _op  # noqa: F401  (defines kevin::launch)
    from kevin_backend.runtime import registry as runtime
    from kevin_backend.cache.key import apply_numerics

    if job.numerics:
        apply_numerics(dict(job.numerics))  # the settings the task's cache key names, as when it was judged
    device = torch.device(job.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda":
        if not torch.cuda.is_available():
            return _judge_failure("NO_GPU", "no CUDA GPU to re-time on")
        device = torch.device("cuda", torch.cuda.current_device() if device.index is None else device.index)
        torch.cuda.set_device(device)
    stack = contextlib.ExitStack()
    if job.build_root:
        from kevin_backend.toolchain.build import Builder, answering_load_inline

        stack.enter_context(answering_load_inline(Builder(Path(job.build_root), jobs=1), job.arch))
    with stack:
        task = load_program(job.task, "kevin_task")
        seed = job.seed

        phase("load")
        candidate = load_program(job.kernel, "kevin_candidate")
        if not hasattr(candidate, "ModelNew"):
            return _kernel_failure("the program defines no ModelNew")

        phase("setup")  # both models seeded alike, as the judge builds them
        init = [to_device(v, device) for v in task.get_init_inputs()]
        torch.manual_seed(seed)
        reference = task.Model(*init).to(device).eval()
        phase("init")
        torch.manual_seed(seed)
        model = candidate.ModelNew(*init).to(device).eval()

        phase("inputs")  # (shared: another worker's timing must not see it fill the GPU's memory)
        with gpu_hold(job.gpu_lock, shared=True):
            values = make_input_set(task, seed, device).values
        kernel_call = _kernel_call(job, model, reference, values, runtime)

        trials, warmup, rounds = job.trials, job.warmup, job.rounds
        phase("lock")  # waiting for the GPU: the judge's step, whatever the wait
        # Held from Inductor's first call on: that call compiles and benchmarks the configurations
        # of Inductor's kernels (another worker's run beside it would skew the choice for good),
        # and the kernel's warm-up must not land inside another worker's timing.
        with gpu_hold(job.gpu_lock, shared=False):
            phase("inductor")
            inductor_fn, inductor_how = inductor_call(reference, values, job.compile_backend)
            _sync(device)

            phase("kernel-warmup")
            with torch.no_grad():
                kernel_call()
            _sync(device)
            _check_kernel_used(kernel_call)

            phase("timer")
            measure = make_timer(device, trials, warmup, queued=True)

            def kernel_round() -> float:
                phase("retime-kernel")
                return measure(kernel_call)

            def inductor_round() -> float:
                phase("retime-inductor")
                return measure(inductor_fn)

            with torch.no_grad():
                kernel_ms, inductor_ms = interleaved_rounds(kernel_round, inductor_round, rounds)
        phase("check")
        _check_kernel_used(kernel_call)
        return {
            "status": "ok", "kernel_ms": kernel_ms, "inductor_ms": inductor_ms, "trials": trials, "device": str(device),
            "protocol": PROTOCOL.format(trials=trials, warmup=warmup, timing=GPU_TIME if device.type == "cuda" else HOST_TIME,
                                        inductor=inductor_how,
                                        backend=job.compile_backend),
        }


def _kernel_call(job: RetimeJob, model: torch.nn.Module, reference: torch.nn.Module, values: list[Any],
                 runtime: Any) -> Callable[[], Any]:
    """The kernel as the backend calls it: through `kevin::launch` with a `LoadedKernel`
    registered under a key of its own (the partition's inputs are tensors, exactly these)."""
    if not all(isinstance(v, torch.Tensor) for v in values):
        def direct() -> Any:
            return model(*values)

        direct.loaded = None  # type: ignore[attr-defined]
        return direct
    key = "retime-" + hashlib.sha256(job.kernel.encode()).hexdigest()[:32]
    specs = tuple(TensorSpec.of(v) for v in values)
    loaded = runtime.LoadedKernel(key, specs, model.forward, reference.forward, job.kernel)
    if not loaded.accepts(values) or any(v.data_ptr() % _ALIGNMENT for v in values):
        raise _Ended(_kernel_failure("the runtime would run the reference, not the kernel, on the task's inputs "
                                     "(an input does not start 16-byte aligned)"))
    runtime.register(loaded)
    launch = torch.ops.kevin.launch.default

    def through_runtime() -> Any:
        return launch(key, values, False)

    through_runtime.loaded = loaded  # type: ignore[attr-defined]
    return through_runtime


def _check_kernel_used(kernel_call: Callable[[], Any]) -> None:
    """A kernel that raised inside the runtime is disabled and its reference runs instead: then
    the times measured were the reference's, and the kernel failed."""
    loaded = getattr(kernel_call, "loaded", None)
    if loaded is None or loaded.disabled is None:
        return
    if "OutOfMemoryError" in loaded.disabled or "out of memory" in loaded.disabled.lower():
        # the judge held the kernel to its memory bound: the GPU was short, not the kernel wrong
        raise _Ended(_judge_failure("RESOURCE", f"no GPU memory for the kernel in its re-timing: {loaded.disabled}"))
    raise _Ended(_kernel_failure(f"the kernel raised in its re-timing and the runtime ran its reference: {loaded.disabled}"))


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def main() -> int:
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
