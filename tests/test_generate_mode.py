"""Modes and fallbacks on the CPU: generate fills the cache and cache mode hits it; every failure
in the kevin path ends in Inductor with a recorded reason; a fresh process with a warm Inductor
cache still runs the cached kernels."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch

import kevin_backend
from conftest import ReferenceGenerator, assert_close_tree
from kevin_backend.backend.report import FallbackReason, Status
from kevin_backend.runtime.counters import counters
from kevin_backend.cache.format import CacheEntry, EntryKind
from kevin_backend.cache.store import KernelCache
from kevin_backend.config import Config
from kevin_backend.example_models import make_example


def compile_and_run(options: dict[str, Any], name: str = "mlp") -> tuple[torch.Tensor, torch.Tensor]:
    torch._dynamo.reset()
    model, inputs = make_example(name)
    model.eval()
    with torch.no_grad():
        want = model(*inputs)
        got = torch.compile(model, backend="kevin", options=options)(*inputs)
    return got, want


def statuses() -> list[Status]:
    report = kevin_backend.last_report()
    assert report is not None
    return [r.status for r in report.records()]


def reasons() -> set[FallbackReason | None]:
    return {r.reason for r in kevin_backend.last_report().records()}


def test_generate_fills_the_cache_and_cache_mode_hits(kevin_dir: Path) -> None:
    gen = ReferenceGenerator()
    got, want = compile_and_run({"mode": "generate", "generator": gen, "cache_dir": str(kevin_dir), "cpu_kernels": True})
    assert_close_tree(got, want)
    n = len(gen.tasks)
    assert n >= 2 and statuses() == [Status.GENERATED] * n
    counters.expect(generated=n, hits=0, fallbacks=0)
    assert len(KernelCache(kevin_dir, None).entries()) == n

    counters.reset()  # the cache was filled by a general writer: cut the graph the same way
    got, want = compile_and_run({"cache_dir": str(kevin_dir), "cpu_kernels": True, "writer": "general"})
    assert_close_tree(got, want)
    assert statuses() == [Status.HIT] * n
    counters.expect(hits=n, misses=0, generated=0, fallbacks=0)
    assert len(gen.tasks) == n  # not asked again
    text = str(kevin_backend.last_report())
    assert "hit" in text and "total: %d hit" % n in text


def test_cache_mode_records_pending_tasks(kevin_dir: Path) -> None:
    got, want = compile_and_run({"cache_dir": str(kevin_dir), "cpu_kernels": True})
    assert_close_tree(got, want)
    n = len(statuses())
    assert n >= 2 and statuses() == [Status.PENDING] * n
    pending = KernelCache(kevin_dir, None).pending()
    keys = {r.key for r in kevin_backend.last_report().records()}  # partitions alike share a key
    assert len(pending) == len(keys) >= 2
    for p in pending:  # each pending task is a program that runs on its own
        module = p.task.load()
        out = module.Model(*module.get_init_inputs())(*module.get_inputs())
        assert out is not None
    # again: the same misses, recorded once
    compile_and_run({"cache_dir": str(kevin_dir), "cpu_kernels": True})
    assert len(KernelCache(kevin_dir, None).pending()) == len(keys)


@pytest.mark.skipif(torch.cuda.is_available(), reason="about machines without CUDA")
def test_without_cuda_partitions_are_reported_and_skipped(kevin_dir: Path) -> None:
    got, want = compile_and_run({"cache_dir": str(kevin_dir)})
    assert_close_tree(got, want)
    assert set(statuses()) == {Status.SKIPPED} and reasons() == {FallbackReason.NEEDS_CUDA}
    assert any("need CUDA" in n for n in kevin_backend.last_report().notes)
    assert KernelCache(kevin_dir, None).pending() == []


def test_mode_off_is_plain_inductor(kevin_dir: Path) -> None:
    got, want = compile_and_run({"mode": "off", "cache_dir": str(kevin_dir)})
    assert_close_tree(got, want)
    assert kevin_backend.last_report().graphs == []


def test_generate_with_no_model_server_falls_back_and_caches_nothing(kevin_dir: Path) -> None:
    """The default generator is a search with the OpenAI-compatible policy; with no server the
    partitions fall back to Inductor with the reason, no decision is cached, and the server is
    asked once per compile, not once per partition."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed once the block ends: nothing listens there
    url = f"http://127.0.0.1:{port}/v1"
    got, want = compile_and_run({"mode": "generate", "cache_dir": str(kevin_dir), "cpu_kernels": True, "llm_url": url})
    assert_close_tree(got, want)
    records = kevin_backend.last_report().records()
    assert records and set(statuses()) == {Status.FALLBACK} and reasons() == {FallbackReason.POLICY_ERROR}
    assert all(url in r.detail for r in records)
    assert KernelCache(kevin_dir, None).entries() == []


