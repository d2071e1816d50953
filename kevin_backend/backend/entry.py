"""The `kevin` backend: the function `torch.compile(model, backend="kevin")` calls.

It is registered through the `torch_dynamo_backends` entry point (pyproject.toml), so it needs no
import before use. It must stay an undecorated module-level function: Dynamo guards on the
backend object's identity, and registering the same name again here would clash with the entry
point.
"""

from __future__ import annotations

import copy
import logging
from pathlib import Path
from typing import Any, Sequence

import torch
import torch.fx as fx

# Imported here, not on the first compile: `torch.compile(m, backend="kevin")` loads this module,
# as `torch.compile(m)` loads Inductor, so the first compile does not pay for these imports.
from torch._inductor.compile_fx import compile_fx

from kevin_backend.runtime import registry as runtime
from kevin_backend.backend.graph_check import GraphCheck, graph_key, load_outcome
from kevin_backend.backend.kevin_pass import INFERENCE_AWARE, KevinPass, PassBase
from kevin_backend.backend.report import CompileReport, Status, begin_report
from kevin_backend.runtime.counters import counters
from kevin_backend.cache.key import current_numerics, inductor_config
from kevin_backend.cache.store import KernelCache
from kevin_backend.config import Config, Mode, env_value

__all__ = ["kevin"]

log = logging.getLogger("kevin_backend")
_said: set[str] = set()


def _say_once(report_notes: list[str], text: str) -> None:
    report_notes.append(text)
    if text not in _said:
        _said.add(text)
        log.warning("kevin: %s", text)


def _configure_logging() -> None:
    """Apply KEVIN_LOG to the package's logger, once, on the first compile (not at import)."""
    if "logging" in _said:
        return
    _said.add("logging")
    level = str(env_value("KEVIN_LOG")).upper()
    log.setLevel(level)
    if level != "WARNING" and not log.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(levelname)s kevin_backend: %(message)s"))
        log.addHandler(handler)


def _inductor_patches(mode: str | None) -> dict[str, Any]:
    if not mode or mode == "default":
        return {}
    from torch._inductor import list_mode_options

    return dict(list_mode_options(mode))


def kevin(
    gm: fx.GraphModule,
    example_inputs: Sequence[Any],
    *,
    options: dict[str, Any] | None = None,
    mode: str | None = None,
) -> Any:
    """Compile `gm` with Inductor, with cached kernels swapped in for the partitions that have one.

    `options` are kevin's (see `Config`); `mode` is torch.compile's Inductor mode
    ("max-autotune", ...), passed through to Inductor.
    """
    _configure_logging()
    config = Config.from_options(options)
    report = begin_report(config.fingerprint())
    counters.add("compiles")
    patches = _inductor_patches(mode)
    if config.mode is Mode.OFF:
        return compile_fx(gm, example_inputs, config_patches=patches)

    cache = KernelCache.from_config(config)
    runtime.use_cache(cache, config)  # its kernels are built under this compile's cache folder
    if not torch.cuda.is_available() and not config.cpu_kernels:
        _say_once(report.notes, "no CUDA device: generated kernels need CUDA, Inductor compiles everything")

    # Inductor may change the graph it is given: keep a copy for the fallback compile.
    backup = fx.GraphModule(gm, copy.deepcopy(gm.graph))
    backup.meta.update(gm.meta)
    try:
        return _compile(gm, backup, example_inputs, config, cache, report, patches)
    except Exception as exc:
        # Dynamo's own control flow (restart analysis and the like) passes through, and so does
        # any failure of a graph the kevin pass did not change: plain Inductor would fail alike.
        if isinstance(exc, _dynamo_control_flow()) or not any(
            r.status in (Status.HIT, Status.GENERATED) for r in report.records()
        ):
            raise
        counters.add("compile_fallbacks")
        _say_once(report.notes, f"compile with kevin kernels failed ({type(exc).__name__}: {exc}); plain Inductor instead")
        return compile_fx(backup, example_inputs, config_patches=patches)


def _kevin_pass(config: Config, cache: KernelCache, report: CompileReport, dropped: dict[str, str],
                counting: bool = True) -> PassBase:
    kevin_pass = KevinPass(config, cache, report, dropped=dropped, counting=counting)
    existing = torch._inductor.config.post_grad_custom_pre_pass
    return kevin_pass if existing is None else _Chain(existing, kevin_pass)


