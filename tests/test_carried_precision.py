"""The precision a task's own arithmetic leaves in each output (`measure/precision.py`) and the
bound the comparison then applies (`measure/compare.py`): a float32 output whose values went through
a bfloat16 rounding is held to bfloat16's bound. The tasks are the partitions of `kevin bench`'s
GPT-2 in bfloat16 whose kernels an H100 refused: the backward's matmul, its result converted to
float32 and scaled by the layer norm's weight (eager's own output fails float32's bound there),
and the forward's residual add with its float32 copy."""

from __future__ import annotations

import pytest
import torch

from kevin_backend.judge.sandbox import RunConfig
from kevin_backend.measure import compare
from kevin_backend.measure.inputs import make_input_set
from kevin_backend.measure.precision import carried_precision, output_precision, task_precision
from kevin_backend.types import load_program
from conftest import full_tier, pooled_run

_HEAD = '''
import torch
import torch.nn as nn


def _tensor(shape, stride, dtype, device):
    extent = 1 + sum((n - 1) * s for n, s in zip(shape, stride) if n > 0)
    return torch.as_strided(torch.randn(extent, device=device).to(dtype), shape, stride)

'''
# The backward's matmul (GPT-2's MLP down projection's input gradient, d 768,
# on 2 x 32 tokens: eager's bfloat16 product is slow on a CPU and the judge runs it some 27 times):
# the bfloat16 product converted to float32, then scaled by the layer norm's weight and its inverse
# deviation, as the training step's graph has it.
BACKWARD = _HEAD + '''
class Model(nn.Module):
    def forward(self, arg0, arg1, arg2, arg3):
        v0 = torch.ops.aten.mm.default(arg0, arg1)
        v1 = torch.ops.aten.reshape.default(v0, [2, 32, 768])
        v2 = torch.ops.prims.convert_element_type.default(v1, torch.float32)
        v3 = torch.ops.aten.mul.Tensor(v2, arg2)
        v4 = torch.ops.aten.mul.Tensor(v3, 768)
        v5 = torch.ops.aten.mul.Tensor(v3, arg3)
        return (v2, v3, v4, v5,)


def get_inputs():
    return [
        _tensor((64, 3072), (3072, 1), torch.bfloat16, 'cpu'),
        _tensor((3072, 768), (768, 1), torch.bfloat16, 'cpu'),
        _tensor((768,), (1,), torch.float32, 'cpu'),
        _tensor((2, 32, 768), (24576, 768, 1), torch.float32, 'cpu'),
    ]


def get_init_inputs():
    return []
'''
# The forward's projection with the residual stream: bias, the residual add in bfloat16, and the
# stream's float32 copy (rounded twice by eager: the product, then the sum).
RESIDUAL = _HEAD + '''
class Model(nn.Module):
    def forward(self, arg0, arg1, arg2, arg3):
        v0 = torch.ops.aten.addmm.default(arg0, arg1, arg2)
        v1 = torch.ops.aten.reshape.default(v0, [8, 64, 768])
        v2 = torch.ops.aten.add.Tensor(arg3, v1)
        v3 = torch.ops.prims.convert_element_type.default(v2, torch.float32)
        return (v2, v3,)


def get_inputs():
    return [
        _tensor((768,), (1,), torch.bfloat16, 'cpu'),
        _tensor((512, 768), (768, 1), torch.bfloat16, 'cpu'),
        _tensor((768, 768), (768, 1), torch.bfloat16, 'cpu'),
        _tensor((8, 64, 768), (49152, 768, 1), torch.bfloat16, 'cpu'),
    ]


def get_init_inputs():
    return []
'''


def _references(source: str, seed: int, mixed: bool = False) -> tuple[list, list, list, tuple]:
    module = load_program(source, "precision_task")
    model = module.Model()
    inputs = make_input_set(module, seed, "cpu", 6 if mixed else 0)
    with torch.no_grad():
        want = compare.output_list(model(*inputs.values))
        exact = compare.exact_outputs(model, inputs.values, want, torch.device("cpu"))
    return inputs.values, want, exact, output_precision(model, inputs.values)


def _bf16(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.bfloat16).float()


