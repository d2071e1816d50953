"""The judge's input sets on the CPU (`kevin_backend.measure.inputs`, `kevin_backend.placement`):
KernelBench's placement (inputs made on the device under test whatever device the problem names),
true layouts (stride-0 broadcasts, transposes, offsets), values never zero, mixed scales, and
input sets whose reference never overflows."""

from __future__ import annotations

import types

import pytest
import torch

from kevin_backend.generate.builtin.suite import SUITE
from kevin_backend.measure.inputs import clone_layout, fingerprint, layout_text, make_input_set, to_device
from kevin_backend.measure.memory import MemoryLedger
from kevin_backend.judge.job import Job
from kevin_backend.judge.judged_run import Run
from kevin_backend.judge.reference_sets import make_reference_set
from kevin_backend.placement import placed_on
from kevin_backend.types import KernelTask, load_program

KERNELBENCH_STYLE = '''
import torch
import torch.nn as nn

batch_size, dim = 64, 48


class Model(nn.Module):
    def forward(self, x, xt, row, tail, idx, scalar):
        return x + xt + row + tail * scalar + idx.float().mean()


def get_inputs():
    x = torch.randn(batch_size, dim)                       # made on the CPU, as published problems do
    xt = torch.randn(dim, batch_size, device="cuda").t()   # names a device
    row = torch.randn(dim).expand(batch_size, dim)         # a stride-0 broadcast
    tail = torch.randn(batch_size, dim + 5)[:, 5:]         # a slice with a storage offset
    idx = torch.randint(0, 10, (batch_size, dim)).cuda()
    return [x, xt, row, tail, idx, 3]


def get_init_inputs():
    return []
'''


def program(source: str) -> types.ModuleType:
    return load_program(source, "task")


def test_factories_make_inputs_on_the_device_under_test_with_their_layouts() -> None:
    values = make_input_set(program(KERNELBENCH_STYLE), seed=11, device="cpu").values
    x, xt, row, tail, idx, scalar = values
    assert all(v.device.type == "cpu" for v in values[:5]) and scalar == 3
    assert xt.stride() == (1, 64) and not xt.is_contiguous()
    assert row.stride() == (0, 1) and row.untyped_storage().nbytes() == 48 * 4  # one row of memory
    assert tail.stride() == (53, 1) and tail.storage_offset() == 5
    assert idx.dtype == torch.int64 and int(idx.min()) >= 0


def test_moving_keeps_sizes_strides_and_offset_and_pads_before_the_offset_with_nan() -> None:
    base = torch.randn(10, 23)
    view = base[:, 3:].t()
    moved = clone_layout(view)
    assert (moved.shape, moved.stride(), moved.storage_offset()) == (view.shape, view.stride(), view.storage_offset())
    assert torch.equal(moved, view)
    before = torch.as_strided(moved, (3,), (1,), 0)
    assert torch.isnan(before).all()
    broadcast = torch.randn(7).expand(1000, 7)
    assert to_device(broadcast, "meta").stride() == (0, 1)
    assert "stride-0 broadcast" in layout_text(broadcast) and "offset 3" in layout_text(view)


def test_input_sets_are_seeded_never_zero_and_mixed_sets_span_orders_of_magnitude() -> None:
    task = program("import torch\ndef get_inputs():\n    return [torch.zeros(1000, 100), torch.rand(1000, 100)]\n")
    a = make_input_set(task, 5, "cpu")
    b = make_input_set(task, 5, "cpu")
    assert all(torch.equal(x, y) for x, y in zip(a.values, b.values))
    assert not (a.values[0] == 0).any()
    plain, wide = make_input_set(task, 5, "cpu").values[1], make_input_set(task, 5, "cpu", exponent_range=6).values[1]
    assert (plain >= 0).all() and (wide >= 0).all()  # the sign (and a problem's domain) is kept
    ratio = wide / plain
    assert ratio.min() == 2.0 ** -6 and ratio.max() == 2.0 ** 6


def test_inputs_that_share_memory_are_changed_once() -> None:
    task = program("import torch\ndef get_inputs():\n    x = torch.randn(32, 16)\n    return [x, x.t()]\n")
    x, xt = make_input_set(task, 1, "cpu", exponent_range=6).values
    assert torch.equal(x.t(), xt) and x.untyped_storage().data_ptr() == xt.untyped_storage().data_ptr()


def test_fingerprints_see_one_changed_element_and_nothing_else() -> None:
    values = make_input_set(program(KERNELBENCH_STYLE), seed=3, device="cpu").values
    before = fingerprint(values)
    assert fingerprint(values) == before
    torch.as_strided(values[2], (1,), (1,), 7).add_(1.0)  # one element of the broadcast row
    after = fingerprint(values)
    assert [a != b for a, b in zip(before, after)] == [False, False, True, False, False, False]


def test_a_kernelbench_program_becomes_a_task_on_the_device_under_test() -> None:
    task = KernelTask.from_program("layouts", KERNELBENCH_STYLE, "cuda")  # no GPU needed: fake tensors
    assert {s.device for s in task.inputs + task.outputs} == {"cuda"}
    assert task.inputs[2].stride == (0, 1) and task.inputs[1].stride == (1, 64)
    assert task.outputs[0].shape == (64, 48)


def _run(source: str) -> Run:
    task = program(source)
    model = task.Model().eval()
    return Run(Job(task=source, candidate="", seeds=(11,), trials=1, warmup=0), task, model, model, torch.device("cpu"), MemoryLedger(torch.device("cpu")),
               lambda phase: None)


def test_a_mixed_set_whose_reference_overflows_is_made_again_with_narrower_scales() -> None:
    source = ("import torch\nimport torch.nn as nn\nclass Model(nn.Module):\n    def forward(self, x):\n"
              "        return x.exp().sum(-1)\ndef get_inputs():\n    return [torch.randn(256, 1024)]\n")
    ref = make_reference_set(_run(source), seed=12, mixed=True)
    assert torch.isfinite(ref.want[0]).all()
    assert 0 < ref.inputs.exponent_range < 6  # 2^6 * 4 overflows exp in float32; a narrower range does not


def test_a_task_whose_own_values_give_nan_keeps_them() -> None:
    source = ("import torch\nimport torch.nn as nn\nclass Model(nn.Module):\n    def forward(self, x):\n"
              "        return torch.log(x)\ndef get_inputs():\n    return [torch.randn(64, 64)]\n")
    ref = make_reference_set(_run(source), seed=12, mixed=True)
    assert ref.inputs.exponent_range == 0 and ref.inputs.shrink == 0 and torch.isnan(ref.want[0]).any()


@pytest.mark.parametrize("task", [t for t in SUITE if t.category in ("reduction", "norm")] +
                         [t for t in SUITE if "exp" in t.source or "softplus" in t.source or "mish" in t.source],
                         ids=lambda t: t.name)
def test_no_reference_row_is_inf_in_any_input_set_of_the_suite(task) -> None:  # type: ignore[no-untyped-def]
    run = _run(task.source)
    for index, seed in enumerate((11, 12, 13, 14, 15)):
        ref = make_reference_set(run, seed, mixed=index % 2 == 1)
        for out in ref.want:
            if out.is_floating_point():
                assert torch.isfinite(out).all(), (task.name, index, ref.inputs.describe())


def test_placed_on_rewrites_devices_named_by_cuda_and_to() -> None:
    with placed_on("cpu"):
        a = torch.ones(3, device="cuda")
        b = torch.zeros(2).cuda()
        c = torch.empty(2).to("cuda", torch.float16)
    assert {a.device.type, b.device.type, c.device.type} == {"cpu"} and c.dtype == torch.float16
