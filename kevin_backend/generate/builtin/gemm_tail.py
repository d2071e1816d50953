"""The built-in writer's own kernels around a GEMM. After it: a GEMM task whose product is reduced
after its epilogue (a sum, a max, a logsumexp, a softmax or a norm over the output's rows: what
level-2 problems do after a Linear) is the GEMM kernel, then the built-in writer's own kernel for
the rest, one program of two extensions. Before it: a left operand computed by ops (a cast, a
pre-norm) is the writer's own kernel first (`plan_head`), its output the GEMM's left operand.

    tail = plan_tail(graph, metas, read)      # a GemmTail, or Unsupported with the reason

The graph is cut where the matmul's elementwise epilogue ends: from the matmul through each value
read once, by an elementwise op (a bias, an activation, a scale), up to the first value read twice
or by a reduction (its end). The GEMM kernel computes the matmul and that epilogue (`read`:
`gemm_plan._read` on the first part) and keeps its end (`y0`); the rest reads y0 and the task's
inputs it needs, a task of its own for the built-in writer's planner (`planner.plan_graph`: its
row kernels), written with the variant its ranking puts first for its shape (`gemm_plan.own_variant`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.fx as fx

from kevin_backend.generate.builtin.gemm_chain import MATMULS, copy_placeholder, the_matmul, value_placeholder
from kevin_backend.generate.builtin.gemm_function import ELEMENTWISE
from kevin_backend.generate.builtin.graph_nodes import REDUCTIONS
from kevin_backend.generate.builtin.ops import Unsupported
from kevin_backend.generate.builtin.plan import Plan

__all__ = ["GemmHead", "GemmTail", "KeptEnd", "WideEnd", "copy_strided_left_operand", "has_tail", "head_of", "padded_rows", "plan_head", "plan_tail"]

aten = torch.ops.aten
# Reductions that exponentiate their operand: a 16-bit end's rounding (half an ulp of a logit of
# magnitude 100 is 0.25) becomes a relative error of e^0.25 in the output, beyond what the judge's
# bound allows where eager rounds elsewhere. Such a tail has variants whose GEMM stores the end in
# float32 (`GemmTail.wide`, `WideEnd`): twice the end's bytes, tried once a 16-bit end failed.
_MAGNIFYING = frozenset({aten._softmax.default, aten._log_softmax.default, aten.logsumexp.default, aten.exp.default})


class _AroundGemm:
    """A GEMM (`gemm`) with the built-in writer's own kernels around it: the task's inputs and
    parameters are its GEMM's."""

    gemm: Any

    @property
    def inputs(self) -> int:
        return self.gemm.inputs

    @property
    def state(self) -> tuple[str, ...]:
        return self.gemm.state


@dataclass(frozen=True)
class GemmTail(_AroundGemm):
    """The GEMM (`gemm`, a GemmPlan whose output is the end) and the built-in writer's plan of the
    rest (`tail`), whose inputs are, in order, the task's inputs numbered `reads` (the end: the
    number after the task's inputs and parameters)."""

    gemm: Any
    tail: Plan
    reads: tuple[int, ...]
    wide: GemmTail | None = None  # the same with the end stored in float32 (a 16-bit end the tail exponentiates)
    # the task's outputs (their numbers) that are the end itself, the GEMM kernel's output; the
    # tail's outputs are the others, in order
    ends: tuple[int, ...] = ()
    # the same as one GEMM where the tail is one elementwise function of the end (and of tensors
    # a tree reads: a pre-activation and its GELU, the residual stream and its float32 copy, a gate
    # and its SiLU times the up projection): Hopper's kernel keeps the end beside its output, the
    # function's value (`Epilogue.after`; variants `KeptEnd`)
    kept: Any = None
    kept_shape: tuple[int, ...] | None = None  # (that value's shape, where a view makes it another than the end's)
    # the kept variants first: the value is a float32 one of a 16-bit end, which the two kernels
    # compute from the end rounded as stored, and the judge's exact reference rounds nothing
    kept_first: bool = False

    def describe(self) -> str:
        returned = f", the GEMM's output returned as output {', '.join(map(str, self.ends))} too" if self.ends else ""
        kept = f"; or one GEMM keeping its end beside that value (its variants {'first' if self.kept_first else 'last'})" \
            if self.kept is not None else ""
        return f"[{self.gemm.describe()}] -> {_own_kernel(self.tail)}{returned}{kept}"


