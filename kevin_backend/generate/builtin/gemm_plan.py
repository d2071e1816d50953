"""What the built-in writer reads from a GEMM task: its matmul and the epilogue it can fuse into
the CUTLASS kernel's store (`gemm_kernel.py`), or why it cannot.

    plan = plan_gemm(task_source)                 # a GemmPlan, GemmChain, GemmTail, GemmHead, or Declined(reason)
    program = write_gemm_program(plan, plan_tilings(plan)[0])

A task (a partition's, or a KernelBench task's, whose model's parameters and buffers are read as
inputs after the forward's: `tracing.trace_with_parameters`) is traced on meta tensors and read as

    out = f(alpha * (x @ w.T) + bias + beta * residual)

(the epilogue read by `gemm_reading.py`, which the convolutions' plan shares)

x an input of (..., K) values, w an input of N x K (as `nn.Linear` keeps its weight, read through
`t` or `permute`, or given as that K x N view: a compiled model's partition gets its weights so) or
of K x N (`x @ w`), bias an input of N values (added, or addmm's), residual an input of the
output's shape, alpha and beta numbers, f one of `gemm_kernel.ACTIVATIONS` or any elementwise
function of the value (`gemm_function.py`). Where the chain after the product reads other tensors
than these (a second bias, a column of M values, a tensor after the activation), the epilogue is a
visitor tree instead: one function of the accumulator and each tensor it reads, broadcast over
the columns, over the rows or read whole. A task of several matmuls is a chain
(`gemm_chain.py`); a reduction after the product, or ops computing the left operand (a cast, a
pre-norm), are the built-in writer's own kernels around the GEMM (`gemm_tail.py`). A bmm (and a
baddbmm: a bmm, its scale and its c added) is a batch of products, its operands the inputs they
view in place (`gemm_chain.batched_operands`). A convolution (`conv_plan.py`): a 1x1 one of a
channels-last input is the GEMM of its rows of channels; other 1-D, 2-D and 3-D ones and
transposed 1-D and 2-D ones, of one group, are CUTLASS's implicit GEMM (`conv_kernel.py`), with
their bias and a function after; one of few input channels (transposed or not, of any dimensions),
or a depthwise one, is first a direct kernel with its whole epilogue (`direct_conv.py`: a
`DirectConv`, the implicit GEMM's plan its `fallback`, tried after, where there is one). 16-bit rows of
N that TMA cannot store (an LM head's 50257 logits) are stored directly, for a plain linear
combination; rows TMA cannot read, or other epilogues of such rows, go to CUTLASS 2.x's sm80
kernel (`gemm_kernel_sm80.py`), which packs rows of odd length first. On Hopper such rows with
nothing fused after the product (a bare LM head) are declined: cuBLAS's is faster. Each thing it cannot take
declines the task with the reason: another dtype than float16, bfloat16 or float32, a grouped
convolution, a float32 product exponentiated after it, and so on. A plan is for a GPU
(`plan_gemm`'s `arch`, by default the one here): Hopper's ("sm90"), or Ampere's and Ada's ("sm80":
CUTLASS 2.x's kernels for every GEMM).
An output that views the product in another shape (a compiled model's 3-D activations) is the
kernel's M x N output viewed so; several outputs that view it (a QKV split) are made from it by
the program (`gemm_reading.read_outputs`).
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import hashlib
from typing import Any

import torch
import torch.fx as fx

from kevin_backend.generate.builtin import builtin_support
from kevin_backend.generate.builtin.gemm_kernel import (FAST_MATH, Epilogue, gemm_cpp_source, gemm_cuda_flags, gemm_cuda_source, gemm_unaligned,
                                                         tilings_for)
from kevin_backend.generate.builtin.conv_plan import plan_conv
from kevin_backend.generate.builtin.direct_conv import DirectConv, DirectTiling, direct_tilings, plan_direct
from kevin_backend.generate.builtin.direct_conv_source import direct_extension
from kevin_backend.generate.builtin.gemm_chain import (MATMULS, ChainTiling, GemmChain, batched_operands, chain_cut, chain_tilings,
                                                        decompose_baddbmm, with_parameters)
from kevin_backend.generate.builtin.gemm_reading import DTYPES, RESHAPES, GemmPlan, gemm_spec, read_epilogue, read_outputs
from kevin_backend.generate.builtin.gemm_tail import (GemmHead, GemmTail, KeptEnd, WideEnd, copy_strided_left_operand, has_tail, head_of,
                                                      plan_head, plan_tail)
from kevin_backend.generate.builtin.ops import Unsupported
from kevin_backend.generate.builtin.program import extension
from kevin_backend.generate.builtin.variant_ranking import preferred_order
from kevin_backend.generate.builtin.variants import Variant, variant_named
from kevin_backend.generate.builtin.plan import Declined, Plan
from kevin_backend.generate.builtin.tracing import TRACE_LOCK, trace_with_parameters

__all__ = ["AnyGemm", "GEMM_PLANS", "ChainTiling", "DirectConv", "GemmChain", "GemmHead", "GemmPlan", "GemmTail", "KeptEnd", "WideEnd", "gemm_turn", "own_variant", "plan_gemm", "plan_tilings",
           "write_gemm_program"]

aten = torch.ops.aten
_TRANSPOSES = (aten.t.default, aten.permute.default, aten.transpose.int)
_CHAIN = 4  # the most matmuls a chain takes (a program builds every kernel of it in one compile)
# the plans this writer's GEMM programs compute (else `plan_gemm` says Declined)
GEMM_PLANS = (GemmPlan, GemmChain, GemmTail, GemmHead, DirectConv)
AnyGemm = GemmPlan | GemmChain | GemmTail | GemmHead | DirectConv


def plan_gemm(task_source: str, arch: str | None = None, conv_tf32: bool = False, matmul_tf32: bool = False) -> AnyGemm | Declined:
    """The task's GEMM plan (a chain of them for a task of several matmuls: `gemm_chain.py`), or
    why the built-in writer's GEMM declines it; for the GPU `arch` ("sm90": Hopper's kernels,
    "sm80": Ampere's), by default the one here (`builtin_support.gemm_arch`; Hopper's without one).
    `conv_tf32`: the task's numerics let cuDNN compute float32 convolutions in TF32 (its cache
    key's `cudnn_tf32`, on under torch's defaults), so a float32 convolution's implicit GEMM,
    3xTF32's, is declined (`_implicit_gemm`). `matmul_tf32`: they let cuBLAS compute float32
    matmuls in TF32 (the key's `matmul_tf32`), so a float32 GEMM's search tries TF32 too
    (`GemmSpec.tf32`)."""
    arch = arch or builtin_support.gemm_arch() or "sm90"
    if arch not in ("sm90", "sm80"):
        raise ValueError(f"arch {arch!r}: 'sm90' or 'sm80'")
    _read = functools.partial(_read_gemm, arch=arch, tf32=matmul_tf32)
    _read_with_tail = functools.partial(_read_gemm_with_tail, arch=arch, tf32=matmul_tf32)
    try:
        with TRACE_LOCK:
            gm, metas, names = trace_with_parameters(task_source)
        decompose_baddbmm(gm.graph)
        count = len(metas) - len(names)
        matmuls = [n for n in gm.graph.nodes if n.op == "call_function" and n.target in MATMULS]
        if len(matmuls) > 1:
            if len(matmuls) > _CHAIN:
                raise Unsupported(f"{len(matmuls)} matmuls: the GEMM writer chains at most {_CHAIN}")
            chain = GemmChain(tuple(_read(graph, sub_metas) for graph, sub_metas in chain_cut(gm.graph, metas)))
            return with_parameters(chain, count, tuple(names))
        if not matmuls:  # (a convolution; a reduction after it: the writer's own kernel, as after a GEMM)
            return _named(_plan_convolution(gm.graph, metas, arch, conv_tf32), count, tuple(names))
        if len(matmuls) == 1:  # (a left operand of another layout: copied first, by the writer's kernel)
            copy_strided_left_operand(gm.graph, metas)
        if len(matmuls) == 1 and head_of(gm.graph) is not None:  # a left operand ops compute: the writer's kernel first
            return _named(plan_head(gm.graph, metas, _read_with_tail), count, tuple(names))
        return _named(_read_with_tail(gm.graph, metas), count, tuple(names))
    except Unsupported as exc:
        return Declined(str(exc))
    except Exception as exc:  # a task the tracer cannot take is declined, not an error
        return Declined(f"the task could not be traced on meta tensors: {type(exc).__name__}: {exc}")


def _plan_convolution(graph: fx.Graph, metas: list[Any], arch: str, tf32: bool) -> GemmPlan | GemmTail | DirectConv:
    """A convolution's plan: the direct kernel with its whole epilogue where it takes the
    convolution (few input channels: `direct_conv.py`), the implicit GEMM's plan as its fallback;
    else the implicit GEMM's (`tf32`: `plan_gemm`'s `conv_tf32`)."""
    try:
        direct = plan_direct(graph, metas)
    except Unsupported:
        return _implicit_gemm(graph, metas, arch, tf32)
    try:
        return dataclasses.replace(direct, fallback=_implicit_gemm(graph, metas, arch, tf32))
    except Unsupported:
        return direct


def _implicit_gemm(graph: fx.Graph, metas: list[Any], arch: str, tf32: bool) -> GemmPlan | GemmTail:
    """A convolution's implicit GEMM (`conv_plan.plan_conv`), declined in float32 where cuDNN may
    compute the convolution in TF32 (`tf32`): the kernel's float32 is three TF32 products a
    multiply-add (`gemm_kernel_sm80.py` says why not one), three times the tensor cores' work of
    the baseline's, and on the H200 every such convolution of the GEMM suite ran slower than
    Inductor's cuDNN (benchmarks/RESULTS.md). The direct kernel (few input channels) is no
    tensor-core GEMM and stays."""
    plan = plan_conv(graph, metas, arch)
    if tf32 and (plan.gemm if isinstance(plan, GemmTail) else plan).spec.dtype == "float32":
        raise Unsupported("a float32 convolution while its numerics let cuDNN compute it in TF32 (torch.backends.cudnn.allow_tf32, "
                          "on by default): the GEMM writer's float32 is 3xTF32, three times TF32's tensor-core work, and ran "
                          "0.36x to 0.72x of Inductor's cuDNN on such convolutions (benchmarks/RESULTS.md); with "
                          "cudnn.allow_tf32 off the writer takes it")
    return plan


def _read_gemm_with_tail(graph: fx.Graph, metas: list[Any], arch: str, tf32: bool = False) -> GemmPlan | GemmTail:
    """The GEMM of a graph of one matmul, with the built-in writer's kernel after it where the GEMM
    kernel alone cannot compute the task (`gemm_tail.has_tail`: a reduction after the product,
    values besides its end; a float32 end it cannot store). `tf32`: `plan_gemm`'s `matmul_tf32`."""
    read = functools.partial(_read_gemm, arch=arch, tf32=tf32)
    try:
        plan = read(graph, metas)
    except Unsupported:
        if not has_tail(graph):
            raise
        return plan_tail(graph, metas, read, read_tree=functools.partial(read, tree=True), tf32=tf32)
    if arch == "sm90" and _bare_unaligned(plan):
        raise Unsupported(f"an output of {plan.n} columns (not 16-byte rows) and nothing fused after the product: on Hopper "
                          "such rows are stored without TMA, element by element, which costs more than cuBLAS takes for the "
                          "whole product (an LM head's logits: every tiling at half Inductor's speed or less, "
                          "benchmarks/RESULTS.md), so Inductor's matmul stays")
    return plan


