"""Where prewarm's work comes from: recorded misses, a model, or a folder of tasks.

Every source ends the same way: the tasks are recorded as pending in the kernel cache (so a run
killed at any moment resumes from the cache alone) and returned as `WorkItem`s; a task whose key
already has an entry is finished and skipped unless forced.
"""

from __future__ import annotations

import importlib.util
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import torch

from kevin_backend.cache.key import CacheKey, make_key
from kevin_backend.cache.store import KernelCache
from kevin_backend.config import Config
from kevin_backend.types import KernelTask, placement_device

__all__ = ["WorkItem", "SourceError", "from_pending", "from_model", "from_bench", "from_kernelbench", "from_folder",
           "from_revisit", "machine_devices"]


class SourceError(ValueError):
    """A source of tasks cannot be read; the message says which and why."""


@dataclass(frozen=True)
class WorkItem:
    key: CacheKey
    task: KernelTask
    origin: str  # "pending", "model:FILE:FACTORY", "bench:NAME:WORKLOAD:DTYPE", "kernelbench:FILE", "folder:FILE", "revisit"
    occurrences: int = 1  # how often the model's steps run this partition (a repeated layer: once per layer)

    @property
    def digest(self) -> str:
        return self.key.digest


def from_pending(cache: KernelCache) -> list[WorkItem]:
    return [WorkItem(p.key, p.task, "pending") for p in cache.pending()]


def machine_devices() -> list[Any]:
    """This machine's devices as keys name them (`DeviceInfo`): its CPU and every GPU."""
    from kevin_backend.cache.key import DeviceInfo

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return [DeviceInfo.detect("cpu")] + [DeviceInfo.detect("cuda", i) for i in range(gpus)]


def from_revisit(cache: KernelCache, devices: Sequence[Any], before: str | None = None) -> list[WorkItem]:
    """"Inductor wins" decisions to make again (`kevin prewarm --revisit`): every entry, of the
    user cache or the seed, whose effective decision (the user's where both have one) says
    Inductor's code is the best known, made for one of `devices` (`DeviceInfo`s: the device and
    versions this machine can measure, `machine_devices()`) before the ISO date or time `before`
    when given, oldest first. A kernel writer, Inductor and the GPU's software all change over
    months; a decision that Inductor wins is a measurement, not a law."""
    from kevin_backend.cache.format import EntryKind

    items: list[tuple[str, WorkItem]] = []
    seen: set[str] = set()
    for info in cache.entries():  # (user entries first: where both have one, the user's is the decision)
        if not info.ok or info.digest in seen or info.entry is None:
            continue
        seen.add(info.digest)
        entry = info.entry
        if entry.kind is not EntryKind.INDUCTOR:
            continue
        key = entry.key
        if not any((key.gpu, key.capability, key.torch_version, key.cuda_version)
                   == (d.name, d.capability, d.torch_version, d.cuda_version) for d in devices):
            continue
        if before is not None and entry.created >= before:
            continue
        items.append((entry.created, WorkItem(key, entry.task, "revisit")))
    return [item for _, item in sorted(items, key=lambda pair: (pair[0], pair[1].digest))]


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
        key = make_key(task, placement_device())  # where from_program placed its tensors
        cache.record_pending(key, task)
        items.append(WorkItem(key, task, f"folder:{path.name}"))
    if not items:
        raise SourceError(f"{folder} holds no KernelBench-format task (a .py file defining Model)")
    return items


def from_model(spec: str, config: Config, cache: KernelCache, train: bool = True) -> list[WorkItem]:
    """`path/to/file.py:factory`: the factory returns (model, example_inputs); the model is compiled
    in `cache` mode, once for inference and once for a training step, which records every
    partition it misses as pending; those are the work."""
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
    steps = ("infer", "train") if train else ("infer",)
    return _record(model, inputs, steps, config, cache, f"model:{spec}")


