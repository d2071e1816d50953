"""Where prewarm's work comes from: recorded misses, a model, or a folder of tasks.

Every source ends the same way: the tasks are recorded as pending in the kernel cache (so a run
killed at any moment resumes from the cache alone) and returned as `WorkItem`s; a task whose key
already has an entry is finished and skipped unless forced.
"""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from kevin_backend.cache.key import CacheKey, make_key
from kevin_backend.cache.store import KernelCache
from kevin_backend.config import Config
from kevin_backend.types import KernelTask

__all__ = ["WorkItem", "SourceError", "from_pending", "from_model", "from_folder"]


class SourceError(ValueError):
    """A source of tasks cannot be read; the message says which and why."""


@dataclass(frozen=True)
class WorkItem:
    key: CacheKey
    task: KernelTask
    origin: str  # "pending", "model:FILE:FACTORY", "folder:FILE"

    @property
    def digest(self) -> str:
        return self.key.digest


def from_pending(cache: KernelCache) -> list[WorkItem]:
    return [WorkItem(p.key, p.task, "pending") for p in cache.pending()]


def from_folder(folder: Path, cache: KernelCache) -> list[WorkItem]:
    """Every KernelBench-format task (`*.py` defining Model) in `folder`, recorded as pending."""
    folder = Path(folder)
    if not folder.is_dir():
        raise SourceError(f"no such folder: {folder}")
    items = []
    for path in sorted(folder.glob("*.py")):
        source = path.read_text()
        if "class Model" not in source:
            continue
        try:
            task = KernelTask.from_program(path.stem, source)
        except Exception as exc:
            raise SourceError(f"{path}: running the task failed: {type(exc).__name__}: {exc}") from exc
        key = make_key(task)
        cache.record_pending(key, task)
        items.append(WorkItem(key, task, f"folder:{path.name}"))
    if not items:
        raise SourceError(f"{folder} holds no KernelBench-format task (a .py file defining Model)")
    return items


def from_model(spec: str, config: Config, cache: KernelCache, train: bool = True) -> list[WorkItem]:
    """`path/to/file.py:factory`: the factory returns (model, example_inputs); the model is compiled
    in `cache` mode, once for inference and once for a training step, which records every
    partition it misses as pending; those are the work."""
    import kevin_backend

    path_text, _, name = spec.rpartition(":")
    path = Path(path_text)
    if not path_text or not name or not path.is_file():
        raise SourceError(f"expected FILE.py:FACTORY with an existing file, got {spec!r}")
    module_spec = importlib.util.spec_from_file_location(f"kevin_prewarm_{path.stem}", path)
    assert module_spec is not None and module_spec.loader is not None
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[module_spec.name] = module
    module_spec.loader.exec_module(module)
    factory = getattr(module, name, None)
    if not callable(factory):
        raise SourceError(f"{path} defines no callable {name!r}")
    model, inputs = factory()
    inputs = tuple(inputs) if isinstance(inputs, (list, tuple)) else (inputs,)
    options: dict[str, Any] = {"mode": "cache", "cache_dir": str(config.cache_dir), "record_pending": True,
                               "policy": config.policy if isinstance(config.policy, str) else "auto", "writer": config.writer,
                               "cpu_kernels": config.cpu_kernels}
    digests: set[str] = set()
    torch._dynamo.reset()
    model.eval()
    with torch.no_grad():
        torch.compile(model, backend="kevin", options=options)(*inputs)
    digests.update(r.key for r in kevin_backend.last_report().records() if r.key)
    if train:
        torch._dynamo.reset()
        model.train()
        out = torch.compile(model, backend="kevin", options=options)(*inputs)
        outs = out if isinstance(out, (list, tuple)) else (out,)
        loss = sum(o.float().sum() for o in outs if isinstance(o, torch.Tensor) and o.requires_grad)
        if isinstance(loss, torch.Tensor):
            loss.backward()
        digests.update(r.key for r in kevin_backend.last_report().records() if r.key)
    torch._dynamo.reset()
    items = [WorkItem(p.key, p.task, f"model:{spec}") for p in cache.pending() if p.digest in digests]
    for digest in sorted(digests - {i.digest for i in items}):  # partitions the cache already decides
        entry = cache.get_digest(digest)
        if entry is not None:
            items.append(WorkItem(entry.key, entry.task, f"model:{spec}"))
    return items
