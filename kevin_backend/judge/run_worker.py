"""The sandboxed side of the judge: runs one candidate against its task in this (worker) process.

    python -m kevin_backend.judge.run_worker < job.json     # prints one JSON line: the outcome

A crash, hang, illegal address or out-of-memory here ends this process, never the judge; the
parent (`runner.py`) reads the exit status and the output. The protocol, in order:

  1. load the task (the reference `Model`) and the candidate (`ModelNew`); the candidate's
     `load_inline` calls are answered from the judge's build cache
  2. correctness, for each seeded input set (normal values, then mixed scales; never zeros):
     the candidate gets its own copy of the inputs and runs first, on memory poisoned with NaN,
     with every op it dispatches audited (allocation, view and metadata ops only); then the
     reference runs on its own copy; outputs are compared (shape, dtype, NaN/Inf, tolerance by
     dtype) and the candidate's inputs checked unchanged
  3. timing, one protocol for the candidate, the eager reference and the Inductor-compiled
     reference: warm-up, then trials timed with device-wide synchronization (side streams cannot
     escape), the L2 cache flushed between trials; the median counts
  4. replay check: fresh values written into the candidate's input buffers, output checked again
"""

from __future__ import annotations

import contextlib
import json
import math
import statistics
import sys
import time
import traceback
import types
from typing import Any, Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from kevin_backend.judge.tolerance import tolerance
from kevin_backend.locks import file_lock

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
        "set_", "resize_", "record_stream", "clone", "copy_", "contiguous",
    }
)


_WORKER_LIFETIME = contextlib.ExitStack()


class _Audit(TorchDispatchMode):
    """Records every aten op dispatched while active, from Python or from C++ host code alike."""

    def __init__(self) -> None:
        super().__init__()
        self.computed: list[str] = []

    def __torch_dispatch__(self, func: Any, types_: Any, args: Any = (), kwargs: Any = None) -> Any:
        # A fast build's operators are registered without a dispatch key (CompositeImplicitAutograd),
        # so this mode never sees them, only the aten ops their host code calls.
        name = func._schema.name.split("::")[-1]
        if name not in _ALLOWED_OPS and name not in self.computed:
            self.computed.append(name)
        return func(*args, **(kwargs or {}))


def _load(source: str, name: str) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__file__ = f"<{name}>"
    exec(compile(source, module.__file__, "exec"), module.__dict__)  # noqa: S102 - this is the sandbox
    return module


def _inputs(task: types.ModuleType, seed: int, mixed: bool, grow: int = 1) -> list[Any]:
    torch.manual_seed(seed)
    values = list(task.get_inputs())
    tensors = [v for v in values if isinstance(v, torch.Tensor)]
    if grow > 1 and tensors and len({t.shape[0] if t.dim() else None for t in tensors}) == 1 and tensors[0].dim():
        # larger inputs along the batch dimension all tensor inputs share
        values = [
            torch.randn((v.shape[0] * grow, *v.shape[1:]), device=v.device).to(v.dtype)
            if isinstance(v, torch.Tensor) and v.is_floating_point()
            else v.repeat(grow, *([1] * (v.dim() - 1))) if isinstance(v, torch.Tensor) else v
            for v in values
        ]
    out = []
    for v in values:
        if isinstance(v, torch.Tensor) and v.is_floating_point():
            v = v.clone()
            zeros = v == 0
            if zeros.any():  # never zeros: they hide unwritten outputs and wrong indexing
                v[zeros] = 0.5
            if mixed:  # mixed scales: values across orders of magnitude
                scale = torch.exp2(torch.randint(-6, 7, v.shape, device=v.device).to(v.dtype))
                v = v * scale
        out.append(v)
    return out


def _clone(values: list[Any]) -> list[Any]:
    return [v.clone() if isinstance(v, torch.Tensor) else v for v in values]


