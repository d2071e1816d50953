"""A direct convolution with its whole epilogue in one kernel, for convolutions of few input
channels: KernelBench's level-2 habit (3 -> 16 channels through a 3x3 or 3x3x3 window, then a min
or a softmax over the channels, an activation, a bias). There an implicit GEMM's K (input
channels x window) is too short for tensor cores to pay, and the time is the output's round trip
through memory between the convolution's kernel and the epilogue's: on the H200 CUTLASS's implicit
GEMM and the writer's row kernel after it took 5.9 ms for a softmax over the 16 channels of a 3-D
convolution where Inductor (cuDNN, then its own kernel) took 0.56.

    plan = plan_direct(graph, metas)              # a DirectConv, or raises Unsupported with the reason
    tiling = direct_tilings(plan)[0]
    cuda, declaration = direct_extension(plan, tiling)   # (direct_conv_source.py)

The kernel: each thread takes `positions` neighbouring output positions along the innermost
spatial dimension, every output channel of each in registers. The filter (and the bias) is read
once per block into shared memory, laid out so that one window tap's output channels are
consecutive (a thread reads them four at a time, the same words for the whole warp); the input's
taps are read from memory, each tap's value used for every output channel. The multiply-adds are
float32 FMAs whatever the dtype (no TF32: a float32 convolution is as exact as float32 makes it).
Then the epilogue, per position, on the channels in registers:

- a pointwise op (`ops.py`'s table) of the convolution's values, of values over the channels
  reduced, and of the task's other tensors, read where they broadcast (a per-channel bias, a
  tensor of the output's size, a scalar);
- a sum, mean, max or min over the channels (kept as a dimension of 1 or not): a softmax over the
  channels is its max, an exp, its sum and a division, all in registers;
- the outputs, each stored once: a value over the channels, or one per position.

A transposed convolution (KernelBench's ConvTranspose2d/3d, 3 -> 16 channels, stride 2) is
computed the same way, gathered: an output position reads the input position `(o + padding -
k * dilation) / stride` of each window tap where that divides evenly and lies in the input, its
filter read as C_in x C_out x window. An outer spatial dimension's taps that do not divide are
skipped; the innermost dimension's multiply a zero (its positions differ in which taps divide).

A depthwise convolution (one channel a group: MobileNet's 3x3 with its batch norm and ReLU6, a
ConvNeXt's 7x7) takes any number of channels: a thread holds CB of them (8 where they divide) at
its positions, reads each channel's own input and its filter words through the cache (a warp's
threads read the same words), and runs the epilogue on those channels. A grouped one (ResNeXt's
32 groups of 4 channels, ShuffleNet's, a level-1 problem's `groups=4`) is the kernel above for one
group: a thread holds its group's CB output channels (c0 on) and reads the group's input channels
alone, the filter (C_out x C_in / groups x window) in shared memory. A reduction over the channels
is declined for both (a thread holds a few of them).

Declined, each with what it is: a transposed grouped convolution, a filter or input made by ops
(not an input), more than `MAX_TAPS` input values per output (a group's input channels x window) or
`MAX_CHANNELS` output channels a thread (a group's), a filter of more than `MAX_TAPS x MAX_CHANNELS`
words in shared memory, a reduction over other dimensions than the channels, an index (argmin), a
value of another shape (a group norm's groups), an op outside the table.
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx as fx

from kevin_backend.generate.builtin.graph_nodes import REDUCTIONS, op_name, reduced_dims
from kevin_backend.generate.builtin.ops import Unsupported, float_literal, is_pointwise, pointwise_expr
from kevin_backend.generate.builtin.plan import Reduction
from kevin_backend.generate.builtin.plan_builder import aligned
from kevin_backend.generate.builtin.rows_kernel import REDUCTION_COMBINE, REDUCTION_INIT
from kevin_backend.types import channels_last_form

__all__ = ["DirectConv", "DirectTiling", "plan_direct", "direct_tilings", "takes", "MAX_TAPS", "MAX_CHANNELS"]

aten = torch.ops.aten

MAX_TAPS = 128  # input values per output value (input channels x window): beyond, an implicit GEMM's K pays
MAX_CHANNELS = 64  # output channels a thread holds in registers per position
_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
# the reductions over the channels (a min or max with its index: its values alone)
_FOLDS = {Reduction.SUM: Reduction.SUM, Reduction.MEAN: Reduction.MEAN, Reduction.AMAX: Reduction.AMAX, Reduction.AMIN: Reduction.AMIN,
          Reduction.MAX_DIM: Reduction.AMAX, Reduction.MIN_DIM: Reduction.AMIN}
# views of the task's own tensors, their strides those of the input's storage
_STORAGE_VIEWS = (aten.view.default, aten._unsafe_view.default, aten.squeeze.dim, aten.squeeze.dims, aten.unsqueeze.default,
                  aten.expand.default, aten.alias.default, aten.t.default, aten.permute.default)
_FORMS = {"C": "over the channels", "K": "per position, the channels' dimension kept", "R": "per position, the channels' dimension gone"}
_VIEWS = (aten.view.default, aten.reshape.default, aten._unsafe_view.default, aten.squeeze.dim, aten.squeeze.dims,
          aten.unsqueeze.default, aten.clone.default, aten.alias.default)


@dataclass(frozen=True)
class DirectTiling:
    """A direct kernel's shape: threads a block, output positions a thread, and (a depthwise or
    grouped convolution's) output channels a thread; 0: all of them."""

    threads: int
    positions: int
    channels: int = 0

    @property
    def name(self) -> str:
        return (f"direct {self.threads} threads x {self.positions} position{'s' if self.positions > 1 else ''}"
                + (f" x {self.channels} channel{'s' if self.channels > 1 else ''}" if self.channels else ""))


