"""The judge's worker pool on the CPU: workers reused across candidates, replaced after a crash,
a hang, an error or a candidate that changed the kept reference, and the next verdict unaffected.
(The GPU half, with an illegal address and an out-of-bounds write, is tests/test_judge_pool_gpu.py.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kevin_backend.judge.judge import ReferenceTimes
from kevin_backend.judge.pool import WorkerPool
from kevin_backend.judge.sandbox import RunConfig

TASK = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(32))

    def forward(self, x, w):
        return x * self.scale + w


def get_inputs():
    return [torch.randn(64, 32), torch.randn(64, 32)]


def get_init_inputs():
    return []
'''


def candidate(body: str) -> str:
    return ("import numpy as np\nimport torch\nimport torch.nn as nn\n\n\n"
            "class ModelNew(nn.Module):\n    def forward(self, x, w):\n" + body)


HONEST = candidate("        return torch.from_numpy(x.numpy() + w.numpy())\n")
WRONG = candidate("        return torch.from_numpy(x.numpy() - w.numpy())\n")
RAISES = candidate("        raise RuntimeError('boom')\n")
CRASH = candidate("        import os, signal\n        os.kill(os.getpid(), signal.SIGSEGV)\n")
HANG = candidate("        while True:\n            pass\n")
# Writes into the reference the worker keeps (as an out-of-bounds kernel could), then answers
# as the unchanged reference would.
CORRUPT = candidate(
    "        import gc\n"
    "        for m in gc.get_objects():\n"
    "            if type(m).__name__ == 'Model' and hasattr(m, 'scale'):\n"
    "                m.scale.data.numpy()[:] = 2.0\n"
    "        return torch.from_numpy(x.numpy() + w.numpy())\n"
)

FAST = RunConfig(seeds=(1, 2), trials=3, warmup=1, timeout=60, inductor=False)


@pytest.fixture()
def pool():  # type: ignore[no-untyped-def]
    with WorkerPool(size=1, max_jobs=64) as p:
        yield p


def test_one_worker_judges_candidate_after_candidate(pool: WorkerPool) -> None:
    reasons = [pool.run(TASK, source, FAST).reason for source in (HONEST, WRONG, HONEST)]
    assert reasons == ["ACCEPTED", "MISMATCH", "ACCEPTED"]
    assert pool.started == 1 and pool.retired == []


@pytest.mark.parametrize("bad, reason", [(CRASH, "CRASH"), (RAISES, "RUNTIME_ERROR"), (CORRUPT, "ACCEPTED")])
def test_a_bad_candidate_leaves_the_judges_worker_in_order_and_the_next_verdict_unaffected(
        pool: WorkerPool, bad: str, reason: str) -> None:
    """The candidate runs in a process of its own: its crash, its exception or its writes into
    whatever it finds in memory end with that process. The judge's worker, which keeps the
    references, is not replaced; the corrupting candidate finds no reference to write into (it
    lives in the judge's worker) and is judged on its own outputs, which are right."""
    assert pool.run(TASK, HONEST, FAST).reason == "ACCEPTED"
    out = pool.run(TASK, bad, FAST)
    assert out.reason == reason, out.feedback
    again = pool.run(TASK, HONEST, FAST)
    assert again.reason == "ACCEPTED", again.feedback
    assert pool.started == 1 and pool.retired == [], pool.retired


def test_a_hang_is_killed_and_the_worker_replaced(pool: WorkerPool) -> None:
    import dataclasses

    out = pool.run(TASK, HANG, dataclasses.replace(FAST, timeout=15))
    assert out.reason == "HANG"
    assert pool.run(TASK, HONEST, FAST).reason == "ACCEPTED"
    assert pool.started == 2 and pool.retired == ["HANG in phase candidate"]


def test_workers_are_recycled_after_a_fixed_number_of_candidates() -> None:
    with WorkerPool(size=1, max_jobs=2) as pool:
        reasons = [pool.run(TASK, HONEST, FAST).reason for _ in range(3)]
    assert reasons == ["ACCEPTED"] * 3
    assert pool.started == 2 and pool.retired == ["2 jobs"]


def test_several_workers_serve_at_once() -> None:
    import concurrent.futures

    with WorkerPool(size=2) as pool, concurrent.futures.ThreadPoolExecutor(4) as threads:
        reasons = list(threads.map(lambda s: pool.run(TASK, s, FAST).reason, [HONEST, WRONG, HONEST, WRONG]))
    assert reasons == ["ACCEPTED", "MISMATCH", "ACCEPTED", "MISMATCH"]
    assert pool.started == 2


def test_reference_times_are_kept_per_task_and_protocol(tmp_path: Path) -> None:
    times = ReferenceTimes(tmp_path)
    key = ReferenceTimes.key(TASK, FAST, "9.0")
    assert times.get(key) is None
    times.put(key, 0.5, 0.25)
    assert ReferenceTimes(tmp_path).get(key) == (0.5, 0.25)  # from disk, in a new judge
    assert ReferenceTimes.key(TASK + "\n", FAST, "9.0") != key
    import dataclasses

    assert ReferenceTimes.key(TASK, dataclasses.replace(FAST, trials=50), "9.0") != key
    (tmp_path / f"{key}.json").write_text("{not json")
    assert ReferenceTimes(tmp_path).get(key) is None  # a damaged file is measured again
    assert json.loads(json.dumps(times.get(key))) == [0.5, 0.25]  # (the first store still remembers)


# Right only while the run's matmul precision is "high": shows which numerics the run had.
NEEDS_HIGH = candidate(
    "        import torch as t\n"
    "        shift = 0.0 if t.get_float32_matmul_precision() == 'high' else 1.0\n"
    "        return torch.from_numpy(x.numpy() + w.numpy() + shift)\n"
)


def test_a_run_has_the_numerics_its_key_names_and_the_next_run_does_not_inherit_them(pool: WorkerPool) -> None:
    import dataclasses

    from kevin_backend.judge.sandbox import run_in_sandbox

    high = dataclasses.replace(FAST, numerics=(("float32_matmul_precision", "high"), ("matmul_tf32", True)))
    assert pool.run(TASK, NEEDS_HIGH, high).reason == "ACCEPTED"
    assert pool.run(TASK, NEEDS_HIGH, FAST).reason == "MISMATCH"  # same worker: its own settings again
    assert pool.started == 1
    assert run_in_sandbox(TASK, NEEDS_HIGH, high).reason == "ACCEPTED"  # a one-shot worker too
    assert ReferenceTimes.key(TASK, high, "9.0") != ReferenceTimes.key(TASK, FAST, "9.0")