def _poison(device: torch.device) -> None:
    """Fill the allocator's free memory with NaN: a candidate that returns memory it never wrote
    returns NaN (the reference's freed outputs are never in reach: it runs after the candidate)."""
    if device.type != "cuda":
        return
    free, _ = torch.cuda.mem_get_info(device)
    size = min(int(free * 0.5), 4 << 30) // 4
    blob = torch.full((size,), float("nan"), device=device)
    del blob


def _scrub(tensors: list[Any]) -> None:
    for t in tensors:
        if isinstance(t, torch.Tensor):
            t.fill_(float("nan") if t.is_floating_point() else -1)


def _as_list(out: Any) -> list[Any]:
    return [out] if isinstance(out, torch.Tensor) else list(out) if isinstance(out, (tuple, list)) else [out]


def _compare(got: list[Any], want: list[Any], trial: int) -> dict[str, Any] | None:
    """None when `got` matches `want`; else the reason and the details."""
    if len(got) != len(want):
        return {"reason": "SHAPE_MISMATCH", "feedback": f"returns {len(got)} outputs, expected {len(want)}"}
    for i, (g, w) in enumerate(zip(got, want)):
        if not isinstance(g, torch.Tensor):
            return {"reason": "SHAPE_MISMATCH", "feedback": f"output {i} is a {type(g).__name__}, expected a tensor"}
        if g.shape != w.shape:
            return {"reason": "SHAPE_MISMATCH", "feedback": f"output {i} has shape {list(g.shape)}, expected {list(w.shape)}"}
        if g.dtype != w.dtype:
            return {"reason": "DTYPE_MISMATCH", "feedback": f"output {i} has dtype {g.dtype}, expected {w.dtype}"}
        if not w.is_floating_point():
            if not torch.equal(g, w):
                bad = (g != w)
                return _mismatch(i, g.double(), w.double(), bad, trial)
            continue
        tol = tolerance(w.dtype)
        gf, wf = g.double(), w.double()
        finite_ref = torch.isfinite(wf)
        if (~torch.isfinite(gf) & finite_ref).any():
            bad = ~torch.isfinite(gf) & finite_ref
            result = _mismatch(i, gf, wf, bad, trial)
            result["reason"] = "NAN_INF"
            return result
        bad = ~torch.isclose(gf, wf, rtol=tol, atol=tol, equal_nan=True)
        if bad.any():
            return _mismatch(i, gf, wf, bad, trial)
    return None


def _mismatch(i: int, g: torch.Tensor, w: torch.Tensor, bad: torch.Tensor, trial: int) -> dict[str, Any]:
    diff = (g - w).abs().nan_to_num(nan=math.inf)
    rel = diff / w.abs().clamp_min(1e-12)
    first = tuple(int(x) for x in bad.nonzero()[0].tolist())
    details = {
        "output": i,
        "max_abs_error": float(diff.max()),
        "max_rel_error": float(rel.max()),
        "bad_elements": int(bad.sum()),
        "total_elements": int(bad.numel()),
        "first_bad_index": list(first),
        "expected": float(w[first]),
        "got": float(g[first]),
        "trial": trial,
    }
    return {"reason": "MISMATCH", "mismatch": details}


