"""Cache keys: the same computation gives the same key; any change to what it covers changes it."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from kevin_backend.backend.partition import partition_graph
from kevin_backend.generate.op_support import GeneralOpSupport
from kevin_backend.backend.task import extract_task
from kevin_backend.cache.key import CacheKey, DeviceInfo, make_key

H200 = DeviceInfo("NVIDIA H200", "9.0", "2.11.0", "13.0")


def key_of(fn, *inputs: torch.Tensor, device: DeviceInfo = H200, rename: str | None = None) -> CacheKey:
    graph = make_fx(fn, tracing_mode="fake")(*inputs).graph
    if rename:
        for i, node in enumerate(graph.nodes):
            node.name = f"{rename}_{i}"
    (part,) = partition_graph(graph, GeneralOpSupport()).partitions
    return make_key(extract_task(part), device)


def base(x, y):
    return torch.relu(x * y + 0.5).sum(dim=-1)


def renamed_args(first, second):
    return torch.relu(first * second + 0.5).sum(dim=-1)


X, Y = torch.randn(8, 16), torch.randn(8, 16)

# a script that computes the base key in another process (another interpreter, other object ids)
_SCRIPT = textwrap.dedent(
    """
    import torch
    from torch.fx.experimental.proxy_tensor import make_fx
    from kevin_backend.backend.partition import partition_graph
    from kevin_backend.generate.op_support import GeneralOpSupport
    from kevin_backend.backend.task import extract_task
    from kevin_backend.cache.key import DeviceInfo, make_key
    g = make_fx(lambda x, y: torch.relu(x * y + 0.5).sum(dim=-1), tracing_mode="fake")(torch.randn(8, 16), torch.randn(8, 16)).graph
    (p,) = partition_graph(g, GeneralOpSupport()).partitions
    print(make_key(extract_task(p), DeviceInfo("NVIDIA H200", "9.0", "2.11.0", "13.0")).digest)
    """
)


def test_key_ignores_names() -> None:
    k = key_of(base, X, Y)
    assert key_of(renamed_args, X, Y) == k
    assert key_of(base, X, Y, rename="other").digest == k.digest


def test_key_is_the_same_in_another_process() -> None:
    out = subprocess.run([sys.executable, "-c", _SCRIPT], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == key_of(base, X, Y).digest


@pytest.mark.parametrize(
    "change",
    [
        pytest.param(lambda: key_of(base, torch.randn(8, 17), torch.randn(8, 17)), id="shape"),
        pytest.param(lambda: key_of(base, X.double(), Y.double()), id="dtype"),
        pytest.param(lambda: key_of(base, X.t().contiguous().t(), Y), id="strides"),
        pytest.param(lambda: key_of(lambda x, y: torch.relu(x * y + 0.25).sum(dim=-1), X, Y), id="constant"),
        pytest.param(lambda: key_of(lambda x, y: torch.relu(x * y + 0.5).sum(dim=0), X, Y), id="reduction-dim"),
        pytest.param(lambda: key_of(lambda x, y: torch.sigmoid(x * y + 0.5).sum(dim=-1), X, Y), id="op"),
        pytest.param(lambda: key_of(base, X, Y, device=DeviceInfo("NVIDIA H200", "10.0", "2.11.0", "13.0")), id="capability"),
        pytest.param(lambda: key_of(base, X, Y, device=DeviceInfo("NVIDIA H100", "9.0", "2.11.0", "13.0")), id="gpu"),
        pytest.param(lambda: key_of(base, X, Y, device=DeviceInfo("NVIDIA H200", "9.0", "2.12.0", "13.0")), id="torch"),
        pytest.param(lambda: key_of(base, X, Y, device=DeviceInfo("NVIDIA H200", "9.0", "2.11.0", "12.8")), id="cuda"),
    ],
)
def test_key_changes_with_what_it_covers(change) -> None:
    assert change().digest != key_of(base, X, Y).digest


def test_key_changes_with_schema_and_prints_as_a_dict() -> None:
    k = key_of(base, X, Y)
    d = k.as_dict()
    assert set(d) == {"graph", "inputs", "gpu", "capability", "torch", "cuda", "numerics", "schema"}
    assert d["numerics"] == {"deterministic_algorithms": False}  # a pointwise task: no matmul or cuDNN settings
    assert d["inputs"][0] == {"shape": [8, 16], "stride": [16, 1], "dtype": "float32", "device": "cpu"}
    assert CacheKey.from_dict(d) == k
    d["schema"] += 1
    assert CacheKey.from_dict(d).digest != k.digest
    assert '"gpu": "NVIDIA H200"' in str(k)