@dataclass(frozen=True)
class WideEnd:
    """A variant of a tail whose GEMM stores its end in float32 (`GemmTail.wide`): `tiling` the GEMM's."""

    tiling: Any

    @property
    def name(self) -> str:
        return f"{self.tiling.name}, its end in float32"


@dataclass(frozen=True)
class KeptEnd:
    """A variant of a tail whose GEMM keeps its end beside the tail's value (`GemmTail.kept`): one
    kernel, the end not read back; `tiling` the kept GEMM's; `staged`: the end stored through
    shared memory and TMA as the output is (`Epilogue.after_staged`), else from registers."""

    tiling: Any
    staged: bool = False

    @property
    def name(self) -> str:
        return f"{self.tiling.name}, its end kept beside the output" + (" through shared memory" if self.staged else "")


@dataclass(frozen=True)
class GemmHead(_AroundGemm):
    """The built-in writer's plan of what computes the GEMM's left operand (`head`: a cast, a
    norm; reading the task's inputs numbered `reads`), then the GEMM (`gemm`: a GemmPlan or a
    GemmTail) whose left operand is the head's output, numbered after the task's inputs and
    parameters."""

    head: Plan
    reads: tuple[int, ...]
    gemm: Any

    def describe(self) -> str:
        return f"{_own_kernel(self.head)} -> {self.gemm.describe()}"


def _own_kernel(plan: Plan) -> str:
    """The built-in writer's kernel of `plan`, in a description: its family and its ops, short."""
    ops = ", ".join(dict.fromkeys(o.split(".")[1] if o.count(".") >= 2 else o for o in plan.ops))
    return f"[the built-in writer's {'row' if plan.is_rows else 'pointwise'} kernel: {ops}]"


def head_of(graph: fx.Graph) -> fx.Node | None:
    """The node whose value the task's matmul reads as its left operand where an op computes it
    (through views at most, and bmm's expands that add nothing), or None where it is an input."""
    mm = the_matmul(graph)
    a = mm.args[1] if mm.target is aten.addmm.default else mm.args[0]
    while isinstance(a, fx.Node) and a.target in (aten.view.default, aten._unsafe_view.default, aten.reshape.default, aten.expand.default):
        a = a.args[0]
    return a if isinstance(a, fx.Node) and a.op == "call_function" else None


def copy_strided_left_operand(graph: fx.Graph, metas: list[Any]) -> bool:
    """Where the task's mm or addmm reads a 2-D input that is not row-major as its left operand (the
    transpose of a logits gradient, as a tied LM head's weight gradient has it: strides (1, M)),
    a copy into row-major put before it, so the writer's own kernel makes the operand the GEMM
    reads (`plan_head`); the GEMM kernel itself takes a row-major left operand only. True where one
    was put in."""
    mm = the_matmul(graph)
    if mm.target not in (aten.mm.default, aten.addmm.default):
        return False
    a = mm.args[1] if mm.target is aten.addmm.default else mm.args[0]
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    if not isinstance(a, fx.Node) or a not in placeholders:
        return False
    value = metas[placeholders.index(a)]
    if not isinstance(value, torch.Tensor) or value.dim() != 2 or value.is_contiguous():
        return False
    with graph.inserting_before(mm):
        copy = graph.call_function(aten.clone.default, (a,), {"memory_format": torch.contiguous_format})
    copy.meta["val"] = torch.empty(tuple(value.shape), dtype=value.dtype, device="meta")
    mm.replace_input_with(a, copy)
    return True


