"""Quickstart: compile a transformer block with backend="kevin", check it against eager, and read
the compile report.

    python examples/quickstart.py            # uses CUDA when present, else the CPU

It needs only the base install (`pip install -e .`: torch, diskcache, ninja, numpy). On a GPU, a
partition with an entry in the kernel cache runs its kernel; a miss runs on Inductor and is
recorded as a pending task (a standalone KernelBench program waiting for a kernel) in your cache.
On the CPU, Inductor compiles everything and the partitions are only reported. The last line
counts the two caches apart: the seed cache shipped with the package and your own
(`~/.cache/kevin_backend`, created by its first entry or pending task). `kevin cache ls` lists
what they hold.
"""

from __future__ import annotations

import copy
from pathlib import Path

import torch

import kevin_backend
from kevin_backend.cache.store import KernelCache
from kevin_backend.config import Config
from kevin_backend.example_models import make_example


def main() -> None:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model, inputs = make_example("transformer", device=device, size="large" if device == "cuda" else "tiny")
    reference = copy.deepcopy(model)

    compiled = torch.compile(model, backend="kevin")  # options={"mode": "cache"} is the default

    # inference
    with torch.no_grad():
        got, want = compiled(*inputs), reference(*inputs)
    print(f"inference: max |kevin - eager| = {(got - want).abs().max().item():.2e}")
    print(kevin_backend.last_report())

    # a training step: forward and backward graphs both go through the backend
    loss = compiled(*inputs).pow(2).mean()
    loss.backward()
    ref_loss = reference(*inputs).pow(2).mean()
    ref_loss.backward()
    grad_err = max((p.grad - q.grad).abs().max().item() for p, q in zip(model.parameters(), reference.parameters()))
    print(f"training: loss {loss.item():.6f} vs eager {ref_loss.item():.6f}, max gradient difference {grad_err:.2e}")
    print(kevin_backend.last_report())
    print("counters:", {k: v for k, v in kevin_backend.counters.snapshot().items() if v})

    print(describe_caches(KernelCache.from_config(Config.from_env())))


def describe_caches(cache: KernelCache) -> str:
    """The two kernel caches, each counted alone: the seed cache shipped with the package
    (read-only) and the user's own cache, which is created by the first entry or pending task."""
    entries = cache.entries()
    seed = sum(e.source == "seed" for e in entries)
    user = sum(e.source == "user" for e in entries)
    seed_text = "off" if cache.seed_dir is None else f"{seed} entries"
    user_dir = _home_relative(cache.cache_dir)
    if cache.cache_dir.exists():
        user_text = f"{user} entries, {len(cache.pending())} pending tasks"
    else:
        user_text = "0 entries (not created yet)"
    return f"seed cache (shipped, read-only): {seed_text}; your cache {user_dir}: {user_text}"


def _home_relative(path: Path) -> str:
    try:
        return f"~/{path.relative_to(Path.home())}"
    except ValueError:
        return str(path)


if __name__ == "__main__":
    main()