def test_failing_generator_falls_back_for_its_partitions_only(kevin_dir: Path) -> None:
    gen = ReferenceGenerator(fail_on=("aten.native_layer_norm.default", "aten.var_mean.correction"))
    got, want = compile_and_run({"mode": "generate", "generator": gen, "cache_dir": str(kevin_dir), "cpu_kernels": True})
    assert_close_tree(got, want)
    records = kevin_backend.last_report().records()
    failed = [r for r in records if r.status is Status.FALLBACK]
    assert failed and all(r.reason is FallbackReason.GENERATOR_ERROR for r in failed)
    assert "refuses" in failed[0].detail
    assert any(r.status is Status.GENERATED for r in records)


class _BrokenGenerator(ReferenceGenerator):
    def __init__(self, kernel_source: str) -> None:
        super().__init__()
        self.kernel_source = kernel_source

    def generate(self, task: Any, key: Any) -> CacheEntry:
        entry = super().generate(task, key)
        return CacheEntry(key=key, kind=EntryKind.KERNEL, task=task, kernel_source=task.source + self.kernel_source, policy="broken")


@pytest.mark.parametrize(
    "source, reason",
    [
        ("\nclass ModelNew(:\n", FallbackReason.LOAD_ERROR),  # does not parse
        ("\nimport torch\nclass ModelNew(torch.nn.Module):\n    def __init__(self):\n        super().__init__()\n        raise RuntimeError('no')\n", FallbackReason.LOAD_ERROR),
        (
            "\nimport torch\nclass ModelNew(torch.nn.Module):\n    def forward(self, *xs):\n        return torch.zeros(3, 3)\n",
            FallbackReason.KERNEL_MISMATCH,
        ),
    ],
    ids=["syntax-error", "raises-in-init", "wrong-output-shape"],
)
def test_broken_kernels_fall_back(kevin_dir: Path, source: str, reason: FallbackReason) -> None:
    gen = _BrokenGenerator(source)
    got, want = compile_and_run({"mode": "generate", "generator": gen, "cache_dir": str(kevin_dir), "cpu_kernels": True})
    assert_close_tree(got, want)
    assert set(statuses()) == {Status.FALLBACK} and reasons() == {reason}


class _ImportedGenerator(_BrokenGenerator):
    """Entries as an imported archive or a seed cache might hold them: checked by the runtime."""

    def generate(self, task: Any, key: Any) -> CacheEntry:
        entry = super().generate(task, key)
        return CacheEntry(key=key, kind=EntryKind.KERNEL, task=task, kernel_source=entry.kernel_source, policy="imported")


_RUNS_AT_LOAD = (
    "\nimport torch\ntorch.os.environ.setdefault('KEVIN_PROGRAM_RAN', '1')\n"
    "class ModelNew(torch.nn.Module):\n    def forward(self, *xs):\n        return xs[0]\n"
)


