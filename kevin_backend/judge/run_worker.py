"""The sandboxed side of the judge: runs one candidate against its task in this (worker) process.

    python -m kevin_backend.judge.run_worker < job.json     # prints one JSON line: the outcome
    python -m kevin_backend.judge.run_worker --serve        # a pool's worker: one job per line

A pool's worker (`pool.py`) keeps torch and CUDA initialised and, per task, the reference model
and its float64 copy; every candidate still gets a fresh module
namespace, its outputs are scrubbed, the references' parameters are fingerprinted after each
candidate (a change ends the worker) and the parent replaces the worker after any error.

A crash, hang, illegal address or out-of-memory here ends this process, never the judge; the
parent (`sandbox.py`) reads the exit status, the output and the last phase this worker announced
(a failure in the judge's own phases is the judge's, never the candidate's). The protocol:

  1. load the task (the reference `Model`) and the candidate (`ModelNew`), both seeded alike and
     moved to the device under test (KernelBench's placement); the candidate's `load_inline`
     calls are answered from the judge's build cache
  2. correctness, for each seeded input set (the problem's own values, then mixed scales; never
     zeros; true layouts, on the device under test, `measure/inputs.py`):
       a. the eager reference, in the task's dtype (a mixed set whose reference overflows is made
          again with a narrower range of scales)
       b. the exact reference: the same model and inputs in float64, when that fits the memory the
          judge may take (`memory.py`)
       c. the candidate, on memory poisoned with NaN, every op it dispatches audited (allocation,
          view and metadata ops only), its inputs fingerprinted before and after
       d. the comparison (`measure/compare.py`); a candidate wrong on non-contiguous inputs is run once
          more on contiguous copies, to say whether it ignores their strides
  3. timing, one protocol for the candidate, the eager reference and the Inductor-compiled
     reference (`measure/timer.py`), under the judge's GPU lock; Inductor's one compiled graph is called
     directly, without Dynamo's guards, as the backend's re-timing calls it
     (`measure/inductor.inductor_call`)
  4. replay check: fresh values written into the candidate's input buffers, output checked again
  5. roofline (an accepted candidate): the bytes the task must move, its matmul/convolution FLOPs
     and the GPU's copy bandwidth (measured once per GPU and software, under the timing lock),
     from which the judge derives each side's fraction of the copy bandwidth (`measure/roofline.py`)
"""

from __future__ import annotations

import contextlib
import copy
import gc
import hashlib
import json
import statistics
import sys
import traceback
import types
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from kevin_backend.cache.key import apply_numerics, current_numerics
from kevin_backend.measure.compare import Mismatch, compare_outputs, output_list
from kevin_backend.measure.inputs import (
    MIXED_RANGES, InputSet, clone_layout, copy_values, fingerprint, layout_text, make_input_set, tensor_bytes, to_device,
)
from kevin_backend.measure.memory import MemoryLedger, poison, requested_bytes
from kevin_backend.judge.phases import CANDIDATE_PHASES
from kevin_backend.measure.timer import flush_bytes, make_timer
from kevin_backend.locks import gpu_hold

# What a candidate's forward may dispatch: allocation, views, metadata, and the fills that
# torch.zeros and friends are made of. Everything else is PyTorch computing for the candidate.
_ALLOWED_OPS = frozenset(
    {
        "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "zeros", "zeros_like",
        "new_zeros", "ones", "ones_like", "new_ones", "full", "full_like", "new_full", "fill_", "zero_",
        "view", "_unsafe_view", "reshape", "as_strided", "permute", "transpose", "t", "unsqueeze", "squeeze",
        "expand", "slice", "select", "split", "split_with_sizes", "unbind", "chunk", "narrow", "alias",
        "detach", "lift_fresh", "_reshape_alias", "unflatten", "flatten", "view_as", "expand_as",
        "is_same_size", "sym_size", "sym_stride", "sym_numel", "sym_storage_offset", "_local_scalar_dense",
        "set_", "resize_", "record_stream", "clone", "copy_", "contiguous", "_to_copy",
    }
)

_WORKER_LIFETIME = contextlib.ExitStack()

_CUDA_FAULTS = ("illegal memory access", "misaligned address", "unspecified launch failure", "an illegal instruction",
                "device-side assert")


class Verdict(Exception):
    """Ends the run with an outcome (raised from deep inside a phase)."""

    def __init__(self, outcome: dict[str, Any]) -> None:
        super().__init__(outcome.get("reason"))
        self.outcome = outcome