def _bare_unaligned(plan: GemmPlan) -> bool:
    """A 16-bit product with nothing fused after it (no scale, bias, residual, function, nor a
    float32 store) whose output rows are not 16 bytes: TMA cannot store them."""
    return plan.spec.dtype != "float32" and plan.n % 8 != 0 and plan.spec.epilogue == Epilogue() and not plan.spec.store


def _named(plan: Any, inputs: int, state: tuple[str, ...]) -> Any:
    """`plan` (a GemmPlan, or a head or tail around one) with the task's forward inputs counted and
    its parameters named (`GemmPlan.state`)."""
    if isinstance(plan, DirectConv) and plan.fallback is not None:
        plan = dataclasses.replace(plan, fallback=_named(plan.fallback, inputs, state))
    if isinstance(plan, GemmTail) and plan.wide is not None:
        plan = dataclasses.replace(plan, wide=_named(plan.wide, inputs, state))
    if isinstance(plan, GemmTail) and plan.kept is not None:
        plan = dataclasses.replace(plan, kept=_named(plan.kept, inputs, state))
    if isinstance(plan, (GemmHead, GemmTail)):
        return dataclasses.replace(plan, gemm=_named(plan.gemm, inputs, state))
    return dataclasses.replace(plan, inputs=inputs, state=state)


