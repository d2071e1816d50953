"""Shared fixtures: isolated kernel and Inductor caches, fresh Dynamo state, graph capture, torch's
share of the cores under pytest-xdist; a benchmark script loaded as a module."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.fx as fx

import kevin_backend
from kevin_backend.runtime.counters import counters

HAS_CUDA = torch.cuda.is_available()
BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def load_benchmark(name: str) -> Any:
    """benchmarks/NAME.py as a module (`bench_NAME` in sys.modules: dataclasses look their module up)."""
    import importlib.util
    import sys

    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCHMARKS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module

# The graph-level check (backend/graph_check.py) times every compiled graph with and without its
# kernels and may drop them: tests of other stages keep it off so that what they assert does not
# hang on a timing; the check's own tests turn it on.
os.environ.setdefault("KEVIN_GRAPH_CHECK", "0")


FULL = os.environ.get("KEVIN_TESTS_FULL") == "1"
"""The full tier: tests marked `full` run too (see `full_tier`)."""


def pytest_collection_modifyitems(config: Any, items: list[Any]) -> None:
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    later = pytest.mark.skip(reason="in the full tier only (KEVIN_TESTS_FULL=1)")
    for item in items:
        if item.get_closest_marker("gpu") is not None and not HAS_CUDA:
            item.add_marker(skip)
        if item.get_closest_marker("full") is not None and not FULL:
            item.add_marker(later)


def full_tier(*values: Any, keep: Any = ()) -> list[Any]:
    """`values` of a parametrisation, those not in `keep` marked `full`: the default run takes a
    covering subset of a large matrix (every pair of settings at least once), the full tier all."""
    return [pytest.param(*(v if isinstance(v, tuple) else (v,)), marks=() if v in keep else pytest.mark.full) for v in values]


# Policies of the tests' stand-in generators (ReferenceGenerator below, test_generate_mode's
# broken kernels): their "kernels" run the task's reference in Python on machines without a GPU,
# which no kernel program may do, so the runtime's static check lets exactly these through. Every
# other entry (the seed cache, the built-in writer's, the rejection tests') is checked.
STAND_IN_POLICIES = ("test-reference", "broken")


STAND_IN_SITE = Path(__file__).resolve().parent / "stand_in_site"


@pytest.fixture(autouse=True)
def _stand_in_kernels_load(monkeypatch: pytest.MonkeyPatch) -> None:
    """In this process and in every Python process a test starts (stand_in_site/sitecustomize.py)."""
    from kevin_backend.runtime import registry

    real = registry.entry_violations

    def violations(entry: Any) -> list[str]:
        return [] if entry.policy in STAND_IN_POLICIES else real(entry)

    monkeypatch.setattr(registry, "entry_violations", violations)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (str(STAND_IN_SITE), os.environ.get("PYTHONPATH")) if p))


@pytest.fixture(scope="module")
def one_share_of_the_cores() -> Any:
    """Torch in this process on its share of the cores under pytest-xdist (a module that trains a
    tiny model asks for it: `pytestmark = pytest.mark.usefixtures("one_share_of_the_cores")`).
    With as many workers as cores, torch's default of a thread per core in every worker
    oversubscribes the machine, and a tiny model's many small products wait on each other's
    threads: beside a busy core, 30 batches of tests/test_rl_train.py's run took 119 s on two
    threads and 79 s on one; tests/test_rl_sft.py's warm start 68-75 s on two and 4-9 s on one.
    Outside xdist nothing changes."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
    threads = torch.get_num_threads()
    if workers:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // workers))
    yield
    torch.set_num_threads(threads)


_POOL: Any = None


def pooled_run(task_source: str, candidate_source: str, config: Any) -> Any:
    """A verdict from this test process's warm judge worker: the pool's path (the product's: the
    judge's workers serve job after job, each candidate in a process forked for it), without the
    seconds a fresh worker and its fork server spend importing torch for every verdict. Tests of
    the one-shot worker's own start, clock and death call `run_in_sandbox`."""
    global _POOL
    from kevin_backend.judge.pool import WorkerPool

    if _POOL is None:
        _POOL = WorkerPool(size=1)
    return _POOL.run(task_source, candidate_source, config)


@pytest.fixture(scope="session", autouse=True)
def _close_the_pool() -> Any:
    yield
    if _POOL is not None:
        _POOL.close()


@pytest.fixture(scope="session")
def inductor_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One Inductor cache for the session, away from the user's."""
    path = tmp_path_factory.mktemp("inductor")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(path)
    return path


@pytest.fixture()
def kevin_dir(tmp_path: Path, inductor_cache: Path) -> Path:
    """A fresh, empty kevin cache; Dynamo and the counters reset."""
    torch._dynamo.reset()
    counters.reset()
    path = tmp_path / "kevin_cache"
    yield path
    torch._dynamo.reset()


