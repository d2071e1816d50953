"""`kevin prewarm` on the CPU: tasks from a model factory and from a folder, several workers,
resuming after a kill with no finished task redone, the Ray path on a local cluster, and old
Inductor decisions revisited. The generators are plug-ins (tests/prewarm_helpers.py); the search
with the judge is tested on a GPU. Bench models and --budget: tests/test_prewarm_bench_and_budget.py
(a file of its own, so that pytest-xdist, which runs each file on one worker, can run the two
side by side)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from kevin_backend.cache.store import KernelCache
from kevin_backend.config import override
from prewarm_helpers import task_program

TESTS = str(Path(__file__).resolve().parent)


@pytest.fixture
def plugin_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Worker processes import the test plug-ins, and log what they generate."""
    log = tmp_path / "generated.log"
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([TESTS, os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setenv("KEVIN_TEST_GENERATOR_LOG", str(log))
    return log


def _lines(log: Path) -> list[str]:
    return log.read_text().split() [::2] if log.exists() else []


def test_prewarm_a_model_on_two_workers_then_nothing_is_redone(tmp_path: Path, plugin_env: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from kevin_backend.cli.main import main

    cache_dir = tmp_path / "cache"
    args = ["--cache-dir", str(cache_dir), "prewarm", "--model", f"{TESTS}/prewarm_helpers.py:mlp",
            "--generator", "prewarm_helpers:reference", "--workers", "2", "--json", str(tmp_path / "summary.json")]
    with override(KEVIN_CPU_KERNELS=True):
        assert main(args) == 0
    out = capsys.readouterr()
    generated = _lines(plugin_env)
    assert len(generated) >= 3 and len(set(generated)) == len(generated)  # forward and backward partitions, once each
    cache = KernelCache(cache_dir, None)
    assert {e.digest for e in cache.entries()} == set(generated) and cache.pending() == []
    assert "| tasks |" in out.out and "kernel winners" in out.out
    import json

    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["kernels"] == len(generated) and summary["failures"] == {}
    assert len({o["device"] for o in summary["outcomes"]}) == 1  # both workers report the CPU
    with override(KEVIN_CPU_KERNELS=True):
        assert main(args) == 0  # everything finished: skipped
    assert _lines(plugin_env) == generated
    assert f"{len(generated)} finished before, 0 to do" in capsys.readouterr().err


def test_prewarm_of_a_kernelbench_folder_covers_what_kevin_bench_kernelbench_compiles(tmp_path: Path, plugin_env: Path) -> None:
    import kevin_backend
    from kevin_backend.cli.main import main
    from kevin_backend.types import load_program

    folder = tmp_path / "kernelbench"
    folder.mkdir()
    for i in range(3):
        (folder / f"task{i}.py").write_text(task_program(i))
    cache_dir = tmp_path / "cache"
    with override(KEVIN_CPU_KERNELS=True):
        assert main(["--cache-dir", str(cache_dir), "prewarm", "--kernelbench", str(folder),
                     "--generator", "prewarm_helpers:reference"]) == 0
    assert len(_lines(plugin_env)) == 3  # one partition per task
    path = folder / "task1.py"
    task = load_program(path.read_text(), "t")
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = task.Model(*task.get_init_inputs()).eval()
    with override(KEVIN_CPU_KERNELS=True), torch.no_grad():
        torch.compile(model, backend="kevin", options={"mode": "cache", "cache_dir": str(cache_dir)})(*task.get_inputs())
    statuses = [r.status.value for r in kevin_backend.last_report().records()]
    assert statuses and set(statuses) == {"hit"}, statuses
    assert main(["--cache-dir", str(cache_dir), "prewarm", "--kernelbench", str(tmp_path / "missing")]) == 2


def test_a_killed_prewarm_resumes_without_redoing_finished_tasks(tmp_path: Path, plugin_env: Path) -> None:
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    for i in range(6):
        (tasks / f"task{i}.py").write_text(task_program(i))
    cache_dir = tmp_path / "cache"
    command = [sys.executable, "-m", "kevin_backend.cli.main", "--cache-dir", str(cache_dir), "prewarm", "--tasks", str(tasks),
               "--generator", "prewarm_helpers:slow"]
    proc = subprocess.Popen(command, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.time() + 240
    while len(_lines(plugin_env)) < 2 and time.time() < deadline:
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate()
    stored = {e.digest for e in KernelCache(cache_dir, None).entries()}
    assert 1 <= len(stored) < 6, stored
    before = _lines(plugin_env)
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    after = _lines(plugin_env)[len(before):]
    assert not stored & set(after), "a finished task was generated again"
    cache = KernelCache(cache_dir, None)
    assert len(cache.entries()) == 6 and cache.pending() == []
    assert f"{len(stored)} finished before" in done.stderr


def test_prewarm_on_a_local_ray_cluster_spreads_tasks_and_fills_one_cache(tmp_path: Path, plugin_env: Path) -> None:
    ray = pytest.importorskip("ray")
    from kevin_backend.prewarm.ray_cluster import prewarm_ray
    from kevin_backend.prewarm.local import format_summary
    from kevin_backend.prewarm.sources import from_folder

    tasks = tmp_path / "tasks"
    tasks.mkdir()
    for i in range(6):
        (tasks / f"task{i}.py").write_text(task_program(i))
    cache = KernelCache(tmp_path / "cache", None)
    items = from_folder(tasks, cache)
    ray.init(num_cpus=2, include_dashboard=False, runtime_env={"env_vars": {"PYTHONPATH": TESTS}}, log_to_driver=False)
    try:
        summary = prewarm_ray(items, {"cache_dir": str(tmp_path / "unused"), "generator": "prewarm_helpers:slow"},
                              address="auto", cache=cache, workers=2)
    finally:
        ray.shutdown()
    assert summary.kernels == 6 and not summary.failures
    assert len({o["device"] for o in summary.outcomes}) == 2  # two actors shared the work
    assert "tasks per worker: " in format_summary(summary)
    data = summary.as_dict()  # the actors' time in the model and the judge reaches the table
    assert data["model_seconds"] == pytest.approx(6 * 1.5) and data["judge_seconds"] == pytest.approx(6 * 0.25)
    assert len(cache.entries()) == 6 and cache.pending() == []


def test_revisit_decides_old_inductor_decisions_again(tmp_path: Path, plugin_env: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """`kevin prewarm --revisit --revisit-before DATE`: the "Inductor wins" decisions for this
    machine made before DATE are searched again and replaced; newer ones and kernels stay."""
    import dataclasses

    from kevin_backend.cache.format import EntryKind
    from kevin_backend.cli.main import main

    cache_dir = tmp_path / "cache"
    base = ["--cache-dir", str(cache_dir), "prewarm", "--generator", "prewarm_helpers:reference", "--workers", "1"]
    with override(KEVIN_CPU_KERNELS=True):
        assert main(base + ["--model", f"{TESTS}/prewarm_helpers.py:mlp"]) == 0
    cache = KernelCache(cache_dir, None)
    digests = sorted(e.digest for e in cache.entries())
    assert len(digests) >= 3
    old, new = digests[:2], digests[2:]
    for digest in digests:  # every decision made "Inductor wins": two of them in January
        entry = cache.get_digest(digest)
        created = "2026-01-15T00:00:00+00:00" if digest in old else "2026-12-01T00:00:00+00:00"
        cache.put(dataclasses.replace(entry, kind=EntryKind.INDUCTOR, kernel_source=None, created=created,
                                      reason="best kernel 1.010x of Inductor's speed; needs 1.03x"), replace=True)
    plugin_env.unlink()
    with override(KEVIN_CPU_KERNELS=True):
        assert main(base + ["--revisit", "--revisit-before", "2026-06-01"]) == 0
    assert sorted(_lines(plugin_env)) == old  # only the old decisions searched again
    assert "2 task(s), 0 finished before, 2 to do" in capsys.readouterr().err
    kinds = {d: KernelCache(cache_dir, None).get_digest(d).kind for d in digests}
    assert all(kinds[d] is EntryKind.KERNEL for d in old) and all(kinds[d] is EntryKind.INDUCTOR for d in new)
    with override(KEVIN_CPU_KERNELS=True):  # kernels now: nothing older to revisit
        assert main(base + ["--revisit", "--revisit-before", "2026-06-01"]) == 0
    assert "0 task(s)" in capsys.readouterr().err
    assert main(base + ["--revisit-before", "2026-06-01"]) == 2  # without --revisit: a usage error
    assert main(base + ["--revisit", "--revisit-before", "June"]) == 2
    assert "not a date" in capsys.readouterr().err