@dataclass
class Run:
    """One judged run: the job, the task and candidate, where they run, and the memory ledger."""

    job: dict[str, Any]
    task: types.ModuleType
    reference: torch.nn.Module
    model: torch.nn.Module
    device: torch.device
    ledger: MemoryLedger
    announce: Callable[[str], None]
    exact_dtype: torch.dtype | None = None  # decided on the first input set
    output_bytes: tuple[int, ...] = ()
    candidate_ran: bool = False
    reference_temps: int = 0  # the most eager allocated beyond its outputs, in bytes
    current: str = "setup"  # the phase now running
    state: "TaskState | None" = None  # what the worker keeps of the task between candidates

    def phase(self, name: str) -> None:
        self.current = name
        self.announce(name)


class _Audit(TorchDispatchMode):
    """Records every aten op dispatched while active, from Python or from C++ host code alike."""

    def __init__(self) -> None:
        super().__init__()
        self.computed: list[str] = []

    def __torch_dispatch__(self, func: Any, types_: Any, args: Any = (), kwargs: Any = None) -> Any:
        # A fast build's operators are registered without a dispatch key (CompositeImplicitAutograd),
        # so this mode never sees them, only the aten ops their host code calls.
        name = func._schema.name.split("::")[-1]
        if name == "_to_copy" and _changes_dtype(args, kwargs):
            name = "_to_copy (a dtype conversion)"
        if name not in _ALLOWED_OPS and name not in self.computed:
            self.computed.append(name)
        return func(*args, **(kwargs or {}))


def _changes_dtype(args: Any, kwargs: Any) -> bool:
    dtype = (kwargs or {}).get("dtype")
    return dtype is not None and isinstance(args[0], torch.Tensor) and dtype != args[0].dtype


def _load(source: str, name: str) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__file__ = f"<{name}>"
    exec(compile(source, module.__file__, "exec"), module.__dict__)  # noqa: S102 - this is the sandbox
    return module


def _scrub(values: Sequence[Any]) -> None:
    """NaN into outputs about to be freed: a later candidate must not find their values."""
    for t in values:
        if isinstance(t, torch.Tensor) and t.numel() and not t.is_inference():
            with torch.no_grad():
                t.fill_(float("nan") if t.is_floating_point() else -1)
        elif isinstance(t, torch.Tensor) and t.numel():
            with torch.inference_mode():
                t.fill_(float("nan") if t.is_floating_point() else -1)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _error(reason: str, stage: str, feedback: str, **extra: Any) -> dict[str, Any]:
    return {"stage": stage, "reason": reason, "feedback": feedback, **extra}


def _judge_failure(run: Run | None, what: str, exc: BaseException) -> dict[str, Any]:
    """An exception outside the candidate's phases: the judge's (RESOURCE when memory ran out),
    unless a CUDA fault the candidate left behind surfaced there."""
    text = f"{type(exc).__name__}: {exc}"
    if run is not None and run.candidate_ran and any(f in text.lower() for f in _CUDA_FAULTS):
        return _error("ILLEGAL_ADDRESS", "run", f"the GPU reported a fault after the kernel ran: {text}")
    if isinstance(exc, torch.OutOfMemoryError):
        return _error("RESOURCE", "run", f"the judge could not get GPU memory while {what}: {text}")
    return _error("INFRA", "run", f"the judge failed while {what}: {text}\n{traceback.format_exc(limit=4)}")


def _candidate_failure(run: Run, what: str, exc: BaseException) -> dict[str, Any]:
    """An exception in the candidate's code: its failure, except an out-of-memory error while it
    asked for no more than the judge's bound (then the GPU was short: RESOURCE)."""
    text = f"{type(exc).__name__}: {exc}"
    if isinstance(exc, torch.OutOfMemoryError):
        asked = requested_bytes(str(exc))
        if run.ledger.candidate_within_bound(asked):
            return _error("RESOURCE", "run", f"the GPU had no memory for the candidate's {what}: {text}")
        return _error("OUT_OF_MEMORY", "run", f"{what} ran out of memory: {text}")
    if any(f in text.lower() for f in _CUDA_FAULTS):
        return _error("ILLEGAL_ADDRESS", "run", f"{what} raised {text}")
    return _error("RUNTIME_ERROR", "run", f"{what} raised {text}")


# -- the reference, eager and exact -----------------------------------------------------------


def _eager(run: Run, inputs: InputSet) -> list[Any]:
    """Eager's outputs; on a GPU it also measures what eager needs beyond its inputs and outputs
    (the exact run needs as much again, upcast)."""
    before = 0
    if run.ledger.cuda:
        run.ledger.observe()
        before = torch.cuda.memory_allocated(run.device)
        torch.cuda.reset_peak_memory_stats(run.device)
    with torch.no_grad():
        out = output_list(run.reference(*inputs.values))
    _sync(run.device)
    if run.ledger.cuda:
        made = sum(v.numel() * v.element_size() for v in out if isinstance(v, torch.Tensor))
        run.reference_temps = max(run.reference_temps, torch.cuda.max_memory_allocated(run.device) - before - made)
        run.ledger.peak = max(run.ledger.peak, torch.cuda.max_memory_allocated(run.device) - run.ledger.baseline)
    return out


