"""QuACK (`quack-kernels`, CuTe-DSL kernels for softmax, RMSNorm, LayerNorm and cross-entropy) as a
measured peer of the roofline suite: which tasks it takes, and why not the others; the task's
computation built from QuACK's own functions; on a GPU, QuACK's outputs checked against the task's
reference on the task's inputs, then timed by the project's timer (the judge's protocol), and its
fraction of the GPU's copy bandwidth over the same bytes as the writer's kernel and Inductor.

    verdict = quack_verdict(task)          # CPU, meta tensors: taken (QuACK's op) or not, and why
    call = build_call(FORMS[task.name], inputs, outputs)   # QuACK's function and arguments, and what
                                           # its result becomes (the task's outputs' shapes and dtypes)
    got = bind(call)()                     # on a GPU, QuACK installed
    row = measure_task(task, device, copy_gbps, trials, warmup)

    python benchmarks/quack_peer.py --which                      which tasks QuACK takes (CPU)
    python benchmarks/quack_peer.py [--tasks a,b] [--copy-gbps G] [--trials 50] [--json FILE]
                                    [--check-refusals]           QuACK timed on the tasks it takes (and
                                                                 run once on those refused for their
                                                                 rows' length or alignment alone)

`benchmarks/bench_builtin.py --suite roofline` runs the second form in a process of its own before
its searches (the GPU otherwise idle) and puts QuACK's time beside the kernel's and Inductor's.

What QuACK 0.6.5 takes (read from its sources: `quack/softmax.py`, `rmsnorm.py`, `cross_entropy.py`,
`reduction_base.py`, `rmsnorm_config.py`), on a Hopper GPU:
- its four operations over the last dimension of rows contiguous in memory (a 2-D tensor, or
  leading dimensions flattened into rows by a view); a transposed or permuted input would need a
  copy first, another computation than the task's, so it is not taken;
- softmax: a row a whole number of 16-byte vectors (the kernel asserts it);
- RMSNorm, LayerNorm, cross-entropy: each thread's copy from global into shared memory is a
  `cp.async` of gcd(N, 16 bytes / widest element) elements, and a `cp.async` moves 4, 8 or 16
  bytes: a 16-bit row of odd length is refused (issue 35 saw cross-entropy over 50257 bf16 fail);
- every kernel holds its tile of the row in shared memory, split over a cluster of at most 16
  blocks: the tile (QuACK's own threads per row, threads per block and cluster size for the
  row's length) must fit the 227 KiB a block may hold, so rows of 1M fp32 and 4M elements are not
  QuACK's;
- LayerNorm (`layernorm_fwd`) asks for a float32 weight and bias: the task's are converted once,
  before timing, as a user of QuACK keeps them.

The inputs are made by the task's own `get_inputs()` with the GPU as the default device (the
same code and distributions as the judge's CPU-made inputs, without minutes of CPU random
numbers for 8 GiB tasks), seeded; QuACK's outputs must pass the judge's comparison
(`measure/compare.py`) against eager, with the float64 run where the GPU has the memory.
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

PEER = "quack"
VERSION = "0.6.5"  # pyproject.toml's extra `peers` pins it; what QuACK takes is read from this version
SMEM_PER_BLOCK = 232_448  # bytes of shared memory a block of an H100 / H200 may hold (227 KiB)
MAX_CLUSTER = 16  # the largest cluster QuACK launches on Hopper (non-portable size)
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
NOT_AN_OP = "not one of QuACK's operations (softmax, RMSNorm, LayerNorm and cross-entropy over the last dimension)"


@dataclass(frozen=True)
class Form:
    """A task's computation as one of QuACK's operations: `op` ("softmax", "rmsnorm", "layernorm",
    "cross_entropy") over `dims` trailing dimensions (flattened into one row), reducing dimension
    `dim` of the input as the task writes it (-1: the last); `eps` as the task writes it;
    `residual`: the task adds its second input first and also returns the sum (QuACK's prenorm)."""

    op: str
    dim: int = -1
    dims: int = 1
    eps: float | None = None
    residual: bool = False


# What each task that is one of QuACK's operations computes, as QuACK would be asked for it. A task
# of the suite named for one of them and absent here must be in NOT_QUACK (the test checks).
FORMS: dict[str, Form] = {
    "layernorm-last-f32-16x4M": Form("layernorm", eps=1e-5),
    "layernorm-last-bf16-1Mx64": Form("layernorm", eps=1e-5),
    "layernorm-last-bf16-16384x8192": Form("layernorm", eps=1e-5),
    "layernorm-chw-f32-16x64x256x256": Form("layernorm", dims=3, eps=1e-5),
    "layernorm-channels-last-f16-64x64x64x256": Form("layernorm", eps=1e-6),
    "rmsnorm-last-f32-8192x8192": Form("rmsnorm", eps=1e-6),
    "rmsnorm-last-bf16-32768x4096": Form("rmsnorm", eps=1e-6),
    "rmsnorm-last-f32-4096x393216": Form("rmsnorm", eps=1e-6),
    "rmsnorm-last-bf16-32768x16384": Form("rmsnorm", eps=1e-6),
    "rmsnorm-last-bf16-32768x65536": Form("rmsnorm", eps=1e-6),
    "rmsnorm-last-f16-1Mx64": Form("rmsnorm", eps=1e-6),
    "rmsnorm-dim1-f32-16x64x256x256": Form("rmsnorm", dim=1, eps=1e-5),
    "rmsnorm-channels-last-bf16-32x64x64x512": Form("rmsnorm", eps=1e-6),
    "add-rmsnorm-bf16-32768x4096": Form("rmsnorm", eps=1e-6, residual=True),
    "softmax-last-f32-16x1M": Form("softmax"),
    "softmax-last-f32-8x4M": Form("softmax"),
    "softmax-last-f32-16x4096x1024": Form("softmax"),
    "softmax-last-bf16-32768x4096": Form("softmax"),
    "softmax-last-f32-1Mx64": Form("softmax"),
    "softmax-last-f32-4096x393216": Form("softmax"),
    "softmax-last-f32-16384x8192": Form("softmax"),
    "softmax-last-bf16-32768x16384": Form("softmax"),
    "softmax-last-bf16-32768x65536": Form("softmax"),
    "softmax-last-bf16-16x4M": Form("softmax"),
    "softmax-mid-f32-128x4096x64": Form("softmax", dim=1),
    "softmax-dim0-bf16-4096x16384": Form("softmax", dim=0),
    "softmax-transposed-input-f32-16384x4096": Form("softmax"),
    "crossentropy-f32-8192x32000": Form("cross_entropy"),
    "crossentropy-bf16-16384x50257": Form("cross_entropy"),
    "crossentropy-f32-8192x50257": Form("cross_entropy"),
    "crossentropy-bf16-16384x131072": Form("cross_entropy"),
}

# Tasks near one of QuACK's operations that it still does not compute, and why.
NOT_QUACK: dict[str, str] = {
    "logsoftmax-last-f16-65536x2048": "QuACK has a softmax but no log-softmax",
    "logsoftmax-mid-bf16-64x8192x128": "QuACK has a softmax but no log-softmax",
    "logsoftmax-last-bf16-8192x50257": "QuACK has a softmax but no log-softmax",
    "groupnorm-f32-16x64x256x256": "QuACK has no group norm",
    "instancenorm-f32-16x64x256x256": "QuACK has no instance norm",
    "batchnorm-infer-f32-16x64x256x256": "QuACK has no batch norm",
}


@dataclass(frozen=True)
class Verdict:
    """Whether QuACK takes a task: `op` its operation when it does, else None; `reason` why not, or
    (when taken) the configuration it runs, as QuACK would choose it."""

    task: str
    op: str | None
    reason: str

    @property
    def taken(self) -> bool:
        return self.op is not None


@dataclass(frozen=True)
class QuackCall:
    """One call of QuACK: `function` of module `module` on `args` and `kwargs`; its result (a tensor
    or a tuple) becomes the task's outputs, each reshaped to `shapes[i]` and cast to `dtypes[i]`."""

    module: str
    function: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any] = field(default_factory=dict)
    shapes: tuple[tuple[int, ...], ...] = ()
    dtypes: tuple[torch.dtype, ...] = ()


