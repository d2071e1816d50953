"""Input sets with zeros, negative zeros and subnormals (`make_input_set(special=True)`), on the
CPU: what they hold, and the judge's third correctness set made of them. A candidate right
everywhere except at exact zeros, at -0.0 or at subnormals is rejected and told why; a task
whose reference is not finite on them (1/x) is checked without them, and the run's notes say so."""

from __future__ import annotations

import types

import pytest
import torch

from kevin_backend.generate.builtin.suite import SUITE
from kevin_backend.judge.job import Job
from kevin_backend.judge.judged_run import Run
from kevin_backend.judge.reference_sets import make_reference_set
from kevin_backend.judge.sandbox import RunConfig
from kevin_backend.measure.inputs import make_input_set
from kevin_backend.measure.memory import MemoryLedger
from kevin_backend.types import load_program
from conftest import FULL, pooled_run

ROWS, COLS = 1024, 1000  # 1,024,000 elements: every quarter holds thousands of specials


def _task(dtype: torch.dtype) -> types.SimpleNamespace:
    return types.SimpleNamespace(get_inputs=lambda: [torch.randn(ROWS, COLS).to(dtype), torch.rand(64).to(dtype),
                                                     torch.arange(10)])


def _kinds(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Masks of +0.0, -0.0 and subnormals (0 < |x| < the dtype's smallest normal)."""
    zero = x == 0
    return zero & ~torch.signbit(x), zero & torch.signbit(x), ~zero & (x.abs() < torch.finfo(x.dtype).tiny)


def _bits(x: torch.Tensor) -> torch.Tensor:
    return x.view({2: torch.int16, 4: torch.int32, 8: torch.int64}[x.element_size()])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64], ids=str)
def test_a_special_set_holds_zeros_negative_zeros_and_subnormals_spread_over_every_input(dtype: torch.dtype) -> None:
    inputs = make_input_set(_task(dtype), 7, "cpu", special=True)
    x = inputs.values[0].reshape(-1)
    positive, negative, subnormal = _kinds(x)
    n = x.numel()
    shares = [float(m.sum()) / n for m in (positive, negative, subnormal)]
    total = sum(shares)
    print(f"{dtype}: +0 {shares[0]:.5f}, -0 {shares[1]:.5f}, subnormal {shares[2]:.5f}, all {total:.5f} (1/64 = {1 / 64:.5f})")
    assert 1 / 128 < total < 1 / 32
    assert all(0.2 * total < s < 0.45 * total for s in shares), shares  # about a third each
    assert (x[subnormal] > 0).any() and (x[subnormal] < 0).any()  # subnormals of both signs
    special = positive | negative | subnormal
    quarter = n // 4
    assert special[:quarter].sum() > quarter / 128 and special[-quarter:].sum() > quarter / 128  # spread, not a prefix
    assert inputs.special and inputs.describe() == "the problem's own values, with zeros, -0 and subnormals"
    assert torch.equal(inputs.values[2], torch.arange(10))  # integers untouched

    again = make_input_set(_task(dtype), 7, "cpu", special=True)
    assert all(torch.equal(_bits(a), _bits(b)) for a, b in zip(inputs.values[:2], again.values[:2]))  # -0.0 too
    other = _kinds(make_input_set(_task(dtype), 8, "cpu", special=True).values[0].reshape(-1))
    assert not torch.equal(special, other[0] | other[1] | other[2])  # another seed, other places

    plain = make_input_set(_task(dtype), 7, "cpu")
    assert not plain.special and not (plain.values[0] == 0).any() and not (plain.values[1] == 0).any()
    assert torch.equal(_bits(plain.values[0].reshape(-1)[~special]), _bits(x[~special]))  # the rest: the plain set's


def test_specials_come_after_mixed_scales_and_leave_the_other_values_as_the_mixed_set_has_them() -> None:
    task = _task(torch.float32)
    mixed = make_input_set(task, 3, "cpu", exponent_range=6).values[0].reshape(-1)
    both = make_input_set(task, 3, "cpu", exponent_range=6, special=True)
    x = both.values[0].reshape(-1)
    positive, negative, subnormal = _kinds(x)
    special = positive | negative | subnormal
    assert torch.equal(x[~special], mixed[~special]) and special.float().mean() > 1 / 128
    assert both.describe().endswith("2^-6..2^6, with zeros, -0 and subnormals")


def test_a_small_input_gets_specials_with_its_share_of_the_chance() -> None:
    """Fewer than 64 elements: a special with probability n/64 (a 1-element scale is not always
    zeroed); over many seeds, about that share."""
    task = types.SimpleNamespace(get_inputs=lambda: [torch.randn(16)])
    hits = sum(int(((make_input_set(task, s, "cpu", special=True).values[0].abs() < 1e-30)).sum()) for s in range(400))
    print(f"16-element input, 400 seeds: {hits} specials (expected {400 * 16 / 64:.0f})")
    assert 60 < hits < 145


# ---- the judge's reference sets, in this process ----------------------------------------------

def _run(source: str) -> Run:
    task = load_program(source, "task")
    model = task.Model().eval()
    return Run(Job(task=source, candidate="", seeds=(11,), trials=1, warmup=0), task, model, model, torch.device("cpu"),
               MemoryLedger(torch.device("cpu")), lambda phase: None)


def _source(expression: str) -> str:
    return ("import torch\nimport torch.nn as nn\nclass Model(nn.Module):\n    def forward(self, x):\n"
            f"        return {expression}\ndef get_inputs():\n    return [torch.randn(128, 96)]\n"
            "def get_init_inputs():\n    return []\n")