def test_the_tracker_marks_what_a_16_bit_rounding_went_into() -> None:
    x16, w16 = torch.randn(8, 16).bfloat16(), torch.randn(16, 4).bfloat16()
    x32 = torch.randn(8, 4)
    with carried_precision() as carried:
        product = (x16 @ w16).float()  # rounded to bfloat16 by the product
        scaled = product * x32  # float32 arithmetic on it: still only bfloat16's precision
        plain = x32 * 2 + 1  # float32 alone
        upcast = x16.float().sum(1)  # a bfloat16 input read in float32: inputs are exact
        moved = x16.t().contiguous().clone().float()  # moved, not rounded
        halves = (x16.half() * 3).float()  # rounded to float16, after a bfloat16 input: float16
        both = (x16 @ w16).half().float()  # a bfloat16 rounding, then a float16 one: the narrower, bfloat16
        narrow = x16 * 2  # a bfloat16 output: its own dtype's bound already
    assert carried.of([product, scaled, plain, upcast, moved, halves, both, narrow, 3.0]) == (
        torch.bfloat16, torch.bfloat16, None, None, None, torch.float16, torch.bfloat16, None, None)


def test_the_precision_comes_from_a_meta_run_and_needs_no_memory() -> None:
    module = load_program(BACKWARD, "precision_task")
    inputs = make_input_set(module, 1, "cpu").values
    assert task_precision(module, inputs) == (torch.bfloat16,) * 4

    class ReadsBack(torch.nn.Module):  # a value read back to Python: no meta run, no finding
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x.float() * float(x.sum())

    assert output_precision(ReadsBack(), [torch.randn(4).bfloat16()]) is None

    class Weighted(torch.nn.Module):  # parameters: meta copies, the model's own left alone
        def __init__(self) -> None:
            super().__init__()
            self.linear = torch.nn.Linear(16, 4).bfloat16()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.linear(x).float()

    model = Weighted()
    before = model.linear.weight.detach().clone()
    assert output_precision(model, [torch.randn(8, 16).bfloat16()]) == (torch.bfloat16,)
    assert model.linear.weight.device.type == "cpu" and torch.equal(model.linear.weight, before)


@pytest.mark.parametrize("source", [BACKWARD, RESIDUAL], ids=["backward", "residual"])
def test_eagers_own_output_passes_only_with_the_precision_it_carries(source: str) -> None:
    # eager rounds the product (and the sum) to bfloat16; float32's bound caps its own error at
    # 2e-3 of the element and the scale, under a bfloat16 rounding's 2^-8
    failed = 0
    for seed in (1, 2, 3):
        _, want, exact, precision = _references(source, seed, mixed=seed == 2)
        bad = compare.compare_outputs(want, want, exact)
        failed += bad is not None
        assert compare.compare_outputs(want, want, exact, precision=precision) is None, seed
    assert failed == 3


def _backward_kernel(values: list, round_product: bool, product_in: torch.dtype = torch.float32,
                     zero_below: float = 0.0) -> list[torch.Tensor]:
    """The backward task as a kernel computes it: the product accumulated in `product_in`
    (float32, or bfloat16 partial sums every 256 terms), rounded to bfloat16 once or not at all,
    the rest in float32; with `zero_below`, outputs under that magnitude written as zeros."""
    a, b, gamma, rstd = values
    if product_in is torch.float32:
        product = a.float() @ b.float()
    else:
        product = torch.zeros(a.shape[0], b.shape[1])
        for k in range(0, a.shape[1], 256):
            product = (product + a[:, k:k + 256].float() @ b[k:k + 256].float()).to(product_in).float()
    v2 = (_bf16(product) if round_product else product).reshape(2, 32, 768)
    v3 = v2 * gamma
    outs = [v2, v3, v3 * 768, v3 * rstd]
    return [torch.where(o.abs() < zero_below, torch.zeros_like(o), o) for o in outs]


def test_honest_kernels_pass_and_wrong_ones_fail_at_bfloat16s_bound() -> None:
    for seed in (1, 2):
        values, want, exact, precision = _references(BACKWARD, seed, mixed=seed == 2)
        for round_product in (True, False):  # (as eager rounds, or never: closer to exact)
            got = _backward_kernel(values, round_product)
            assert compare.compare_outputs(got, want, exact, precision=precision) is None, (seed, round_product)
        summed_in_bf16 = compare.compare_outputs(_backward_kernel(values, True, torch.bfloat16), want, exact, precision=precision)
        assert summed_in_bf16 is not None and summed_in_bf16.bad_elements > 1000, seed
        scale = float(want[0].abs().mean())
        zeroed = compare.compare_outputs(_backward_kernel(values, True, zero_below=scale / 64), want, exact, precision=precision)
        assert zeroed is not None and zeroed.bad_elements > 100, seed
        # (a float32 output of its own: a kernel rounding it to bfloat16 is refused)
        plain = [want[0], want[1], want[2], _bf16(want[3])]
        assert compare.compare_outputs(plain, want, exact, precision=(torch.bfloat16,) * 3 + (None,)) is not None


