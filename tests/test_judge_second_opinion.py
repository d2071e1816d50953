"""The comparison's second opinion on the CPU (`measure/compare.py`, `judge/reference_sets.py`):
an output that fails the bound is compared again with its conditioning, the exact run on its
inputs moved by the output dtype's unit roundoff. The float32 case: a 27-term convolution of the
judge's mixed-scale inputs (values times 2^U(-6, 6)) scaled by a squared parameter, then a
sigmoid (the direct kernel tests' viewed-bias-sigmoid-f32). Where its sum cancels to near zero,
eager's own float32 output fails the first bound on some draws, and an honest float32 kernel
summing in another order fails it by up to 24 times; the H100 refused the direct kernel so."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from kevin_backend.generate.builtin.gemm_suite import GEMM_SUITE
from kevin_backend.judge.judged_run import Run
from kevin_backend.judge.reference_sets import run_conditioned
from kevin_backend.judge.sandbox import RunConfig
from kevin_backend.measure import compare
from kevin_backend.measure.inputs import make_input_set
from kevin_backend.measure.memory import MemoryLedger
from kevin_backend.types import load_program

sys.path.insert(0, str(Path(__file__).parent))
from direct_conv_tasks import DIRECT_TASKS  # noqa: E402
from conftest import pooled_run  # noqa: E402

TASK = DIRECT_TASKS["viewed-bias-sigmoid-f32"]

# The convolution as a float32 kernel would compute it: numpy's einsum (float32 BLAS), another
# summation order than eager's; no PyTorch op runs in the forward.
NUMPY_KERNEL = '''
import numpy as np
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x, w, b, s):
        x, w, b, s = (t.numpy() for t in (x, w, b, s))
        cols = np.lib.stride_tricks.sliding_window_view(x, (3, 3), axis=(2, 3))
        conv = np.einsum("nchwij,ocij->nohw", cols, w{ROUND}, optimize=True).astype(np.float32)
        z = conv * (s * s).reshape(-1, 1, 1) + b.reshape(-1, 1, 1)
        with np.errstate(over="ignore"):
            return torch.from_numpy((1 / (1 + np.exp(-z))).astype(np.float32))
'''
HONEST = NUMPY_KERNEL.replace("{ROUND}", "")
# the same kernel with its filter rounded to half precision first (a kernel that reads 16-bit copies)
HALF_FILTER = NUMPY_KERNEL.replace("{ROUND}", ".astype(np.float16).astype(np.float32)")
# the second input set is a mixed-scale one: seed 25 is the draw where the honest kernel is 24x past the first bound
CONFIG = RunConfig(seeds=(11, 25), trials=3, warmup=1, timeout=240, inductor=False)


def test_an_honest_float32_kernel_past_the_first_bound_on_a_cancelling_sum_is_accepted_by_the_second_opinion() -> None:
    out = pooled_run(TASK, HONEST, CONFIG)
    assert (out.stage, out.reason) == ("timing", "ACCEPTED"), (out.reason, out.feedback, out.mismatch)
    notes = (out.memory or {}).get("notes", [])
    second = [n for n in notes if "second opinion" in n]
    assert len(second) == 1 and second[0].startswith("input set 1: output 0 passed"), notes
    assert out.exact == "float64"


def test_a_kernel_of_half_precision_filters_is_refused_after_the_second_opinion() -> None:
    out = pooled_run(TASK, HALF_FILTER, CONFIG)
    assert out.reason == "MISMATCH", (out.reason, out.feedback)
    assert out.mismatch["bad_elements"] > 1000 and out.mismatch["trial"] == 0, out.mismatch
    assert not [n for n in (out.memory or {}).get("notes", []) if "passed on the second opinion" in n]


def _run(module, model: torch.nn.Module) -> Run:
    return Run(job=None, task=module, reference=model, model=None, device=torch.device("cpu"),  # type: ignore[arg-type]
               ledger=MemoryLedger(torch.device("cpu"), task_bytes=64 << 20), announce=lambda phase: None,
               exact_dtype=torch.float64)


def test_eagers_own_float32_output_passes_with_the_conditioning_run() -> None:
    """Eager's own float32 output (CPU, no TF32) fails the first bound on seeds 10, 22, 29, 50
    and 57 of 60 (one element each, 1.4-3.5 times it: the cap is below honest rounding where the sum
    cancels) and passes with the judge's conditioning run; the conditioning run leaves the
    inputs as they were."""
    module = load_program(TASK, "cancelling_task")
    model = module.Model(*module.get_init_inputs())
    exact_model = [module.Model(*module.get_init_inputs()).double()]
    run = _run(module, model)
    first, second = [], []
    for seed in (10, 22, 29, 50, 57):
        inputs = make_input_set(module, seed, "cpu", 6)
        kept = [v.clone() for v in inputs.values]
        with torch.no_grad():
            want = compare.output_list(model(*inputs.values))
            exact = compare.output_list(exact_model[0](*[v.double() for v in inputs.values]))
        bad = compare.compare_outputs(want, want, exact)
        first.append(None if bad is None else (seed, bad.bad_elements))
        conditioned = run_conditioned(run, inputs, exact_model, want, exact, torch.float32)
        assert conditioned is not None and conditioned[0].dtype == torch.float64
        assert all(torch.equal(a, b) for a, b in zip(kept, inputs.values))
        moved = (conditioned[0] - exact[0]).abs()
        assert float(moved.max()) > 1e-3 and float(moved.median()) < 1e-6  # (ill-conditioned at a few elements only)
        second.append(compare.compare_outputs(want, want, exact, conditioned=conditioned))
    assert first == [(10, 1), (22, 1), (29, 1), (50, 1), (57, 1)]
    assert second == [None] * 5


def test_the_conditioning_run_perturbs_a_broadcast_input_once_and_needs_a_wider_exact_run() -> None:
    """A stride-0 input stays one row of memory, perturbed once (every broadcast copy of an element
    moves alike); an exact run no wider than the output's dtype gets no conditioning run."""
    from kevin_backend.measure.inputs import perturbed_copy

    row = torch.randn(1, 64)
    wide = row.expand(32, 64)
    moved = perturbed_copy(wide, torch.float64, 2.0 ** -24, torch.Generator().manual_seed(1))
    assert moved.stride() == (0, 1) and moved.untyped_storage().nbytes() == 64 * 8
    ratio = moved[0] / row[0].double()
    assert set(torch.round((ratio - 1) * 2 ** 24).tolist()) == {-1.0, 1.0}

    module = load_program(TASK, "cancelling_task")
    model = module.Model(*module.get_init_inputs())
    inputs = make_input_set(module, 1, "cpu", 6)
    with torch.no_grad():
        want = compare.output_list(model(*inputs.values))
    run = _run(module, model)
    run.exact_dtype = torch.float32
    assert run_conditioned(run, inputs, [model], want, want, torch.float32) is None


