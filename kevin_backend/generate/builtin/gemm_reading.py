"""Reading a GEMM's (or a convolution's) epilogue from the task's graph, for the GEMM writer's
plans (`gemm_plan.py`, `conv_plan.py`): the plan of one kernel (`GemmPlan`), its kernel's spec
(`gemm_spec`), the linear part and the function after the product (`read_epilogue`: CUTLASS's
activations, one elementwise function, or a visitor tree of the tensors it reads), and the task's
outputs as views of the kernel's (`read_outputs`).
"""

from __future__ import annotations

import dataclasses
import math
import operator
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.fx as fx

from kevin_backend.generate.builtin.gemm_kernel import Epilogue, GemmSpec
from kevin_backend.generate.builtin.gemm_kernel_sm80 import sm80_alignment
from kevin_backend.generate.builtin.ops import Unsupported

__all__ = ["DTYPES", "RESHAPES", "GemmPlan", "TreeOperands", "broadcast_shape", "epilogue_input", "float_cast", "gemm_spec",
           "read_epilogue", "read_outputs", "wide_operand"]

aten = torch.ops.aten
DTYPES = {torch.float16: "float16", torch.bfloat16: "bfloat16", torch.float32: "float32"}
RESHAPES = (aten.view.default, aten._unsafe_view.default, aten.reshape.default)
# ops that view a value without computing: a task's outputs made so from the kernel's (`read_outputs`)
_VIEW_OPS = {aten.view.default: "view", aten._unsafe_view.default: "view", aten.reshape.default: "view", aten.t.default: "t",
             aten.transpose.int: "transpose", aten.permute.default: "permute", aten.split.Tensor: "split",
             aten.split_with_sizes.default: "split", aten.select.int: "select", aten.unsqueeze.default: "unsqueeze",
             aten.squeeze.dim: "squeeze", aten.chunk.default: "chunk", aten.unbind.int: "unbind"}  # (the Tensor method each is)


@dataclass(frozen=True)
class GemmPlan:
    spec: GemmSpec
    m: int
    n: int
    k: int
    inputs: int  # the forward's inputs, in order (v0, v1, ...); the model's parameters and buffers after them
    x: int  # which input is x, w, the bias and the residual (None: absent)
    w: int
    bias: int | None = None
    residual: int | None = None
    # w is given as the K x N view of an N x K weight (strides (1, K): a graph's `t(weight)` made
    # outside the partition, as a compiled `nn.Linear` gives it): the program passes `w.t()`
    w_view: bool = False
    out_shape: tuple[int, ...] | None = None  # the output's shape where it is not x's leading dimensions and N
    # the model's parameters and buffers the GEMM reads (a KernelBench task's nn.Linear), numbered
    # from `inputs` on: their paths ("buffer:" before a buffer's)
    state: tuple[str, ...] = ()
    # a tree epilogue's operands (`Epilogue.operands`), the task's input each is, in order
    operands: tuple[int, ...] = ()
    batch: int = 1  # L products of M x N (bmm's; x and w hold L matrices each, the output L x M x N)
    views: tuple[str, ...] = ()  # the program's lines making the task's outputs, views of the kernel's (`y`): `read_outputs`
    conv: bool = False  # a 1x1 convolution (`conv_plan.read_conv`): x passed as its N x H x W x C view, w as C_out x C
    conv1d: bool = False  # a 1-D convolution (`spec.convolution`'s 2-D of height 1): x and w passed with a dimension of 1 before the last

    def describe(self) -> str:
        e = self.spec.epilogue
        parts = [f"{self.batch} x " * (self.batch > 1) + f"{self.m}x{self.n}x{self.k} {self.spec.dtype}",
                 *(["a 1x1 convolution's channels-last rows"] if self.conv else []), *(["K x N weight"] if self.spec.weight == "kn" else []),
                 *(["bias"] if e.bias else []),
                 *([f"alpha {e.alpha:g}"] if e.alpha != 1 else []), *([f"+ {e.beta:g} x residual"] if e.residual else []),
                 *([e.activation] if e.activation not in ("identity", "function") else []),
                 *([f"an elementwise function ({e.function.count(chr(10))} statements)"] if e.function and not e.tree else []),
                 *([f"a visitor tree ({e.function.count(chr(10))} statements) reading {_kinds(e.operands, self.spec.convolution)}"
                   + (f" ({len(e.wide)} of float32 values)" if e.wide else "")]
                   if e.tree else []),
                 *(["its value kept beside the output, a function of it stored"] if e.after else []),
                 *([f"stored in {self.spec.store}"] if self.spec.output != self.spec.dtype else []),
                 *(["its rows stored directly (N unaligned)"] if self.spec.direct_store else []),
                 *(["its rows padded to 16 bytes (N unaligned)"] if self.spec.row_pad else []),
                 *(["x and w packed into rows of 8 first (rows of odd length)"] if self.spec.pad_k else []),
                 *([self.spec.convolution.describe() + (" (1-D, as height 1)" if self.conv1d else "")] if self.spec.convolution else []),
                 *([f"{self.views[-1].count(',') + 1} views of it returned"] if self.views and not self.conv and not self.spec.convolution else [])]
        return ", ".join(parts)