def plan_head(graph: fx.Graph, metas: list[Any], plan_rest: Callable[[fx.Graph, list[Any]], Any]) -> GemmHead:
    """The head (`head_of`: what computes the left operand, planned by the built-in writer's
    planner) and the rest, the GEMM reading the head's output as a new last input (`plan_rest`)."""
    from kevin_backend.generate.builtin.planner import plan_graph

    nodes = list(graph.nodes)
    placeholders = [n for n in nodes if n.op == "placeholder"]
    end = head_of(graph)
    assert end is not None
    head = {n for n in _ancestors(end) if n.op == "call_function"}
    feeding = _ancestors(the_matmul(graph))
    if any(u not in head and u not in feeding for n in head for u in n.users):
        raise Unsupported("a value of the matmul's prologue is read after the matmul too")
    if any(n.target in MATMULS for n in head):
        raise Unsupported("a matmul in the prologue of another")
    used = [p for p in placeholders if any(u in head for u in p.users)]
    head_graph = fx.Graph()
    env = {p: copy_placeholder(head_graph, p) for p in used}
    for n in nodes:
        if n in head:
            env[n] = head_graph.node_copy(n, lambda i: env[i])
    head_graph.output(env[end])
    plan = plan_graph(fx.GraphModule(torch.nn.Module(), head_graph), [metas[placeholders.index(p)] for p in used])

    rest_graph = fx.Graph()
    env = {p: copy_placeholder(rest_graph, p) for p in placeholders}
    env[end] = value_placeholder(rest_graph, "h0", end)  # (the head's output)
    for n in nodes:
        if n.op == "call_function" and n not in head:
            env[n] = rest_graph.node_copy(n, lambda i: env[i])
    (output,) = [n for n in nodes if n.op == "output"]
    rest_graph.output(fx.map_arg(output.args[0], lambda i: env[i]))
    rest = plan_rest(rest_graph, list(metas) + [env[end].meta["val"]])
    return GemmHead(plan, tuple(placeholders.index(p) for p in used), rest)


def has_tail(graph: fx.Graph) -> bool:
    """Whether the built-in writer's own kernel follows the task's matmul: a reduction follows it,
    or the task's outputs are more than the GEMM kernel stores (values besides its end, as a
    compiled model's partitions return the residual stream with its float32 copy for the next
    norm, or the pre-activation it saves for the backward pass with the activation; a float32
    output of a 16-bit product)."""
    from kevin_backend.generate.builtin.gemm_reading import read_outputs

    mm = the_matmul(graph)
    before = _ancestors(mm)
    if any(n.op == "call_function" and n.target in REDUCTIONS and n not in before for n in graph.nodes):
        return True
    try:
        end, _ = read_outputs(graph)
    except Unsupported:
        return True  # (several values)
    value, product = end.meta.get("val"), mm.meta.get("val")
    return isinstance(value, torch.Tensor) and isinstance(product, torch.Tensor) and value.dtype != product.dtype