def test_a_cached_program_that_breaks_the_rules_is_never_run(kevin_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The partition stays Inductor's, the report names the rules, and the program's top level
    never ran; compiled code that names the kernel later (a warm Inductor cache) runs the
    partition's reference through Inductor's code instead."""
    from kevin_backend.runtime import registry

    monkeypatch.delenv("KEVIN_PROGRAM_RAN", raising=False)
    gen = _ImportedGenerator(_RUNS_AT_LOAD)
    got, want = compile_and_run({"mode": "generate", "generator": gen, "cache_dir": str(kevin_dir), "cpu_kernels": True})
    assert_close_tree(got, want)
    records = kevin_backend.last_report().records()
    assert {r.status for r in records} == {Status.FALLBACK} and reasons() == {FallbackReason.REJECTED_PROGRAM}
    assert all("inert-top-level" in r.detail and "no-runtime-reach" in r.detail for r in records)
    assert "KEVIN_PROGRAM_RAN" not in os.environ

    digest = records[0].key
    registry.loaded_kernels.pop(digest, None)
    kernel = registry.lookup(digest)  # as compiled code calling kevin::launch would
    assert kernel.disabled is not None and "inert-top-level" in kernel.disabled
    entry = KernelCache(kevin_dir, None).get_digest(digest)
    assert entry is not None and "KEVIN_PROGRAM_RAN" not in os.environ
    registry.loaded_kernels.pop(digest, None)


def test_inductor_winner_is_remembered(kevin_dir: Path) -> None:
    class InductorWins(ReferenceGenerator):
        def generate(self, task: Any, key: Any) -> CacheEntry:
            self.tasks.append(task)
            return CacheEntry(key=key, kind=EntryKind.INDUCTOR, task=task, kernel_source=None, reason="nothing beat Inductor")

    gen = InductorWins()
    options = {"mode": "generate", "generator": gen, "cache_dir": str(kevin_dir), "cpu_kernels": True}
    compile_and_run(options)
    n = len(gen.tasks)
    assert set(statuses()) == {Status.INDUCTOR}
    compile_and_run(options)
    assert set(statuses()) == {Status.INDUCTOR} and len(gen.tasks) == n


def test_kernel_that_raises_at_run_time_is_replaced_by_its_reference(kevin_dir: Path) -> None:
    source = "\nimport torch\nclass ModelNew(Model):\n    calls = 0\n    def forward(self, *xs):\n        ModelNew.calls += 1\n        if ModelNew.calls > 1:\n            raise RuntimeError('kernel crashed')\n        return super().forward(*xs)\n"
    gen = _BrokenGenerator(source)
    got, want = compile_and_run({"mode": "generate", "generator": gen, "cache_dir": str(kevin_dir), "cpu_kernels": True})
    assert_close_tree(got, want)
    assert Status.GENERATED in statuses()
    assert counters["runtime_errors"] >= 1


def test_a_cache_dir_option_is_where_the_runtime_builds(kevin_dir: Path, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A `cache_dir` given as a compile option is where the runtime builds the kernels it loads
    (the cache's build folder) and keeps the fast build's precompiled header, whatever
    KEVIN_CACHE_DIR says: when the pass loads a generated kernel, and when compiled code that
    finds none loaded looks it up in the compile's cache."""
    from kevin_backend.runtime import registry
    from kevin_backend.toolchain.build import Builder

    made: list[tuple[Path, Path | None]] = []
    init = Builder.__init__

    def recording(self: Builder, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        made.append((self.root, self.pch_root))

    monkeypatch.setattr(Builder, "__init__", recording)
    monkeypatch.setenv("KEVIN_CACHE_DIR", str(tmp_path / "elsewhere"))
    model, inputs = make_example("mlp")
    model.eval()
    compiled = torch.compile(model, backend="kevin", options={"mode": "generate", "generator": ReferenceGenerator(),
                                                              "cache_dir": str(kevin_dir), "cpu_kernels": True})
    with torch.no_grad():
        want = model(*inputs)
        assert_close_tree(compiled(*inputs), want)
    assert statuses() and set(statuses()) == {Status.GENERATED}
    loaded = len(made)
    assert loaded >= 1 and set(made) == {(kevin_dir / "builds", kevin_dir)}
    saved = dict(registry.loaded_kernels)
    registry.loaded_kernels.clear()  # as in a process whose compiled code was loaded from disk
    try:
        with torch.no_grad():
            assert_close_tree(compiled(*inputs), want)
    finally:
        registry.loaded_kernels.update(saved)
    assert counters["runtime_loads"] >= 1 and len(made) > loaded
    assert set(made) == {(kevin_dir / "builds", kevin_dir)}
    assert not (tmp_path / "elsewhere").exists()


_FRESH = textwrap.dedent(
    """
    import json, sys, torch, kevin_backend
    from kevin_backend.example_models import make_example
    model, inputs = make_example("mlp")
    model.eval()
    with torch.no_grad():
        want = model(*inputs)
        got = torch.compile(model, backend="kevin", options={"cache_dir": sys.argv[1], "cpu_kernels": True, "writer": "general"})(*inputs)
    report = kevin_backend.last_report()
    print(json.dumps({
        "error": (got - want).abs().max().item(),
        "statuses": [r.status.value for r in report.records()],
        "counters": kevin_backend.counters.snapshot(),
    }))
    """
)


def test_fresh_process_with_warm_inductor_cache_still_runs_kernels(kevin_dir: Path, tmp_path: Path) -> None:
    gen = ReferenceGenerator()
    compile_and_run({"mode": "generate", "generator": gen, "cache_dir": str(kevin_dir), "cpu_kernels": True})
    n = len(gen.tasks)
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor-fresh")}

    def fresh() -> dict[str, Any]:
        out = subprocess.run([sys.executable, "-c", _FRESH, str(kevin_dir)], env=env, capture_output=True, text=True, timeout=600)
        assert out.returncode == 0, out.stderr[-3000:]
        return json.loads(out.stdout.strip().splitlines()[-1])

    first = fresh()  # cold Inductor cache: the pass runs and hits
    assert first["statuses"] == ["hit"] * n and first["error"] < 1e-5
    second = fresh()  # warm Inductor cache: the pass is skipped, the cached code calls kevin::launch
    assert second["error"] < 1e-5
    assert second["statuses"] == []
    assert second["counters"]["runtime_loads"] == n


def test_a_users_own_post_grad_pass_keeps_running(kevin_dir: Path) -> None:
    from torch._inductor.custom_graph_pass import CustomGraphPass

    class CountNodes(CustomGraphPass):
        def __init__(self) -> None:
            self.graphs = 0

        def __call__(self, graph: torch.fx.Graph) -> None:
            self.graphs += 1

        def uuid(self) -> str:
            return "count-nodes-v1"

    mine = CountNodes()
    with torch._inductor.config.patch(post_grad_custom_pre_pass=mine):
        got, want = compile_and_run({"cache_dir": str(kevin_dir), "cpu_kernels": True})
    assert_close_tree(got, want)
    assert mine.graphs == 1
    assert statuses() and set(statuses()) == {Status.PENDING}
    counters.expect(pending_recorded=len({r.key for r in kevin_backend.last_report().records()}))


def test_repeated_partitions_load_their_kernel_once(kevin_dir: Path) -> None:
    # identical layers: partitions that share a key share one loaded kernel
    class Repeated(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for _ in range(3):
                x = torch.cumsum(torch.sigmoid(x) * 2.0 + 1.0, dim=-1) / 100.0
            return x

    gen = ReferenceGenerator()
    model, x = Repeated(), torch.randn(4, 8)
    got = torch.compile(model, backend="kevin", options={"mode": "generate", "generator": gen, "cache_dir": str(kevin_dir), "cpu_kernels": True})(x)
    assert_close_tree(got, model(x))
    records = kevin_backend.last_report().records()
    keys = [r.key for r in records]
    assert len(records) == 3 and len(set(keys)) < 3
    assert len(gen.tasks) == len(set(keys))  # a repeated key is generated once, then a cache hit
    from kevin_backend.runtime import registry as runtime

    repeated = max(set(keys), key=keys.count)
    loaded = runtime.lookup(repeated)
    assert runtime.load_entry(KernelCache(kevin_dir, None).get_digest(repeated), Config(cache_dir=kevin_dir)) is loaded


def test_a_graphs_later_partitions_are_foreseen_before_its_first_search(kevin_dir: Path) -> None:
    # a generator that foresees (`ForeseeingGenerator`) is told, before the graph's first search,
    # the tasks of the partitions searched after it (their first turns' builds start then, not
    # each after the search before it); a failure of that foresight loses nothing
    said: list[str] = []

    class Foreseeing(ReferenceGenerator):
        def foresee(self, tasks: Any, keys: Any) -> None:
            said.append("foresee " + " ".join(t.name for t in tasks))
            raise RuntimeError("a foresight that fails")

        def generate(self, task: Any, key: Any) -> CacheEntry:
            said.append("generate " + task.name)
            return super().generate(task, key)

    got, want = compile_and_run({"mode": "generate", "generator": Foreseeing(), "cache_dir": str(kevin_dir), "cpu_kernels": True})
    assert_close_tree(got, want)
    generated = [s.removeprefix("generate ") for s in said if s.startswith("generate ")]
    assert len(generated) >= 2 and statuses() == [Status.GENERATED] * len(generated)
    assert said[0] == "foresee " + " ".join(generated[1:]) and said.count(said[0]) == 1, said