def test_a_special_set_whose_reference_is_not_finite_is_made_without_the_specials_and_noted() -> None:
    run = _run(_source("1.0 / x"))
    ref = make_reference_set(run, 13, mixed=False, special=True)
    assert not ref.inputs.special and torch.isfinite(ref.want[0]).all()
    assert ref.inputs.exponent_range == 0 and ref.inputs.shrink == 0  # the same set, without specials
    assert any("zeros, -0 and subnormals" in n and "checked without them" in n for n in run.ledger.notes), run.ledger.notes

    run = _run(_source("torch.where(x == 0, torch.ones_like(x), x)"))
    ref = make_reference_set(run, 13, mixed=False, special=True)
    assert ref.inputs.special and (ref.want[0] == 1).sum() > 128 * 96 / 128 and not run.ledger.notes


def test_a_special_set_of_a_task_that_changes_its_inputs_is_made_again_with_its_specials() -> None:
    run = _run(_source("x.mul_(2.0).clone()"))
    ref = make_reference_set(run, 13, mixed=False, special=True)
    fresh = make_input_set(run.task, 13, "cpu", special=True).values[0]
    assert ref.inputs.special and torch.equal(_bits(ref.inputs.values[0]), _bits(fresh))


def _finite(values: list) -> bool:  # type: ignore[type-arg]
    return all(bool(torch.isfinite(v).all()) for v in values if isinstance(v, torch.Tensor) and v.is_floating_point())


def test_the_suites_special_sets_keep_their_specials_where_the_reference_stays_finite() -> None:
    """The built-in suite's tasks on their special set: a reference as finite as without the
    specials on every one (a task whose own values give NaN keeps them), and the specials dropped
    only where the reference is not finite with them. Every third task (every one in the full tier)."""
    dropped, own_nan = [], []
    tasks = SUITE if FULL else SUITE[::3]
    for task in tasks:
        ref = make_reference_set(_run(task.source), 13, mixed=False, special=True)
        if not _finite(ref.want):
            own_nan.append(task.name)
            assert not _finite(make_reference_set(_run(task.source), 13, mixed=False).want), task.name
        if not ref.inputs.special:
            dropped.append(task.name)
    print(f"suite: {len(tasks)} tasks, specials dropped on {len(dropped)}: {dropped}; "
          f"not finite on their own values: {own_nan}")
    assert len(dropped) < len(tasks) / 10


# ---- the real judge, in its sandboxed worker ------------------------------------------------

CONFIG = RunConfig(seeds=(1, 2, 3), trials=5, warmup=1, timeout=120, inductor=False)  # set 2: the special one


def _task_source(expression: str) -> str:
    return ("import torch\nimport torch.nn as nn\n\n\nclass Model(nn.Module):\n    def forward(self, x):\n"
            f"        return {expression}\n\n\ndef get_inputs():\n    return [torch.randn(64, 32)]\n\n\n"
            "def get_init_inputs():\n    return []\n")


def _candidate(body: str) -> str:
    """A candidate computing with numpy (no PyTorch op: the forward audit lets it through)."""
    return ("import numpy as np\nimport torch\nimport torch.nn as nn\n\n\nclass ModelNew(nn.Module):\n"
            "    def forward(self, x):\n        a = x.numpy()\n" + body)


ONE_AT_ZERO = "torch.where(x == 0, torch.ones_like(x), x)"
ATAN2 = "torch.atan2(x, torch.full_like(x, -1.0))"  # pi at +0.0, -pi at -0.0
FLUSH = "        a = np.where(np.abs(a) < np.finfo(np.float32).tiny, np.float32(0), a)\n"

CASES = {
    "zeros-kept": (ONE_AT_ZERO, "        return torch.from_numpy(a.copy())\n"),
    "sign-of-zero-lost": (ATAN2, "        return torch.from_numpy(np.arctan2(a + np.float32(0), np.float32(-1)))\n"),
    "subnormals-flushed": (ONE_AT_ZERO, FLUSH + "        return torch.from_numpy(np.where(a == 0, np.float32(1), a))\n"),
}
HONEST = {
    ONE_AT_ZERO: "        return torch.from_numpy(np.where(a == 0, np.float32(1), a))\n",
    ATAN2: "        return torch.from_numpy(np.arctan2(a, np.float32(-1)))\n",
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_candidate_wrong_only_at_zeros_or_subnormals_is_rejected_on_the_special_set(case: str) -> None:
    task, body = CASES[case]
    out = pooled_run(_task_source(task), _candidate(body), CONFIG)
    assert out.reason == "MISMATCH", (out.reason, out.feedback)
    assert out.mismatch is not None and out.mismatch["trial"] == 2 and out.mismatch["max_abs_error"] > 0.5, out.mismatch
    assert "Input set 2 has zeros, negative zeros and subnormals" in out.feedback, out.feedback


@pytest.mark.parametrize("task", list(HONEST), ids=["one-at-zero", "atan2"])
def test_the_same_ops_written_right_are_accepted(task: str) -> None:
    out = pooled_run(_task_source(task), _candidate(HONEST[task]), CONFIG)
    assert out.reason == "ACCEPTED", (out.reason, out.feedback)


def test_a_task_computing_one_over_x_gets_its_verdict_without_the_specials_noted() -> None:
    out = pooled_run(_task_source("1.0 / x"), _candidate("        return torch.from_numpy(np.float32(1) / a)\n"), CONFIG)
    assert out.reason == "ACCEPTED", (out.reason, out.feedback)
    notes = " ".join((out.memory or {}).get("notes", []))
    assert "zeros, -0 and subnormals" in notes and "checked without them" in notes, notes
