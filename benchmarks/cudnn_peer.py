"""cuDNN's fused graphs as a measured peer of the GEMM suite's convolutions: the convolution and its
pointwise epilogue as one cuDNN graph (cuDNN's frontend, `nvidia-cudnn-frontend`: a convolution
node, a transposed one as cuDNN's data gradient of a convolution, then add, sub, mul, div, ReLU, clamps, sigmoid, tanh, softplus, leaky ReLU, GELU as pointwise
nodes), which cuDNN runs as one fused kernel where it has an engine for it; the answer to which of
CUTLASS's implicit GEMM and cuDNN's fused graphs to use for a convolution with its epilogue.

    recipe = conv_recipe(task.source)      # CPU: the graph's steps, or Declined with the reason
    row = measure_task(task, device, trials, rounds)   # GPU: cuDNN's graph built, checked, timed
                                                      # beside eager and Inductor in this process

    python benchmarks/cudnn_peer.py --which                   what each convolution task becomes (CPU)
    python benchmarks/cudnn_peer.py [--tasks a,b] [--trials 20] [--rounds 3] [--json FILE]

The recipe is read from the task's traced graph (`tracing.trace_with_parameters`, the GEMM
writer's own reading): one convolution of the task's input and filter (its bias, if any, the first
add), then pointwise ops of its value, of the task's other tensors (a vector over the channels, a
tensor of the output's size, viewed as they broadcast) and of numbers (float32 tensors of one
element). A cast (`_to_copy`) is left to cuDNN's float32 intermediates; the output takes the
task's dtype and layout. Declined, with the reason: reductions (a min or softmax over the channels,
a group norm), more than one output, an op outside the table.

On the GPU, every timing is the project's timer (`measure/timer.make_timer`, the judge's
protocol: queued calls, the L2 cache flushed), cuDNN's graph, eager and Inductor's default compile
in turn for `rounds` rounds, each's median kept; cuDNN's output is checked against the float64 run
of the task with the judge's comparison (`measure/compare.py`). float32 convolutions follow torch's
`torch.backends.cudnn.allow_tf32` (on by default, as eager's): where it is off, plans that use
tensor cores are excluded. Which GPU, torch, cuDNN and frontend versions ran is in the JSON.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

PEER = "cudnn"
FRONTEND = "1.32.0"  # pyproject.toml's extra `peers` pins nvidia-cudnn-frontend at this version

aten = torch.ops.aten

# aten op -> the recipe's pointwise step (cuDNN's frontend names them the same, bar the notes)
_BINARY = {aten.add.Tensor: "add", aten.sub.Tensor: "sub", aten.mul.Tensor: "mul", aten.div.Tensor: "div"}
_UNARY = {aten.relu.default: "relu", aten.sigmoid.default: "sigmoid", aten.tanh.default: "tanh",
          aten.softplus.default: "softplus"}
_VIEWS = (aten.view.default, aten.unsqueeze.default, aten.reshape.default, aten.expand.default, aten._unsafe_view.default)


@dataclass(frozen=True)
class Step:
    """One node of the cuDNN graph: `op` of `args`, each a step's index (an int), an input's
    ("input", index, shape as it broadcasts) or a number ("number", value)."""

    op: str
    args: tuple[Any, ...]
    params: tuple[tuple[str, Any], ...] = ()


@dataclass(frozen=True)
class Recipe:
    """The convolution (`steps[0]`, its input and filter the task's inputs `x`, `w`) and its epilogue."""

    x: int
    w: int
    stride: tuple[int, ...]
    padding: tuple[int, ...]
    dilation: tuple[int, ...]
    groups: int
    steps: tuple[Step, ...]
    out_dtype: torch.dtype
    transposed: bool = False  # cuDNN's data gradient of a convolution (filter C_in x C_out x window)
    out_shape: tuple[int, ...] = ()  # the convolution's output (a transposed one's: its output padding in it)

    def describe(self) -> str:
        ops = [s.op + (f"({dict(s.params)})" if s.params else "") for s in self.steps[1:]]
        conv = f"{'transposed ' if self.transposed else ''}conv stride {'x'.join(map(str, self.stride))}" + (f", {self.groups} groups" if self.groups > 1 else "")
        return " -> ".join([conv, *ops])


@dataclass(frozen=True)
class Declined:
    reason: str


def conv_recipe(source: str) -> Recipe | Declined:
    """The task as one cuDNN graph (see the module's docstring), or Declined with the reason."""
    from kevin_backend.generate.builtin.ops import Unsupported
    from kevin_backend.generate.builtin.tracing import trace_with_parameters

    try:
        gm, metas, _ = trace_with_parameters(source)
    except (Unsupported, RuntimeError, ValueError) as exc:
        return Declined(f"the task could not be traced: {exc}")
    graph = gm.graph
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    convs = [n for n in graph.nodes if n.op == "call_function" and n.target is aten.convolution.default]
    if len(convs) != 1:
        return Declined(f"{len(convs)} convolutions (the graph holds one)")
    (conv,) = convs
    x, w, b, stride, padding, dilation, transposed, _, groups = conv.args
    if transposed and groups != 1:
        return Declined("a transposed convolution of groups")
    if x not in placeholders or w not in placeholders:
        return Declined("a convolution of values computed in the task")
    index: dict[Any, int] = {conv: 0}
    steps = [Step("conv", ())]
    if b is not None:
        if b not in placeholders:
            return Declined("a convolution bias computed in the task")
        steps.append(Step("add", (0, _operand(b, placeholders, metas, conv))))
        index[conv] = 1

    def arg(value: Any) -> Any:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return ("number", float(value))
        while isinstance(value, torch.fx.Node) and value.target in _VIEWS and value not in index:
            value = value.args[0]  # (an operand viewed to broadcast: read as it broadcasts)
        if value in index:
            return index[value]
        if value in placeholders:
            return _operand(value, placeholders, metas, conv)
        raise _Refused(f"{getattr(value, 'name', value)} is not a value of the convolution's or an input")

    output = next(n for n in graph.nodes if n.op == "output")
    results = output.args[0] if isinstance(output.args[0], (tuple, list)) else (output.args[0],)
    if len(results) != 1:
        return Declined(f"{len(results)} outputs (the graph stores one)")
    try:
        for node in graph.nodes:
            if node.op != "call_function" or node is conv or node.target in _VIEWS:
                continue
            step = _step(node, arg)
            if step is None:  # (a cast: cuDNN's intermediates are float32, the output the task's dtype)
                index[node] = arg(node.args[0])
                continue
            steps.append(step)
            index[node] = len(steps) - 1
    except _Refused as exc:
        return Declined(str(exc))
    (result,) = results
    if index.get(result) != len(steps) - 1:
        return Declined("the output is not the epilogue's last value")
    val = result.meta["val"]
    return Recipe(placeholders.index(x), placeholders.index(w), tuple(stride), tuple(padding), tuple(dilation), int(groups),
                  tuple(steps), val.dtype, bool(transposed), tuple(conv.meta["val"].shape))


class _Refused(Exception):
    pass


def _operand(node: Any, placeholders: list[Any], metas: list[Any], conv: Any) -> tuple[str, int, tuple[int, ...]]:
    """An input read by the epilogue, as it broadcasts against the convolution's output (a
    `(C,)` bias as `(1, C, 1, ...)`, a `(C, 1, 1)` parameter right-aligned)."""
    out = tuple(conv.meta["val"].shape)
    shape = tuple(metas[placeholders.index(node)].shape)
    if len(shape) == 1 and shape[0] == out[1]:  # (the convolution's own bias)
        shape = (1, shape[0]) + (1,) * (len(out) - 2)
    shape = (1,) * (len(out) - len(shape)) + shape
    if len(shape) != len(out) or any(s not in (1, o) for s, o in zip(shape, out)):
        raise _Refused(f"{node.name} of shape {list(shape)} does not broadcast to the output's {list(out)}")
    return ("input", placeholders.index(node), shape)


def _step(node: Any, arg: Callable[[Any], Any]) -> Step | None:
    """The recipe's step for one aten node after the convolution (None: a cast)."""
    t = node.target
    if t is aten._to_copy.default:
        return None
    if t in _BINARY:
        alpha = node.kwargs.get("alpha", 1)
        if alpha != 1:
            raise _Refused(f"{t} with alpha {alpha}")
        return Step(_BINARY[t], (arg(node.args[0]), arg(node.args[1])))
    if t in _UNARY:
        if t is aten.softplus.default and tuple(node.args[1:]) not in ((), (1,), (1, 20), (1.0, 20.0)):
            raise _Refused(f"softplus with beta and threshold {node.args[1:]}")
        return Step(_UNARY[t], (arg(node.args[0]),))
    if t in (aten.clamp.default, aten.hardtanh.default):
        default = (None, None) if t is aten.clamp.default else (-1.0, 1.0)
        low, high = (list(node.args[1:]) + list(default))[:2] if len(node.args) > 1 else default
        low, high = node.kwargs.get("min", low), node.kwargs.get("max", high)
        return Step("clamp", (arg(node.args[0]),), tuple((k, float(v)) for k, v in (("low", low), ("high", high)) if v is not None))
    if t in (aten.clamp_min.default, aten.clamp_max.default):
        return Step("clamp", (arg(node.args[0]),), (("low" if t is aten.clamp_min.default else "high", float(node.args[1])),))
    if t is aten.leaky_relu.default:
        return Step("leaky_relu", (arg(node.args[0]),), (("slope", float(node.args[1]) if len(node.args) > 1 else 0.01),))
    if t is aten.gelu.default:
        return Step("gelu_approx_tanh" if node.kwargs.get("approximate", "none") == "tanh" else "gelu", (arg(node.args[0]),))
    raise _Refused(f"{t} after the convolution (cuDNN's graph here takes pointwise ops)")


# -- on the GPU ------------------------------------------------------------------------------------

_CUDNN_TYPES = {torch.float32: "FLOAT", torch.float16: "HALF", torch.bfloat16: "BFLOAT16"}


def build_graph(recipe: Recipe, inputs: list[torch.Tensor], out: torch.Tensor, handle: Any) -> Callable[[], None]:
    """cuDNN's graph of `recipe` on `inputs`, writing `out`; the function that runs it once."""
    import cudnn

    dt = getattr(cudnn.data_type, _CUDNN_TYPES[out.dtype])
    graph = cudnn.pygraph(io_data_type=dt, intermediate_data_type=cudnn.data_type.FLOAT,
                          compute_data_type=cudnn.data_type.FLOAT, handle=handle)
    x, w = inputs[recipe.x], inputs[recipe.w]
    flat = x.dim() == 3  # (a 1-D convolution as 2-D of height 1)
    if flat:
        x, w = x.unsqueeze(2), w.unsqueeze(2)
    pack: dict[Any, torch.Tensor] = {}
    held: list[torch.Tensor] = []

    def tensor(value: torch.Tensor) -> Any:
        t = graph.tensor_like(value)
        pack[t] = value
        return t

    def operand(a: Any) -> Any:
        if isinstance(a, int):
            return values[a]
        if a[0] == "number":
            held.append(torch.full((1,) * x.dim(), a[1], device=out.device, dtype=torch.float32))  # (x: 4-D for a 1-D one too)
            return tensor(held[-1])
        value = inputs[a[1]].reshape(a[2])
        if flat:
            value = value.unsqueeze(2)
        held.append(value)
        return tensor(value)

    padding = [0, *recipe.padding] if flat else list(recipe.padding)
    stride = [1, *recipe.stride] if flat else list(recipe.stride)
    dilation = [1, *recipe.dilation] if flat else list(recipe.dilation)
    if recipe.transposed:  # (the data gradient of the convolution whose filter it is: its output's dims given)
        dims = [recipe.out_shape[0], recipe.out_shape[1], *([1] if flat else []), *recipe.out_shape[2:]]
        conv = graph.conv_dgrad(loss=tensor(x), filter=tensor(w), padding=padding, stride=stride, dilation=dilation,
                                compute_data_type=cudnn.data_type.FLOAT, out_dims=dims)
    else:
        conv = graph.conv_fprop(image=tensor(x), weight=tensor(w), padding=padding, stride=stride, dilation=dilation,
                                compute_data_type=cudnn.data_type.FLOAT)
    values: list[Any] = [conv]
    for step in recipe.steps[1:]:
        a = [operand(v) for v in step.args]
        p = dict(step.params)
        if step.op in ("add", "sub", "mul", "div"):
            values.append(getattr(graph, step.op)(a=a[0], b=a[1]))
        elif step.op == "clamp":
            v = a[0]
            if "low" in p:
                v = graph.max(input0=v, input1=operand(("number", p["low"])))
            if "high" in p:
                v = graph.min(input0=v, input1=operand(("number", p["high"])))
            values.append(v)
        elif step.op == "leaky_relu":
            values.append(graph.leaky_relu(input=a[0], negative_slope=p["slope"]))
        else:
            values.append(getattr(graph, step.op)(input=a[0]))
    final = values[-1]
    target = out.unsqueeze(2) if flat else out
    final.set_output(True).set_data_type(dt).set_dim(list(target.shape)).set_stride(list(target.stride()))
    pack[final] = target
    if out.dtype == torch.float32 and not torch.backends.cudnn.allow_tf32:
        graph.deselect_numeric_notes([cudnn.numerical_note.TENSOR_CORE])
    graph.build([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
    workspace = torch.empty(max(1, graph.get_workspace_size()), device=out.device, dtype=torch.uint8)

    def run() -> None:
        graph.execute(pack, workspace, handle=handle)

    run.keep = (held, workspace)  # type: ignore[attr-defined]
    return run


def measure_task(task: Any, device: torch.device, trials: int, rounds: int, seed: int = 0) -> dict[str, Any]:
    """cuDNN's fused graph on one suite task: the recipe or why not; built (or cuDNN's refusal),
    checked against the task's float64 run, then timed beside eager and Inductor."""
    import cudnn

    from kevin_backend.types import load_program

    recipe = conv_recipe(task.source)
    row: dict[str, Any] = {"task": task.name}
    if isinstance(recipe, Declined):
        return {**row, "cudnn": "not taken", "cudnn_note": recipe.reason}
    row["recipe"] = recipe.describe()
    module = load_program(task.source, "cudnn_task_" + re.sub(r"\W", "_", task.name))
    torch.manual_seed(seed)
    with torch.device(device):
        inputs = list(module.get_inputs())
    model = module.Model(*module.get_init_inputs()).to(device)
    state = [t.detach() for t in {**dict(model.named_parameters()), **dict(model.named_buffers())}.values()]
    handle = cudnn.create_handle()
    try:
        return {**row, **_check_and_time(recipe, model, inputs, state, handle, device, trials, rounds)}
    finally:
        cudnn.destroy_handle(handle)
        torch.cuda.empty_cache()


def _check_and_time(recipe: Recipe, model: torch.nn.Module, inputs: list[Any], state: list[torch.Tensor], handle: Any,
                    device: torch.device, trials: int, rounds: int) -> dict[str, Any]:
    import cudnn

    from kevin_backend.measure.compare import compare_outputs, exact_outputs, output_list
    from kevin_backend.measure.timer import make_timer

    with torch.no_grad():
        want = output_list(model(*inputs))
        out = torch.empty_like(want[0])
        try:
            cudnn.set_stream(handle=handle, stream=torch.cuda.current_stream(device).cuda_stream)
            run = build_graph(recipe, [*inputs, *state], out, handle)
            run()
            torch.cuda.synchronize(device)
        except Exception as exc:  # noqa: BLE001 - cuDNN's refusal (no engine for the graph) is the finding
            said = f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0][:300]}"
            return {"cudnn": "failed", "cudnn_note": said}
        exact = exact_outputs(model, inputs, want, device)
        bad = compare_outputs([out], want, exact)
        del exact
        if bad is not None:
            return {"cudnn": "wrong", "cudnn_note": f"{bad.reason}: {bad.message or ''} ({bad.bad_elements} of {bad.total_elements} elements)"}
        compiled = torch.compile(model)
        compiled(*inputs)
        timer = make_timer(device, trials, 3, queued=True)
        times: dict[str, list[float]] = {"cudnn": [], "eager": [], "inductor": []}
        calls = {"cudnn": run, "eager": lambda: model(*inputs), "inductor": lambda: compiled(*inputs)}
        for r in range(rounds):  # (in turn, the order rotating: drift falls on each alike)
            for name in list(calls)[r % 3:] + list(calls)[:r % 3]:
                times[name].append(timer(calls[name]))
    ms = {k: sorted(v)[len(v) // 2] for k, v in times.items()}
    return {"cudnn": "ran", "cudnn_ms": ms["cudnn"], "eager_ms": ms["eager"], "inductor_ms": ms["inductor"],
            "x_inductor": ms["inductor"] / ms["cudnn"], "x_eager": ms["eager"] / ms["cudnn"], "rounds": times}


def _tasks(names: str | None) -> list[Any]:
    from kevin_backend.generate.builtin.gemm_suite import GEMM_SUITE

    convs = [t for t in GEMM_SUITE if "conv" in t.name]
    if not names:
        return convs
    wanted = [n.strip() for n in names.split(",") if n.strip()]
    unknown = sorted(set(wanted) - {t.name for t in convs})
    if unknown:
        raise SystemExit(f"cudnn_peer: unknown convolution tasks {', '.join(unknown)}; known: {', '.join(t.name for t in convs)}")
    return [t for t in convs if t.name in wanted]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", help="suite convolution tasks, comma-separated (default: all)")
    parser.add_argument("--which", action="store_true", help="print each task's recipe or why not (CPU), then stop")
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    tasks = _tasks(args.tasks)
    if args.which:
        for task in tasks:
            recipe = conv_recipe(task.source)
            print(f"{task.name}: " + (f"not taken ({recipe.reason})" if isinstance(recipe, Declined) else recipe.describe()))
        return 0
    if not torch.cuda.is_available():
        print("cudnn_peer needs a CUDA GPU (--which works without one)", file=sys.stderr)
        return 2
    try:
        import cudnn
    except ImportError as exc:
        print(f"cudnn_peer needs cuDNN's frontend (pip install nvidia-cudnn-frontend=={FRONTEND}): {exc}", file=sys.stderr)
        return 2
    device = torch.device("cuda")
    rows = []
    for k, task in enumerate(tasks, 1):
        began = time.perf_counter()
        row = measure_task(task, device, args.trials, args.rounds)
        row["seconds"] = round(time.perf_counter() - began, 1)
        rows.append(row)
        said = (f"{row['cudnn_ms']:.4f} ms, Inductor {row['inductor_ms']:.4f}: {row['x_inductor']:.3f}x" if row["cudnn"] == "ran"
                else f"{row['cudnn']} ({row.get('cudnn_note', '')})")
        print(f"[{k}/{len(tasks)}] {task.name}: {said} ({row['seconds']} s)", flush=True)
        if args.json:
            args.json.write_text(json.dumps({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                                             "cudnn": torch.backends.cudnn.version(), "frontend": getattr(cudnn, "__version__", "?"),
                                             "allow_tf32": torch.backends.cudnn.allow_tf32, "rows": rows}, indent=1))
    print("\n| task | cuDNN graph | cuDNN ms | Inductor ms | eager ms | x Inductor |\n|---|---|---|---|---|---|")
    for row in rows:
        if row["cudnn"] == "ran":
            print(f"| {row['task']} | {row['recipe']} | {row['cudnn_ms']:.4f} | {row['inductor_ms']:.4f} | {row['eager_ms']:.4f} | "
                  f"{row['x_inductor']:.3f}x |")
        else:
            print(f"| {row['task']} | {row['cudnn']}: {row.get('cudnn_note', '')} | - | - | - | - |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
