"""Inductor's code for a task, as the thing a kernel is timed against: the reference's one compiled
graph called directly on the arguments Dynamo gave it (AOTAutograd's and Inductor's wrappers and
kernels, not Dynamo's frame and guard check), and what Inductor generated, for the record.

    call, how = inductor_call(reference, values, "inductor")   # how: DIRECT or GUARDED
    mark = generated_modules(); ...; text = inductor_code(mark)
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any, Callable

import torch

__all__ = ["DIRECT", "GUARDED", "generated_modules", "inductor_code", "inductor_call", "inductor_function"]

DIRECT = "the reference's one compiled graph called directly (no Dynamo guards)"
GUARDED = "torch.compile of the reference called as a whole ({graphs} graphs, guards included)"


def generated_modules() -> int:
    """How many Python modules Inductor has generated and loaded in this process so far (a mark
    for `inductor_code`); 0 where that is not known."""
    try:
        from torch._inductor.codecache import PyCodeCache

        return len(PyCodeCache.modules)
    except Exception:  # noqa: BLE001 - a private interface of torch: no mark, no description
        return 0


def inductor_code(mark: int) -> str:
    """What Inductor generated since `mark` (`generated_modules()`), for the record: a hash of the
    generated code and, for each GPU kernel whose first call has chosen among its configurations,
    the one chosen ("" when nothing is known). Two compiles of one task that time differently can
    then be told apart: other code, other choices, or the same code timed at another moment."""
    try:
        from torch._inductor.codecache import PyCodeCache

        modules = PyCodeCache.modules[mark:]
        if not modules:
            return ""
        digest = hashlib.sha256()
        chosen = []
        for module in modules:
            path = getattr(module, "__file__", None)
            if path:
                digest.update(Path(path).read_bytes())
            for name, value in sorted(vars(module).items(), key=lambda item: item[0]):
                launchers = getattr(value, "launchers", None)  # a Triton kernel's autotuner, once it has run
                if not isinstance(launchers, list) or len(launchers) != 1 or not hasattr(value, "triton_meta"):
                    continue
                config = getattr(launchers[0], "config", None)
                if config is not None:
                    kwargs = ",".join(f"{k}={v}" for k, v in sorted(getattr(config, "kwargs", {}).items()))
                    tuned = " (benchmarked)" if getattr(value, "autotune_time_taken_ns", None) else ""
                    chosen.append(f"{name} [{kwargs}] warps {getattr(config, 'num_warps', '?')}{tuned}")
        return f"code {digest.hexdigest()[:12]}" + (f"; chosen: {'; '.join(chosen)}" if chosen else "")
    except Exception:  # noqa: BLE001 - a private interface of torch: no description
        return ""


def inductor_call(reference: torch.nn.Module, values: list[Any], backend: str) -> tuple[Callable[[], Any], str]:
    """Inductor's code for the task, called as a compiled model calls it, and how (for the
    protocol). The backend is wrapped so that each graph Dynamo captures is seen with the
    arguments it is called on; after one warm-up call, a reference captured as one graph called
    once is timed through that graph's compiled function alone, if it returns what the whole
    does."""
    compiled, function, args = _compiled_parts(reference, values, backend)
    if function is None:
        def guarded() -> Any:
            return compiled(*values)

        return guarded, args

    def direct() -> Any:
        return function(*args)

    return direct, DIRECT


def inductor_function(reference: torch.nn.Module, values: list[Any], backend: str) -> tuple[Callable[..., Any], str]:
    """As `inductor_call`, but a function of the inputs: called on other values of the same sizes,
    strides and dtypes (the judge's rotated input sets), it runs the same compiled code. The one
    graph's arguments that are the inputs are taken from each call; the rest (the parameters
    Dynamo lifted) stay as they were."""
    compiled, function, args = _compiled_parts(reference, values, backend)
    if function is None:
        def guarded(*new: Any) -> Any:
            return compiled(*new)

        return guarded, args
    where = [next((k for k, v in enumerate(values) if a is v), None) for a in args]

    def direct(*new: Any) -> Any:
        return function(*[new[k] if k is not None else a for k, a in zip(where, args)])

    return direct, DIRECT


def _compiled_parts(reference: torch.nn.Module, values: list[Any], backend: str) -> tuple[Callable[..., Any], Any, Any]:
    """(the compiled reference, the one graph's compiled function, its arguments), or (the
    compiled reference, None, how it must be called) when it is not one graph called once that
    returns what the whole does."""
    import torch._dynamo

    compiler = torch._dynamo.lookup_backend(backend)
    graphs: list[list[tuple[Any, ...]]] = []  # per graph, the arguments of each call while recording
    functions: list[Callable[..., Any]] = []
    recording = [True]  # only the warm-up call: the timed calls must not keep their arguments alive

    def capture(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        function = compiler(gm, example_inputs)
        calls: list[tuple[Any, ...]] = []
        graphs.append(calls)
        functions.append(function)

        def run(*args: Any) -> Any:
            if recording[0]:
                calls.append(args)
            return function(*args)

        return run

    # static shapes, always: a worker judges task after task, each program loaded under the same
    # file name with its forward on the same line, and Dynamo's automatic dynamic shapes (which
    # keys what it has seen by file, line and name) took the second task's reference for the first
    # one's at new sizes and compiled it for any size: on the H200, Inductor's code for a
    # log-softmax over dim 1 of 64 x 8192 x 128 bf16 then took 0.508 ms instead of 0.178 ms
    compiled = torch.compile(reference, backend=capture, dynamic=False)
    with torch.no_grad():
        whole = compiled(*values)
    recording[0] = False
    if len(graphs) != 1 or len(graphs[0]) != 1:
        count = len(graphs)
        graphs.clear()  # the intermediate values between graphs, held by the recorded arguments
        return compiled, None, GUARDED.format(graphs=count)
    args, function = graphs[0][0], functions[0]
    with torch.no_grad():
        alone = function(*args)
    if not _same(whole, alone):
        return compiled, None, GUARDED.format(graphs=1)
    return compiled, function, args


def _same(whole: Any, alone: Any) -> bool:
    """The graph's outputs (a list or tuple) hold the model's output tensors, bit for bit."""
    wanted = [whole] if isinstance(whole, torch.Tensor) else list(whole) if isinstance(whole, (list, tuple)) else None
    got = list(alone) if isinstance(alone, (list, tuple)) else [alone]
    if wanted is None or not all(isinstance(t, torch.Tensor) for t in wanted):
        return False
    got_tensors = [t for t in got if isinstance(t, torch.Tensor)]
    return len(got_tensors) >= len(wanted) and all(
        any(g.shape == w.shape and g.dtype == w.dtype and torch.equal(g, w) for g in got_tensors) for w in wanted)

