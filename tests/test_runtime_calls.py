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


def test_the_ops_outputs_lie_as_its_fake_says_channels_last_where_eagers_do() -> None:
    """A channels-last convolution's partition: its reference (eager) returns channels-last, so the
    op's fake implementation says channels-last, and a kernel that writes it so is returned as it
    lies, with no copy (it was made contiguous before); a kernel that writes it plain is copied
    into that layout, as is Inductor's code for other inputs. A reference returning a transposed
    view keeps the contiguous layout it always had."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from kevin_backend.runtime.op import _launch_fake

    torch.manual_seed(0)
    conv = torch.nn.Conv2d(8, 8, 3, padding=1, groups=8).eval()
    x = torch.randn(2, 8, 6, 6).to(memory_format=torch.channels_last)
    spec = TensorSpec(tuple(x.shape), x.stride(), "float32", "cpu")

    def reference(t: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return torch.relu(conv(t))

    last = runtime.LoadedKernel("f" * 16, (spec,), kernel=reference, reference=reference)
    plain = runtime.LoadedKernel("a" * 16, (spec,), kernel=lambda t: reference(t).contiguous(), reference=reference)
    runtime.register(last)
    made = [last([x])[0], last([x])[0]]
    assert all(m.is_contiguous(memory_format=torch.channels_last) and not m.is_contiguous() for m in made)
    assert last._plain  # (its outputs kept as the kernel made them: no copy)
    copied = plain([x])[0]
    assert copied.is_contiguous(memory_format=torch.channels_last) and not copied.is_contiguous() and not plain._plain
    torch.testing.assert_close(copied, made[0])
    other = plain([torch.randn(1, 8, 5, 5).to(memory_format=torch.channels_last)])[0]  # (not the verified size)
    assert other.is_contiguous(memory_format=torch.channels_last) and not other.is_contiguous()
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        (fake,) = _launch_fake("f" * 16, [mode.from_tensor(x)])
    assert fake.stride() == made[0].stride()
    # (symbolic sizes, as a dynamic compile traces: the same format, so the compiled code's stride checks hold)
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    with FakeTensorMode(allow_non_fake_inputs=True, shape_env=ShapeEnv()) as mode:
        (symbolic,) = _launch_fake("f" * 16, [mode.from_tensor(x, static_shapes=False)])
        assert any(isinstance(n, torch.SymInt) for n in symbolic.shape)
        assert symbolic.is_contiguous(memory_format=torch.channels_last) and not symbolic.is_contiguous()
    # a reference that does not run on fake tensors (an output shape set by the values): every output
    # contiguous, in its fake and real calls alike
    spec3 = TensorSpec((2, 8, 6, 6), x.stride(), "float32", "cpu")
    odd = runtime.LoadedKernel("c" * 16, (spec3,), kernel=reference, reference=lambda t: reference(t) + t.sum().item() * 0)
    assert odd.output_formats() == [] and odd([x])[0].is_contiguous()
    spec2 = TensorSpec((4, 6), (6, 1), "float32", "cpu")
    viewed = runtime.LoadedKernel("b" * 16, (spec2,), kernel=lambda t: (t * 2).t(), reference=lambda t: (t * 2).t())
    out = viewed([torch.randn(4, 6)])[0]
    assert out.shape == (6, 4) and out.is_contiguous()