def _finite(values: Sequence[Any]) -> bool:
    return all(bool(torch.isfinite(v).all()) for v in values if isinstance(v, torch.Tensor) and v.is_floating_point())


@dataclass
class _Reference:
    inputs: InputSet  # what the candidate runs on (as the reference first saw it)
    want: list[Any]  # eager's outputs
    after: tuple[int, ...]  # the inputs' fingerprints once the reference ran (a task may change its inputs)


def _reference_set(run: Run, seed: int, mixed: bool) -> _Reference:
    """An input set and eager's outputs on it. A set whose reference is not finite is made again:
    a mixed set with a narrower range of scales, the problem's own values scaled down; if none is
    finite, the problem's own values (its non-finite outputs are then part of the task)."""
    grow = run.job.get("grow", 1)
    ranges = MIXED_RANGES if mixed else (0,)
    tries = [(r, 0) for r in ranges] + [(0, s) for s in (1, 2, 4)]
    chosen: tuple[InputSet, list[Any], tuple[int, ...]] | None = None
    for exponent_range, shrink in tries:
        run.phase("inputs")
        inputs = make_input_set(run.task, seed, run.device, exponent_range, shrink, grow)
        before = fingerprint(inputs.values)
        run.phase("reference")
        want = _eager(run, inputs)
        if _finite(want):
            if chosen is not None:
                _scrub(chosen[1])
            chosen = (inputs, want, before)
            break
        if chosen is None and exponent_range == 0 and shrink == 0:
            chosen = (inputs, want, before)  # the problem's own values: kept if nothing else is finite
        else:
            _scrub(want)
    assert chosen is not None
    inputs, want, before = chosen
    run.phase("inputs")
    after = fingerprint(inputs.values)
    if after != before:  # the task changes its own inputs: the candidate gets them as they were
        inputs = make_input_set(run.task, inputs.seed, run.device, inputs.exponent_range, inputs.shrink, grow)
    return _Reference(inputs, want, after)


def _float_inputs_bytes(values: Sequence[Any]) -> int:
    return sum(tensor_bytes(v) for v in values if isinstance(v, torch.Tensor) and v.is_floating_point())


def _plan_exact(run: Run, inputs: InputSet, want: Sequence[Any], reference_temps: int) -> torch.dtype | None:
    """The dtype of the exact reference: float64 when it fits the judge's memory, float32 for a
    half-precision task otherwise, else none (eager stands in, with KernelBench's tolerances)."""
    floats = [v for v in want if isinstance(v, torch.Tensor) and v.is_floating_point()]
    if not floats:
        return None
    size = max(v.element_size() for v in floats)
    params = sum(p.numel() * p.element_size() for p in run.reference.parameters() if p.is_floating_point())
    data = _float_inputs_bytes(inputs.values) + sum(v.numel() * v.element_size() for v in floats) + reference_temps + params
    for dtype in (torch.float64, torch.float32):
        factor = torch.empty((), dtype=dtype).element_size() / size
        if factor <= 1:
            continue
        if run.ledger.fits(int(data * factor)):
            return dtype
        run.ledger.notes.append(f"a {dtype} reference needs about {data * factor / 2**30:.2f} GiB more "
                                f"(held {run.ledger.held() / 2**30:.2f} GiB, task {run.ledger.task_bytes / 2**30:.2f} GiB, "
                                f"available {run.ledger.available() / 2**30:.2f} GiB): not taken")
    return None


def _exact(run: Run, inputs: InputSet, exact_model: list[torch.nn.Module]) -> list[Any] | None:
    """The reference in the exact dtype on upcast copies of the inputs (layouts kept), or None
    when there is no exact run (an op without a kernel in that dtype falls back, noted)."""
    if run.exact_dtype is None or not exact_model:
        return None
    reference64 = exact_model[0]
    values = [clone_layout(v, dtype=run.exact_dtype) if isinstance(v, torch.Tensor) and v.is_floating_point() else v
              for v in inputs.values]
    try:
        with torch.no_grad():
            out = output_list(reference64(*values))
        _sync(run.device)
    except torch.OutOfMemoryError:
        raise
    except (RuntimeError, NotImplementedError) as exc:
        run.ledger.notes.append(f"no {run.exact_dtype} run ({type(exc).__name__}: {str(exc).splitlines()[0][:200]})")
        run.exact_dtype = None
        run.ledger.exact = "eager"
        exact_model.clear()
        if run.state is not None:
            run.state.forget_exact()
        return None
    finally:
        del values
    return out


# -- one input set ----------------------------------------------------------------------------