@dataclass(frozen=True)
class _Tensor:
    """An input the kernel reads (the task's input `index`) as the host function checks it."""

    index: int
    dtype: torch.dtype
    shape: tuple[int, ...]
    stride: tuple[int, ...]


@dataclass(frozen=True)
class _Output:
    """A value the kernel stores: over the channels (`per_channel`) or one per position; `steps`
    its element step along (n, channel, spatial...) of the convolution's output."""

    var: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    per_channel: bool
    steps: tuple[int, ...]


@dataclass(frozen=True)
class DirectConv:
    """The plan of a convolution and its epilogue as one direct kernel (`plan_direct`).
    `fallback`: the implicit GEMM's plan of the same task where it has one (its tilings come after
    the direct ones); `inputs`, `state`: as `GemmPlan`'s (the forward's inputs, then the model's
    parameters by path)."""

    x: _Tensor
    w: _Tensor
    bias: _Tensor | None
    operands: tuple[_Tensor, ...]  # the epilogue's other tensors
    out_spatial: tuple[int, ...]
    stride: tuple[int, ...]
    padding: tuple[int, ...]
    dilation: tuple[int, ...]
    body: tuple[str, ...]  # the epilogue's lines for one position `p` (the convolution's values acc[p][c])
    outputs: tuple[_Output, ...]
    ops: tuple[str, ...]  # the epilogue's ops, in words
    transposed: bool = False  # a transposed convolution: its filter C_in x C_out x window, its taps gathered
    depthwise: bool = False  # one channel a group (groups = C_in = C_out): its filter C x 1 x window
    groups: int = 1  # more than one (and not depthwise): grouped, its filter C_out x C_in / groups x window
    inputs: int = 0
    state: tuple[str, ...] = ()
    fallback: Any = None

    @property
    def reads(self) -> tuple[int, ...]:
        """The task's inputs the host function takes, in order."""
        return tuple(sorted({t.index for t in (self.x, self.w, self.bias, *self.operands) if t is not None}))

    @property
    def grouped(self) -> bool:
        """Of more than one group, and not depthwise: a thread holds one group's output channels."""
        return self.groups > 1 and not self.depthwise

    @property
    def blocked(self) -> bool:
        """Depthwise or grouped: a thread holds CB of the output channels, from c0 on."""
        return self.groups != 1

    @property
    def channels(self) -> tuple[int, int]:
        """(input channels an output reads: a grouped convolution's group's, output channels)."""
        if self.depthwise:
            return self.w.shape[0], self.w.shape[0]
        return (self.w.shape[0], self.w.shape[1]) if self.transposed else (self.w.shape[1], self.w.shape[0])

    @property
    def taps(self) -> int:
        """Input values per output: input channels x window (a depthwise convolution's: the window)."""
        return (1 if self.depthwise else self.channels[0]) * math.prod(self.w.shape[2:])

    def describe(self) -> str:
        cin, cout = self.channels
        window = "x".join(map(str, self.w.shape[2:]))
        positions = "x".join(map(str, (self.x.shape[0], *self.out_spatial)))
        stride = f", stride {'x'.join(map(str, self.stride))}" if self.transposed else ""
        kind = "transposed " if self.transposed else "depthwise " if self.depthwise else "grouped " if self.grouped else ""
        cin = cin * self.groups if self.grouped else cin
        groups = f" in {self.groups} groups" if self.grouped else ""
        return (f"a direct {kind}{len(self.out_spatial)}-D convolution {cin} -> {cout} channels{groups}, "
                f"window {window}{stride}, "
                f"{positions} positions, {str(self.x.dtype).replace('torch.', '')}"
                + (", its bias" if self.bias else "") + (f", then {', '.join(dict.fromkeys(self.ops))}" if self.ops else "")
                + f", {len(self.outputs)} output{'s' if len(self.outputs) > 1 else ''}")