def _compile(gm: fx.GraphModule, backup: fx.GraphModule, example_inputs: Sequence[Any], config: Config,
             cache: KernelCache, report: CompileReport, patches: dict[str, Any]) -> Any:
    """Inductor with the kevin pass; then, unless the graph-level check is off, the graph wrapped
    in its check (graph_check.py), or compiled with the kernels a stored check kept."""
    checking = config.graph_check and (torch.cuda.is_available() or config.cpu_kernels)
    if not checking:
        return compile_fx(gm, example_inputs, config_patches={**patches, "post_grad_custom_pre_pass": _kevin_pass(config, cache, report, {})})
    store = Path(config.cache_dir) / "graph_checks"
    key = graph_key(backup, example_inputs, {"config": config.fingerprint(), "numerics": current_numerics(),
                                             "inductor": inductor_config(patches)})
    stored = load_outcome(store, key)
    if stored is not None and stored.cache_fingerprint != cache.fingerprint():
        stored = None  # the cache changed since: other kernels may be found, measure again
    dropped = stored.dropped if stored is not None else {}
    compiled = compile_fx(gm, example_inputs, config_patches={**patches, "post_grad_custom_pre_pass": _kevin_pass(config, cache, report, dropped)})
    if stored is not None and stored.unconfirmed:
        report.notes.append(f"graph check: the stored outcome keeps {len(stored.kept)} kernel(s) on another process's rounds "
                            "alone; timed again on the first call")
    elif stored is not None:
        counters.add("graph_checks_stored")
        report.notes.append(f"graph check: the stored outcome stands ({stored.summary})")

    def compile_variant(drop: dict[str, str] | None) -> Any:
        fresh = fx.GraphModule(backup, copy.deepcopy(backup.graph))
        fresh.meta.update(backup.meta)
        if drop is None:  # Inductor alone
            return compile_fx(fresh, example_inputs, config_patches=patches)
        scratch = CompileReport(config=report.config)  # the variants' records are not the compile's
        return compile_fx(fresh, example_inputs, config_patches={**patches, "post_grad_custom_pre_pass": _kevin_pass(config, cache, scratch, drop, counting=False)})

    # (a stored outcome to confirm names its kernels where Inductor's cache served the graph's code without the pass)
    kernels = any(r.status in (Status.HIT, Status.GENERATED) for r in report.records()) or (stored is not None and stored.unconfirmed)
    training = torch.is_grad_enabled() and any(isinstance(v, torch.Tensor) and v.requires_grad for v in example_inputs)
    if not kernels and not training:  # no kevin kernel in this graph: nothing to check
        return compiled
    sizes = _verified_sizes(backup, example_inputs)
    other_sizes = compile_variant(None) if sizes else None
    return GraphCheck(compiled, compile_variant, report, store, key, cache, config.margin, sizes, stored, other_sizes)


def _verified_sizes(gm: fx.GraphModule, example_inputs: Sequence[Any]) -> list[tuple[int, Any]]:
    """Under dynamic shapes, the arguments with symbolic sizes and the sizes this compile saw
    (the ones its kernels were made and verified for); empty for a static graph."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    sizes: list[tuple[int, Any]] = []
    for i, (node, value) in enumerate(zip(placeholders, example_inputs)):
        meta = node.meta.get("example_value", node.meta.get("val"))
        if isinstance(meta, torch.SymInt):
            sizes.append((i, _concrete(value)))
        elif isinstance(meta, torch.Tensor) and any(isinstance(s, torch.SymInt) for s in meta.shape):
            sizes.append((i, tuple(_concrete(s) for s in value.shape)))
    return sizes


def _concrete(value: Any) -> int:
    if isinstance(value, torch.SymInt):
        hint = value.node.hint
        if hint is None:
            raise ValueError(f"size {value} has no hint")
        return int(hint)
    return int(value)


def _dynamo_control_flow() -> tuple[type[BaseException], ...]:
    from torch._dynamo import exc as dynamo_exc

    names = ("RestartAnalysis", "TensorifyScalarRestartAnalysis", "SkipFrame", "ObservedException")
    return tuple(t for t in (getattr(dynamo_exc, n, None) for n in names) if isinstance(t, type))


class _Chain(PassBase):  # type: ignore[misc, valid-type]
    """A user's own post-grad pass followed by the kevin pass (both keep running)."""

    def __init__(self, first: Any, second: KevinPass) -> None:
        self.first, self.second = first, second

    def uuid(self) -> Any:
        first = self.first.uuid() if hasattr(self.first, "uuid") else None
        return None if first is None else (first, self.second.uuid())

    def __call__(self, graph: fx.Graph, is_inference: bool | None = None) -> None:
        if INFERENCE_AWARE is not None and isinstance(self.first, INFERENCE_AWARE):
            self.first(graph, is_inference=bool(is_inference))
        else:
            self.first(graph)
        self.second(graph, is_inference)
