"""Prewarm on a Ray cluster: one actor per GPU of the cluster (or `workers` CPU actors where it
has none), each holding a generator; the driver hands out tasks and writes every decision into
its own kernel cache as it arrives, so the cluster fills one cache.

    summary = prewarm_ray(items, setup, address="auto", cache=cache, progress=print_progress)

Tasks and entries travel as their cache folders' files (`cache.disk_format.serialize_*`), so actors
need the package installed but no access to the driver's disk.
"""

from __future__ import annotations

import os
import time
from typing import Any, Sequence

from kevin_backend.cache.disk_format import deserialize_entry, serialize_pending
from kevin_backend.cache.store import KernelCache
from kevin_backend.cache.format import PendingTask
from kevin_backend.prewarm.local import Progress, Summary
from kevin_backend.prewarm.sources import WorkItem

__all__ = ["prewarm_ray"]


class _Actor:
    """Runs in a Ray worker: a generator, fed one pending task at a time."""

    def __init__(self, setup: dict[str, Any]) -> None:
        import tempfile

        from kevin_backend.prewarm.gpu_worker import make_generator

        # the actor's own scratch cache (builds, trajectory logs); decisions go back to the driver
        local = dict(setup, cache_dir=tempfile.mkdtemp(prefix="kevin-ray-"))
        self.generator = make_generator(local)
        self.where = _where()

    def generate(self, files: dict[str, bytes], digest: str) -> dict[str, Any]:
        import time as _time

        from kevin_backend.cache.disk_format import deserialize_pending, serialize_entry
        from kevin_backend.prewarm.gpu_worker import time_spent

        start = _time.perf_counter()
        where = self.where
        pending = deserialize_pending(files, digest)
        try:
            entry = self.generator.generate(pending.task, pending.key)
        except Exception as exc:
            return {"digest": digest, "status": "failed", "reason": f"{type(exc).__name__}: {exc}",
                    "seconds": _time.perf_counter() - start, "device": where}
        return {"digest": digest, "status": entry.kind.value, "files": serialize_entry(entry), "reason": entry.reason,
                "speedup_vs_inductor": entry.speedup_vs_inductor, "seconds": _time.perf_counter() - start, "device": where,
                **time_spent(self.generator)}


def _where() -> str:
    """The actor's host and GPU as a person reads them: `host GPU 1 (NVIDIA H200)`, or `host CPU (pid)`."""
    import socket

    import torch

    host = socket.gethostname()
    try:
        import ray

        ids = [str(i) for i in ray.get_gpu_ids()]
    except Exception:  # outside an actor (tests call this directly)
        ids = []
    if ids and torch.cuda.is_available():
        return f"{host} GPU {','.join(ids)} ({torch.cuda.get_device_name()})"
    return f"{host} CPU (pid {os.getpid()})"


def prewarm_ray(items: Sequence[WorkItem], setup: dict[str, Any], address: str, cache: KernelCache,
                workers: int = 1, progress: Progress | None = None) -> Summary:
    try:
        import ray
        from ray.util import ActorPool
    except ImportError as exc:
        raise RuntimeError("--ray needs Ray: pip install 'kevin_backend[ray]'") from exc
    start = time.perf_counter()
    if not ray.is_initialized():
        ray.init(address=address, ignore_reinit_error=True, log_to_driver=False)
    gpus = int(ray.cluster_resources().get("GPU", 0))
    remote = ray.remote(num_gpus=1 if gpus else 0, num_cpus=1)(_Actor)
    actors = [remote.remote(setup) for _ in range(gpus or max(1, workers))]
    pool = ActorPool(actors)
    summary = Summary()
    jobs = [(serialize_pending(PendingTask(item.key, item.task)), item.digest, item) for item in items]
    by_digest = {item.digest: item for item in items}
    for files, digest, _ in jobs:
        pool.submit(lambda actor, job: actor.generate.remote(job[0], job[1]), (files, digest))
    while pool.has_next():
        outcome = pool.get_next_unordered()
        item = by_digest[outcome["digest"]]
        files = outcome.pop("files", None)
        if files is not None:
            cache.put(deserialize_entry(files, item.digest), replace=True)
            cache.remove_pending(item.digest)
        outcome.update(name=item.task.name, origin=item.origin)
        summary.outcomes.append(outcome)
        if progress is not None:
            progress(outcome, len(summary.outcomes), len(items), time.perf_counter() - start)
    summary.seconds = time.perf_counter() - start
    return summary