def plan_tail(graph: fx.Graph, metas: list[Any], read: Callable[[fx.Graph, list[Any]], Any],
              end_layout: torch.memory_format | None = None, read_tree: Callable[[fx.Graph, list[Any]], Any] | None = None,
              tf32: bool = False) -> GemmTail:
    """The GEMM (`read` of the graph up to the end) and the built-in writer's plan of the rest,
    reading the end as the GEMM kernel leaves it: contiguous, or in `end_layout` (a convolution's
    output as it lies, channels innermost: `conv_plan.plan_conv`). Where the task returns the end
    too, also the one GEMM keeping it (`GemmTail.kept`: `read_tree` reads the GEMM as a tree).
    `tf32`: eager computes a float32 product in TF32 (the task's `matmul_tf32`)."""
    from kevin_backend.generate.builtin.planner import plan_graph

    nodes = list(graph.nodes)
    placeholders = [n for n in nodes if n.op == "placeholder"]
    mm = the_matmul(graph)
    end = mm
    dtype = mm.meta["val"].dtype
    while len(end.users) == 1:  # (the end in the product's dtype: what the GEMM kernel stores)
        (user,) = end.users
        if user.op != "call_function" or user.target in REDUCTIONS or user.target not in ELEMENTWISE or (
                not isinstance(user.meta.get("val"), torch.Tensor) or user.meta["val"].dtype != dtype):
            break
        end = user
    head = _ancestors(end)
    if any(n.target in REDUCTIONS for n in head):
        raise Unsupported("a reduction before the matmul's epilogue ends (the GEMM kernel takes none)")
    gemm_graph = fx.Graph()
    env = {p: copy_placeholder(gemm_graph, p) for p in placeholders}
    for n in nodes:
        if n in head and n.op == "call_function":
            env[n] = gemm_graph.node_copy(n, lambda i: env[i])
    gemm_graph.output(env[end])
    gemm = read(gemm_graph, list(metas))
    (output,) = [n for n in nodes if n.op == "output"]
    values = list(output.args[0]) if isinstance(output.args[0], (list, tuple)) else [output.args[0]]
    if gemm.spec.direct_store and end not in values:  # (an end only the tail reads: TMA's store into padded rows)
        gemm = dataclasses.replace(gemm, spec=dataclasses.replace(gemm.spec, direct_store=False, row_pad=True))

    rest = [n for n in nodes if n.op == "call_function" and n not in head]
    outside = [i for n in rest for i in n.all_input_nodes if i not in rest]
    if any(i in head and i is not end and i.op != "placeholder" for i in outside):
        raise Unsupported("the reduction reads a value of the matmul's epilogue before its end")
    used = [p for p in placeholders if p in outside]
    ends = tuple(i for i, v in enumerate(values) if v is end)  # (the task's outputs that are the end itself)
    computed = [v for v in values if v is not end]
    if not computed:
        raise Unsupported("no output of the writer's kernel after the matmul: its outputs are the GEMM's")

    def after(stored: torch.dtype) -> Plan:  # the built-in writer's plan of the rest, its y0 stored so
        tail_graph = fx.Graph()
        env = {p: copy_placeholder(tail_graph, p) for p in used}
        env[end] = value_placeholder(tail_graph, "y0", end, stored)  # (the GEMM's output)
        if end_layout is not None:
            env[end].meta["val"] = env[end].meta["val"].contiguous(memory_format=end_layout)
        if gemm.spec.row_pad:  # (the end as the GEMM leaves it: rows padded to 16 bytes)
            env[end].meta["val"] = padded_rows(env[end].meta["val"])
        for n in rest:
            env[n] = tail_graph.node_copy(n, lambda i: env[i])
        if ends:  # (the others: the tail's outputs)
            made = [env[v] for v in computed]
            tail_graph.output(tuple(made) if len(made) > 1 else made[0])
        else:
            tail_graph.output(fx.map_arg(output.args[0], lambda i: env[i]))
        tail_metas = [metas[placeholders.index(p)] for p in used] + [env[end].meta["val"]]
        return plan_graph(fx.GraphModule(torch.nn.Module(), tail_graph), tail_metas)

    reads = tuple(placeholders.index(p) for p in used) + (len(placeholders),)
    if ends:  # (the task returns the end itself too: the GEMM kernel's output, as it stores it)
        kept = _kept(end, computed, gemm_graph, metas, read_tree) if read_tree is not None else None
        made = computed[0].meta["val"]
        shape = tuple(made.shape)
        return GemmTail(gemm, after(dtype), reads, ends=ends, kept=kept,
                        kept_shape=shape if kept is not None and shape != tuple(end.meta["val"].shape) else None,
                        kept_first=kept is not None and made.dtype == torch.float32 and dtype != torch.float32)
    wide = None
    # (3xTF32's products hold about 21 bits: on the H200 a softmax of a 2048 x 2048 float32
    # product was off in 3 of 4.2M elements on the judge's inputs of mixed scales. Not so after a
    # convolution: eager's own float32 convolution is TF32's under torch's default numerics
    # (`cache.key`'s cudnn_tf32), and the judge's bound scales with eager's error; where a key turns
    # TF32 off, the judge decides, and a task it fails falls back; so too where eager's matmul is
    # TF32's, `tf32`)
    if (dtype == torch.float32 and any(n.target in _MAGNIFYING for n in rest) and mm.target is not aten.convolution.default
            and not tf32):
        raise Unsupported("a float32 product exponentiated after it (a softmax, a logsumexp): the float32 "
                          "kernel's 3xTF32 products are less exact than eager's, and the exponent magnifies it")
    if dtype in (torch.float16, torch.bfloat16) and any(n.target in _MAGNIFYING for n in rest) and gemm.spec.can_end_in_float32:
        wide = GemmTail(dataclasses.replace(gemm, spec=dataclasses.replace(gemm.spec, store="float32")), after(torch.float32), reads)
    return GemmTail(gemm, after(dtype), reads, wide)


