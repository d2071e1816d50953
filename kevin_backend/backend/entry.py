"""The `kevin` backend: the function `torch.compile(model, backend="kevin")` calls.

It is registered through the `torch_dynamo_backends` entry point (pyproject.toml), so it needs no
import before use. It must stay an undecorated module-level function: Dynamo guards on the
backend object's identity, and registering the same name again here would clash with the entry
point.
"""

from __future__ import annotations

import copy
import logging
from typing import Any, Sequence

import torch
import torch.fx as fx

# Imported here, not on the first compile: `torch.compile(m, backend="kevin")` loads this module,
# as `torch.compile(m)` loads Inductor, so the first compile does not pay for these imports.
from torch._inductor.compile_fx import compile_fx

from kevin_backend.backend import runtime
from kevin_backend.backend.kevin_pass import INFERENCE_AWARE, KevinPass, PassBase
from kevin_backend.backend.report import Status, begin_report, counters
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
    runtime.use_cache(cache)
    if not torch.cuda.is_available() and not config.cpu_kernels:
        _say_once(report.notes, "no CUDA device: generated kernels need CUDA, Inductor compiles everything")

    kevin_pass = KevinPass(config, cache, report)
    existing = torch._inductor.config.post_grad_custom_pre_pass
    if existing is not None:
        kevin_pass = _Chain(existing, kevin_pass)
    # Inductor may change the graph it is given: keep a copy for the fallback compile.
    backup = fx.GraphModule(gm, copy.deepcopy(gm.graph))
    backup.meta.update(gm.meta)
    try:
        return compile_fx(gm, example_inputs, config_patches={**patches, "post_grad_custom_pre_pass": kevin_pass})
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
