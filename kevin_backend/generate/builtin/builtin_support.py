"""What the built-in writer declares to the partitioner (`BuiltinSupport`): the nodes it may take,
and what a reduction must share with the other reductions of its kernel.

    ok, why = BuiltinSupport().supports(node)   # (False, "mm ... CUTLASS's headers are not installed ...")

Matmuls (mm, addmm, bmm, baddbmm) it declares where its CUTLASS GEMM can run (`gemm_available`: CUTLASS's
headers found, a GPU of compute capability 8.0 or later: `gemm_arch`), each in a partition of its own with the epilogue that follows it
(`epilogue_only`: no prologue, no other partition merged in, no reduction), and convolutions alike
(its plan declines those it cannot write: grouped ones of many channels a group, transposed 3-D
ones of many channels; Inductor keeps them; a depthwise or grouped one of few channels a group is
the direct kernel's), except that
a convolution the direct kernel may take (`direct_conv.py`) shares its partition with the reductions
over its channels that follow it (`reduction_key`), and is declared without CUTLASS too
(`direct_available`). The
reason says what is missing (`no_matmul_reason`), so the report tells a user what to install."""

from __future__ import annotations

import weakref

import torch
import torch.fx as fx

from kevin_backend.config import ConfigError
from kevin_backend.generate.builtin.cross_entropy import match_decomposed_nll
from kevin_backend.generate.builtin.direct_conv import takes
from kevin_backend.generate.builtin.graph_nodes import REDUCTIONS, VIEWS, node_value, op_name, reduced_dims
from kevin_backend.generate.builtin.ops import check as check_pointwise, is_pointwise
from kevin_backend.generate.op_support import MATMUL_OPS
from kevin_backend.toolchain.cutlass_headers import find_cutlass

__all__ = ["BuiltinSupport", "direct_available", "gemm_arch", "gemm_available", "no_matmul_reason"]

_GEMM_OPS = (torch.ops.aten.mm.default, torch.ops.aten.addmm.default, torch.ops.aten.bmm.default, torch.ops.aten.baddbmm.default,
             torch.ops.aten.convolution.default)

aten = torch.ops.aten


class BuiltinSupport:
    """What the built-in writer declares to the partitioner: the pointwise ops of its op table,
    the reductions above (over any dimensions; a task whose reductions differ in them is
    declined by its plan) and the views that keep rows in place. Whether a whole
    partition fits one of its two kernels is decided per task (`plan_task`), with the reason.
    Cross-entropy's last step as Inductor decomposes it (`DecomposedNll`: int64 targets, a gather,
    sums over the rows) is declared as a whole: its task folds back to `nll_loss_forward`."""

    name = "builtin"
    epilogue_only = True  # a matmul's partition: the matmul and what follows it (`partition.py`)

    def __init__(self) -> None:
        self._nll: tuple[weakref.ref[fx.Graph], int, frozenset[fx.Node]] | None = None

    def _nll_nodes(self, graph: fx.Graph) -> frozenset[fx.Node]:
        """The nodes of every `DecomposedNll` in `graph` (found once per graph and size)."""
        if self._nll is None or self._nll[0]() is not graph or self._nll[1] != len(graph.nodes):
            found = (match_decomposed_nll(n) for n in graph.nodes if n.target is aten.gather.default)
            self._nll = (weakref.ref(graph), len(graph.nodes), frozenset().union(*(m.nodes for m in found if m is not None)))
        return self._nll[2]

    def supports(self, node: fx.Node) -> tuple[bool, str]:
        target = node.target
        if node in self._nll_nodes(node.graph):
            return True, ""
        if target in REDUCTIONS:
            val = node.args[0].meta.get("val") if isinstance(node.args[0], fx.Node) else None
            if not isinstance(val, torch.Tensor) or not val.dim():
                return False, f"{op_name(node)} of a 0-dimensional value"
            if val.dtype not in (torch.float32, torch.float16, torch.bfloat16):
                return False, f"{op_name(node)} of {val.dtype} values"
            return True, ""
        if target in VIEWS or target is aten.masked_fill.Scalar:
            return True, ""
        if is_pointwise(node):
            reason = check_pointwise(node)
            return (True, "") if reason is None else (False, reason)
        if target in MATMUL_OPS or target is aten.convolution.default:
            reason = no_matmul_reason(op_name(node))
            if reason and target is aten.convolution.default and _direct(node) and direct_available():
                return True, ""  # (the direct kernel: no CUTLASS, any GPU of compute capability 7.0 or later)
            return not reason, reason
        return False, f"{op_name(node)} not declared by writer 'builtin'"

    def reduction_key(self, node: fx.Node) -> tuple[tuple[int | str, ...], tuple[int, ...]] | None:
        """What a reduction node must share with every other reduction of its kernel (a plan
        reduces one set of dimensions of one iteration space): the reduced value's shape and the
        dimensions; None for other nodes. The partitioner keeps reductions of different keys apart."""
        if node.op == "call_function" and node.target is aten.convolution.default and _direct(node) and node.args[8] == 1:
            # (a convolution the direct kernel takes: its reductions over the channels share its
            # kernel, as KernelBench's min or softmax over them after a 3 -> 16 convolution; not a
            # depthwise or grouped one's, whose threads hold a few channels each)
            return tuple(node.meta["val"].shape), (1,)
        if node.op == "call_function" and node.target in _GEMM_OPS:
            return ("gemm", node.name)  # (no reduction shares a kernel with a matmul)
        if node.op != "call_function" or node.target not in REDUCTIONS or node in self._nll_nodes(node.graph):
            return None  # (a cross-entropy's sums over its rows fold into its nll_loss_forward)
        val = node_value(node.args[0]) if node.args else None
        if val is None:
            return None
        # (a symbolic size, under dynamic shapes, by its expression: SymInts do not hash)
        return tuple(d if isinstance(d, int) else str(d) for d in val.shape), reduced_dims(node, val.dim())