def _correctness(run: Run, index: int, seed: int, exact_model: list[torch.nn.Module]) -> dict[str, Any] | None:
    """Check the candidate on input set `index`: an outcome when it fails, else None."""
    ref = _reference_set(run, seed, mixed=index % 2 == 1)
    if index == 0:
        _size_the_task(run, ref, exact_model)
    run.ledger.observe()
    run.phase("exact")
    exact = _exact(run, ref.inputs, exact_model)
    run.ledger.observe()

    # the candidate, on the inputs as the reference saw them, on poisoned memory
    run.phase("poison")
    poison(run.device, run.output_bytes)
    got = _candidate_forward(run, ref.inputs.values)
    run.ledger.observe()
    run.phase("compare")
    for k, (a, b) in enumerate(zip(fingerprint(ref.inputs.values), ref.after)):
        if a != b:
            return _error("INPUT_MUTATED", "correctness", f"input {k} was changed by the forward")
    bad = compare_outputs(got, ref.want, exact)
    if bad is not None:
        return _mismatch_outcome(run, bad, index, ref.inputs, ref.want, exact)
    _scrub(ref.want)
    _scrub(exact or [])
    return None


def _size_the_task(run: Run, ref: _Reference, exact_model: list[torch.nn.Module]) -> None:
    """The first set fixes the task's size (its inputs and outputs), hence the judge's memory
    bound, and whether an exact run fits in it."""
    output_bytes = [v.numel() * v.element_size() for v in ref.want if isinstance(v, torch.Tensor)]
    run.output_bytes = tuple(output_bytes)
    run.ledger.task_bytes = sum(tensor_bytes(v) for v in ref.inputs.tensors) + sum(output_bytes)
    run.exact_dtype = _plan_exact(run, ref.inputs, ref.want, max(0, run.reference_temps))
    if run.exact_dtype is not None and (not exact_model or getattr(exact_model[0], "kevin_dtype", None) != run.exact_dtype):
        run.phase("exact")
        exact_model.clear()
        model = copy.deepcopy(run.reference).to(run.exact_dtype)
        model.kevin_dtype = run.exact_dtype  # a worker keeps it for the task's next candidates
        exact_model.append(model)
        if run.state is not None:
            run.state.mark()
    run.ledger.exact = "eager" if run.exact_dtype is None else str(run.exact_dtype).removeprefix("torch.")


def _candidate_forward(run: Run, values: Sequence[Any], phase: str = "candidate") -> list[Any]:
    """The candidate's forward on `values`, audited; raises Verdict on its failures."""
    run.phase(phase)
    audit = _Audit()
    run.candidate_ran = True
    try:
        with torch.no_grad(), audit:
            got = output_list(run.model(*values))
        _sync(run.device)
    except Exception as exc:  # noqa: BLE001 - the candidate's failure, whatever it is
        raise Verdict(_candidate_failure(run, "forward", exc)) from None
    if audit.computed:
        raise Verdict(_error("PYTORCH_COMPUTE", "run", "forward ran PyTorch compute ops: " + ", ".join(audit.computed[:10])))
    return got


def _mismatch_outcome(run: Run, bad: Mismatch, index: int, inputs: InputSet, want: list[Any],
                      exact: list[Any] | None) -> dict[str, Any]:
    details = {k: v for k, v in bad.__dict__.items() if k not in ("reason", "message")}
    details["first_bad_index"] = list(bad.first_bad_index)
    details["trial"] = index
    details["exact"] = run.ledger.exact
    if bad.reason in ("SHAPE_MISMATCH", "DTYPE_MISMATCH") or (bad.reason == "MISMATCH" and bad.message and not bad.total_elements):
        return {"stage": "correctness", "reason": bad.reason, "feedback": bad.message}
    feedback = ""
    strided = [(k, v) for k, v in enumerate(inputs.values)
               if isinstance(v, torch.Tensor) and (not v.is_contiguous() or v.storage_offset())]
    if strided:
        feedback = _layout_diagnosis(run, inputs, strided, want, exact)
    outcome = {"stage": "correctness", "reason": bad.reason, "mismatch": details, "set": inputs.describe()}
    if feedback:
        outcome["feedback"] = feedback
    return outcome


# The replay check looks for stored results, not for precision (the correctness sets judged that,
# with the exact reference): an output computed from the old values differs from the new one
# almost everywhere and by the values' own size. A few elements just past the bound, as rounding
# in another order gives on a set without the exact run, are not stale.
STALE_FRACTION = 1e-3  # more than this share of the elements outside the bound
STALE_RATIO = 8.0  # or an error more than this many times the bound


def stale(bad: Mismatch) -> bool:
    """Whether a failed replay comparison shows a stale output (see STALE_FRACTION)."""
    if bad.reason != "MISMATCH" or not bad.total_elements:
        return True  # NaN, infinities, a shape or dtype that changed: never rounding
    return bad.bad_elements > STALE_FRACTION * bad.total_elements or not bad.worst_ratio <= STALE_RATIO


