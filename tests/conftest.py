"""Shared fixtures: isolated kernel and Inductor caches, fresh Dynamo state, graph capture."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.fx as fx

import kevin_backend
from kevin_backend.backend.report import counters

HAS_CUDA = torch.cuda.is_available()


def pytest_collection_modifyitems(config: Any, items: list[Any]) -> None:
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if item.get_closest_marker("gpu") is not None and not HAS_CUDA:
            item.add_marker(skip)


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