def _kinds(operands: tuple[str, ...], convolution: Any = None) -> str:
    """The operands in words, in their order, each kind counted ("2 vectors over N, a tensor of the output's size")."""
    words = {"n": ("a vector", "vectors", " over the output channels" if convolution else " over N"), "m": ("a vector", "vectors", " over M"),
             "mn": ("a tensor", "tensors", " of the output's size")}
    kinds = list(dict.fromkeys(operands))
    return ", ".join(f"{words[k][0] if operands.count(k) == 1 else f'{operands.count(k)} {words[k][1]}'}{words[k][2]}" for k in kinds)



def gemm_spec(dtype: str, epilogue: Epilogue, nk: bool, n: int, k: int, arch: str, direct: bool = False) -> GemmSpec:
    """The kernel's spec, or why the kernel for `arch` cannot take this GEMM: the sm80 kernel
    (float32's everywhere, 16-bit values' on sm80) reads one source beside a visitor tree, not a
    bias and a residual both; rows its accesses cannot read are packed first."""
    sm80 = dtype == "float32" or arch == "sm80"
    align, out_align = sm80_alignment(dtype, n, k, "nk" if nk else "kn") if sm80 else (0, 0)
    if sm80:
        if epilogue.bias and epilogue.residual:
            raise Unsupported(f"a {dtype} GEMM on the sm80 kernel with both a bias and a residual (its epilogue reads one source)")
    # 16-bit rows of odd length (cp.async copies 4 bytes at least): x and w packed into rows of K rounded up to 8
    pad = sm80 and not align
    try:
        return GemmSpec(dtype, epilogue, "nk" if nk else "kn", 8 if pad else align, direct_store=direct, arch=arch,
                        out_align=out_align, pad_k=pad)
    except ValueError as exc:  # (float32 vectors for CUTLASS 2.x's tree, say)
        raise Unsupported(f"a {dtype} GEMM for {arch}: {exc}") from None



