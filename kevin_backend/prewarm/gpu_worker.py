"""One prewarm worker: `python -m kevin_backend.prewarm.gpu_worker` (on one GPU, chosen by the
parent through CUDA_VISIBLE_DEVICES).

Reads one JSON request per line on stdin: {"digest": ...}; runs the generator on that pending
task (after the same task's kernel from another environment, when the cache has one), stores the decision in the kernel cache (atomically) and forgets the pending record, then
answers one JSON line on stdout: the outcome. The first line it reads is its setup:
{"cache_dir": ..., "policy": ..., "generator": "module:factory" or null, "search": {...}}.
"""

from __future__ import annotations

import importlib
import json
import sys
import time
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kevin_backend.cache.store import KernelCache
    from kevin_backend.generate.kernel_generator import KernelGenerator

__all__ = ["run_one", "make_generator"]


def make_generator(setup: dict[str, Any]) -> KernelGenerator:
    """The generator a setup names: a user factory (`module:function`) or a search with a policy."""
    from kevin_backend.config import Config
    from kevin_backend.generate.engine import SearchConfig
    from kevin_backend.generate.generator import SearchGenerator, default_generator
    from kevin_backend.generate.writers import make_policy

    config = Config(cache_dir=Path(setup["cache_dir"]), policy=setup.get("policy") or "auto")
    if setup.get("generator"):
        module_name, _, attr = setup["generator"].partition(":")
        return getattr(importlib.import_module(module_name), attr)()
    search = setup.get("search")
    if search:
        return SearchGenerator(make_policy(config.policy, config), search=SearchConfig(**search), config=config)
    return default_generator(config)


def run_one(generator: KernelGenerator, cache: KernelCache, digest: str, device: str) -> dict[str, Any]:
    """Generate for one pending task and store the decision; the outcome as a dict. A kernel the
    cache holds for the same task under another GPU, torch or CUDA is judged again first
    (`generate/revalidation.py`): kept, it is the decision and no search runs."""
    from kevin_backend.generate.revalidation import first_known

    start = time.perf_counter()
    item = cache.get_pending(digest)
    if item is None:
        done = cache.get_digest(digest)
        return {"digest": digest, "status": "skipped" if done else "failed",
                "reason": "already finished" if done else "no such pending task", "seconds": 0.0, "device": device}
    try:
        known = first_known(generator, cache, item.task, item.key)
        if known is not None and known.entry is not None:  # a kernel made elsewhere, kept here: no search
            entry, spent = known.entry, {"model_seconds": 0.0, "judge_seconds": known.seconds}
        else:
            entry = generator.generate(item.task, item.key)
            spent = time_spent(generator)
        cache.put(entry, replace=True)
        cache.remove_pending(digest)
    except Exception as exc:
        return {"digest": digest, "name": item.task.name, "status": "failed", "reason": f"{type(exc).__name__}: {exc}",
                "seconds": time.perf_counter() - start, "device": device, "trace": traceback.format_exc(limit=3)}
    return {
        "digest": digest, "name": item.task.name, "status": entry.kind.value, "reason": entry.reason,
        "speedup_vs_inductor": entry.speedup_vs_inductor, "seconds": time.perf_counter() - start, "device": device,
        **spent,
    }


def time_spent(generator: KernelGenerator) -> dict[str, float]:
    """Seconds the generator's last task spent waiting on the model and on the judge (a search's
    `results`; a generator of another kind reports none)."""
    results = getattr(generator, "results", None)
    last = results[-1] if results else None
    return {"model_seconds": getattr(last, "model_seconds", 0.0), "judge_seconds": getattr(last, "judge_seconds", 0.0)}


def main() -> int:
    from kevin_backend.lifeline import die_with_parent

    die_with_parent()  # a killed prewarm leaves no search running
    import torch

    from kevin_backend.cache.store import KernelCache

    setup = json.loads(sys.stdin.readline())
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    generator = make_generator(setup)
    cache = KernelCache(Path(setup["cache_dir"]))
    print(json.dumps({"ready": True, "device": device}), flush=True)
    for line in sys.stdin:
        if not line.strip():
            continue
        request = json.loads(line)
        print(json.dumps(run_one(generator, cache, request["digest"], device)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
