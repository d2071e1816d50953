"""Quickstart: compile a transformer block with backend="kevin", check it against eager, and read
the compile report.

    python examples/quickstart.py            # uses CUDA when present, else the CPU

With an empty kernel cache every partition is a miss: Inductor runs it, and (on a GPU) the
partition is recorded as a pending task, a standalone KernelBench program waiting for a kernel.
`kevin cache ls` lists what the cache holds.
"""

from __future__ import annotations

import copy

import torch

import kevin_backend
from kevin_backend.cache.store import KernelCache
from kevin_backend.config import Config
from kevin_backend.models import make_example


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

    cache = KernelCache.from_config(Config.from_env())
    print(f"kernel cache {cache.cache_dir}: {len(cache.entries())} entries, {len(cache.pending())} pending tasks")


if __name__ == "__main__":
    main()