def _mismatch_text(bad: Mismatch) -> str:
    """The comparison's finding in words: its message, else its numbers."""
    if bad.message:
        return bad.message
    return (f"output {bad.output}: {bad.bad_elements} of {bad.total_elements} elements outside the bound, first at "
            f"{list(bad.first_bad_index)}: expected {bad.expected:.6g}, got {bad.got:.6g}, allowed error {bad.allowed:.3g}; "
            f"max abs error {bad.max_abs_error:.3g}, worst error/bound {bad.worst_ratio:.3g}, eager's error there "
            f"{bad.eager_error:.3g}")


def _layout_diagnosis(run: Run, inputs: InputSet, strided: list[tuple[int, torch.Tensor]], want: list[Any],
                      exact: list[Any] | None) -> str:
    """Run the candidate once more on contiguous copies of the inputs: if it is right there, it
    ignores the task's layouts; say which inputs and their strides."""
    names = "; ".join(f"input {k}: {layout_text(v)}" for k, v in strided)
    try:
        dense = [v.contiguous() if isinstance(v, torch.Tensor) else v for v in inputs.values]
        again = _candidate_forward(run, dense, "candidate")
    except Verdict:
        return ""
    if compare_outputs(again, want, exact) is None:
        return (f"The kernel is right when every input is contiguous and wrong on the task's own layouts ({names}). "
                "Read each input through its strides (and storage offset), or make it contiguous first.")
    return f"Some inputs are not contiguous ({names}); a kernel must address them by their strides."


# -- the whole run ----------------------------------------------------------------------------


@dataclass
class TaskState:
    """What a worker keeps of one task between candidates: the task's module, its init inputs on
    the device, the seeded reference and its exact (float64) copy."""

    task: types.ModuleType
    init: list[Any]
    reference: torch.nn.Module
    exact_model: list[torch.nn.Module] = field(default_factory=list)
    marked: tuple[int, ...] = ()  # the fingerprint when last known intact
    counts: tuple[int, int] | None = None  # the task's bytes and FLOPs for the roofline (the same for every candidate)

    def fingerprint(self) -> tuple[int, ...]:
        """The bits of everything kept between candidates (the init inputs, every reference's
        parameters and buffers): a candidate that wrote into them (out of bounds) leaves a
        different fingerprint. Everything else a candidate could reach is released after it and
        written again (inputs) or poisoned (outputs) before the next one runs."""
        return fingerprint(self._kept(with_exact=True))

    def _kept(self, with_exact: bool) -> list[torch.Tensor]:
        models = (self.reference, *self.exact_model) if with_exact else (self.reference,)
        return [v for v in self.init if isinstance(v, torch.Tensor)] + \
            [t for m in models for t in (*m.parameters(), *m.buffers())]

    def forget_exact(self) -> None:
        """The exact copy is gone: only the init inputs and the reference stay checked."""
        self.marked = self.marked[:len(self._kept(with_exact=False))]

    def mark(self) -> None:
        self.marked = self.fingerprint()

    def intact(self) -> bool:
        return self.fingerprint() == self.marked


class TaskStates:
    """A worker's task states, the most recently used kept (each holds a model on the GPU)."""

    def __init__(self, keep: int = 2) -> None:
        self.keep = keep
        self.states: dict[str, TaskState] = {}

    def get(self, key: str) -> TaskState | None:
        state = self.states.pop(key, None)
        if state is not None:
            self.states[key] = state  # most recent last
        return state

    def put(self, key: str, state: TaskState) -> None:
        self.states[key] = state
        while len(self.states) > self.keep:
            self.states.pop(next(iter(self.states)))

    def intact(self) -> bool:
        return all(state.intact() for state in self.states.values())


_ANSWERING: set[tuple[str, str | None]] = set()