def read_epilogue(mm: fx.Node, out: fx.Node, bias: Any, index: dict[fx.Node, int], metas: list[Any], mn: tuple[int, int],
                  dtype: torch.dtype, tree: bool = False) -> tuple[Epilogue, int | None, int | None, tuple[int, ...]]:
    """The linear part (views, casts, a scale, a bias over N, a residual) walked from the matmul
    while each value is read once; what follows, up to the output, is one of CUTLASS's activations
    where it is one (`_named_activation`), else one elementwise function of that value
    (`gemm_function.py`). Where that function reads other tensors (a second bias, a column of M
    values, a tensor added after the activation), the whole epilogue is one function of the
    accumulator and those operands instead: a visitor tree (`_tree`), as always with `tree`."""
    from kevin_backend.generate.builtin.gemm_function import elementwise_function

    if tree:
        return _tree(mm, out, bias, index, metas, mn, dtype)
    m, n = mn
    alpha, beta, residual = 1.0, 1.0, None
    bias_in = read_bias(bias, index, metas, n, dtype) if bias is not None else None
    node = mm
    while node is not out and len(node.users) == 1:
        nxt = next(iter(node.users))
        other = [a for a in nxt.args if a is not node]
        if nxt.target in RESHAPES or float_cast(nxt, dtype):
            pass  # (a cast to float32 and back, as decompositions of 16-bit ops write: the kernel computes in float32)
        elif nxt.target in (aten.mul.Tensor, aten.mul.Scalar, aten.div.Tensor, aten.div.Scalar) and _number(other) \
                and bias_in is None and residual is None:
            alpha *= float(other[0]) if nxt.target in (aten.mul.Tensor, aten.mul.Scalar) else 1.0 / float(other[0])
        elif nxt.target is aten.add.Tensor and len(other) == 1 and isinstance(other[0], fx.Node):
            # (another tensor: the function after the linear part reads the product alone)
            scale = float(nxt.kwargs.get("alpha", 1))
            value = metas[index[other[0]]] if other[0] in index else None
            if value is not None and tuple(value.shape) == (n,) and bias_in is None and residual is None and scale == 1:
                bias_in = read_bias(other[0], index, metas, n, dtype)
            elif value is not None and value.numel() == _numel(nxt) and residual is None and value.dtype == dtype \
                    and value.is_contiguous():
                residual, beta = index[other[0]], scale
            else:
                break  # (something else added: the function reads it, as a tree's operand)
        else:
            break
        node = nxt
    epilogue = Epilogue(bias=bias_in is not None, alpha=alpha, residual=residual is not None, beta=beta)
    activation = _named_activation(node, out, dtype)
    if activation is not None:
        return dataclasses.replace(epilogue, activation=activation), bias_in, residual, ()
    reads: list[fx.Node] = []
    function = elementwise_function(node, out, dtype, operand=lambda other, _: reads.append(other) or "a")
    if not reads:
        return dataclasses.replace(epilogue, activation="function", function=function), bias_in, residual, ()
    return _tree(mm, out, bias, index, metas, mn, dtype)


def _tree(mm: fx.Node, out: fx.Node, bias: Any, index: dict[fx.Node, int], metas: list[Any], mn: tuple[int, int],
          dtype: torch.dtype) -> tuple[Epilogue, None, None, tuple[int, ...]]:
    """The whole epilogue as one function of the accumulator and the tensors it reads, each an
    operand of the kind its shape makes it (`gemm_kernel.OPERAND_KINDS`); addmm's bias the first."""
    from kevin_backend.generate.builtin.gemm_function import elementwise_function

    operands = TreeOperands()
    operand = operands.reader(mm, index, metas, mn, dtype)
    start = "v"
    if bias is not None:  # addmm: its bias added to the product before eager rounds it
        start = f"(v + {operand(bias)})"
    function = elementwise_function(mm, out, dtype, operand=operand, start=start)
    return (Epilogue(activation="function", function=function, operands=tuple(operands.kinds), wide=tuple(operands.wide)), None,
            None, tuple(operands.inputs))


def wide_operand(value: torch.Tensor, kind: str, dtype: torch.dtype, loaded: bool = False) -> bool:
    """Whether a tree's operand is of float32 values a 16-bit kernel reads (`Epilogue.wide`): a
    vector, or a tensor of the output's size where the kernel can load one beside its source C
    (`loaded`: Hopper's GEMM); else Unsupported for such a tensor (a convolution reads its dtype's)."""
    if value.dtype == dtype:
        return False
    if kind == "mn" and not loaded:
        raise Unsupported(f"an epilogue operand of the output's size of {value.dtype}: the kernel reads {dtype} values as its source")
    return True