def padded_rows(value: torch.Tensor) -> torch.Tensor:
    """A tensor of `value`'s shape and dtype whose last dimension's rows are padded to 16 bytes (the
    end of a GEMM with `GemmSpec.row_pad`: the first N columns of rows of N rounded up)."""
    *lead, n = value.shape
    per = 16 // value.element_size()
    strides, step = [1], -(-n // per) * per
    for size in reversed(lead):
        strides.insert(0, step)
        step *= size
    return torch.empty_strided(value.shape, tuple(strides), dtype=value.dtype, device=value.device)


def _kept(end: fx.Node, computed: list[fx.Node], gemm_graph: fx.Graph, metas: list[Any],
          read_tree: Callable[[fx.Graph, list[Any]], Any]) -> Any:
    """The GEMM (a tree: `read_tree` of `gemm_graph`) keeping `end` beside the one value `computed`
    from it, elementwise, and from the task's inputs it reads as a tree's operands (Llama's gate
    and its SiLU times the up projection; through views: its values in the end's order; its dtype
    or float32), or None where there is no such one value or the kernel cannot keep it."""
    from kevin_backend.generate.builtin.gemm_function import elementwise_function
    from kevin_backend.generate.builtin.gemm_reading import TreeOperands

    value = end.meta.get("val")
    made = computed[0].meta.get("val") if len(computed) == 1 else None
    if not (isinstance(made, torch.Tensor) and isinstance(value, torch.Tensor) and made.numel() == value.numel()
            and made.is_contiguous() and value.is_contiguous() and made.dtype in (value.dtype, torch.float32)):
        return None
    try:
        plan = read_tree(gemm_graph, metas)
        if plan.views:
            return None
        e = plan.spec.epilogue
        index = {p: i for i, p in enumerate(n for n in end.graph.nodes if n.op == "placeholder")}
        more = TreeOperands(first=len(e.operands))
        after = elementwise_function(end, computed[0], value.dtype,
                                     operand=more.reader(end, index, metas, (plan.batch * plan.m, plan.n), value.dtype))
        if plan.batch > 1 and "m" in more.kinds:
            return None  # (a column of values per row in a batch of products: the kernel reads one column for all)
        epilogue = dataclasses.replace(e, activation="function", operands=e.operands + tuple(more.kinds), wide=e.wide + tuple(more.wide),
                                       after=after, after_from=len(e.operands))
        return dataclasses.replace(plan, operands=plan.operands + tuple(more.inputs), spec=dataclasses.replace(
            plan.spec, epilogue=epilogue, store="float32" if made.dtype == torch.float32 else plan.spec.store))
    except (Unsupported, ValueError):  # (ValueError: a spec no kernel builds, CUTLASS 2.x's or a tree of no operand)
        return None


def _ancestors(node: fx.Node) -> set[fx.Node]:
    seen: set[fx.Node] = set()
    todo = [node]
    while todo:
        n = todo.pop()
        if n not in seen:
            seen.add(n)
            todo.extend(n.all_input_nodes)
    return seen