def direct_tilings(plan: DirectConv) -> tuple[DirectTiling, ...]:
    """The direct kernel's variants, in the order a search tries them: two positions a thread
    first (each filter word read from shared memory serves both), then one, then four; a depthwise
    or grouped convolution's thread holds few channels, and four positions first; at most 64
    values a thread (a bf16 stem's 32 channels at two positions took 240 registers), and where
    two positions hold more than 32, one position first (its registers leave room for threads)."""
    _, cout = plan.channels
    if plan.depthwise:  # (a few channels a thread, 8 where they divide the channels; MobileNetV2's 144 channels
        # at 64x56x56 on an H200: four positions 0.162-0.182 ms, two 0.205-0.232, one 0.300; Inductor 0.199-0.226)
        few = next(c for c in (8, 4, 2, 1) if cout % c == 0)
        return (DirectTiling(128, 4, few), DirectTiling(128, 2, few), DirectTiling(128, 1, few), DirectTiling(256, 1, max(1, few // 2)))
    group = cout // plan.groups if plan.grouped else 0  # (a grouped convolution's thread: its group's channels)
    # (ResNeXt's 32 groups of 4 at 64x56x56 on an H200: 64 threads x 4 positions 0.199 ms, 128 x 2 0.214-0.230,
    # 256 x 1 0.265-0.287; Inductor 0.229-0.251)
    shapes = ((64, 4), (128, 2), (256, 1)) if plan.grouped else ((128, 2), (256, 1), (64, 4))
    fits = [DirectTiling(threads, positions, group) for threads, positions in shapes
            if positions * (group or cout) <= 64]
    return tuple(sorted(fits, key=lambda t: t.positions * (group or cout) > 32))


# ----------------------------------------------------------------------------------------------
# The plan


def _tensor(node: Any, placeholders: list[fx.Node], metas: list[Any], what: str) -> _Tensor:
    if not isinstance(node, fx.Node) or node not in placeholders:
        raise Unsupported(f"the convolution's {what} is computed in the graph (the direct kernel reads it as an input)")
    meta = metas[placeholders.index(node)]
    if meta.dtype not in _DTYPES:
        raise Unsupported(f"the convolution's {what} is {meta.dtype}")
    return _Tensor(placeholders.index(node), meta.dtype, tuple(meta.shape), tuple(meta.stride()))


def takes(weight_shape: tuple[int, ...], transposed: bool = False, groups: int = 1) -> bool:
    """Whether a filter of `weight_shape` (C_out, C_in / groups, window...; a transposed
    convolution's C_in, C_out, window...) is few enough values per output and few enough output
    channels for the direct kernel: one group; one channel a group (depthwise: any channels); or,
    not transposed, groups of few channels whose filter fits in shared memory."""
    window = math.prod(weight_shape[2:])
    if groups != 1:
        cout, cin = weight_shape[0], weight_shape[1]
        if transposed or cout % groups:
            return False
        if cout == groups and cin == 1:  # (depthwise)
            return window <= MAX_TAPS
        return cin * window <= MAX_TAPS and cout // groups <= MAX_CHANNELS and cout * cin * window <= MAX_TAPS * MAX_CHANNELS
    cin, cout = (weight_shape[0], weight_shape[1]) if transposed else (weight_shape[1], weight_shape[0])
    return cin * window <= MAX_TAPS and cout <= MAX_CHANNELS


def _steps(shape: tuple[int, ...], stride: tuple[int, ...], target: tuple[int, ...]) -> tuple[int, ...]:
    """The element steps of a tensor of `shape` and `stride` broadcast to `target`: 0 where it
    broadcasts, and along `target`'s dimensions of 1 (whose index is always 0)."""
    _, steps = aligned(shape, stride, target)
    return tuple(0 if size == 1 else step for size, step in zip(target, steps))


def _thread_channels(blocked: bool, cout: int) -> tuple[str, str]:
    """A thread's output channels in the kernel's code: how many (all `cout`, or a depthwise or
    grouped thread's CB) and the channel index of its `c`-th (`c`, or CB of them from c0 on)."""
    return ("CB", "(c0 + c)") if blocked else (str(cout), "c")


class _Epilogue:
    """Reads the nodes after the convolution: each value's form ("C": over the channels, "K": one
    per position kept as a channel of 1, "R": one per position, the channels' dimension gone,
    "lazy": an op of the task's other tensors alone, written where it is read) and its code."""

    def __init__(self, conv: fx.Node, placeholders: list[fx.Node], metas: list[Any], blocked: bool = False) -> None:
        self.conv, self.placeholders, self.metas = conv, placeholders, metas
        self.out = tuple(conv.meta["val"].shape)
        self.cout = self.out[1]
        # a thread's channels: all of them, or (depthwise, grouped) CB of them from c0 on, CB the kernel's constant
        self.blocked = blocked
        self.count, self.channel = _thread_channels(blocked, self.cout)
        self.form: dict[fx.Node, str] = {conv: "C"}
        self.var: dict[fx.Node, str] = {conv: "acc[p]"}
        self.lines: list[str] = []
        self.operands: dict[int, _Tensor] = {}
        self.views: dict[fx.Node, tuple[fx.Node, tuple[int, ...], tuple[int, ...]]] = {}
        self.ops: list[str] = []

    def shape_form(self, node: fx.Node) -> str:
        shape = tuple(node.meta["val"].shape)
        if shape == self.out:
            return "C"
        if shape == (self.out[0], 1, *self.out[2:]):
            return "K"
        if shape == (self.out[0], *self.out[2:]):
            return "R"
        raise Unsupported(f"{node.target} makes a value of shape {list(shape)}: the direct kernel keeps the convolution's "
                          f"{list(self.out)}, one per position, or the task's other tensors")

    def load(self, node: fx.Node, form: str, target: tuple[int, ...]) -> str:
        """A placeholder's value where a value of `form` (shape `target`) reads it, at channel `c`."""
        source, shape, stride = self.views.get(node, (node, None, None))
        index = self.placeholders.index(source)
        meta = self.metas[index]
        if meta.dtype not in (*_DTYPES, torch.bool):
            raise Unsupported(f"the epilogue reads {source.name} of {meta.dtype}")
        self.operands[index] = _Tensor(index, meta.dtype, tuple(meta.shape), tuple(meta.stride()))
        shape, stride = (shape, stride) if shape is not None else (tuple(meta.shape), tuple(meta.stride()))
        steps = _steps(shape, stride, target)
        if form == "R":
            steps = (steps[0], 0, *steps[1:])
        if form != "C" and steps[1]:
            raise Unsupported(f"{node.name} varies over the channels where a value per position reads it")
        return f"kevin_ld(p_in{index}, {_offset(steps, self.channel)})"

    def value(self, arg: fx.Node, form: str, target: tuple[int, ...]) -> str:
        """`arg`'s expression where a value of `form` reads it (at channel `c` over the channels)."""
        if arg in self.placeholders or arg in self.views:
            return self.load(arg, form, target)
        own = self.form.get(arg)
        if own is None:
            raise Unsupported(f"{arg.name} is computed before the convolution")
        if own == "lazy":
            return "(" + pointwise_expr(arg, lambda a: self.value(a, form, target)) + ")"
        # over the channels: read where a value over them is; one per position kept as a channel of
        # 1: broadcast over the channels too; one per position without it: where such values are
        if own == "C" and form != "C" or own == "R" and form != "R" or own == "K" and form == "R":
            raise Unsupported(f"{arg.name} (a value {_FORMS[own]}) where a value {_FORMS[form]} reads it")
        return f"{self.var[arg]}[c]" if own == "C" else self.var[arg]

    def read(self, node: fx.Node) -> None:
        if node.op != "call_function":
            raise Unsupported(f"{node.op} {node.target} after the convolution")
        lineage = [a for a in node.all_input_nodes if self.form.get(a) in ("C", "K", "R")]
        name = f"v{len(self.var)}"
        if node.target is operator.getitem:
            (source, index) = node.args
            if source not in self.var:
                raise Unsupported(f"an item of {getattr(source, 'name', source)}, which is not a reduction over the channels")
            if index != 0:
                raise Unsupported("the index of a min or max over the channels (the direct kernel keeps their values)")
            self.form[node], self.var[node] = self.form[source], self.var[source]
            return
        if not lineage and node.target in _STORAGE_VIEWS and (node.args[0] in self.placeholders or node.args[0] in self.views):
            # (a view of an input, as a compiled model reshapes a parameter: read through the view's strides)
            source = self.views.get(node.args[0], (node.args[0],))[0]
            val = node.meta["val"]
            self.views[node] = (source, tuple(val.shape), tuple(val.stride()))
            return
        if not lineage:  # (an op of the task's other tensors alone: written where it is read)
            if not is_pointwise(node):
                raise Unsupported(f"{node.target} of the task's other tensors after the convolution")
            self.form[node] = "lazy"
            return
        if node.target in _VIEWS:
            (source,) = lineage
            form = self.shape_form(node)
            if (self.form[source] == "C") != (form == "C") or node.args[0] is not source:
                raise Unsupported(f"{node.target} reshapes the convolution's values")
            self.form[node], self.var[node] = form, self.var[source]
            return
        if REDUCTIONS.get(node.target) in _FOLDS:
            self.reduce(node, name)
            return
        if not is_pointwise(node):
            raise Unsupported(f"{node.target} after the convolution (the direct kernel takes pointwise ops and "
                              "reductions over the channels)")
        form = self.shape_form(node)
        target = tuple(node.meta["val"].shape)
        self.ops.append(op_name(node).split(".")[1])
        if form == "C":
            expr = pointwise_expr(node, lambda a: self.value(a, "C", target))
            self.lines += [f"float {name}[{self.count}];", "#pragma unroll",
                           f"for (int c = 0; c < {self.count}; ++c) {name}[c] = {expr};"]
        else:
            expr = pointwise_expr(node, lambda a: self.value(a, form, target))
            self.lines.append(f"const float {name} = {expr};")
        self.form[node], self.var[node] = form, name

    def reduce(self, node: fx.Node, name: str) -> None:
        kind = _FOLDS[REDUCTIONS[node.target]]
        source = node.args[0]
        dims = reduced_dims(node, len(self.out))
        if self.form.get(source) != "C" or dims != (1,):
            raise Unsupported(f"{node.target} over dims {list(dims)}: the direct kernel reduces over the channels alone")
        if self.blocked:
            raise Unsupported(f"{node.target} over a depthwise or grouped convolution's channels (a thread holds a few of them)")
        keep = bool(node.args[2]) if len(node.args) > 2 else bool(node.kwargs.get("keepdim", False))
        combine = REDUCTION_COMBINE[kind].format(a=name, b=f"{self.var[source]}[c]")
        self.lines += [f"float {name} = {REDUCTION_INIT[kind]};", "#pragma unroll", f"for (int c = 0; c < {self.cout}; ++c) {name} = {combine};"]
        if kind is Reduction.MEAN:
            self.lines.append(f"{name} = {name} / {float_literal(self.cout)};")
        self.ops.append(f"{kind.value} over the channels")
        self.form[node], self.var[node] = ("K" if keep else "R"), name


def _offset(steps: tuple[int, ...], channel: str) -> str:
    """The element offset at (n, channel, o0, ..., ol + p) for `steps`."""
    spatial = len(steps) - 2
    names = [f"o{d}" for d in range(spatial - 1)] + ["(ol + p)"]
    terms = [f"n * {steps[0]}LL"] * bool(steps[0]) + [f"{channel} * {steps[1]}LL"] * bool(steps[1]) + \
            [f"{name} * {s}LL" for name, s in zip(names, steps[2:]) if s]
    return " + ".join(terms) or "0"


def _laid_out(val: Any, x: _Tensor) -> tuple[int, ...]:
    """A depthwise or grouped convolution's output strides: channels-last where its input is (as
    eager makes it on a GPU; the meta tensors the plan reads say plain), so that a warp along the
    channel blocks stores consecutive vectors; else the meta's."""
    xm = torch.empty_strided(x.shape, x.stride, device="meta")
    form = channels_last_form(xm)
    if form is None or xm.is_contiguous() or not val.is_contiguous():
        return tuple(val.stride())
    return tuple(torch.empty(tuple(val.shape), device="meta", memory_format=form).stride())


def plan_direct(graph: fx.Graph, metas: list[Any]) -> DirectConv:
    """The direct kernel's plan of a graph whose product is its one convolution, or Unsupported."""
    convs = [n for n in graph.nodes if n.op == "call_function" and n.target is aten.convolution.default]
    if len(convs) != 1:
        raise Unsupported(f"{len(convs)} convolutions (the direct kernel takes one)")
    (conv,) = convs
    x, w, b, stride, padding, dilation, transposed, _, groups = conv.args  # (output padding: in the output's size)
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    xt, wt = _tensor(x, placeholders, metas, "input"), _tensor(w, placeholders, metas, "filter")
    if groups != 1 and not takes(wt.shape, bool(transposed), groups):
        raise Unsupported(f"a {'transposed ' if transposed else ''}convolution of {groups} groups, filter {list(wt.shape)} (the "
                          f"direct kernel takes one group, one channel a group, or groups of at most {MAX_TAPS} input values "
                          f"and {MAX_CHANNELS} output channels, not transposed)")
    depthwise = groups != 1 and wt.shape[0] == groups and wt.shape[1] == 1
    bt = _tensor(b, placeholders, metas, "bias") if b is not None else None
    if len({t.dtype for t in (xt, wt, bt) if t}) != 1:
        raise Unsupported("the convolution's input, filter and bias are of different dtypes")
    cout, taps = (wt.shape[1], wt.shape[0] * math.prod(wt.shape[2:])) if transposed else (wt.shape[0], math.prod(wt.shape[1:]))
    if groups == 1 and not takes(wt.shape, bool(transposed)):
        raise Unsupported(f"{taps} input values per output and {cout} output channels: the direct kernel takes at most "
                          f"{MAX_TAPS} and {MAX_CHANNELS} (an implicit GEMM's K pays beyond)")
    epilogue = _Epilogue(conv, placeholders, metas, blocked=groups != 1)
    output = next(n for n in graph.nodes if n.op == "output")
    for node in graph.nodes:  # (before the convolution too: views and ops of the other tensors alone)
        if node.op not in ("placeholder", "output") and node is not conv:
            epilogue.read(node)
    results = output.args[0] if isinstance(output.args[0], (tuple, list)) else (output.args[0],)
    outputs = []
    for node in results:
        if not isinstance(node, fx.Node) or epilogue.form.get(node) not in ("C", "K", "R"):
            raise Unsupported(f"the task returns {getattr(node, 'name', node)}, not a value of the convolution's")
        val = node.meta["val"]
        if val.dtype not in _DTYPES:
            raise Unsupported(f"the task returns a value of {val.dtype}")
        form = epilogue.form[node]
        layout = _laid_out(val, xt) if form == "C" and groups != 1 and tuple(val.shape) == epilogue.out else tuple(val.stride())
        steps = (layout[0], 0, *layout[1:]) if form == "R" else (layout[0], 0, *layout[2:]) if form == "K" else layout
        outputs.append(_Output(epilogue.var[node], val.dtype, tuple(val.shape), layout, form == "C", steps))
    return DirectConv(xt, wt, bt, tuple(sorted(epilogue.operands.values(), key=lambda t: t.index)),
                      tuple(conv.meta["val"].shape[2:]), tuple(stride), tuple(padding), tuple(dilation),
                      tuple(epilogue.lines), tuple(outputs), tuple(epilogue.ops), bool(transposed), depthwise, groups)
