"""The judge's error bound on the CPU (`kevin_backend.measure.compare`): outputs compared with a
float64 run of the reference, allowed what eager's own distance from float64 says is rounding.
Honest reorderings pass; lower precision, a wrong element, a wrong row or a NaN do not."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from kevin_backend.measure import compare
from kevin_backend.measure.compare import compare_outputs

RNG = np.random.default_rng(7)


def mixed(shape: tuple[int, ...], r: int = 6) -> np.ndarray:
    """Normal values times 2^U(-r, r) per element, as the judge's mixed-scale input sets."""
    x = RNG.standard_normal(shape).astype(np.float32)
    return (x * np.exp2(RNG.integers(-r, r + 1, shape)).astype(np.float32)).astype(np.float32)


def sequential_rows(x: np.ndarray, dtype: type = np.float32) -> np.ndarray:
    """One thread per row: x[0] + x[1] + ... in `dtype`, in order."""
    return np.add.accumulate(x, axis=-1, dtype=dtype)[..., -1]


def tree_rows(x: np.ndarray) -> np.ndarray:
    """A block-wide tree: 256 strided partial sums, then pairwise."""
    rows, n = x.shape
    parts = np.add.accumulate(x.reshape(rows, n // 256, 256), axis=1, dtype=np.float32)[:, -1, :]
    while parts.shape[1] > 1:
        parts = (parts[:, 0::2] + parts[:, 1::2]).astype(np.float32)
    return parts[:, 0]


def verdict(got: torch.Tensor, eager: torch.Tensor, exact: torch.Tensor) -> compare.Mismatch | None:
    return compare_outputs([got], [eager], [exact])


@pytest.mark.parametrize("n", [4096, 65536])
def test_sequential_and_tree_row_sums_under_cancellation_pass_in_float32(n: int) -> None:
    x = mixed((256, n))  # mixed scales: sums cancel, the float32 eager sum is itself off exact
    exact, eager = torch.from_numpy(x.astype(np.float64).sum(-1)), torch.from_numpy(x).sum(-1)
    old_rule = torch.isclose(torch.from_numpy(sequential_rows(x)).double(), eager.double(), rtol=1e-4, atol=1e-4)
    assert not old_rule.all()  # KernelBench's fixed 1e-4 against float32 eager rejects this honest sum
    assert verdict(torch.from_numpy(sequential_rows(x)), eager, exact) is None
    assert verdict(torch.from_numpy(tree_rows(x)), eager, exact) is None


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_row_sums_in_half_types_pass_whatever_the_order(dtype: torch.dtype) -> None:
    x = torch.from_numpy(mixed((512, 4096), r=3)).to(dtype)
    exact, eager = x.double().sum(-1), x.sum(-1)  # eager accumulates in float32, rounds once
    seq = torch.from_numpy(sequential_rows(x.float().numpy())).to(dtype)
    tree = torch.from_numpy(tree_rows(x.float().numpy())).to(dtype)
    assert verdict(seq, eager, exact) is None and verdict(tree, eager, exact) is None
    # accumulating in the half type itself is not an honest reordering on rows of 4096
    low = torch.from_numpy(sequential_rows(x.float().numpy().astype(np.float16), np.float16)).to(dtype)
    assert verdict(low, eager, exact) is not None


@pytest.mark.parametrize("k", [256, 4096])
def test_matmul_with_another_summation_order_passes_on_mixed_scales(k: int) -> None:
    a, b = mixed((256, k)), mixed((k, 256))
    exact, eager = torch.from_numpy(a.astype(np.float64) @ b.astype(np.float64)), torch.from_numpy(a) @ torch.from_numpy(b)
    by_k = np.zeros((256, 256), np.float32)
    for i in range(k):  # k-outer accumulation, as a tiled kernel with one accumulator per output does
        by_k = (by_k + np.outer(a[:, i], b[i]).astype(np.float32)).astype(np.float32)
    assert verdict(torch.from_numpy(by_k), eager, exact) is None


def test_float32_computed_through_fp16_or_bf16_round_trips_is_rejected() -> None:
    x, w = torch.from_numpy(mixed((1024, 1024))), torch.from_numpy(mixed((1024, 1024)))
    exact = torch.sigmoid(x.double()) * w.double() + 1
    eager = torch.sigmoid(x) * w + 1
    assert verdict(exact.float(), eager, exact) is None  # a correctly rounded fused kernel
    for low in (torch.float16, torch.bfloat16):
        through = (torch.sigmoid(x.to(low).float()) * w.to(low).float() + 1).to(low).float()
        bad = verdict(through, eager, exact)
        assert bad is not None and bad.reason == "MISMATCH" and bad.bad_elements > 1000
    a, b = mixed((256, 256)), mixed((256, 256))
    exact = torch.from_numpy(a.astype(np.float64) @ b.astype(np.float64))
    halves = torch.from_numpy(a.astype(np.float16).astype(np.float32) @ b.astype(np.float16).astype(np.float32))
    assert verdict(halves, torch.from_numpy(a) @ torch.from_numpy(b), exact) is not None


def test_one_wrong_element_in_a_million_and_one_wrong_row_in_ten_thousand_are_rejected() -> None:
    x = torch.randn(1000, 1000)
    exact, eager = torch.tanh(x.double()), torch.tanh(x)
    one = eager.clone()
    one[123, 456] *= 1.001
    bad = verdict(one, eager, exact)
    assert bad is not None and bad.bad_elements == 1 and bad.first_bad_index == (123, 456)
    rows = torch.from_numpy(mixed((10_000, 512)))
    exact, eager = rows.double().sum(-1), rows.sum(-1)
    shifted = eager.clone()
    shifted[7777] = rows[7778].sum()  # one row reads its neighbour's values
    bad = verdict(shifted, eager, exact)
    assert bad is not None and bad.bad_elements == 1 and bad.first_bad_index == (7777,)


def test_nan_where_the_reference_is_finite_is_nan_inf_and_nan_where_it_is_nan_passes() -> None:
    x = torch.rand(100_000) + 0.5
    exact, eager = torch.log(x.double()), torch.log(x)
    got = eager.clone()
    got[99_999] = float("nan")
    bad = verdict(got, eager, exact)
    assert bad is not None and bad.reason == "NAN_INF"
    x[5] = -1.0  # the task's own NaN: log of a negative value
    exact, eager = torch.log(x.double()), torch.log(x)
    assert verdict(eager.clone(), eager, exact) is None
    finite_there = eager.clone()
    finite_there[5] = 0.0
    assert verdict(finite_there, eager, exact) is not None


def test_where_only_eager_overflows_its_infinity_is_accepted() -> None:
    x = torch.tensor([100.0, 1.0, 2.0])
    exact, eager = torch.exp(x.double()), torch.exp(x)  # exp(100) overflows float32 only
    assert torch.isinf(eager[0]) and torch.isfinite(exact[0])
    assert verdict(eager.clone(), eager, exact) is None


def test_integer_outputs_must_equal_eager_and_shapes_and_dtypes_are_checked() -> None:
    x = torch.randn(64, 33)
    idx = x.argmax(-1)
    assert compare_outputs([idx.clone()], [idx], None) is None
    wrong = idx.clone()
    wrong[3] += 1
    assert compare_outputs([wrong], [idx], None).bad_elements == 1
    assert compare_outputs([x[:, :32]], [x], None).reason == "SHAPE_MISMATCH"
    assert compare_outputs([x.double()], [x], None).reason == "DTYPE_MISMATCH"
    assert compare_outputs([x, x], [x], None).reason == "SHAPE_MISMATCH"


def test_without_an_exact_run_the_fallback_uses_kernelbench_tolerances() -> None:
    x = torch.randn(4096)
    assert compare_outputs([x * (1 + 5e-5)], [x], None) is None
    assert compare_outputs([x * (1 + 5e-3)], [x], None) is not None


def test_chunked_comparison_finds_the_same_element_as_a_whole_one(monkeypatch: pytest.MonkeyPatch) -> None:
    x = torch.randn(64, 40, 30)
    exact, eager = torch.sin(x.double()), torch.sin(x)
    got = eager.clone()
    got[50, 7, 29] += 0.01
    whole = verdict(got, eager, exact)
    monkeypatch.setattr(compare, "_limit", lambda elements: 7)  # blocks of at most 7 elements: rows of 30 split
    chunked = verdict(got, eager, exact)
    assert whole is not None and chunked is not None
    assert whole.first_bad_index == chunked.first_bad_index == (50, 7, 29) and whole.bad_elements == chunked.bad_elements == 1


def test_the_replay_check_tells_a_stale_output_from_rounding() -> None:
    """A replay comparison that fails on a few elements just past the bound (an honest bf16
    kernel on a set without the exact run: 2 of 134M elements, 1.08x the bound) is rounding; an
    output from the old values fails almost everywhere, or far past the bound."""
    from kevin_backend.measure.compare import Mismatch
    from kevin_backend.judge.replay_check import stale

    n = 32768 * 4096
    assert not stale(Mismatch(0, "MISMATCH", 2, n, (23174, 2425), 2.26562, 2.29688, 0.0289, 0.0312, 0.0138, 1.08))
    assert stale(Mismatch(0, "MISMATCH", n // 2, n, (0, 0), 1.0, -0.3, 0.01, 3.0, 5.0, 300.0))
    assert stale(Mismatch(0, "MISMATCH", 10, n, (0, 0), 1.0, 2.0, 0.01, 1.0, 1.0, 100.0))  # few, but far
    assert stale(Mismatch(0, "MISMATCH", n // 100, n, (0, 0), 1.0, 1.02, 0.01, 0.02, 0.02, 2.0))  # near, but many
    # against a stand-in for the exact reference (Inductor's TF32 convolution in a re-timing): a
    # float32-exact kernel's few elements 12.6 times past the float32 bound are its reference's error
    tf32 = Mismatch(0, "MISMATCH", 25, 115200, (10, 0, 5, 25), -0.686122, -0.686363, 0.000145, 0.0014, 0.0014, 12.6)
    assert stale(tf32) and not stale(tf32, stand_in=True)
    wider = Mismatch(0, "MISMATCH", 157, 115200, (0, 0, 21, 21), -0.665249, -0.665036, 0.00408, 0.000143, 0.000143, 39.2)
    assert stale(wider) and not stale(wider, stand_in=True)  # (the same, on another draw: 0.14% of the elements)
    assert stale(Mismatch(0, "MISMATCH", 10, n, (0, 0), 1.0, 2.0, 0.01, 1.0, 1.0, 100.0), stand_in=True)  # few, but farther
    assert stale(Mismatch(0, "MISMATCH", n // 100, n, (0, 0), 1.0, 1.02, 0.01, 0.02, 0.02, 2.0), stand_in=True)  # many
    assert stale(Mismatch(0, "NAN_INF", 1, n))
    assert stale(Mismatch(0, "SHAPE_MISMATCH", message="returns 2 outputs, expected 1"))


def test_a_timed_call_checked_against_a_stand_in_allows_the_stand_ins_own_error() -> None:
    """The timing's replay check (`timed_output_wrong`) against eager's or Inductor's float32
    output (no exact run): a few elements 12 times past the fallback bound, a TF32 reference's
    error, are not a stale output; against the exact reference they are."""
    import torch

    from kevin_backend.judge.timing_phase import timed_output_wrong

    class _Remote:  # the kernel's process, read again: the same output
        def __init__(self, out: torch.Tensor) -> None:
            self.out = out

        def read(self, desc: object, what: str, copy: bool = True) -> list[torch.Tensor]:
            return [self.out]

    gen = torch.Generator().manual_seed(0)
    want = torch.rand(115200, generator=gen) * 2 - 1
    got = want.clone()
    got[:25] += 12 * 1e-4 * (want[:25].abs() + want.abs().mean())
    assert timed_output_wrong(_Remote(got), None, [got], [want], None, 3) == ""
    wrong = timed_output_wrong(_Remote(got), None, [got], [want], [want.double()], 3)
    assert "timed call 3 of a batch returned a wrong output" in wrong, wrong


def test_a_peers_exact_reference_upcasts_a_copy_of_the_model_and_keeps_the_input_layouts() -> None:
    """`exact_outputs`, a benchmark's float64 check of a peer (QuACK, cuDNN's graphs): a model with
    float32 parameters runs as a float64 copy on float64 copies of channels-last inputs (its
    outputs the float64 convolution's), and the model itself stays float32."""
    class Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = torch.nn.Conv2d(4, 8, 3, padding=1)

        def forward(self, x: torch.Tensor, scale: int) -> torch.Tensor:
            assert x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous()
            return torch.relu(self.conv(x)) * scale

    torch.manual_seed(3)
    model = Model()
    x = torch.randn(2, 4, 6, 6).to(memory_format=torch.channels_last)
    want = compare.output_list(model(x, 3))
    exact = compare.exact_outputs(model, [x, 3], want, torch.device("cpu"))
    assert exact is not None and exact[0].dtype == torch.float64
    assert model.conv.weight.dtype == torch.float32 and x.dtype == torch.float32
    w, b = model.conv.weight.double(), model.conv.bias.double()
    by_hand = torch.relu(torch.nn.functional.conv2d(x.double(), w, b, padding=1)) * 3
    assert torch.equal(exact[0], by_hand)
    assert (exact[0] - want[0].double()).abs().max() < 1e-4