def _read_gemm(graph: fx.Graph, metas: list[Any], arch: str, tree: bool = False, tf32: bool = False) -> GemmPlan:
    """The GEMM of a graph of one matmul and its epilogue (`tree`: read as a visitor tree; `tf32`:
    a float32 product's search tries TF32 too, `GemmSpec.tf32`)."""
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    index = {p: i for i, p in enumerate(placeholders)}
    out, views = read_outputs(graph)
    matmuls = [n for n in graph.nodes if n.op == "call_function" and n.target in MATMULS]
    if len(matmuls) != 1:
        raise Unsupported(f"{len(matmuls)} matmuls (mm, addmm or bmm): the GEMM writer takes one")
    mm = matmuls[0]
    x, w, bias, nk, w_view, (batch, m, n, k) = _operands(mm, index, metas)
    xv = metas[index[x]]
    why = gemm_unaligned(m, n, k) if xv.dtype != torch.float32 and arch == "sm90" else ""  # (the sm80 kernel's: `sm80_alignment`)
    value = out.meta.get("val")
    if not isinstance(value, torch.Tensor) or value.numel() != batch * m * n or not value.is_contiguous():
        shape = tuple(value.shape) if isinstance(value, torch.Tensor) else "?"
        raise Unsupported(f"an output of shape {shape}: not the {m} x {n} product's values, row by row")
    out_shape = None if tuple(value.shape) == (*xv.shape[:-1], n) else tuple(int(d) for d in value.shape)
    epilogue, bias_in, residual_in, operands = read_epilogue(mm, out, bias, index, metas, (batch * m, n), xv.dtype, tree)
    if batch > 1 and "m" in epilogue.operands:
        raise Unsupported("a column of values per row in a batch of products (the kernel reads one column for all)")
    if value.dtype != xv.dtype and value.dtype != torch.float32:
        raise Unsupported(f"an output of {value.dtype} from {xv.dtype} inputs (the kernel stores its inputs' dtype or float32)")
    # only the output's rows unaligned (an LM head's N = 50257; w's rows are K long), a plain linear
    # combination after the product (a scale, a residual): stored directly by the sm90 kernel
    direct = bool(why) and k % 8 == 0 and nk and not (epilogue.bias or epilogue.tree or epilogue.activation != "identity")
    if why and not direct:  # else CUTLASS 2.x's kernel (cp.async's 4-byte copies, stores of any size), on Hopper too
        try:
            spec = gemm_spec(DTYPES[xv.dtype], epilogue, nk, n, k, "sm80")
        except Unsupported as exc:
            raise Unsupported(f"{why}, and {exc}") from None
    else:
        try:
            spec = gemm_spec(DTYPES[xv.dtype], epilogue, nk, n, k, arch, direct)
        except Unsupported:
            if tree or not (epilogue.bias and epilogue.residual):
                raise
            return _read_gemm(graph, metas, arch, tree=True, tf32=tf32)  # (CUTLASS 2.x's kernel reads one source; its tree reads both)
    if value.dtype != xv.dtype:  # (a float32 output of a 16-bit product, as a compiled model's residual stream for its norm)
        if spec.direct_store or not spec.can_end_in_float32:
            raise Unsupported(f"an output of {value.dtype} from {xv.dtype} inputs: the sm80 kernel beside a bias or a residual, "
                              "and a direct store, store the inputs' dtype")
        spec = dataclasses.replace(spec, store="float32")
    if tf32 and spec.dtype == "float32":
        spec = dataclasses.replace(spec, tf32=True)
    return GemmPlan(spec, m, n, k, len(placeholders), index[x], index[w], bias_in, residual_in, w_view, out_shape,
                    operands=operands, batch=batch, views=views)