class TreeOperands:
    """A tree's operands as its function reads them (`a0, a1, ...`; from `a{first}` on, for a
    second function after others): the task's inputs and their kinds, an input read twice in one
    kind one operand."""

    def __init__(self, first: int = 0) -> None:
        self.first = first
        self.inputs: list[int] = []
        self.kinds: list[str] = []
        self.wide: list[int] = []  # (the operands of float32 values read by a 16-bit kernel, their numbers: `Epilogue.wide`)

    def name(self, input_index: int, kind: str, wide: bool = False) -> str:
        read_as = list(zip(self.inputs, self.kinds))
        if (input_index, kind) not in read_as:
            read_as.append((input_index, kind))
            self.inputs.append(input_index)
            self.kinds.append(kind)
            if wide:
                self.wide.append(self.first + len(read_as) - 1)
        return f"a{self.first + read_as.index((input_index, kind))}"

    def reader(self, product: fx.Node, index: dict[fx.Node, int], metas: list[Any], mn: tuple[int, int],
               dtype: torch.dtype) -> Callable[[fx.Node, fx.Node | None], str]:
        """The function naming each tensor an epilogue of `product` (M x N values) reads: an operand
        of the kind its shape makes it (`gemm_kernel.OPERAND_KINDS`), or Unsupported."""
        m, n = mn

        def operand(node: fx.Node, reader: fx.Node | None = None) -> str:
            source, value = epilogue_input(node, index, metas, dtype, wide=True)
            if not value.is_contiguous():
                raise Unsupported(f"an epilogue operand that is not contiguous (strides {tuple(value.stride())})")
            shape = broadcast_shape(node, product, reader) or tuple(value.shape)  # (as the epilogue reads it: through its views)
            kind = ("n" if value.numel() == n and shape[-1:] == (n,) else
                    "m" if value.numel() == m and shape[-1:] == (1,) else
                    "mn" if value.numel() == m * n and shape[-1:] == (n,) else None)
            if kind is None:
                raise Unsupported(f"an epilogue operand of shape {shape}: not one value per column (N = {n}), "
                                  f"per row (M = {m}) nor per element")
            return self.name(index[source], kind, wide=wide_operand(value, kind, dtype, loaded=True))
        return operand


def broadcast_shape(node: fx.Node, product: fx.Node, reader: fx.Node | None = None) -> tuple[int, ...] | None:
    """The shape in which `node`'s values meet those computed from `product`: its own where a value
    of the product's reads it (`reader` None), else the one the ops of operands alone from `reader`
    on give them first (an inference batch norm's running variance made `rsqrt(var + eps)` and
    unsqueezed to C x 1 x 1); None where it has no shape. Unsupported where they meet it in two
    shapes, or grown by a broadcast against another operand."""
    own = node.meta.get("val")
    own_shape = tuple(own.shape) if isinstance(own, torch.Tensor) else None
    if reader is None:
        return own_shape
    derived, todo = {product}, [product]
    while todo:
        for user in todo.pop().users:
            if user not in derived:
                derived.add(user)
                todo.append(user)
    shapes, seen, todo = set(), {reader}, [reader]
    while todo:
        value = todo.pop()
        for user in value.users:
            if user in derived:
                meta = value.meta.get("val")
                shapes.add(tuple(meta.shape) if isinstance(meta, torch.Tensor) else None)
            elif user not in seen:
                seen.add(user)
                todo.append(user)
    if len(shapes) > 1:
        raise Unsupported(f"{node.name} meets the product in shapes {sorted(map(str, shapes))} (the kernel reads an operand in one)")
    shape = next(iter(shapes), own_shape)
    if shape is not None and own_shape is not None and math.prod(shape) != math.prod(own_shape):
        raise Unsupported(f"{node.name} {list(own_shape)} meets the product in shape {list(shape)}, broadcast against "
                          "another operand first (the kernel reads each operand's own values)")
    return shape


def epilogue_input(node: fx.Node, index: dict[fx.Node, int], metas: list[Any], dtype: torch.dtype,
                   wide: bool = False) -> tuple[fx.Node, Any]:
    """The task's input an epilogue operand reads (through views and float casts) and its value,
    or why it cannot be one (computed in the task, of another dtype; `wide`: float32 may be read
    by a 16-bit kernel too)."""
    source = node
    while isinstance(source, fx.Node) and (source.target in RESHAPES or source.target is aten.unsqueeze.default
                                           or float_cast(source, dtype)):
        source = source.args[0]
    if source not in index:
        raise Unsupported(f"{node.name} in the epilogue is neither computed from the product nor an input")
    value = metas[index[source]]
    if value.dtype != dtype and not (wide and value.dtype == torch.float32):
        raise Unsupported(f"an epilogue operand of {value.dtype}: the kernel reads {dtype} values")
    return source, value


