"""The comparison's fused passes (measure/compare_fused.py) against its PyTorch path on a GPU: the
same verdict, the same bad elements and first bad index, the same statistics, on outputs with
NaN, infinities, eager-only overflow, values just inside and just outside the bound, sizes that
are no multiple of a program's block, every floating dtype and without an exact run."""

from __future__ import annotations

import dataclasses
import math

import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")


def _both(monkeypatch: pytest.MonkeyPatch, got, want, exact):
    from kevin_backend.measure import compare, compare_fused

    assert compare_fused.available(got[0], want[0], exact[0] if exact else None), "the fused path is not taken"
    fused_checks: list = []
    fused = compare.compare_outputs(got, want, exact, fused_checks)
    with monkeypatch.context() as m:
        m.setattr(compare_fused, "available", lambda *a: False)
        torch_checks: list = []
        plain = compare.compare_outputs(got, want, exact, torch_checks)
    return fused, plain, fused_checks, torch_checks


def _same(fused, plain, fused_checks, torch_checks) -> None:
    assert (fused is None) == (plain is None), (fused, plain)
    for a, b in zip(fused_checks, torch_checks):
        assert a.stats["scale"] == pytest.approx(b.stats["scale"], rel=1e-12)
        assert a.stats["eager_error_q99"] == b.stats["eager_error_q99"]
        assert a.worst_ratio == pytest.approx(b.worst_ratio, rel=1e-9)
    if fused is not None:
        for name in ("reason", "bad_elements", "total_elements", "first_bad_index", "expected", "got"):
            a, b = getattr(fused, name), getattr(plain, name)
            assert a == b or (isinstance(a, float) and math.isnan(a) and math.isnan(b)), (name, a, b)
        for name in ("max_abs_error", "max_rel_error", "worst_ratio"):
            a, b = getattr(fused, name), getattr(plain, name)
            assert (math.isnan(a) and math.isnan(b)) or a == pytest.approx(b, rel=1e-9), (name, a, b)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("shape", [(4096, 1024), (3, 1000, 333), (7,)])
def test_honest_rounding_and_wrong_values_get_the_same_verdict(monkeypatch: pytest.MonkeyPatch, dtype, shape) -> None:
    g = torch.Generator(device="cuda").manual_seed(1)
    exact = torch.randn(shape, device="cuda", dtype=torch.float64, generator=g)
    want = exact.to(dtype)
    honest = (exact * (1 + 1e-3 * torch.finfo(dtype).eps * torch.randn(shape, device="cuda", dtype=torch.float64,
                                                                     generator=g))).to(dtype)
    _same(*_both(monkeypatch, [honest], [want], [exact]))
    wrong = honest.clone()
    wrong.view(-1)[wrong.numel() // 2] += 1.0
    fused = _both(monkeypatch, [wrong], [want], [exact])
    assert fused[0] is not None and fused[0].bad_elements == 1
    _same(*fused)


def test_non_finite_values_and_eager_overflow(monkeypatch: pytest.MonkeyPatch) -> None:
    n = 10_000 + 17
    exact = torch.randn(n, device="cuda", dtype=torch.float64)
    exact[5] = math.nan
    exact[6] = math.inf
    want = exact.float()
    want[7] = math.inf  # eager overflowed, exact did not
    got = want.clone()
    _same(*_both(monkeypatch, [got], [want], [exact]))  # NaN where NaN, the same infinity, eager's infinity: passes
    assert _both(monkeypatch, [got], [want], [exact])[0] is None
    for index, value in ((100, math.nan), (6, -math.inf), (200, math.inf)):
        bad = got.clone()
        bad[index] = value
        fused = _both(monkeypatch, [bad], [want], [exact])
        assert fused[0] is not None and fused[0].reason == ("MISMATCH" if index == 6 else "NAN_INF")
        _same(*fused)


def test_values_just_inside_and_just_outside_the_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    from kevin_backend.measure import compare

    n = 1 << 20
    exact = torch.randn(n, device="cuda", dtype=torch.float64)
    want = exact.float()
    checks: list = []
    compare.compare_outputs([want], [want], [exact], checks)
    scale, q = checks[0].stats["scale"], checks[0].stats["eager_error_q99"]
    bound = compare.BOUNDS[torch.float32]
    ref = exact
    allowed = bound.rho * (ref.abs() + scale) + torch.minimum(bound.k * ((want.double() - ref).abs() + q),
                                                              bound.cap * (ref.abs() + scale))
    for factor in (0.5, 2.0):  # (float32 rounding moves a value by 6e-8 of itself: far less than half the bound)
        got = (ref + factor * allowed).float()
        expected_bad = int(((got.double() - ref).abs() > allowed).sum())
        assert expected_bad == (0 if factor < 1 else n)
        fused = _both(monkeypatch, [got], [want], [exact])
        assert (fused[0].bad_elements if fused[0] else 0) == expected_bad
        _same(*fused)


def test_without_an_exact_run(monkeypatch: pytest.MonkeyPatch) -> None:
    want = torch.randn(5000, 77, device="cuda")
    got = want * (1 + 5e-5)
    _same(*_both(monkeypatch, [got], [want], None))
    _same(*_both(monkeypatch, [want * (1 + 5e-3)], [want], None))


def test_a_strided_output_takes_the_pytorch_path() -> None:
    from kevin_backend.measure import compare_fused

    w = torch.randn(64, 64, device="cuda")
    assert not compare_fused.available(w.t(), w, None) and compare_fused.available(w, w, None)
    assert not compare_fused.available(w.cpu(), w.cpu(), None)


def test_a_mismatch_record_is_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    exact = torch.randn(4096, device="cuda", dtype=torch.float64)
    want = exact.float()
    got = want + 1.0
    fused, plain, _, _ = _both(monkeypatch, [got], [want], [exact])
    assert dataclasses.asdict(fused).keys() == dataclasses.asdict(plain).keys()
    assert fused.bad_elements == 4096 and fused.max_abs_error == pytest.approx(1.0, rel=1e-6)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_16_bit_groups_their_own_scale_the_same_on_both_paths(monkeypatch: pytest.MonkeyPatch, dtype) -> None:
    """The 16-bit rule's local scales (a group of 2048 elements each, the last one short): a
    mixed-scale product zeroed where small, and rows of a thousandth of the others' size off
    by a thousandth, get the same verdicts, counts and first index on both paths."""
    g = torch.Generator(device="cuda").manual_seed(2)
    shape = (333, 1001)
    exps = torch.randint(-6, 7, shape, device="cuda", generator=g).double()
    exact = torch.randn(shape, device="cuda", dtype=torch.float64, generator=g) * torch.exp2(exps)
    want = exact.to(dtype)
    _same(*_both(monkeypatch, [want], [want], [exact]))
    zeroed = torch.where(exact.abs() < 0.01 * exact.abs().mean(), torch.zeros_like(want), want)
    fused = _both(monkeypatch, [zeroed], [want], [exact])
    assert fused[0] is not None and fused[0].bad_elements > 0.2 * exact.numel()  # (28% on the H200)
    _same(*fused)
    exact = torch.randn(shape, device="cuda", dtype=torch.float64, generator=g)
    exact[200:] *= 1e-3
    want = exact.to(dtype)
    off = want.clone()
    off[250] = (exact[250] + 1e-3 * torch.sign(exact[250])).to(dtype)
    fused = _both(monkeypatch, [off], [want], [exact])
    assert fused[0] is not None and fused[0].first_bad_index[0] == 250
    _same(*fused)
