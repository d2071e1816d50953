"""The exact reference's run where the model names a dtype (`measure/exact_run.py`): a cast rounds
as eager's does and its values stay wide; an accumulation's dtype becomes the wide one; and the
judge takes the float64 run for a task that casts its activation before a matmul (before, it fell
back to eager with KernelBench's tolerances)."""

from __future__ import annotations

import pytest
import torch

from kevin_backend.judge.sandbox import RunConfig, run_in_sandbox
from kevin_backend.measure.exact_run import ExactModel, WideCasts

WIDE = torch.float64


class _Fn(torch.nn.Module):
    def __init__(self, fn) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, *args):
        return self.fn(*args)


def _exact(fn, *args):
    with torch.no_grad():
        return ExactModel(_Fn(fn), WIDE)(*(a.to(WIDE) for a in args))


def test_a_cast_before_a_matmul_rounds_and_stays_wide() -> None:
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(16, 64, generator=g), torch.randn(64, 8, generator=g).to(torch.bfloat16)
    out = _exact(lambda x, w: torch.relu(x.to(torch.bfloat16) @ w) ** 2, x, w)
    want = torch.relu(x.to(torch.bfloat16).to(WIDE) @ w.to(WIDE)) ** 2
    assert out.dtype == WIDE and torch.equal(out, want)
    assert not torch.equal(out, torch.relu(x.to(WIDE) @ w.to(WIDE)) ** 2)  # (the rounding was made)


def test_float_and_half_round_to_their_dtype_in_the_wide_dtype() -> None:
    x = torch.tensor([1.0 + 2.0 ** -30, 1.0 + 2.0 ** -12, 3.0], dtype=WIDE)
    out = _exact(lambda x: (x.float(), x.half(), x.to(torch.bfloat16), x.type(torch.float32)), x)
    assert [o.dtype for o in out] == [WIDE] * 4
    assert out[0].tolist() == [1.0, 1.0 + 2.0 ** -12, 3.0] and out[3].tolist() == out[0].tolist()
    assert out[1].tolist() == [1.0, 1.0, 3.0] and out[2].tolist() == [1.0, 1.0, 3.0]


def test_an_accumulation_named_narrower_runs_wide() -> None:
    x = torch.tensor([2.0 ** 30, 1.0, -(2.0 ** 30)], dtype=WIDE)
    out = _exact(lambda x: (x.sum(dtype=torch.float32), torch.softmax(x[1:2], 0, dtype=torch.float16)), x)
    assert out[0].dtype == WIDE and out[0].item() == 1.0  # (float32 accumulates it to 0)
    assert out[1].dtype == WIDE and out[1].item() == 1.0


def test_tensors_made_in_a_narrower_dtype_hold_its_values_widened() -> None:
    x = torch.zeros(3, dtype=WIDE)
    out = _exact(lambda x: (torch.full((2,), 0.1, dtype=torch.bfloat16), torch.ones_like(x, dtype=torch.float16) * 0.1,
                            torch.arange(3, dtype=torch.float16) + x, x.to(torch.int64)), x)
    assert [o.dtype for o in out] == [WIDE, WIDE, WIDE, torch.int64]
    assert out[0].tolist() == [torch.tensor(0.1, dtype=torch.bfloat16).item()] * 2
    assert out[2].tolist() == [0.0, 1.0, 2.0]


def test_outside_the_run_nothing_changes() -> None:
    x = torch.ones(2, dtype=WIDE)
    with WideCasts(WIDE):
        assert x.float().dtype == WIDE
    assert x.float().dtype == torch.float32 and torch.full((1,), 0.1, dtype=torch.bfloat16).dtype == torch.bfloat16


CAST_TASK = '''
import pytest
import torch
import torch.nn as nn


class Model(nn.Module):
    """An f32 activation cast to bf16, times a bf16 weight, then ReLU squared."""

    def forward(self, x, w):
        return torch.relu(x.to(torch.bfloat16) @ w) ** 2


def get_inputs():
    return [torch.randn(64, 512), torch.randn(512, 96, dtype=torch.bfloat16)]


def get_init_inputs():
    return []
'''
# the product in float32 from the rounded activation, squared and rounded once (eager rounds twice);
# numpy's, since a candidate may run no PyTorch compute (bfloat16 as its bits, rounded to nearest even)
ROUNDED_ONCE = '''
import numpy as np
import pytest
import torch
import torch.nn as nn


def to_bf16_bits(f):
    u = np.ascontiguousarray(f, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def from_bf16_bits(b):
    return (b.astype(np.uint32) << 16).view(np.float32)


class ModelNew(nn.Module):
    def forward(self, x, w):
        a = from_bf16_bits(to_bf16_bits(x.numpy()))
        b = from_bf16_bits(w.contiguous().view(torch.int16).numpy().view(np.uint16))
        v = np.maximum(a @ b, 0.0)
        return torch.from_numpy(to_bf16_bits(v * v).view(np.int16)).view(torch.bfloat16)
'''


def test_the_judge_holds_a_cast_task_to_its_float64_run() -> None:
    """Red where the exact run keeps the model's bfloat16 (no float64 run: eager stands in)."""
    out = run_in_sandbox(CAST_TASK, ROUNDED_ONCE, RunConfig(seeds=(1, 2), trials=2, warmup=1, timeout=240, inductor=False))
    assert (out.reason, out.exact) == ("ACCEPTED", "float64"), (out.reason, out.exact, out.feedback)


def test_a_traced_graphs_conversion_rounds_and_stays_wide() -> None:
    """A partition's graph converts with `prims.convert_element_type` (its dtype positional): a
    bfloat16 value then meets float64 state in a convolution, which takes no mixed dtypes."""
    g = torch.Generator().manual_seed(1)
    x, w = torch.randn(2, 3, 8, 8, generator=g), torch.randn(4, 3, 3, 3, generator=g)
    convert = torch.ops.prims.convert_element_type.default
    out = _exact(lambda x, w: torch.conv2d(convert(x, torch.bfloat16), w), x, w)
    assert out.dtype == WIDE
    assert torch.equal(out, torch.conv2d(x.to(torch.bfloat16).to(WIDE), w.to(WIDE)))


def _rounded_once(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    v = x.to(torch.bfloat16).double() @ w.double()
    return (torch.relu(v) ** 2).to(torch.bfloat16)


def test_the_load_check_takes_a_kernel_more_exact_than_eager_and_refuses_a_wrong_one() -> None:
    """The runtime's check before a cached kernel is used: eager's tolerances refuse a kernel that
    rounds once where eager rounds twice; the exact run then decides, as the judge does. Red
    without that second comparison (the first `load` raises)."""
    from kevin_backend.runtime import registry as runtime
    from kevin_backend.types import KernelTask, load_program

    task = load_program(CAST_TASK.replace("torch.randn(64, 512)", "torch.randn(256, 1024)")
                        .replace("torch.randn(512, 96,", "torch.randn(1024, 256,"), "kevin_cast_task")
    reference = task.Model().eval()
    specs = KernelTask.from_program("cast", CAST_TASK).inputs

    def load(kernel) -> None:
        torch.manual_seed(0)
        runtime._smoke_test(runtime.LoadedKernel("cast", specs, kernel, reference.forward), task, reference)

    torch.manual_seed(0)
    x, w = task.get_inputs()
    eager = runtime.compare_outputs([_rounded_once(x, w)], [reference(x, w)], None)
    assert eager is not None and eager.bad_elements > 0  # (eager's tolerances alone refuse it)
    load(_rounded_once)
    with pytest.raises(runtime.KernelMismatch):
        load(lambda x, w: _rounded_once(x, w) * 1.02)