def _named_activation(pre: fx.Node, out: fx.Node, dtype: torch.dtype) -> str | None:
    """The CUTLASS activation (`gemm_kernel.ACTIVATIONS`) the chain from `pre` to `out` is, views
    and float casts around it (SiLU as the tracer decomposes it: `v * sigmoid(v)`); "identity" for
    none; None where the chain is something else."""
    activation, node = "identity", pre
    while node is not out:
        users = list(node.users)
        silu = _silu(node, users)
        if silu is not None and activation == "identity":
            activation, node = "silu", silu
            continue
        if len(users) != 1:
            return None
        node = users[0]
        if node.target in RESHAPES or float_cast(node, dtype):
            continue
        named = {aten.relu.default: "relu", aten.sigmoid.default: "sigmoid",
                 aten.gelu.default: "gelu_tanh" if node.kwargs.get("approximate", "none") == "tanh" else "gelu"}.get(node.target)
        if named is None or activation != "identity":
            return None
        activation = named
    return activation


def _silu(value: fx.Node, users: list[fx.Node]) -> fx.Node | None:
    """The `v * sigmoid(v)` node when `value`'s users are SiLU as the tracer decomposes it."""
    sigmoids = [u for u in users if u.target is aten.sigmoid.default]
    products = [u for u in users if u.target is aten.mul.Tensor and set(u.args) == {value, *sigmoids}]
    if len(users) == 2 and len(sigmoids) == 1 and len(products) == 1 and list(sigmoids[0].users) == products:
        return products[0]
    return None


def float_cast(node: fx.Node, dtype: torch.dtype) -> bool:
    """A cast between the task's dtype and float32, nothing else changed."""
    casts = (aten._to_copy.default, torch.ops.prims.convert_element_type.default)
    if node.target not in casts:
        return False
    to = node.kwargs.get("dtype") if node.target is aten._to_copy.default else (node.args[1] if len(node.args) > 1 else None)
    return to in (torch.float32, dtype) and not node.kwargs.get("memory_format") and node.kwargs.get("device") in (None,)


def read_bias(node: Any, index: dict[fx.Node, int], metas: list[Any], n: int, dtype: torch.dtype) -> int:
    if node not in index or tuple(metas[index[node]].shape) != (n,) or metas[index[node]].dtype != dtype:
        raise Unsupported(f"a bias that is not an input of {n} {dtype} values")
    return index[node]



def _number(args: list[Any]) -> bool:
    return len(args) == 1 and isinstance(args[0], (int, float)) and math.isfinite(float(args[0]))


def _numel(node: fx.Node) -> int:
    value = node.meta.get("val")
    return value.numel() if isinstance(value, torch.Tensor) else -1


def read_outputs(graph: fx.Graph) -> tuple[fx.Node, tuple[str, ...]]:
    """The value the kernel computes and, where the task returns several views of it (a QKV
    projection's split into queries, keys and values), the program's lines making them from it
    (`y`), the last returning them; () for a task returning that value itself."""
    (output,) = [n for n in graph.nodes if n.op == "output"]
    values = output.args[0] if isinstance(output.args[0], (list, tuple)) else [output.args[0]]
    if not values or not all(isinstance(v, fx.Node) for v in values):
        raise Unsupported("the GEMM writer takes a task whose outputs are tensors")
    if len(values) == 1:
        return values[0], ()
    ends, viewed = set(), []
    for v in values:
        node = v
        while node.op == "call_function" and (node.target in _VIEW_OPS or node.target is operator.getitem):
            viewed.append(node)
            node = node.args[0]
        ends.add(node)
    if len(ends) != 1:
        raise Unsupported(f"{len(values)} outputs not all views of one value (the GEMM writer computes one)")
    (end,) = ends
    names = {end: "y"}
    lines = []
    for node in graph.nodes:  # (in the graph's order: each view after what it views)
        if node in viewed and node not in names:
            names[node] = f"o{len(names)}"
            source, args = names[node.args[0]], ", ".join(repr(a) for a in node.args[1:])
            lines.append(f"{names[node]} = {source}[{node.args[1]!r}]" if node.target is operator.getitem else
                         f"{names[node]} = {source}.{_VIEW_OPS[node.target]}({args})")
    return end, (*lines, f"return ({', '.join(names[v] for v in values)})")