BLOCK = [t for t in GEMM_SUITE if t.name == "conv2d-bn-add-relu-channels-last-bf16-64x128x56x56"][0].source.replace(
    "batch_size = 64", "batch_size = 2")


def _block_kernel(x, weight, mean, invstd, gamma, beta, chunk: int = 0, zero_below: float = 0.0) -> list[torch.Tensor]:
    """The ResNet block's end as a kernel would compute it: the convolution summed in float32 (or,
    with `chunk`, its partial sums rounded to bfloat16 every `chunk` input channels), the batch
    norm in float32 rounded to bfloat16 as the model says, the input added, ReLU, rounded; with
    `zero_below`, outputs under that magnitude written as zeros."""
    if chunk:
        y = torch.zeros(x.shape[0], weight.shape[0], x.shape[2], x.shape[3], dtype=torch.bfloat16)
        for c in range(0, x.shape[1], chunk):
            y = (y.float() + F.conv2d(x[:, c:c + chunk].float(), weight[:, c:c + chunk].float(), padding=1)).bfloat16()
        y = y.float()
    else:
        y = F.conv2d(x.double(), weight.double(), padding=1).float()
    norm = ((y - mean) * invstd * gamma.float() + beta.float()).to(torch.bfloat16).float()
    out = torch.relu(norm + x.float())
    return [torch.where(out.abs() < zero_below, torch.zeros_like(out), out).to(torch.bfloat16)]