def _timer(device: torch.device, trials: int, warmup: int, queued: bool = False) -> Callable[[Callable[[], Any]], float]:
    """Median milliseconds of `fn` under one protocol for everything timed.

    Every trial starts with the L2 cache flushed. `queued=False` (whole models, `kevin bench`):
    the GPU is idle when a trial starts and the trial ends when all its work has, so the time
    includes the host's part (Python, dispatch, launches). `queued=True` (the judge, one subgraph
    at a time): the GPU is first kept busy while every trial is queued behind it, so each trial's
    two events measure the GPU's own time for it; the host's part, which in a compiled model
    overlaps the GPU's work and is paid per graph rather than per subgraph, is left out for the
    candidate, eager and Inductor alike (what a standalone call of a torch.compile'd function
    spends in guards and wrappers would otherwise dwarf a small kernel)."""
    flush = torch.empty(64 << 20, dtype=torch.int32, device=device) if device.type == "cuda" else None

    def measure(fn: Callable[[], Any]) -> float:
        for _ in range(warmup):
            fn()
        if device.type != "cuda":
            samples = []
            for _ in range(trials):
                start = time.perf_counter()
                fn()
                samples.append((time.perf_counter() - start) * 1e3)
            return statistics.median(samples)
        if queued:
            return _queued(fn, flush, trials)
        samples = []
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        for _ in range(trials):
            flush.zero_()  # evict the inputs from L2
            torch.cuda.synchronize()  # device-wide: work on any stream ends before the timer starts
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()  # ... and before it stops
            samples.append(start.elapsed_time(end))
        return statistics.median(samples)

    return measure


def _queued(fn: Callable[[], Any], flush: Any, trials: int, attempts: int = 4) -> float:
    """Median GPU milliseconds of `fn`, every trial queued while the GPU is still busy.

    The GPU is kept busy for about twice the time the host needs to queue the trials (estimated
    from three calls). If queueing took longer than that (a loaded CPU, a call slower than its
    first three), the GPU ran dry and waited for the host inside some trials, which would then
    count the host's part: the measurement is repeated with a longer busy period."""
    torch.cuda.synchronize()
    host = time.perf_counter()
    for _ in range(3):  # the host's time to queue one trial, flush included
        flush.zero_()
        fn()
    host = (time.perf_counter() - host) / 3
    torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(trials)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(trials)]
    busy_ms = min(_MAX_BUSY_MS, 2.0 * host * 1e3 * trials + 1.0)  # GPU work ahead of the queue
    for _ in range(attempts):
        torch.cuda._sleep(int(busy_ms * _cycles_per_ms()))
        began = time.perf_counter()
        for i in range(trials):
            flush.zero_()  # evict the inputs from L2
            starts[i].record()
            fn()
            ends[i].record()
        queued_ms = (time.perf_counter() - began) * 1e3
        torch.cuda.synchronize()  # device-wide: every trial's work, on any stream, has ended
        if queued_ms < 0.8 * busy_ms or busy_ms >= _MAX_BUSY_MS:
            break
        busy_ms = min(_MAX_BUSY_MS, 3.0 * queued_ms + 1.0)  # the GPU ran dry: again, busy for longer
    return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends))


# The longest the GPU is kept busy ahead of one measurement's trials.
_MAX_BUSY_MS = 4000.0


_CYCLES_PER_MS: list[float] = []


def _cycles_per_ms() -> float:
    """GPU clock cycles per millisecond, as `torch.cuda._sleep` counts them (measured once)."""
    if not _CYCLES_PER_MS:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        torch.cuda._sleep(10_000_000)
        end.record()
        torch.cuda.synchronize()
        _CYCLES_PER_MS.append(10_000_000 / max(start.elapsed_time(end), 1e-3))
    return _CYCLES_PER_MS[0]