def _device_of(job: dict[str, Any]) -> torch.device:
    device = torch.device(job.get("device") or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda":
        device = torch.device("cuda", torch.cuda.current_device() if device.index is None else device.index)
        torch.cuda.set_device(device)
    return device


def _task_state(job: dict[str, Any], device: torch.device, states: TaskStates | None) -> TaskState:
    key = hashlib.sha256(f"{device} {job['seeds'][0]}\n{job['task']}".encode()).hexdigest()
    state = states.get(key) if states is not None else None
    if state is not None:
        return state
    task = _load(job["task"], "kevin_task")
    # KernelBench's placement: each model built (seeded alike) where its program makes it, then
    # moved with the init inputs to the device under test.
    init = [to_device(v, device) for v in task.get_init_inputs()]
    torch.manual_seed(job["seeds"][0])
    state = TaskState(task, init, task.Model(*init).to(device).eval())
    state.mark()
    if states is not None:
        states.put(key, state)
    return state


def run(job: dict[str, Any], announce: Callable[[str], None] = lambda phase: None,
        states: TaskStates | None = None) -> dict[str, Any]:
    announce("setup")
    device = _device_of(job)
    if job.get("numerics"):
        apply_numerics(job["numerics"])  # the numerics the task's cache key names
    if job.get("build_root") is not None and (job["build_root"], job.get("arch")) not in _ANSWERING:
        # For this worker's whole life: a candidate may call load_inline in __init__ or forward too.
        from pathlib import Path

        from kevin_backend.toolchain.build import Builder, answering_load_inline

        _WORKER_LIFETIME.enter_context(answering_load_inline(Builder(Path(job["build_root"]), jobs=1), job.get("arch")))
        _ANSWERING.add((job["build_root"], job.get("arch")))
    task_state = _task_state(job, device, states)
    announce("load")
    try:
        candidate = _load(job["candidate"], "kevin_candidate")
    except Exception as exc:  # noqa: BLE001 - the candidate's program failed to load
        return _error("RUNTIME_ERROR", "run", f"loading the candidate failed: {type(exc).__name__}: {exc}")
    if not hasattr(candidate, "ModelNew"):
        return _error("NO_MODELNEW", "run", "the program defines no ModelNew")
    announce("setup")
    reference = task_state.reference
    ledger = MemoryLedger(device, float(job.get("memory_factor", 3.0)), fixed=flush_bytes(device))
    # until the inputs are known, the bound for the candidate's own parameters is the reference's
    ledger.task_bytes = sum(p.numel() * p.element_size() for p in reference.parameters()) + (1 << 30)
    announce("init")
    torch.manual_seed(job["seeds"][0])
    state = Run(job, task_state.task, reference, reference, device, ledger, announce, current="init", state=task_state)
    try:
        state.model = candidate.ModelNew(*task_state.init).to(device).eval()
    except Exception as exc:  # noqa: BLE001
        return {**_candidate_failure(state, "ModelNew(...)", exc), "device": str(device)}
    ledger.task_bytes = 0
    ledger.start()
    try:
        outcome = _judge(state)
    except Verdict as v:
        outcome = v.outcome
    except Exception as exc:  # noqa: BLE001 - whose failure it is depends on whose code was running
        outcome = (_candidate_failure(state, "forward", exc) if state.current in CANDIDATE_PHASES
                   else _judge_failure(state, f"in its step '{state.current}'", exc))
    if state.candidate_ran and outcome.get("reason") in _CHECKED_AFTER and not _intact(task_state):
        outcome = _error("INPUT_MUTATED", "run", "the forward wrote into memory it does not own: the reference "
                         "model's parameters changed while the candidate ran")
    outcome["memory"] = {**state.ledger.report().as_dict(), "notes": state.ledger.notes}
    outcome["device"] = str(device)
    return outcome


# Verdicts that a write into the reference's memory could have made: they do not stand then.
_CHECKED_AFTER = frozenset({"ACCEPTED", "MISMATCH", "NAN_INF", "SHAPE_MISMATCH", "DTYPE_MISMATCH", "REPLAYED_OUTPUT"})


def _intact(state: TaskState) -> bool:
    try:
        return state.intact()
    except Exception:  # noqa: BLE001 - a CUDA fault surfaced: the verdict already says what happened
        return True


def _judge(run: Run) -> dict[str, Any]:
    exact_model: list[torch.nn.Module] = run.state.exact_model if run.state is not None else []
    # Correctness runs share the GPU with each other, never with a timing (which holds the lock
    # alone: another worker's correctness run would slow what it measures).
    gpu_lock = run.job.get("gpu_lock")
    with gpu_hold(gpu_lock, shared=True):
        for index, seed in enumerate(run.job["seeds"]):
            bad = _correctness(run, index, seed, exact_model)
            if bad is not None:
                return bad
    return _timing(run, exact_model)


def _timing(run: Run, exact_model: list[torch.nn.Module]) -> dict[str, Any]:
    """Candidate, eager and Inductor timed under one protocol (in the job that times Inductor, the
    candidate and Inductor in interleaved rounds, `INDUCTOR_ROUNDS`); then the replay check.

    Every step on the GPU holds its lock: the timing and Inductor's first call exclusively (that
    call compiles and benchmarks the configurations of Inductor's kernels, which another worker's
    run beside it would skew for good), the inputs and the replay check shared (their work must
    not land inside another worker's timing)."""
    job = run.job
    gpu_lock = job.get("gpu_lock")

    with gpu_hold(gpu_lock, shared=True):
        run.phase("inputs")
        inputs = make_input_set(run.task, job["seeds"][0], run.device)
    values = inputs.values
    measure = make_timer(run.device, job["trials"], job["warmup"], queued=True)
    compiled: Callable[[], Any] | None = None
    run.phase("lock")  # waiting for the GPU alone: the judge's step, whatever the wait
    with torch.no_grad(), gpu_hold(gpu_lock, shared=False):
        if job.get("inductor", True):  # (asked for once per task and GPU: the judge keeps the references' times)
            run.phase("inductor")
            from kevin_backend.measure.inductor import generated_modules, inductor_call, inductor_code

            # Inductor's code as a compiled model calls it: the one graph's compiled function without
            # Dynamo's guards (tens of microseconds a call), as the backend's decision times it
            mark = generated_modules()
            compiled, how = inductor_call(run.reference, values, job.get("compile_backend") or "inductor")
            code = inductor_code(mark)
            run.ledger.notes.append(f"Inductor timed as {how}" + (f"; Inductor's {code}" if code else ""))
        kernel_ms, inductor_ms = _candidate_and_inductor(run, measure, values, compiled)
        run.phase("timing-reference")
        # the references' times are measured once per task and GPU (the judge keeps them)
        eager_ms = measure(lambda: run.reference(*values)) if job.get("eager", True) else None
        run.ledger.observe()
        copy_gbps = _copy_bandwidth(run)  # while the GPU is still this worker's alone
    run.ledger.observe()
    measure = compiled = None  # the flush buffer and the compiled reference: their memory goes to the replay
    with gpu_hold(gpu_lock, shared=True):
        return _replay(run, inputs, exact_model, kernel_ms, eager_ms, inductor_ms, copy_gbps)


# Rounds of the candidate and Inductor, interleaved, in the job that times Inductor (once per task
# and GPU; the judge keeps the time for the task's later candidates): each side's median over
# rounds does not hang on one moment of the GPU. The notes name Inductor's code and its kernels'
# chosen configurations (`measure/inductor.inductor_code`): they showed that the Inductor times that
# moved 1.26-3.4x between H200 runs were other code, compiled for any size
# (`measure/inductor.inductor_call` now compiles for the task's own).
INDUCTOR_ROUNDS = 5


def _candidate_and_inductor(run: Run, measure: Callable[[Callable[[], Any]], float], values: list[Any],
                            compiled: Callable[[], Any] | None) -> tuple[float, float | None]:
    """The candidate's time and, when this job times Inductor, Inductor's: then both as the median
    of `INDUCTOR_ROUNDS` interleaved rounds (candidate, Inductor, candidate, ...), the rounds noted."""
    def candidate() -> float:
        run.phase("timing-candidate")
        return measure(lambda: run.model(*values))

    if compiled is None:
        return candidate(), None

    def inductor() -> float:
        run.phase("timing-reference")
        return measure(compiled)

    from kevin_backend.measure.interleave import interleaved_rounds

    kernel_rounds, inductor_rounds = interleaved_rounds(candidate, inductor, INDUCTOR_ROUNDS)
    kernel_ms, inductor_ms = statistics.median(kernel_rounds), statistics.median(inductor_rounds)
    run.ledger.notes.append(
        f"candidate and Inductor timed in {INDUCTOR_ROUNDS} interleaved rounds, medians {kernel_ms:.4f} and "
        f"{inductor_ms:.4f} ms; rounds: candidate {' '.join(f'{v:.4f}' for v in kernel_rounds)}, "
        f"Inductor {' '.join(f'{v:.4f}' for v in inductor_rounds)}")
    return kernel_ms, inductor_ms


def _replay(run: Run, inputs: InputSet, exact_model: list[torch.nn.Module], kernel_ms: float, eager_ms: float | None,
            inductor_ms: float | None, copy_gbps: float | None) -> dict[str, Any]:
    """The replay check after the timing (the same buffers, new values: a candidate that returns
    stored results fails it), then the accepted verdict with its times and roofline facts."""
    job, values = run.job, inputs.values
    run.phase("inputs")
    fresh = make_input_set(run.task, job["seeds"][-1] + 1000, run.device)
    for k, buf in enumerate(values):
        if isinstance(buf, torch.Tensor):
            copy_values(buf, fresh.values[k])
    del fresh  # (no name may keep one of its tensors alive: the replay needs that memory)
    # the references first, as for every input set: the exact run was planned without the
    # candidate's outputs held beside it
    run.phase("reference")
    want = _eager(run, inputs)
    run.phase("exact")
    exact = _exact(run, inputs, exact_model)
    again = _candidate_forward(run, values, "replay")
    run.phase("compare")
    replayed = compare_outputs(again, want, exact)
    if replayed is not None and stale(replayed):  # (the comparison's numbers kept: which output, how many, how far)
        return _error("REPLAYED_OUTPUT", "timing", "after new values were written into its input buffers, the output "
                      f"no longer matched: it returns stored results instead of computing ({_mismatch_text(replayed)})")
    if replayed is not None:
        run.ledger.notes.append(f"replay check: computed afresh, within rounding of the bound ({_mismatch_text(replayed)})")
    outcome = {"stage": "timing", "reason": "ACCEPTED", "kernel_ms": kernel_ms, "eager_ms": eager_ms, "inductor_ms": inductor_ms}
    facts = _roofline_facts(run, values, want, copy_gbps)
    if facts is not None:
        outcome["roofline"] = facts
    return outcome


def _copy_bandwidth(run: Run) -> float | None:
    """The GPU's copy bandwidth (`measure/roofline.py`): kept under the build folder, measured by the
    first worker that needs it. A failure to measure it is never the candidate's: the verdict
    then carries no roofline (a CUDA fault the candidate left behind still surfaces)."""
    if run.device.type != "cuda":
        return None
    from pathlib import Path

    from kevin_backend.measure.roofline import copy_bandwidth

    run.phase("roofline")
    build_root = run.job.get("build_root")
    try:
        gbps = copy_bandwidth(run.device, Path(build_root) / "copy_bandwidth" if build_root else None)
    except Exception as exc:  # noqa: BLE001 - the judge's measurement, not the candidate's
        if any(f in str(exc).lower() for f in _CUDA_FAULTS):
            raise
        run.ledger.notes.append(f"no copy bandwidth measured ({type(exc).__name__}: {str(exc).splitlines()[0][:200]})")
        return None
    finally:
        # the copy's two buffers are the measurement's, not the run's: they leave the peak
        torch.cuda.reset_peak_memory_stats(run.device)
    return gbps


def _roofline_facts(run: Run, inputs: Sequence[Any], outputs: Sequence[Any], copy_gbps: float | None) -> dict[str, Any] | None:
    """What the judge needs for an accepted kernel's roofline: the bytes the task must move (its
    inputs as laid out, its outputs), its matmul/convolution FLOPs, the copy bandwidth. None
    without a copy bandwidth, or when counting failed (the verdict stands without a roofline)."""
    if copy_gbps is None:
        return None
    from kevin_backend.measure.roofline import task_bytes, task_flops

    run.phase("roofline")
    try:
        counts = run.state.counts if run.state is not None else None
        if counts is None:  # what the task moves and computes: counted once per task and worker
            counts = (task_bytes(inputs, outputs), task_flops(run.reference, inputs))
            if run.state is not None:
                run.state.counts = counts
        return {"bytes": counts[0], "flops": counts[1], "copy_gbps": copy_gbps}
    except Exception as exc:  # noqa: BLE001 - the judge's counting, not the candidate's
        if any(f in str(exc).lower() for f in _CUDA_FAULTS):
            raise
        run.ledger.notes.append(f"no roofline ({type(exc).__name__}: {str(exc).splitlines()[0][:200]})")
        return None


def serve() -> int:
    """A pool's worker: torch and CUDA initialised once, then one job per line of stdin, each
    answered like a single run. After each candidate the outputs are gone, the allocator's
    cache is released and the kept references are fingerprinted: a reference that changed (a
    candidate wrote out of bounds into it) ends the worker, as does a CUDA error; the parent
    replaces it."""
    if torch.cuda.is_available():
        torch.cuda.init()
    states = TaskStates()
    own = current_numerics()  # restored before every job: no job's settings reach the next
    print("ready", flush=True)
    for line in sys.stdin:
        if not line.strip():
            continue
        job = json.loads(line)
        token = job.pop("token")
        apply_numerics(own)

        def announce(phase: str, token: str = token) -> None:
            print(f"{token} phase {phase}", flush=True)

        try:
            outcome = run(job, announce, states)
        except Exception as exc:  # noqa: BLE001 - before the run began: the judge's own failure
            outcome = _judge_failure(None, "setting up the run", exc)
        gc.collect()
        healthy = True
        try:
            announce("cleanup")
            if torch.cuda.is_available():
                torch.cuda.synchronize()
                torch.cuda.empty_cache()
            healthy = states.intact()
        except Exception:  # noqa: BLE001 - a CUDA error left behind: this worker is done
            healthy = False
        outcome["worker_healthy"] = healthy
        print(f"{token} {json.dumps(outcome, default=float)}", flush=True)
        if not healthy:
            return 0
    return 0


def main() -> int:
    if "--serve" in sys.argv[1:]:
        return serve()
    job = json.loads(sys.stdin.read())
    token = job.pop("token")

    def announce(phase: str) -> None:
        print(f"{token} phase {phase}", flush=True)

    try:
        outcome = run(job, announce)
    except Exception as exc:  # noqa: BLE001 - before the run began: the judge's own failure
        outcome = _judge_failure(None, "setting up the run", exc)
        print(f"{token} {json.dumps(outcome)}", flush=True)
        return 3
    print(f"{token} {json.dumps(outcome, default=float)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
