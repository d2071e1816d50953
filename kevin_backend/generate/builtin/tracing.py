"""A task's aten graph, traced on meta tensors shaped like its inputs, with the composite ops it may
call (softmax, log_softmax, logsumexp, layer norm, ...) decomposed into the pointwise ops and
reductions the built-in writer knows.

    gm, metas = trace(task_source)     # under TRACE_LOCK: tracing takes turns
    gm, metas, names = trace_with_parameters(task_source)   # the model's parameters and buffers as
                                                            # inputs after the forward's, by name
"""

from __future__ import annotations

import threading
from typing import Any

import torch
import torch.fx as fx

from kevin_backend.generate.builtin.cross_entropy import fold_decomposed_nll
from kevin_backend.generate.builtin.ops import Unsupported
from kevin_backend.types import load_program

__all__ = ["trace", "trace_with_parameters", "TRACE_LOCK"]

aten = torch.ops.aten

# Ops a task may call that the tracer decomposes into the reductions of `graph_nodes.REDUCTIONS` (and pointwise ops).
_DECOMPOSED = [
    aten._softmax, aten._log_softmax, aten.softmax, aten.log_softmax, aten.logsumexp, aten.native_layer_norm,
    aten.layer_norm, aten.silu, aten.mish, aten.hardswish, aten.hardsigmoid,
    aten.rms_norm, aten._fused_rms_norm, aten.linalg_vector_norm, aten.native_group_norm, aten.group_norm,
    aten.native_batch_norm, aten._native_batch_norm_legit_no_training, aten._native_batch_norm_legit_functional,
    aten.batch_norm, aten.instance_norm, aten.smooth_l1_loss, aten.huber_loss, aten.mse_loss, aten.kl_div,
]


class _OnMeta(torch.overrides.TorchFunctionMode):
    """Makes a task's `get_inputs()` build meta tensors wherever it asks for a device: the writer
    needs shapes, strides and dtypes, not data (and runs where no GPU is)."""

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = dict(kwargs or {})
        if func in (torch.Tensor.cuda, torch.Tensor.cpu):
            return args[0]
        if "device" in kwargs:
            kwargs["device"] = "meta"
        if func is torch.Tensor.to:
            args = tuple("meta" if isinstance(a, (str, torch.device)) else a for a in args)
        return func(*args, **kwargs)


def trace(task_source: str) -> tuple[fx.GraphModule, list[Any]]:
    """The task's aten graph on meta tensors shaped like its inputs, composites decomposed."""
    gm, metas, names = _trace(task_source, lift=False)
    return gm, metas


def trace_with_parameters(task_source: str) -> tuple[fx.GraphModule, list[Any], list[str]]:
    """As `trace`, with the model's parameters and buffers as the graph's last inputs (their metas
    after the forward's), and their names in order: `get_parameter` paths, then `get_buffer` paths
    marked with a leading "buffer:"."""
    return _trace(task_source, lift=True)


def _trace(task_source: str, lift: bool) -> tuple[fx.GraphModule, list[Any], list[str]]:
    from torch._decomp import get_decompositions
    from torch.fx.experimental.proxy_tensor import make_fx

    module = load_program(task_source, "kevin_builtin_task")
    with torch.device("meta"), _OnMeta():
        model = module.Model(*module.get_init_inputs())
        metas = list(module.get_inputs())
    state = {**dict(model.named_parameters()), **dict(model.named_buffers())}
    if state and not lift:
        raise Unsupported("the task has parameters or buffers (the built-in writer takes tensor inputs only)")
    names = list(state)
    table = get_decompositions(_DECOMPOSED)
    count = len(metas)

    def forward(*args: Any) -> Any:
        if not names:
            return model(*args)
        return torch.func.functional_call(model, dict(zip(names, args[count:])), tuple(args[:count]))

    # the forward too: a partition's task makes its scalars on the graph's device
    # (`aten.full.default(..., device=cuda:0)`), which must be meta beside meta inputs
    lifted = [state[n].detach() for n in names]
    with _OnMeta():
        gm = make_fx(forward, decomposition_table=table)(*metas, *lifted)
    fold_decomposed_nll(gm.graph)
    gm.graph.eliminate_dead_code()  # what decompositions make and nothing reads (a norm's unused saved statistics)
    gm.recompile()
    buffers = {n for n, _ in model.named_buffers()}
    return gm, metas + lifted, [f"buffer:{n}" if n in buffers else n for n in names]


# make_fx keeps its patching state in module globals: two traces at once in one process break
# each other (searches of several tasks run in threads), so tracing takes turns.
TRACE_LOCK = threading.Lock()
