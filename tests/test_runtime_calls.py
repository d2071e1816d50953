"""The runtime's count of kernel runs: what a GPU test reads to know that a compiled model ran a
kevin kernel and not its reference."""

from __future__ import annotations

import torch

from kevin_backend.runtime import registry as runtime
from kevin_backend.types import TensorSpec


def test_kernel_calls_count_the_kernel_not_its_fallback() -> None:
    spec = TensorSpec((4, 4), (4, 1), "float32", "cpu")
    kernel = runtime.LoadedKernel("d" * 16, (spec,), kernel=lambda x: x * 2, reference=lambda x: x * 2)
    runtime.register(kernel)
    x = torch.randn(4, 4)
    kernel([x])
    kernel([x])
    assert runtime.kernel_calls()["d" * 16] == 2
    kernel([torch.randn(8, 4)])  # not the verified size: the reference runs, not counted
    assert runtime.kernel_calls()["d" * 16] == 2
    broken = runtime.LoadedKernel("e" * 16, (spec,), kernel=lambda x: 1 / 0, reference=lambda x: x * 2)
    runtime.register(broken)
    torch.testing.assert_close(broken([x])[0], x * 2)  # a kernel that raises: its reference answers
    assert runtime.kernel_calls()["e" * 16] == 0