def test_a_bfloat16_block_where_an_explicit_rounding_flips_passes_on_the_second_opinion() -> None:
    """The suite's ResNet block end (batch norm of a bfloat16 convolution, rounded to bfloat16 as
    the model says, plus the block's input, ReLU), at batch 2, its exact run in float32 as the
    judge's on an H200 was: eager's own output fails the first bound on most draws (where the
    input cancels the batch norm, a rounding to bfloat16 at magnitude 1 is an error of 2^-8 in an
    output near 0.02, in a group of ReLU zeros whose scale is small); with the conditioning run
    (each input moved by bfloat16's unit roundoff), eager and a kernel summing in float32 pass;
    a kernel rounding its partial sums to bfloat16 every 16 input channels fails it, and one writing
    zeros for outputs under 1/64 fails it on the problem's own values."""
    module = load_program(BLOCK, "block_end")
    model = module.Model()
    exact_model = [module.Model().float()]
    run = _run(module, model)
    run.exact_dtype = torch.float32
    eager_refused, second = [], []
    for seed, scales in ((0, 0), (1, 6), (2, 6)):
        inputs = make_input_set(module, seed, "cpu", scales)
        with torch.no_grad():
            want = compare.output_list(model(*inputs.values))
            exact = compare.output_list(exact_model[0](*[v.float() for v in inputs.values]))
        eager_refused.append(compare.compare_outputs(want, want, exact) is not None)
        conditioned = run_conditioned(run, inputs, exact_model, want, exact, torch.bfloat16)
        assert conditioned is not None and conditioned[0].dtype == torch.float32
        row = []
        for got in (want, _block_kernel(*inputs.values), _block_kernel(*inputs.values, chunk=16),
                    _block_kernel(*inputs.values, zero_below=2.0 ** -6)):
            bad = compare.compare_outputs(got, want, exact, conditioned=conditioned)
            row.append(None if bad is None else bad.bad_elements)
        second.append(row)
    assert eager_refused == [True, True, True], eager_refused
    assert [r[:2] for r in second] == [[None, None]] * 3, second
    assert all(r[2] for r in second) and second[0][3], second  # (on mixed scales, 1/64 is below a group's precision)


# The block end as eager computes it, in numpy: bfloat16 bits read and written by hand, the convolution
# summed in float32 (BLAS) and rounded to bfloat16 as eager's is, then the batch norm, its rounding, the
# input added, ReLU, rounded (no PyTorch op in the forward)
EAGER_LIKE = '''
import numpy as np
import torch
import torch.nn as nn


def _floats(t):
    bits = t.contiguous().view(torch.int16).numpy().astype(np.uint16).astype(np.uint32) << 16
    return bits.view(np.float32)


def _bf16(a):
    bits = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    return rounded


def _round(a):
    return (_bf16(a).astype(np.uint32) << 16).view(np.float32)


class ModelNew(nn.Module):
    def forward(self, x, weight, mean, invstd, gamma, beta):
        xs = _floats(x)
        w = _floats(weight)
        padded = np.pad(xs, ((0, 0), (0, 0), (1, 1), (1, 1)))
        cols = np.lib.stride_tricks.sliding_window_view(padded, (3, 3), axis=(2, 3))
        y = _round(np.einsum("nchwij,ocij->nohw", cols, w, optimize=True).astype(np.float32))
        norm = (y - mean.numpy()) * invstd.numpy() * _floats(gamma) + _floats(beta)
        out = np.maximum(_round(norm.astype(np.float32)) + xs, 0).astype(np.float32)
        flat = torch.from_numpy(_bf16(out).astype(np.int16)).view(torch.bfloat16)
        return flat
'''


@pytest.mark.full  # (a minute; the float32 test below takes the second opinion by default)
def test_a_bfloat16_kernel_rounding_as_eager_does_is_accepted_by_the_judge_on_the_second_opinion() -> None:
    """Through the sandboxed judge on the CPU (its exact run in float64): both input sets fail the
    first bound at 1 and 8 of 802816 elements (up to 8.8 times it) and pass on the second opinion,
    noted in the verdict's memory notes."""
    out = pooled_run(BLOCK, EAGER_LIKE, RunConfig(seeds=(1, 2), trials=3, warmup=1, timeout=240, inductor=False))
    assert (out.stage, out.reason) == ("timing", "ACCEPTED"), (out.reason, out.feedback, out.mismatch)
    notes = [n for n in (out.memory or {}).get("notes", []) if "passed on the second opinion" in n]
    assert len(notes) == 2 and notes[0].startswith("input set 0") and notes[1].startswith("input set 1"), notes