def _direct(conv: fx.Node) -> bool:
    """Whether a convolution node is one the direct kernel may take (`direct_conv.plan_direct`:
    one group, transposed or not, few input values per output and few output channels; a
    depthwise one, one channel a group; or a grouped one of few channels a group)."""
    w, val, groups = conv.args[1], conv.meta.get("val"), conv.args[8]
    shape = getattr(w.meta.get("val"), "shape", None) if isinstance(w, fx.Node) else None
    if shape is None or not isinstance(val, torch.Tensor) or not isinstance(groups, int):
        return False
    return all(isinstance(d, int) for d in (*shape, *val.shape)) and takes(tuple(shape), bool(conv.args[6]), groups)


def no_matmul_reason(op: str) -> str:
    """Why the built-in writer leaves a matmul or a convolution `op` (mm, addmm, bmm, baddbmm,
    convolution) to Inductor here, with what it found of CUTLASS's headers and the GPU; "" where
    it writes them."""
    declined = f"{op} (a matmul or convolution) not declared by writer 'builtin'"
    try:
        headers = find_cutlass()
    except ConfigError as exc:
        return f"{declined}: {exc}"
    if headers is None:
        return f"{declined}: CUTLASS's headers are not installed (pip install \"kevin_backend[cutlass]\")"
    if not gemm_arch():
        found = "no GPU" if not torch.cuda.is_available() else "compute capability %d.%d" % torch.cuda.get_device_capability()
        return f"{declined}: its CUTLASS GEMM needs a GPU of compute capability 8.0 or later ({found}; CUTLASS {headers.version} found)"
    return ""


def gemm_available() -> bool:
    """Whether the built-in writer writes CUTLASS GEMMs here."""
    return not no_matmul_reason("mm")


def direct_available() -> bool:
    """Whether the direct convolution (`direct_conv.py`: plain CUDA, no CUTLASS) runs here: a GPU of
    compute capability 7.0 or later."""
    return torch.cuda.is_available() and torch.cuda.get_device_capability() >= (7, 0)


def gemm_arch() -> str:
    """The GEMM kernels' family for the GPU here: "sm90" on Hopper (TMA, wgmma: `gemm_kernel.py`),
    "sm80" on Ampere, Ada and later GPUs (CUTLASS 2.x's kernel, built for the GPU: `gemm_kernel_sm80.py`),
    "" without a GPU of compute capability 8.0 or later."""
    if not torch.cuda.is_available():
        return ""
    capability = torch.cuda.get_device_capability()
    return "sm90" if capability == (9, 0) else "sm80" if capability >= (8, 0) else ""