def _operands(mm: fx.Node, index: dict[fx.Node, int], metas: list[Any]) -> tuple[Any, ...]:
    """The matmul's x and w (task inputs), addmm's bias (or None), whether w is read transposed
    (N x K), whether it is given transposed (an N x K weight as its K x N view; bmm's: its packed
    matrices' transpose), and (L, M, N, K): L products (bmm's batch: `gemm_chain.batched_operands`),
    each M x N over K."""
    if mm.target is aten.bmm.default:
        x, w, layout, w_view, sizes = batched_operands(mm, index, metas)
        nk, bias = layout == "nk", None
    else:
        bias = None
        if mm.target is aten.addmm.default:
            if mm.kwargs.get("beta", 1) != 1 or mm.kwargs.get("alpha", 1) != 1:
                raise Unsupported("addmm with alpha or beta")
            bias, a, b = mm.args[:3]
        else:
            a, b = mm.args[:2]
        x = _through(a, RESHAPES)
        transposed = isinstance(b, fx.Node) and b.target in _TRANSPOSES
        w = b.args[0] if transposed else b
        if not isinstance(x, fx.Node) or x.op != "placeholder":
            raise Unsupported("the matmul's left operand is not an input (read through a view at most)")
        if not isinstance(w, fx.Node) or w.op != "placeholder":
            raise Unsupported("the matmul's right operand is not an input (N x K read transposed, or K x N)")
        wv = metas[index[w]]
        # an N x K weight seen as its K x N transpose (strides (1, K)): read as nn.Linear keeps it
        w_view = not transposed and wv.dim() == 2 and wv.shape[0] > 1 and tuple(wv.stride()) == (1, wv.shape[0])
        nk, sizes = transposed or w_view, None
    xv, wv = metas[index[x]], metas[index[w]]
    for v, what in ((xv, "x"), (wv, "w")):
        if v.dtype not in DTYPES:
            raise Unsupported(f"{what} is {v.dtype}: the GEMM writer takes float16, bfloat16 and float32")
        if not v.is_contiguous() and not (what == "w" and w_view):
            raise Unsupported(f"{what} is not contiguous (nor the transpose of a contiguous N x K weight)")
    if xv.dtype != wv.dtype or (sizes is None and wv.dim() != 2):
        raise Unsupported("x and w of different dtypes, or w not 2-D")
    if sizes is None:
        n, k = wv.shape if nk and not w_view else reversed(wv.shape)
        sizes = (1, xv.numel() // k if k else 0, n, k)
    return x, w, bias, nk, w_view, sizes


def _through(node: Any, targets: tuple[Any, ...]) -> Any:
    while isinstance(node, fx.Node) and node.target in targets:
        node = node.args[0]
    return node


def _value(plan: GemmPlan, i: int) -> str:
    """The program's expression for the task's input `i`: a forward argument, or the model's own
    parameter or buffer (read by its path at every call: a buffer moved to the GPU is a new tensor)."""
    if i < plan.inputs:
        return f"v{i}"
    if i >= plan.inputs + len(plan.state):  # (a chain's earlier kernel's end)
        return f"y{i - plan.inputs - len(plan.state)}"
    name = plan.state[i - plan.inputs]
    return f"self.get_buffer({name[len('buffer:'):]!r})" if name.startswith("buffer:") else f"self.get_parameter({name!r})"


def _parameters_module(task_source: str) -> str:
    """The task's module with its Model renamed `KevinTaskParameters` and without its forward (and
    without `get_inputs`, `get_init_inputs`): what makes the model's parameters, none of what
    computes with them."""
    tree = ast.parse(task_source)
    tree.body = [n for n in tree.body if not (isinstance(n, ast.FunctionDef) and n.name in ("get_inputs", "get_init_inputs"))]
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == "Model":
            node.name = "KevinTaskParameters"
            node.body = [b for b in node.body if not (isinstance(b, ast.FunctionDef) and b.name == "forward")]
        elif isinstance(node, ast.Name) and node.id == "Model":
            node.id = "KevinTaskParameters"
    return ast.unparse(tree)


def write_gemm_program(plan: AnyGemm, tiling: Any, name: str | None = None, task_source: str = "") -> str:
    """A KernelBench-format candidate (ModelNew through load_inline) computing `plan` with CUTLASS
    (a chain: its kernels one after the other, each its own host function, with a `ChainTiling`).
    A task with parameters (`plan.state`) needs its own source (`task_source`): ModelNew inherits
    the construction of its Model (`_parameters_module`), so that the same seed makes the same
    parameters, and reads them by name."""
    name = name or "kevin_gemm_" + hashlib.sha256(repr((plan, tiling)).encode()).hexdigest()[:10]
    if plan.state and not task_source:
        raise ValueError("a task with parameters: its source is needed (ModelNew makes its parameters as its Model does)")
    if isinstance(plan, DirectConv):  # (the direct kernel, or a tiling of its implicit GEMM's plan)
        if isinstance(tiling, DirectTiling):
            return _direct_program(plan, tiling, name, task_source)
        if plan.fallback is None:
            raise ValueError(f"{tiling.name}: a direct convolution without an implicit GEMM's plan")
        return write_gemm_program(plan.fallback, tiling, name, task_source)
    head = plan if isinstance(plan, GemmHead) else None
    plan = head.gemm if head else plan
    tail = plan if isinstance(plan, GemmTail) else None
    if isinstance(tiling, WideEnd):  # (the tail's variant whose GEMM stores its end in float32)
        if tail is None or tail.wide is None:
            raise ValueError(f"{tiling.name}: a variant of a tail that exponentiates a 16-bit end")
        tail, tiling = tail.wide, tiling.tiling
    kept = None
    if isinstance(tiling, KeptEnd):  # (the tail's variant of one GEMM keeping its end beside its output)
        if tail is None or tail.kept is None:
            raise ValueError(f"{tiling.name}: a variant of a tail whose GEMM keeps its end")
        kept, plan, tail = tail, tail.kept, None
        if tiling.staged:
            plan = dataclasses.replace(plan, spec=dataclasses.replace(
                plan.spec, epilogue=dataclasses.replace(plan.spec.epilogue, after_staged=True)))
        tiling = tiling.tiling
    plan = tail.gemm if tail else plan
    chained = isinstance(plan, GemmChain)
    plans = plan.plans if chained else (plan,)
    tilings = tiling.tilings if chained else (tiling,)
    if len(tilings) != len(plans):
        raise ValueError(f"{len(plans)} kernels and {len(tilings)} tilings")
    devices, hosts, declarations, lines = [], [], [], []
    around = ""  # the built-in writer's own extensions: before the GEMM (its left operand), after it (a reduction)
    if head:
        around += _own_extension("head", head.head, name)
        lines.append(f"y0 = head.kevin_run({', '.join(_value(plans[0], i) for i in head.reads)})")
    first = 1 if head else 0  # (the number of the GEMM's own end: after the head's)
    for j, (p, t) in enumerate(zip(plans, tilings)):
        device, host = gemm_cuda_source(p.spec, t).split(_HOST_START, 1)
        declaration, function = gemm_cpp_source(p.spec), "gemm_epilogue"
        if chained:  # each kernel in its own namespace, its host function numbered
            device, host = device.replace("kevin_gemm", f"kevin_gemm{j}"), host.replace("kevin_gemm", f"kevin_gemm{j}")
            host, function = host.replace("gemm_epilogue(", f"gemm_epilogue{j}("), f"gemm_epilogue{j}"
            declaration = declaration.replace("gemm_epilogue(", f"{function}(")
        devices.append(device)
        hosts.append(_HOST_START + host)
        declarations.append(declaration)
        shaped = f".view({list(p.out_shape)})" if p.out_shape else ""
        if tail and p.views and (p.conv or p.spec.convolution is not None):  # (its output as it lies: the tail reads it viewed)
            (view,) = p.views
            shaped += view.removeprefix("return y")
        if kept:  # (its output, then the end it kept: each where the task returns it)
            lines += [f"y = ext.{function}({_call(p)})",
                      "return (" + ", ".join(f"y[1]{shaped}" if i in kept.ends else
                                             f"y[0].view({list(kept.kept_shape)})" if kept.kept_shape else f"y[0]{shaped}"
                                             for i in range(len(kept.ends) + 1)) + ",)"]
            continue
        last = j == len(plans) - 1 and not tail
        lines.append(f"{'y =' if last and p.views else 'return' if last else f'y{j + first} ='} ext.{function}({_call(p)}){shaped}")
        lines.extend(p.views if last else ())
    if tail:  # the built-in writer's kernel after the GEMM, in an extension of its own
        around += _own_extension("tail", tail.tail, name)
        call = f"tail.kevin_run({', '.join(_value(plans[0], i) for i in tail.reads)})"
        if tail.ends:  # (the GEMM's output returned too, among the tail's in the task's order)
            made = iter(["t"] if len(tail.tail.outputs) == 1 else [f"t[{k}]" for k in range(len(tail.tail.outputs))])
            end = _value(plans[0], tail.reads[-1])
            lines += [f"t = {call}", "return (" + ", ".join(end if i in tail.ends else next(made)
                                                          for i in range(len(tail.ends) + len(tail.tail.outputs))) + ",)"]
        else:
            lines.append(f"return {call}" if len(tail.tail.outputs) == 1 else f"return tuple({call})")
    args = ", ".join(f"v{i}" for i in range(plan.inputs))
    model = _model_class(plan, task_source)
    sm90 = not plans[0].spec.sm80 or type(tiling).__name__ == "ConvTiling"  # (Hopper's convolution: `conv_kernel.ConvTiling`)
    family = "CUTLASS 3.x (sm90)" if sm90 else "CUTLASS 2.x (sm80)"
    what = (f"a chain of {len(plans)} {family} GEMMs with their epilogues ({plan.describe()})" if chained else
            f"a {family} GEMM with its epilogue and its own kernels around it ({(head or tail).describe()})" if head or tail else
            f"a {family} GEMM with its epilogue ({plan.describe()})")
    functions = [f"gemm_epilogue{j}" for j in range(len(plans))] if chained else ["gemm_epilogue"]
    body = "".join(f"        {line}\n" for line in lines)
    # every output 16-bit: the epilogues' exp, log and division the device's (`gemm_kernel.MATH_HELPERS`)
    fast = FAST_MATH if all(p.spec.output in ("float16", "bfloat16") for p in plans) else ""
    return (
        f'"""Written by kevin\'s built-in writer: {what}, {tiling.name}."""\n'
        "import torch\nimport torch.nn as nn\nfrom torch.utils.cpp_extension import load_inline\n\n"
        f"cuda_source = r'''{fast}{''.join(devices)}{''.join(hosts)}'''\n\n"
        f"cpp_source = '{' '.join(declarations)}'\n\n"
        f"ext = load_inline(name='{name}', cpp_sources=cpp_source, cuda_sources=cuda_source, functions={functions!r},\n"
        f"                  extra_cuda_cflags={list(gemm_cuda_flags(plans[0].spec))!r})\n\n"
        f"{around}\n{model}"
        f"    def forward(self, {args}):\n"
        f"{body}"
    )


def _model_class(plan: Any, task_source: str) -> str:
    """The program's ModelNew class line (and `__init__`): the task's own module without its forward
    where the plan reads the model's parameters (`plan.state`)."""
    return (f"\n\n# The task's module without its forward: ModelNew makes the same parameters under the same seed\n"
            f"{_parameters_module(task_source)}\n\n\nclass ModelNew(KevinTaskParameters):\n" if plan.state else
            "class ModelNew(nn.Module):\n    def __init__(self, *init_inputs):\n        super().__init__()\n\n")


def _direct_program(plan: DirectConv, tiling: DirectTiling, name: str, task_source: str) -> str:
    """The KernelBench-format program of a direct convolution (`direct_conv.py`) in `tiling`."""
    cuda, declaration = direct_extension(plan, tiling)
    call = f"ext.kevin_run({', '.join(_value(plan, i) for i in plan.reads)})"  # type: ignore[arg-type]
    args = ", ".join(f"v{i}" for i in range(plan.inputs))
    return (
        f'"""Written by kevin\'s built-in writer: {plan.describe()}, {tiling.name}."""\n'
        "import torch\nimport torch.nn as nn\nfrom torch.utils.cpp_extension import load_inline\n\n"
        f"cuda_source = r'''{cuda}'''\n\n"
        f"cpp_source = '{declaration}'\n\n"
        f"ext = load_inline(name='{name}', cpp_sources=cpp_source, cuda_sources=cuda_source, functions=['kevin_run'],\n"
        "                  extra_cuda_cflags=['-O3'])\n\n"
        f"{_model_class(plan, task_source)}"
        f"    def forward(self, {args}):\n"
        f"        return {call if len(plan.outputs) == 1 else f'tuple({call})'}\n"
    )


def own_variant(part: Plan) -> Variant:
    """The variant of the built-in writer's own kernel before or after a GEMM: the one its ranking
    puts first for the part's shape (`variant_ranking.preferred_order`). (Its plain first variant,
    a block of 256 threads a row, took 5.9 ms on the H200 for a softmax over the 16 channels of a
    3-D convolution's 1.6M positions, where Inductor's whole task took 0.56.)"""
    return variant_named(part, preferred_order(part)[0])


def _own_extension(role: str, part: Any, name: str) -> str:
    """The program's line building the built-in writer's own kernel of `part` (`own_variant`)
    as the extension `role` ("head" before the GEMM, "tail" after it)."""
    made = extension(part, own_variant(part))
    return (f"{role} = load_inline(name='{name}_{role}', cpp_sources='{made.declaration}', cuda_sources=r'''{made.cuda}''',\n"
            "                   functions=['kevin_run'], extra_cuda_cflags=['-O3'])\n\n")

# where a kernel's host function begins in its CUDA source (the devices' parts all go before it)
_HOST_START = "\n#include <torch/extension.h>"


def _call(plan: GemmPlan) -> str:
    """The host function's arguments for `plan`: x, w, then the bias and the residual (empty where
    absent), or a tree's operands."""
    x = _value(plan, plan.x)
    empty = f"torch.empty(0, device={x}.device, dtype={x}.dtype)"
    w = _value(plan, plan.w)
    operands = ([_value(plan, i) for i in plan.operands] if plan.spec.epilogue.tree else
                [_value(plan, plan.bias) if plan.bias is not None else empty,
                 _value(plan, plan.residual) if plan.residual is not None else empty])
    if plan.batch > 1:  # (w given as the transpose of packed matrices: passed packed)
        w = f"{w}.transpose(-2, -1)" if plan.w_view else w
        w = f"{w}.reshape(-1, {w}.shape[-2], {w}.shape[-1])"
    elif plan.w_view:
        w = f"{w}.t()"
    if plan.conv:
        x, w = f"{x}.permute(0, 2, 3, 1)", f"{w}.flatten(1)"
    if plan.conv1d:  # (and a tree's tensors of the output's size: 2-D, of height 1)
        x, w = f"{x}.unsqueeze(2)", f"{w}.unsqueeze(2)"
        operands = [f"{a}.unsqueeze(2)" if kind == "mn" else a for a, kind in zip(operands, plan.spec.epilogue.operands)] \
            if plan.spec.epilogue.tree else operands
    return ", ".join([x, w, *operands])


def plan_tilings(plan: AnyGemm) -> tuple[Any, ...]:
    """The variants a search of `plan` tries, in order (`gemm_kernel.tilings_for`; a chain's:
    `chain_tilings`; a GEMM with the writer's own kernels around it: its GEMM's)."""
    if isinstance(plan, GemmTail) and plan.wide is not None:  # then its end in float32, with the first two
        own = plan_tilings(plan.gemm)
        return own + tuple(WideEnd(t) for t in own[:2])
    # one kernel keeping the end, after the GEMM and the writer's kernel: on the H200 its store from
    # registers made it slower (a GPT-2 pre-activation and GELU 1.03x Inductor, the two kernels 1.29x),
    # so its end is staged through shared memory as the output is, in two tilings, then from registers
    # in one. It is the variant whose float32 copy of the end the judge takes: first where the tail's
    # value is such a copy (`GemmTail.kept_first`), else tried first once a turn is refused (`gemm_turn`)
    if isinstance(plan, GemmTail) and plan.kept is not None:
        own = plan_tilings(plan.kept)
        kept = tuple(KeptEnd(t, staged=True) for t in own[:2]) + (KeptEnd(own[0]),)
        return kept + plan_tilings(plan.gemm) if plan.kept_first else plan_tilings(plan.gemm) + kept
    if isinstance(plan, (GemmTail, GemmHead)):
        return plan_tilings(plan.gemm)
    if isinstance(plan, DirectConv):  # (the direct kernel's, then its implicit GEMM's)
        return direct_tilings(plan) + (plan_tilings(plan.fallback) if plan.fallback is not None else ())
    if isinstance(plan, GemmChain):
        return chain_tilings(plan)
    return tilings_for(plan.spec, (plan.batch * plan.m, plan.n, plan.k))


def gemm_turn(source: str, plan: AnyGemm, index: int, history: list[tuple[str, float | None]]) -> tuple[str, str, str]:
    """One turn of a GEMM search: (the tiling's name, the program, why this one), from the
    trajectory's earlier turns (`history`: each tiling's name and the judge's kernel ms, None
    where not accepted). Untried tilings first, in `tilings_for` order from this trajectory's
    own start (`index`), then the fastest again. A tail's variants storing its end in float32
    (`WideEnd`) or keeping it beside the tail's value (`KeptEnd`: the tail's float32 copy of it
    unrounded) come last, or first once a turn was not accepted or where the tail's value is a
    float32 one of a 16-bit end (`GemmTail.kept_first`)."""
    tilings = plan_tilings(plan)
    names = [t.name for t in tilings]
    tried, failed = {name for name, _ in history}, any(ms is None for _, ms in history)
    untried = _untried(plan, tilings, index, tried, failed)
    timed = [(ms, name) for name, ms in history if ms is not None and name in names]
    if untried:
        choice, why = untried[0], f"{len(tried & set(names))} of {len(names)} tilings tried"
        wide = [t.name for t in tilings if isinstance(t, (WideEnd, KeptEnd))]
        if choice in wide and (failed or (isinstance(plan, GemmTail) and plan.kept_first)):
            kind = type(tilings[names.index(choice)])
            why += ("; a turn was not accepted" if failed else "; the tail's value is a float32 one of the 16-bit end") + \
                ": the end kept " + ("in float32" if kind is WideEnd else "beside the tail's value, in one kernel")
    elif timed:
        choice, why = min(timed)[1], "every tiling tried: the fastest again"
    else:
        choice, why = names[index % len(names)], "no tiling accepted yet"
    return choice, _turn_program(source, plan, tilings, names.index(choice)), why


def _untried(plan: AnyGemm, tilings: tuple[Any, ...], index: int, tried: set[str], failed: bool) -> list[str]:
    """The tilings not tried yet, in the order `gemm_turn` takes them: the narrow ones from the
    trajectory's start (`index`), the wide ends (`WideEnd`, `KeptEnd`) after them, or before them
    once a turn was not accepted (`failed`) or where the tail's value is a float32 one."""
    wide = [t.name for t in tilings if isinstance(t, (WideEnd, KeptEnd))]
    narrow = [t.name for t in tilings if t.name not in wide]
    order = [narrow[(index + k) % len(narrow)] for k in range(len(narrow))]
    first = failed or (isinstance(plan, GemmTail) and plan.kept_first)
    return [name for name in (wide + order if first else order + wide) if name not in tried]


def _turn_program(source: str, plan: AnyGemm, tilings: tuple[Any, ...], number: int) -> str:
    """The program of a search's turn in tiling `tilings[number]` (its extension named by the task
    and the number, so a program written ahead is the very one its turn writes)."""
    digest = hashlib.sha256(source.encode()).hexdigest()[:10]
    return write_gemm_program(plan, tilings[number], name=f"kevin_gemm_{digest}_{number}", task_source=source)


def gemm_ahead(source: str, plan: AnyGemm, history: list[tuple[str, Any]], index: int = 0,
               turns_left: int | None = None) -> list[str]:
    """The programs a GEMM search's later turns may write, whatever the judge says of the turns
    before (`history`: the tilings' names and verdicts so far, the last one's verdict still
    unknown); `gemm_turn` writes one of them, or one built already (the fastest again). Built ahead
    while a turn is judged, a change of tiling finds its program built. With `turns_left`, only the
    tilings the next that many turns can reach, whichever turns are accepted, nearest turn first
    (a two-turn search of eight tasks foresees a program or two each, not every tiling: builds that
    no turn takes would hold the build slots the next turns' own builds wait for); else every
    tiling not tried yet."""
    tilings = plan_tilings(plan)
    tried = [name for name, _ in history]
    if turns_left is None:
        return [_turn_program(source, plan, tilings, j) for j, t in enumerate(tilings) if t.name not in tried]
    names = [t.name for t in tilings]
    failed_before = any(ms is None for _, ms in history[:-1])
    # The choice depends on the tilings tried and on whether a turn was refused, which once true
    # stays true: the first refusal's turn (none, the current one, or one of the next) sets a path.
    paths = [(set(tried), refused_at) for refused_at in range(-1, turns_left)]
    reached: list[str] = []
    for turn in range(1, turns_left + 1):
        for seen, refused_at in paths:
            untried = _untried(plan, tilings, index, seen, failed_before or 0 <= refused_at < turn)
            if untried:
                seen.add(untried[0])
                reached += [] if untried[0] in reached else [untried[0]]
    return [_turn_program(source, plan, tilings, names.index(name)) for name in reached]