def test_the_timed_calls_stand_in_check_takes_the_precision_too() -> None:
    # the re-timing compares a timed call with Inductor's output alone (no exact run): a float32
    # output carrying bfloat16's rounding gets bfloat16's tolerance, not float32's 1e-4
    values, want, _, precision = _references(RESIDUAL, 1)
    a, b, c, residual = values
    once = _bf16((a.float() + b.float() @ c.float()).reshape(8, 64, 768) + residual.float())  # rounded once, as a fused kernel does
    got = [once.bfloat16(), once]
    assert compare.compare_outputs(got, want, None) is not None
    assert compare.compare_outputs(got, want, None, precision=precision) is None


# The backward task as a kernel without PyTorch compute: numpy's float32 product, then {ROUND}
# (rounded to bfloat16 once, round to nearest even on the bits; or not at all; or cut to 4
# significant bits, a wrong kernel), the rest in float32.
NUMPY_BACKWARD = '''
import numpy as np
import torch
import torch.nn as nn


def _bf16(x):
    bits = x.astype(np.float32).view(np.uint32)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return bits.view(np.float32)


def _cut(x):
    return (x.astype(np.float32).view(np.uint32) & 0xFFF80000).view(np.float32)


class ModelNew(nn.Module):
    def forward(self, arg0, arg1, arg2, arg3):
        a = (arg0.view(torch.int16).numpy().astype(np.int32) << 16).view(np.float32)
        b = (arg1.view(torch.int16).numpy().astype(np.int32) << 16).view(np.float32)
        p = a @ b
        v2 = ({ROUND}).reshape(2, 32, 768)
        v3 = v2 * arg2.numpy()
        return tuple(torch.from_numpy(np.ascontiguousarray(v, dtype=np.float32)) for v in (v2, v3, v3 * 768, v3 * arg3.numpy()))
'''


@pytest.mark.parametrize("rounding, accepted", full_tier(("_bf16(p)", True), ("p", True), ("_cut(p)", False), keep=(("_bf16(p)", True), ("_cut(p)", False))))
def test_the_judge_takes_the_backward_kernel_at_its_precision(rounding: str, accepted: bool) -> None:
    out = pooled_run(BACKWARD, NUMPY_BACKWARD.replace("{ROUND}", rounding),
                     RunConfig(seeds=(1, 2), trials=2, warmup=1, timeout=240, inductor=False))
    if accepted:
        assert (out.stage, out.reason) == ("timing", "ACCEPTED"), (out.reason, out.feedback, out.mismatch)
    else:
        assert out.reason == "MISMATCH" and out.mismatch["bad_elements"] > 1000, (out.reason, out.mismatch)


class _Process:
    """A timed call's outputs as a process holds them (`RemoteModel.read`, by a reply's handle)."""

    def __init__(self, outputs: list[torch.Tensor]) -> None:
        self.outputs = outputs

    def read(self, desc: object, what: str, copy: bool = True) -> list[torch.Tensor]:
        return [o.clone() for o in self.outputs]


def test_the_re_timings_check_against_inductor_takes_the_tasks_precision() -> None:
    # the re-timing's worker compares one timed call of the kernel with Inductor's on the same
    # inputs: a kernel rounding the residual stream once, against Inductor's output rounded as
    # eager rounds it, differs by a bfloat16 rounding in the float32 copy
    import types

    from kevin_backend.judge import retime_worker

    module = load_program(RESIDUAL, "precision_task")
    values, want, _, _ = _references(RESIDUAL, 1)
    a, b, c, residual = values
    once = _bf16((a.float() + b.float() @ c.float()).reshape(8, 64, 768) + residual.float())
    kernel, inductor = _Process([once.bfloat16(), once]), _Process(want)
    replies = {"kernel": {"outputs": [0]}, "inductor": {"outputs": [0]}}
    slots = types.SimpleNamespace(count=1)
    precision = task_precision(module, values)
    assert precision == (None, torch.bfloat16)
    retime_worker._check(kernel, inductor, replies, slots, precision)  # (no finding: returns)
    with pytest.raises(retime_worker._Ended, match="returned a wrong output"):
        retime_worker._check(kernel, inductor, replies, slots)
    wrong = _Process([once.bfloat16(), _bf16(once * (1 + 2.0 ** -6))])  # two bfloat16 ulps off at every element
    with pytest.raises(retime_worker._Ended, match="returned a wrong output"):
        retime_worker._check(wrong, inductor, replies, slots, precision)
