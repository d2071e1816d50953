"""Generate mode on a GPU in a process that cached memory it no longer uses (a training step's
activations, an earlier model): the backend gives it back before the judges run, so the judge's
workers get the memory and the partition is decided, not left RESOURCE."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

import kevin_backend
from conftest import ReferenceGenerator
from kevin_backend.backend.report import Status

pytestmark = pytest.mark.gpu


class _Norm(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x / torch.sqrt((x * x).sum(-1, keepdim=True) + 1e-12)


def _cache_freed_memory(nbytes: int) -> int:
    """Allocate `nbytes` on the GPU and free it: the allocator keeps it reserved. The reserved bytes."""
    block = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    del block
    return torch.cuda.memory_reserved()


def test_the_memory_the_process_cached_is_given_back_before_the_search(kevin_dir: Path) -> None:
    seen: list[int] = []

    class Watching(ReferenceGenerator):
        def generate(self, task: Any, key: Any) -> Any:
            seen.append(torch.cuda.memory_reserved())
            return super().generate(task, key)

    x = torch.randn(64, 1024, device="cuda")
    reserved = _cache_freed_memory(2 << 30)
    assert reserved >= 2 << 30
    torch._dynamo.reset()
    with torch.no_grad():
        torch.compile(_Norm(), backend="kevin", options={"mode": "generate", "generator": Watching(),
                                                         "cache_dir": str(kevin_dir)})(x)
    report = kevin_backend.last_report()
    assert [r.status for r in report.records()] == [Status.GENERATED]
    (release,) = report.released
    assert release.device == f"cuda:{torch.cuda.current_device()}" and release.reserved_before >= reserved
    assert release.released >= 2 << 30 and release.reserved_after < reserved - (2 << 30) + (64 << 20)
    assert seen and seen[0] <= release.reserved_after  # the search began after it
    assert "gave back" in str(report)


def test_a_process_holding_almost_all_the_gpu_in_its_cache_still_gets_its_partition_decided(kevin_dir: Path) -> None:
    """Without the give-back the judge's workers find about 1 GiB free and end RESOURCE (the
    partition left pending); with it they find the device as the process's use leaves it."""
    x = torch.randn(256, 65535, device="cuda")
    free, _ = torch.cuda.mem_get_info()
    _cache_freed_memory(free - (1 << 30))
    torch._dynamo.reset()
    with torch.no_grad():
        got = torch.compile(_Norm(), backend="kevin", options={
            "mode": "generate", "cache_dir": str(kevin_dir), "policy": "builtin", "trajectories": 1, "turns": 1,
            "seed_cache": False})(x)
    report = kevin_backend.last_report()
    print(report)
    torch.testing.assert_close(got, _Norm()(x), rtol=1e-4, atol=1e-5)
    (record,) = report.records()
    assert record.status in (Status.GENERATED, Status.INDUCTOR), (record.status, record.reason, record.detail)
    (release,) = report.released
    assert release.released >= free - (2 << 30)
    assert record.search is not None and record.search.turns == 1