def from_bench(name: str, config: Config, cache: KernelCache, train: bool = True, size: str = "full",
               dtype: str = "float32") -> list[WorkItem]:
    """A model of `kevin bench` (mlp, cnn, gpt2, llama) in `dtype`, for each workload exactly as
    the bench runs it: inference under no_grad, and a training step (the model returns its loss),
    so the partitions prewarmed are the ones the bench meets."""
    from kevin_backend.bench.models import MODELS, WORKLOADS, make_model

    if name not in MODELS:
        raise SourceError(f"unknown bench model {name!r}; valid models: {', '.join(MODELS)}")
    items: list[WorkItem] = []
    device = "cuda" if torch.cuda.is_available() else "cpu"
    for workload in WORKLOADS if train else ("infer",):
        try:
            model, inputs = make_model(name, workload, device=device, dtype=getattr(torch, dtype), size=size)
        except ImportError as exc:
            raise SourceError(f"bench model {name!r} needs a package that is missing: {exc}") from exc
        items += _record(model, inputs, (workload,), config, cache, f"bench:{name}:{workload}:{dtype}")
        del model, inputs
    return items


def from_kernelbench(folder: Path, config: Config, cache: KernelCache) -> list[WorkItem]:
    """A folder of KernelBench-format tasks as `kevin bench --kernelbench` runs them: each task's
    `Model` compiled by the backend for inference, its partitions (not the task as a whole) the
    work."""
    from kevin_backend.bench.kernelbench import task_files
    from kevin_backend.types import load_program

    try:
        files = task_files(folder)
    except (OSError, ValueError) as exc:
        raise SourceError(str(exc)) from exc
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    items: list[WorkItem] = []
    for path in files:
        try:
            task = load_program(path.read_text(), f"kevin_prewarm_{path.stem}")
            torch.manual_seed(0)
            model = task.Model(*[_on(v, device) for v in task.get_init_inputs()]).to(device)
            inputs = tuple(_on(v, device) for v in task.get_inputs())
        except Exception as exc:
            raise SourceError(f"{path}: running the task failed: {type(exc).__name__}: {exc}") from exc
        items += _record(model, inputs, ("infer",), config, cache, f"kernelbench:{path.name}")
    return items


def _on(value: Any, device: torch.device) -> Any:
    from kevin_backend.measure.inputs import to_device

    return to_device(value, device)  # its layout kept (a broadcast stays a broadcast)


def _record(model: Any, inputs: tuple[Any, ...], steps: Sequence[str], config: Config, cache: KernelCache,
            origin: str) -> list[WorkItem]:
    """Compile `model` with kevin in `cache` mode for each step ("infer": eval, no_grad; "train":
    train mode, forward and backward), recording its misses as pending; the work items are those
    misses and the partitions the cache already decides."""
    from kevin_backend.backend.report import collecting_reports

    options: dict[str, Any] = {"mode": "cache", "cache_dir": str(config.cache_dir), "record_pending": True,
                               "policy": config.policy if isinstance(config.policy, str) else "auto", "writer": config.writer,
                               "cpu_kernels": config.cpu_kernels}
    digests: Counter[str] = Counter()
    for step in steps:
        torch._dynamo.reset()
        with collecting_reports() as reports:  # one per graph: a graph break makes several
            if step == "infer":
                model.eval()
                with torch.no_grad():
                    torch.compile(model, backend="kevin", options=options)(*inputs)
            else:
                model.train()
                out = torch.compile(model, backend="kevin", options=options)(*inputs)
                outs = out if isinstance(out, (list, tuple)) else (out,)
                grads = [o for o in outs if isinstance(o, torch.Tensor) and o.requires_grad]
                if len(grads) == 1 and grads[0].dim() == 0:
                    grads[0].backward()  # a loss, as a training step has it
                elif grads:
                    sum(o.float().sum() for o in grads).backward()
        digests.update(r.key for report in reports for r in report.records() if r.key)
    torch._dynamo.reset()
    items = [WorkItem(p.key, p.task, origin, digests[p.digest]) for p in cache.pending() if p.digest in digests]
    for digest in sorted(set(digests) - {i.digest for i in items}):  # partitions the cache already decides
        entry = cache.get_digest(digest)
        if entry is not None:
            items.append(WorkItem(entry.key, entry.task, origin, digests[digest]))
    return items