def run(job: dict[str, Any]) -> dict[str, Any]:
    if job.get("build_root") is not None:
        # For this worker's whole life: a candidate may call load_inline in __init__ or forward too.
        from pathlib import Path

        from kevin_backend.judge.build import Builder, answering_load_inline

        _WORKER_LIFETIME.enter_context(answering_load_inline(Builder(Path(job["build_root"]), jobs=1), job.get("arch")))
    task = _load(job["task"], "kevin_task")
    try:
        candidate = _load(job["candidate"], "kevin_candidate")
    except Exception as exc:
        return _error("RUNTIME_ERROR", "run", f"loading the candidate failed: {type(exc).__name__}: {exc}")
    if not hasattr(candidate, "ModelNew"):
        return _error("NO_MODELNEW", "run", "the program defines no ModelNew")
    init = list(task.get_init_inputs())
    torch.manual_seed(job["seeds"][0])
    reference = task.Model(*init)
    torch.manual_seed(job["seeds"][0])
    try:
        model = candidate.ModelNew(*init)
    except Exception as exc:
        return _error("RUNTIME_ERROR", "run", f"ModelNew(...) raised {type(exc).__name__}: {exc}")
    probe = _inputs(task, job["seeds"][0], False)
    device = next((v.device for v in probe if isinstance(v, torch.Tensor)), torch.device("cpu"))
    reference, model = reference.to(device), model.to(device)

    # correctness on every input set
    for trial, seed in enumerate(job["seeds"]):
        inputs = _inputs(task, seed, mixed=trial % 2 == 1, grow=job.get("grow", 1))
        mine, pristine = _clone(inputs), _clone(inputs)
        _poison(device)
        audit = _Audit()
        try:
            with torch.no_grad(), audit:
                got = _as_list(model(*mine))
            if device.type == "cuda":
                torch.cuda.synchronize()
        except Exception as exc:
            return _error("RUNTIME_ERROR", "run", f"forward raised {type(exc).__name__}: {exc}")
        if audit.computed:
            return _error("PYTORCH_COMPUTE", "run", "forward ran PyTorch compute ops: " + ", ".join(audit.computed[:10]))
        with torch.no_grad():
            want = _as_list(reference(*inputs))
        bad = _compare(got, want, trial)
        if bad is not None:
            return {"stage": "correctness", **bad}
        _scrub(want)  # the next candidate run must not find these values in freed memory
        for k, (a, b) in enumerate(zip(mine, pristine)):
            if isinstance(a, torch.Tensor) and not torch.equal(a, b) and not (a.isnan().any() and torch.allclose(a, b, equal_nan=True)):
                return _error("INPUT_MUTATED", "correctness", f"input {k} was changed by the forward")

    # timing: the candidate, the eager reference and the Inductor-compiled reference; Inductor
    # compiles first, then the measurements hold the GPU alone (other judges' workers wait)
    measure = _timer(device, job["trials"], job["warmup"], queued=True)
    inputs = _inputs(task, job["seeds"][0], False)
    mine = _clone(inputs)
    with torch.no_grad():
        compiled = torch.compile(reference) if job.get("inductor", True) else None
        if compiled is not None:
            compiled(*inputs)
        with file_lock(job["gpu_lock"]) if job.get("gpu_lock") else contextlib.nullcontext():
            kernel_ms = measure(lambda: model(*mine))
            eager_ms = measure(lambda: reference(*inputs))
            inductor_ms = measure(lambda: compiled(*inputs)) if compiled is not None else None

        # replay check: the same buffers, new values
        fresh = _inputs(task, job["seeds"][-1] + 1000, False)
        for buf, new in zip(mine, fresh):
            if isinstance(buf, torch.Tensor):
                buf.copy_(new)
        again = _as_list(model(*mine))
        want = _as_list(reference(*fresh))
    bad = _compare(again, want, len(job["seeds"]))
    if bad is not None:
        return _error("REPLAYED_OUTPUT", "timing", "after new values were written into its input buffers, the output "
                      "no longer matched: it returns stored results instead of computing")
    return {"stage": "timing", "reason": "ACCEPTED", "kernel_ms": kernel_ms, "eager_ms": eager_ms, "inductor_ms": inductor_ms}


def _error(reason: str, stage: str, feedback: str) -> dict[str, Any]:
    return {"stage": stage, "reason": reason, "feedback": feedback}


def main() -> int:
    job = json.loads(sys.stdin.read())
    token = job.pop("token")
    try:
        outcome = run(job)
    except Exception as exc:  # reported, then the exit status says it was not a clean verdict
        outcome = _error("RUNTIME_ERROR", "run", f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=3)}")
        print(f"{token} {json.dumps(outcome)}", flush=True)
        return 3
    print(f"{token} {json.dumps(outcome)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
