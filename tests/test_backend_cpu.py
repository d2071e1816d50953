"""backend="kevin" on the CPU: outputs and gradients match eager for every example model, in
inference and training, static and dynamic, and after a recompile for a second shape."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import torch

import kevin_backend
from conftest import ReferenceGenerator, assert_close_tree, full_tier
from kevin_backend.backend.report import Status
from kevin_backend.runtime.counters import counters
from kevin_backend.example_models import EXAMPLES, make_example


def _options(kind: str, cache_dir: Path, generator: Any = None) -> dict[str, Any]:
    if kind == "cache":  # the default mode on a CPU: partitions reported, Inductor runs them
        return {"cache_dir": str(cache_dir)}
    # generate mode with the test generator: partitions really are replaced by kevin::launch
    return {"cache_dir": str(cache_dir), "mode": "generate", "cpu_kernels": True, "generator": generator}


def _run(model: torch.nn.Module, inputs: tuple[torch.Tensor, ...], train: bool) -> tuple[Any, list[torch.Tensor]]:
    if not train:
        with torch.no_grad():
            return model(*inputs), []
    model.zero_grad(set_to_none=True)
    out = model(*inputs)
    (out.float() ** 2).mean().backward()
    return out.detach(), [p.grad.clone() for p in model.parameters()]


_MATRIX = [(name, kind, train, dynamic) for name in EXAMPLES for kind in ("cache", "generate")
           for train in (False, True) for dynamic in (False, True)]
# (every pair of a model, a mode, a workload and static or dynamic shapes at least once: 6 of the
# 24, a sixth of their CPU time; the full tier runs all 24)
_PAIRWISE = {("mlp", "cache", False, False), ("mlp", "generate", True, True), ("cnn", "cache", True, True),
             ("cnn", "generate", False, False), ("transformer", "cache", False, True), ("transformer", "generate", True, False)}


def _matrix_id(case: tuple[str, str, bool, bool]) -> str:
    name, kind, train, dynamic = case
    return f"{name}-{kind}-{'training' if train else 'inference'}-{'dynamic' if dynamic else 'static'}"


def test_the_default_cases_cover_every_pair_of_settings() -> None:
    """The six cases the default run takes (the full tier: all 24) hold every value of each setting
    beside every value of each other setting."""
    import itertools

    assert _PAIRWISE <= set(_MATRIX)
    for i, j in itertools.combinations(range(4), 2):
        wanted = {(m[i], m[j]) for m in _MATRIX}
        assert wanted == {(c[i], c[j]) for c in _PAIRWISE}, (i, j)


@pytest.mark.parametrize(("name", "kind", "train", "dynamic"), full_tier(*_MATRIX, keep=_PAIRWISE), ids=map(_matrix_id, _MATRIX))
def test_matches_eager(name: str, kind: str, train: bool, dynamic: bool, kevin_dir: Path) -> None:
    model, inputs = make_example(name)
    model.train(train)
    eager_model = copy.deepcopy(model)
    generator = ReferenceGenerator()
    compiled = torch.compile(model, backend="kevin", dynamic=dynamic, options=_options(kind, kevin_dir, generator))

    want, want_grads = _run(eager_model, inputs, train)
    got, got_grads = _run(compiled, inputs, train)
    assert_close_tree(got, want)
    assert_close_tree(got_grads, want_grads)

    report = kevin_backend.last_report()
    assert report is not None and report.graphs
    from kevin_backend.backend.kevin_pass import INFERENCE_AWARE

    # torch versions without inference-aware passes cannot tell inference from forward graphs
    assert report.graphs[0].kind == ("forward" if train or INFERENCE_AWARE is None else "inference")
    if train:
        assert any(g.kind == "backward" for g in report.graphs)
    statuses = {r.status for r in report.records()}
    if kind == "cache":
        assert statuses == {Status.SKIPPED}  # no CUDA: reported, left to Inductor
    else:
        assert Status.GENERATED in statuses and Status.FALLBACK not in statuses
        assert counters["compile_fallbacks"] == 0

    # a second input shape: Dynamo recompiles (or reuses the dynamic graph); still eager's results
    _, bigger = make_example(name, scale=2)
    want2, want2_grads = _run(eager_model, bigger, train)
    got2, got2_grads = _run(compiled, bigger, train)
    assert_close_tree(got2, want2)
    assert_close_tree(got2_grads, want2_grads)
    if kind == "generate" and dynamic:
        # kernels were verified for the first shape only: the second ran Inductor's code for
        # their partitions, not the references op by op
        assert counters["runtime_size_fallbacks"] > 0
        assert counters["runtime_inductor_calls"] == counters["runtime_size_fallbacks"]
        assert counters["runtime_inductor_errors"] == 0


def test_other_sizes_run_inductors_code_compiled_once(kevin_dir: Path) -> None:
    """Under dynamic shapes a kernel serves the size it was verified for; every other size runs
    Inductor's code for its partition, compiled once (a third size compiles nothing new)."""
    from torch._dynamo.utils import counters as dynamo_counters

    model, inputs = make_example("mlp")
    eager_model = copy.deepcopy(model)
    compiled = torch.compile(model, backend="kevin", dynamic=True,
                             options=_options("generate", kevin_dir, ReferenceGenerator()))
    with torch.no_grad():
        assert_close_tree(compiled(*inputs), eager_model(*inputs))
        assert kevin_backend.last_report().count(Status.GENERATED) > 0
        before = counters.snapshot()
        for scale in (2, 3):
            _, other = make_example("mlp", scale=scale)
            if scale == 3:
                graphs = dynamo_counters["stats"]["unique_graphs"]
            assert_close_tree(compiled(*other), eager_model(*other))
        after = counters.snapshot()
    served = after.get("runtime_inductor_calls", 0) - before.get("runtime_inductor_calls", 0)
    assert served > 0 and served == after["runtime_size_fallbacks"] - before.get("runtime_size_fallbacks", 0)
    assert after.get("runtime_inductor_errors", 0) == before.get("runtime_inductor_errors", 0)
    assert dynamo_counters["stats"]["unique_graphs"] == graphs  # the third size: no new graph compiled