# -- what QuACK takes ---------------------------------------------------------------------------


def _threads_per_row(n: int) -> int:
    for limit, threads in ((64, 8), (128, 16), (3072, 32), (6144, 64), (16384, 128)):
        if n <= limit:
            return threads
    return 256


def _cluster(op: str, n: int, bits: int) -> int:
    """QuACK's cluster size on Hopper for rows of `n` elements of `bits` (softmax.py,
    cross_entropy.py, rmsnorm_config.py's `_for_hopper_fwd`)."""
    if bits == 16:
        steps = ((16 << 10, 1), (32 << 10, 2), (64 << 10, 4), (128 << 10, 8))
    elif op == "cross_entropy":
        steps = ((16 << 10, 1), (64 << 10, 2), (128 << 10, 4), (256 << 10, 8))
    elif op == "layernorm":
        steps = ((8 << 10, 1), (64 << 10, 2), (128 << 10, 4), (256 << 10, 8))
    else:  # softmax, rmsnorm in fp32
        steps = ((32 << 10, 1), (64 << 10, 2), (128 << 10, 4), (256 << 10, 8))
    return next((cluster for limit, cluster in steps if n <= limit), MAX_CLUSTER)


def quack_tile(op: str, n: int, x_dtype: torch.dtype, widest_bits: int, residual: bool = False) -> dict[str, int]:
    """The launch QuACK chooses for rows of `n` elements (`widest_bits`: the widest element among
    the operation's row tensors, which sets its vector): threads per row and per block, cluster
    size, vector width, and the bytes of shared memory a block holds for its tile of the rows."""
    bits = torch.empty((), dtype=x_dtype).element_size() * 8
    per_row, threads = _threads_per_row(n), 128 if n <= 16384 else 256
    vector = 128 // widest_bits if op == "softmax" else math.gcd(n, 128 // widest_bits)
    cluster = _cluster(op, n, bits)
    if op in ("rmsnorm", "layernorm"):  # ReductionBase._cap_cluster_n: every block a distinct part of the row
        cluster = min(cluster, max(1, (n // vector) // per_row))
    columns = vector * math.ceil(n / vector / (per_row * cluster)) * per_row
    tiles = 2 if residual else 1  # the residual's tile beside the input's
    return {"threads_per_row": per_row, "threads": threads, "cluster": cluster, "vector": vector,
            "shared_bytes": tiles * (threads // per_row) * columns * bits // 8}


def _layout_word(x: torch.Tensor) -> str:
    return "transposed" if x.dim() == 2 else "permuted (channels-last)"


def _row_length(form: Form, x: torch.Tensor) -> int:
    return math.prod(x.shape[x.dim() - form.dims:])


def _widest_bits(form: Form, inputs: Sequence[torch.Tensor]) -> int:
    """The widest element among the operation's row tensors (input, residual, weight, bias; a
    LayerNorm's weight is float32), which sets QuACK's vector."""
    x = inputs[0]
    return max([8 * x.element_size()] + ([32] if form.op == "layernorm" else [])
               + [8 * t.element_size() for t in inputs[1:] if t.is_floating_point()])


def check_form(form: Form, inputs: Sequence[torch.Tensor]) -> str | None:
    """Why QuACK does not take `form` on these inputs (meta tensors do), or None when it does."""
    x = inputs[0]
    if x.dtype not in DTYPES:
        return f"input dtype {x.dtype} (QuACK takes float32, float16, bfloat16)"
    if form.dim not in (-1, x.dim() - 1):
        return (f"reduces over dimension {form.dim} of {x.dim()}; QuACK's {form.op} reduces over the last "
                f"dimension of rows contiguous in memory")
    if not x.is_contiguous():
        return (f"its input is a {_layout_word(x)} view: rows not contiguous in memory, and QuACK reads each row "
                f"at stride 1 (a copy first would be another computation)")
    n, size = _row_length(form, x), x.element_size()
    if form.op == "softmax" and (n * size) % 16:
        return f"a row of {n} x {size} bytes is not a whole number of 16-byte vectors (QuACK's softmax asserts it)"
    tile = quack_tile(form.op, n, x.dtype, _widest_bits(form, inputs), form.residual)
    if form.op != "softmax" and tile["vector"] * size < 4:
        return (f"rows of {n} {str(x.dtype).removeprefix('torch.')} values: every other row starts off a 4-byte "
                f"boundary, and QuACK copies a row with cp.async of {tile['vector'] * size} bytes (4, 8 or 16 "
                f"allowed); issue 35 saw it fail")
    if tile["shared_bytes"] > SMEM_PER_BLOCK:
        return (f"a row of {n} values over a cluster of {tile['cluster']} blocks leaves each block "
                f"{tile['shared_bytes'] / 1024:.0f} KiB of it in shared memory, over the {SMEM_PER_BLOCK // 1024} KiB "
                f"a block may hold")
    return None


def _meta_inputs(source: str, name: str) -> list[Any]:
    from kevin_backend.types import load_program

    module = load_program(source, "quack_peer_" + re.sub(r"\W", "_", name))
    with torch.device("meta"):
        return list(module.get_inputs())


def quack_verdict(task: Any) -> Verdict:
    """Whether QuACK takes the suite task (name, source), and why not; on the CPU (meta tensors)."""
    if task.name in NOT_QUACK:
        return Verdict(task.name, None, NOT_QUACK[task.name])
    form = FORMS.get(task.name)
    if form is None:
        return Verdict(task.name, None, NOT_AN_OP)
    inputs = _meta_inputs(task.source, task.name)
    why = check_form(form, inputs)
    if why is not None:
        return Verdict(task.name, None, why)
    x = inputs[0]
    tile = quack_tile(form.op, _row_length(form, x), x.dtype, _widest_bits(form, inputs), form.residual)
    return Verdict(task.name, form.op, f"{form.op}{' with residual' if form.residual else ''}: {tile['cluster']} "
                                       f"block(s) a row, {tile['shared_bytes'] / 1024:.0f} KiB of shared memory a block")


# -- the call -------------------------------------------------------------------------------------


def build_call(form: Form, inputs: Sequence[Any], outputs: Sequence[torch.Tensor]) -> QuackCall:
    """The QuACK call computing a task of `form` on its `inputs`, with the task's `outputs` (or
    tensors of their shapes and dtypes: meta ones do) as what its result must become. Rows are views
    of the inputs (no copy); a LayerNorm's weight and bias are converted to float32 here, once."""
    x = inputs[0]
    n = _row_length(form, x)
    rows = x.reshape(-1, n)
    shapes = tuple(tuple(o.shape) for o in outputs)
    dtypes = tuple(o.dtype for o in outputs)
    if form.op == "softmax":
        return QuackCall("quack.softmax", "softmax", (rows,), {}, shapes, dtypes)
    if form.op == "cross_entropy":
        targets = inputs[1]
        return QuackCall("quack.cross_entropy", "cross_entropy", (rows, targets), {"reduction": "mean"}, shapes, dtypes)
    if form.op == "layernorm":
        weight, bias = (inputs[1].reshape(n).float(), inputs[2].reshape(n).float()) if len(inputs) >= 3 else (None, None)
        if weight is None:  # QuACK's layernorm_fwd asks for a weight: the identity's
            weight = torch.ones(n, dtype=torch.float32, device=x.device)
        return QuackCall("quack.rmsnorm", "layernorm_fwd", (rows, weight, bias), {"eps": form.eps}, shapes, dtypes)
    if form.op == "rmsnorm":
        if form.residual:
            residual, weight = inputs[1].reshape(-1, n), inputs[2]
            return QuackCall("quack.rmsnorm", "rmsnorm", (rows, weight), {"residual": residual, "prenorm": True, "eps": form.eps},
                             shapes, dtypes)
        weight = inputs[1] if len(inputs) >= 2 else None
        return QuackCall("quack.rmsnorm", "rmsnorm", (rows, weight), {"eps": form.eps}, shapes, dtypes)
    raise ValueError(f"no QuACK operation {form.op!r}")


def finish(result: Any, call: QuackCall) -> list[torch.Tensor]:
    """QuACK's result as the task's outputs: in order, each in the task's shape and dtype."""
    parts = list(result) if isinstance(result, (tuple, list)) else [result]
    if len(parts) != len(call.shapes):
        raise ValueError(f"QuACK returned {len(parts)} outputs, the task {len(call.shapes)}")
    return [p.reshape(shape) if p.dtype == dtype else p.reshape(shape).to(dtype)
            for p, shape, dtype in zip(parts, call.shapes, call.dtypes)]


def bind(call: QuackCall) -> Callable[[], list[torch.Tensor]]:
    """The call as a function of nothing, QuACK's function looked up once (QuACK is imported here:
    only a GPU run needs it)."""
    function = getattr(importlib.import_module(call.module), call.function)
    return lambda: finish(function(*call.args, **call.kwargs), call)


# -- on a GPU -----------------------------------------------------------------------------------


def refused_by_shape(task: Any) -> bool:
    """Whether QuACK's operation is the task's, on rows in place, and only the row's length or
    alignment (this module's reading of QuACK's launch) refuses it: what `--check-refusals` tries."""
    form = FORMS.get(task.name)
    if form is None or task.name in NOT_QUACK:
        return False
    x = _meta_inputs(task.source, task.name)[0]
    return form.dim in (-1, x.dim() - 1) and x.is_contiguous() and not quack_verdict(task).taken


def measure_task(task: Any, device: torch.device, copy_gbps: float | None, trials: int, warmup: int,
                 seed: int = 0, try_refused: bool = False) -> dict[str, Any]:
    """QuACK on one suite task: its verdict; when taken, its outputs checked, then its median time
    (the judge's queued timer, L2 flushed), and its fraction of the copy bandwidth over the bytes the
    task must move (`measure/roofline.task_bytes`, as the judge counts them). With `try_refused`, a
    task refused for its row's length or alignment alone is run once anyway, untimed, and
    `quack_refusal` says whether QuACK failed as this module predicts."""
    from kevin_backend.measure.compare import compare_outputs, exact_outputs, output_list
    from kevin_backend.measure.roofline import task_bytes
    from kevin_backend.measure.timer import make_timer
    from kevin_backend.types import load_program

    verdict = quack_verdict(task)
    row: dict[str, Any] = {"task": task.name, "quack": "not taken" if not verdict.taken else "ran", "quack_note": verdict.reason}
    if not verdict.taken and not (try_refused and refused_by_shape(task)):
        return row
    module = load_program(task.source, "quack_task_" + re.sub(r"\W", "_", task.name))
    torch.manual_seed(seed)
    with torch.device(device):
        inputs = list(module.get_inputs())
    model = module.Model(*module.get_init_inputs()).to(device)
    try:
        with torch.no_grad():
            want = output_list(model(*inputs))
            exact = exact_outputs(model, inputs, want, device)
            call = build_call(FORMS[task.name], inputs, want)
            try:
                run = bind(call)
                got = run()
                if device.type == "cuda":
                    torch.cuda.synchronize(device)  # an error of QuACK's kernel shows here, not in the timing
            except Exception as exc:  # noqa: BLE001 - QuACK's refusal (an assertion, a compile error) is the finding
                said = f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0][:300]}"
                if not verdict.taken:
                    return {**row, "quack_refusal": f"failed as predicted ({said})"}
                return {**row, "quack": "failed", "quack_note": said}
            bad = compare_outputs(got, want, exact)
            row["quack_exact"] = "eager" if exact is None else "float64"
            del got, exact
            if not verdict.taken:
                return {**row, "quack_refusal": "ran, against the prediction: " + ("correct" if bad is None else f"wrong ({bad.reason})")}
            if bad is not None:
                return {**row, "quack": "wrong", "quack_note": f"{bad.reason}: {bad.message or ''} "
                                                               f"(output {bad.output}, {bad.bad_elements} of {bad.total_elements} elements)"}
            ms = make_timer(device, trials, warmup, queued=True)(run)
        nbytes = task_bytes(inputs, want)
    finally:
        del inputs, model
        if device.type == "cuda":
            torch.cuda.empty_cache()
    fraction = nbytes / (ms * 1e-3) / (copy_gbps * 1e9) if copy_gbps else None
    return {**row, "quack_ms": ms, "quack_bytes": nbytes, "quack_fraction": fraction}


# -- the command ----------------------------------------------------------------------------------


def _suite_tasks(names: str | None, categories: str | None) -> list[Any]:
    from kevin_backend.generate.builtin.roofline_suite import ROOFLINE_SUITE

    tasks = [t for t in ROOFLINE_SUITE if (not names or t.name in names.split(","))
             and (not categories or t.category in categories.split(","))]
    if names:
        unknown = sorted(set(names.split(",")) - {t.name for t in ROOFLINE_SUITE})
        if unknown:
            raise SystemExit(f"not in the roofline suite: {', '.join(unknown)}")
    return tasks


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--which", action="store_true", help="only say which tasks QuACK takes, and why not (no GPU)")
    parser.add_argument("--tasks", help="comma-separated task names (default: the whole roofline suite)")
    parser.add_argument("--categories", help="comma-separated categories of the roofline suite")
    parser.add_argument("--copy-gbps", type=float, help="the GPU's copy bandwidth (default: measured here)")
    parser.add_argument("--trials", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--json", type=Path, help="rows written as they come: {'peer', 'version', 'rows'}")
    parser.add_argument("--check-refusals", action="store_true",
                        help="also run QuACK once on the tasks refused for their rows' length or alignment alone")
    args = parser.parse_args(argv)
    tasks = _suite_tasks(args.tasks, args.categories)
    if args.which:
        verdicts = [quack_verdict(t) for t in tasks]
        width = max(len(v.task) for v in verdicts)
        for v in verdicts:
            print(f"{v.task:<{width}}  {'takes' if v.taken else 'not':<5}  {v.reason}")
        print(f"QuACK {VERSION} takes {sum(v.taken for v in verdicts)} of {len(verdicts)} tasks")
        return 0
    if not torch.cuda.is_available():
        print("quack_peer needs a CUDA GPU to time QuACK (--which needs none)", file=sys.stderr)
        return 2
    try:
        import quack  # noqa: F401 - here, once: the tasks need it
    except ImportError as exc:
        print(f"QuACK is not importable ({exc}): pip install -e \".[peers]\"", file=sys.stderr)
        return 2

    device = torch.device("cuda", torch.cuda.current_device())
    copy = args.copy_gbps
    if copy is None:
        from kevin_backend.measure.roofline import copy_bandwidth

        copy = copy_bandwidth(device)
    rows: list[dict[str, Any]] = []
    out = {"peer": PEER, "version": getattr(sys.modules["quack"], "__version__", None), "copy_gbps": copy, "rows": rows}
    for task in tasks:
        began = time.perf_counter()
        row = measure_task(task, device, copy, args.trials, args.warmup, try_refused=args.check_refusals)
        row["seconds"] = round(time.perf_counter() - began, 1)
        rows.append(row)
        if row.get("quack_refusal"):
            print(f"QuACK {task.name}, refused here: {row['quack_refusal']}", file=sys.stderr, flush=True)
        elif row["quack"] != "not taken":
            shown = (f"{row['quack_ms']:.4f} ms" + (f", {row['quack_fraction']:.0%} of copy" if row.get("quack_fraction") else "")
                     if row["quack"] == "ran" else f"{row['quack']}: {row['quack_note']}")
            print(f"QuACK {task.name}: {shown} ({row['seconds']} s)", file=sys.stderr, flush=True)
        if args.json:
            args.json.write_text(json.dumps(out, indent=1))
    print(f"QuACK {out['version']}: ran {sum(r['quack'] == 'ran' for r in rows)} of {len(rows)} tasks, took "
          f"{sum(r['quack'] != 'not taken' for r in rows)}", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