def capture_aot_graphs(
    model: torch.nn.Module, inputs: tuple[torch.Tensor, ...], train: bool
) -> list[tuple[fx.GraphModule, list[Any]]]:
    """The forward (and backward) aten graphs AOTAutograd makes with Inductor's decompositions
    (the graphs the kevin pass partitions), each with the arguments it was first called with."""
    from torch._functorch.aot_autograd import aot_module_simplified
    from torch._inductor.decomposition import select_decomp_table
    from functorch.compile import make_boxed_func

    graphs: list[tuple[fx.GraphModule, list[Any]]] = []

    def keep(gm: fx.GraphModule, _inputs: Any) -> Any:
        seen: list[Any] = []
        graphs.append((gm, seen))

        def run(*args: Any) -> Any:
            if not seen:
                seen.extend(a.detach().clone() if isinstance(a, torch.Tensor) else a for a in args)
            return gm(*args)

        return make_boxed_func(run)

    def backend(gm: fx.GraphModule, example_inputs: Any) -> Any:
        return aot_module_simplified(gm, example_inputs, fw_compiler=keep, bw_compiler=keep, decompositions=select_decomp_table())

    torch._dynamo.reset()
    compiled = torch.compile(model, backend=backend)
    if train:
        compiled(*inputs).sum().backward()
    else:
        with torch.no_grad():
            compiled(*inputs)
    torch._dynamo.reset()
    return graphs


# A kernel "written" by the test generator below: it runs the task's own reference program
# through a separate module, standing in for a generated kernel on machines without a GPU.
_CPU_KERNEL = '''
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, *init_inputs):
        super().__init__()
        self.reference = Model(*init_inputs)

    def forward(self, *inputs):
        return self.reference(*inputs)
'''


class ReferenceGenerator:
    """A KernelGenerator written for the tests: every task gets a KERNEL entry that runs the
    task's reference program (so swapped-in partitions must still give eager's results), and
    every call is remembered."""

    name = "test-reference"

    def __init__(self, fail_on: tuple[str, ...] = ()) -> None:
        self.tasks: list[Any] = []
        self.fail_on = fail_on

    def generate(self, task: Any, key: Any) -> Any:
        from kevin_backend.cache.format import CacheEntry, EntryKind, Timings

        self.tasks.append(task)
        if any(op in task.ops for op in self.fail_on):
            raise RuntimeError("the test generator refuses this task")
        return CacheEntry(
            key=key,
            kind=EntryKind.KERNEL,
            task=task,
            kernel_source=task.source + _CPU_KERNEL,
            timings=Timings(eager_ms=1.0, inductor_ms=0.8, kernel_ms=0.5),
            policy=self.name,
        )


# The slow stand-in's kernel: the reference kernel after a sleep, so a graph check drops it for certain
# (20 ms: far beyond what a loaded CPU adds to the MLP's own time; 4 ms was not, once)
_SLOW = "\nimport time\n" + _CPU_KERNEL.replace("        return self.reference(*inputs)",
                                                "        time.sleep(0.02)\n        return self.reference(*inputs)")


class SlowGenerator(ReferenceGenerator):
    """ReferenceGenerator's entries, each kernel 20 ms slower than its reference: what the graph
    check must drop."""

    def generate(self, task: Any, key: Any) -> Any:
        entry = super().generate(task, key)
        return type(entry)(**{**entry.__dict__, "kernel_source": task.source + _SLOW})


def assert_close_tree(got: Any, want: Any, atol: float = 1e-5, rtol: float = 1e-4) -> None:
    torch.testing.assert_close(got, want, atol=atol, rtol=rtol)


class _Captured(Exception):
    pass


def builtin_partitions(fn: Any, *inputs: Any, training: bool = False) -> Any:
    """The built-in writer's partition plan of `fn`'s forward graph as the kevin pass gets it:
    after Inductor's decompositions (which turn `scalar_tensor(0)` into `full([], 0)`), in the
    post-grad stage's first custom pass as the backend's own, before Inductor's post-grad
    patterns (on a GPU, those fold a softmax's max and sum into `prepare_softmax_online`, which
    the backend never sees). The compile stops there: no code is generated. `training`: with
    gradients on, so the graph is a training step's forward (what it keeps for its backward among
    the outputs)."""
    import torch._inductor.config as inductor_config

    from kevin_backend.backend.partition import partition_graph
    from kevin_backend.generate.builtin.builtin_support import BuiltinSupport

    plans = []

    def grab(graph: fx.Graph) -> None:
        plans.append(partition_graph(graph, BuiltinSupport()))
        raise _Captured

    torch._dynamo.reset()
    try:
        with torch.set_grad_enabled(training), inductor_config.patch(post_grad_custom_pre_pass=grab):
            torch.compile(fn, dynamic=False)(*inputs)
    except Exception as exc:  # (Dynamo wraps the pass's exception)
        if not plans:
            raise AssertionError(f"the compile failed before the partitioner: {exc}") from exc
    finally:
        torch._dynamo.reset()
    assert len(plans) == 1, f"{len(plans)} graphs"
    return plans[0]


@pytest.fixture
def hopper_with_cutlass(monkeypatch: pytest.MonkeyPatch, tmp_path):  # type: ignore[no-untyped-def]
    """What the GEMM writer needs, as a Hopper machine with CUTLASS's headers has it."""
    from kevin_backend.generate.builtin import builtin_support

    include = tmp_path / "include"
    for folder, header in (("cutlass", "cutlass.h"), ("cute", "tensor.hpp")):
        (include / folder).mkdir(parents=True)
        (include / folder / header).write_text("#pragma once\n")
    (include / "cutlass" / "version.h").write_text("#define CUTLASS_MAJOR 4\n#define CUTLASS_MINOR 2\n#define CUTLASS_PATCH 0\n")
    monkeypatch.setenv("KEVIN_CUTLASS_INCLUDE", str(include))
    monkeypatch.setattr(builtin_support, "gemm_arch", lambda: "sm90")
