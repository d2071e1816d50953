"""QuACK as a measured peer, on the CPU: which roofline-suite tasks QuACK takes and why not the
others (benchmarks/quack_peer.py, read from QuACK 0.6.5's sources), the arguments built for its
functions, what bench_builtin.py makes of its times, and the stored tables' QuACK columns and goals
(benchmarks/tables.py; a result without QuACK renders as before). Whether QuACK computes the task is
left to the GPU run, which checks its outputs against the task's reference before timing them."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
import torch

from conftest import BENCHMARKS, load_benchmark
from kevin_backend.generate.builtin.roofline_suite import ROOFLINE_SUITE
from kevin_backend.types import load_program

TASKS = {task.name: task for task in ROOFLINE_SUITE}
peer = load_benchmark("quack_peer")
tables = load_benchmark("tables")

TAKEN = {
    "layernorm-last-bf16-1Mx64", "layernorm-last-bf16-16384x8192",
    "rmsnorm-last-f32-8192x8192", "rmsnorm-last-bf16-32768x4096", "rmsnorm-last-f32-4096x393216",
    "rmsnorm-last-bf16-32768x16384", "rmsnorm-last-bf16-32768x65536", "rmsnorm-last-f16-1Mx64", "add-rmsnorm-bf16-32768x4096",
    "softmax-last-f32-16x4096x1024", "softmax-last-bf16-32768x4096", "softmax-last-f32-1Mx64", "softmax-last-f32-4096x393216",
    "softmax-last-f32-16384x8192", "softmax-last-bf16-32768x16384", "softmax-last-bf16-32768x65536",
    "crossentropy-f32-8192x32000", "crossentropy-f32-8192x50257", "crossentropy-bf16-16384x131072",
}

# why QuACK does not take these (a part of the reason)
REFUSED = {
    "crossentropy-bf16-16384x50257": "cp.async of 2 bytes",  # the failure issue 35 saw
    "softmax-last-f32-16x1M": "cluster of 16 blocks leaves each block 256 KiB",
    "softmax-last-f32-8x4M": "1024 KiB",
    "softmax-last-bf16-16x4M": "512 KiB",
    "layernorm-last-f32-16x4M": "1024 KiB",
    "layernorm-chw-f32-16x64x256x256": "a row of 4194304 values",  # [C, H, W] flattened: one row of 4M
    "softmax-mid-f32-128x4096x64": "reduces over dimension 1 of 3",
    "softmax-dim0-bf16-4096x16384": "reduces over dimension 0 of 2",
    "rmsnorm-dim1-f32-16x64x256x256": "reduces over dimension 1 of 4",
    "softmax-transposed-input-f32-16384x4096": "transposed view",
    "layernorm-channels-last-f16-64x64x64x256": "permuted (channels-last) view",
    "rmsnorm-channels-last-bf16-32x64x64x512": "permuted (channels-last) view",
    "logsoftmax-last-bf16-8192x50257": "no log-softmax",
    "groupnorm-f32-16x64x256x256": "no group norm",
    "sum-dim0-f32-128x1024x1024": "not one of QuACK's operations",
    "max-sum-last-f32-16384x16384": "not one of QuACK's operations",
    "l2norm-dim1-f32-32768x65535": "not one of QuACK's operations",
}


def _meta(name: str) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    module = load_program(TASKS[name].source, "quack_test_" + re.sub(r"\W", "_", name))
    with torch.device("meta"):
        inputs = list(module.get_inputs())
        out = module.Model()(*inputs)
    return inputs, list(out) if isinstance(out, tuple) else [out]


def test_which_tasks_quack_takes_over_the_whole_suite() -> None:
    verdicts = {task.name: peer.quack_verdict(task) for task in ROOFLINE_SUITE}
    assert {name for name, v in verdicts.items() if v.taken} == TAKEN
    for name, v in verdicts.items():
        assert v.task == name and v.reason, name
        assert v.taken == (v.op is not None)
    for name, part in REFUSED.items():
        assert part in verdicts[name].reason, (name, verdicts[name].reason)
    assert verdicts["softmax-last-f32-4096x393216"].reason == "softmax: 16 block(s) a row, 96 KiB of shared memory a block"


def test_every_task_named_for_one_of_quacks_operations_is_decided() -> None:
    """A task named for a softmax, a norm QuACK has or a cross-entropy is in FORMS or NOT_QUACK: a
    new one cannot fall to "not one of QuACK's operations" unseen."""
    assert set(peer.FORMS) <= set(TASKS) and set(peer.NOT_QUACK) <= set(TASKS)
    assert not set(peer.FORMS) & set(peer.NOT_QUACK)
    for name in TASKS:
        if re.match(r"(add-)?(log)?softmax|(add-)?rmsnorm|layernorm|crossentropy|groupnorm|instancenorm|batchnorm", name):
            assert name in peer.FORMS or name in peer.NOT_QUACK, name


@pytest.mark.parametrize("name", sorted(peer.FORMS))
def test_each_form_is_what_its_task_computes(name: str) -> None:
    form, source = peer.FORMS[name], TASKS[name].source
    forward = source.split("def get_inputs")[0]
    called = {"softmax": "torch.softmax(", "layernorm": "F.layer_norm(", "cross_entropy": "F.cross_entropy(", "rmsnorm": "rsqrt("}
    assert called[form.op] in forward or (form.op == "rmsnorm" and "torch.sqrt(torch.mean(x ** 2" in forward), name
    if form.op == "softmax":
        (dim,) = re.findall(r"dim=(-?\d)", forward)
        assert form.dim == int(dim) or (form.dim == -1 and int(dim) == _meta(name)[0][0].dim() - 1)
    if form.eps is not None:  # as the task writes it (F.layer_norm's default, 1e-5, where it writes none)
        written = re.findall(r"\beps ?= ?([0-9.e-]+)", source)
        assert [float(e) for e in written] in ([form.eps], [form.eps] * 2) or (not written and form.eps == 1e-5), (name, written)
    assert form.residual == ("residual" in forward)
    assert form.dims == (3 if "(features, dim1, dim2)" in forward else 1)


@pytest.mark.parametrize(("op", "n", "dtype", "widest", "cluster", "kib"), [
    ("softmax", 393216, torch.float32, 32, 16, 96),       # issue 35 ran it: 0.77 of copy
    ("softmax", 65536, torch.bfloat16, 16, 4, 32),
    ("softmax", 1 << 20, torch.float32, 32, 16, 256),     # over 227 KiB: not taken
    ("softmax", 64, torch.float32, 32, 1, 4),             # 16 rows of 64 a block of 128 threads
    ("rmsnorm", 393216, torch.float32, 32, 16, 96),
    ("rmsnorm", 16384, torch.bfloat16, 16, 1, 32),
    ("layernorm", 64, torch.bfloat16, 32, 1, 2),          # a float32 weight: 4-wide vectors of bf16
    ("cross_entropy", 131072, torch.bfloat16, 16, 8, 32),
    ("cross_entropy", 50257, torch.float32, 32, 2, 99),   # issue 35 ran it: 0.73 of copy
    ("cross_entropy", 32000, torch.float32, 32, 2, 64),
])
def test_quack_launch_as_read_from_its_sources(op: str, n: int, dtype: torch.dtype, widest: int, cluster: int, kib: int) -> None:
    tile = peer.quack_tile(op, n, dtype, widest)
    assert tile["cluster"] == cluster and round(tile["shared_bytes"] / 1024) == kib, tile


def test_rmsnorm_clusters_are_capped_so_each_block_has_its_own_part_of_the_row() -> None:
    assert peer.quack_tile("rmsnorm", 4096, torch.float32, 32)["cluster"] == 1
    assert peer._cluster("rmsnorm", 300_000, 16) == 16  # a row of 300000 16-bit values: 16 blocks ...
    capped = peer.quack_tile("rmsnorm", 300_000, torch.bfloat16, 16)  # ... but 8-wide vectors of 256 threads: 146 a block
    assert capped["cluster"] == 16 and capped["vector"] == 8
    assert peer.quack_tile("rmsnorm", 2050, torch.bfloat16, 16)["vector"] == 2  # gcd(2050, 8): 4-byte copies


def test_the_16_byte_and_4_byte_rules() -> None:
    def verdict(op: str, shape: tuple[int, ...], dtype: torch.dtype) -> str | None:
        with torch.device("meta"):
            inputs = [torch.empty(shape, dtype=dtype)] + ([torch.empty(shape[:1], dtype=torch.int64)] if op == "cross_entropy" else [])
        return peer.check_form(peer.Form(op), inputs)

    assert verdict("softmax", (8, 1000), torch.float32) is None  # 4000 bytes a row
    assert "16-byte" in verdict("softmax", (8, 1001), torch.float32)
    assert "16-byte" in verdict("softmax", (8, 1004), torch.bfloat16)  # 2008 bytes
    assert verdict("cross_entropy", (8, 1001), torch.float32) is None  # scalar 4-byte copies
    assert verdict("cross_entropy", (8, 1002), torch.bfloat16) is None  # 2-wide bf16: 4 bytes
    assert "cp.async of 2 bytes" in verdict("cross_entropy", (8, 1001), torch.bfloat16)
    assert "cp.async of 2 bytes" in verdict("rmsnorm", (8, 1001), torch.float16)


def test_softmax_call_reads_the_rows_in_place() -> None:
    x = torch.randn(2, 3, 8)
    call = peer.build_call(peer.Form("softmax"), [x], [torch.empty(2, 3, 8)])
    assert (call.module, call.function, call.kwargs) == ("quack.softmax", "softmax", {})
    (rows,) = call.args
    assert rows.shape == (6, 8) and rows.data_ptr() == x.data_ptr()  # a view: no copy timed with QuACK
    assert call.shapes == ((2, 3, 8),) and call.dtypes == (torch.float32,)


@pytest.mark.parametrize(("name", "function", "arguments", "kwargs"), [
    ("rmsnorm-last-bf16-32768x65536", "rmsnorm", [((32768, 65536), torch.bfloat16), ((65536,), torch.bfloat16)], {"eps": 1e-6}),
    ("rmsnorm-last-f32-4096x393216", "rmsnorm", [((4096, 393216), torch.float32), ((393216,), torch.float32)], {"eps": 1e-6}),
    ("layernorm-last-bf16-16384x8192", "layernorm_fwd",
     [((16384, 8192), torch.bfloat16), ((8192,), torch.float32), ((8192,), torch.float32)], {"eps": 1e-5}),
    ("crossentropy-bf16-16384x131072", "cross_entropy", [((16384, 131072), torch.bfloat16), ((16384,), torch.int64)],
     {"reduction": "mean"}),
    ("softmax-last-f32-16x4096x1024", "softmax", [((65536, 1024), torch.float32)], {}),
])
def test_the_arguments_built_for_quacks_functions(name: str, function: str, arguments: list, kwargs: dict) -> None:  # type: ignore[type-arg]
    inputs, outputs = _meta(name)
    call = peer.build_call(peer.FORMS[name], inputs, outputs)
    assert call.function == function and call.module == {"softmax": "quack.softmax", "cross_entropy": "quack.cross_entropy"}.get(
        function, "quack.rmsnorm")
    assert [(tuple(a.shape), a.dtype) for a in call.args] == arguments
    assert call.kwargs == kwargs
    assert call.shapes == tuple(tuple(o.shape) for o in outputs) and call.dtypes == tuple(o.dtype for o in outputs)


def test_the_fused_residual_add_asks_quack_for_both_outputs() -> None:
    inputs, outputs = _meta("add-rmsnorm-bf16-32768x4096")
    call = peer.build_call(peer.FORMS["add-rmsnorm-bf16-32768x4096"], inputs, outputs)
    x, weight = call.args
    assert x.shape == (32768, 4096) and weight.shape == (4096,)
    assert call.kwargs["prenorm"] is True and call.kwargs["eps"] == 1e-6 and call.kwargs["residual"].shape == (32768, 4096)
    assert call.shapes == ((32768, 4096), (32768, 4096))  # the normalised output, then the new residual stream


def test_finish_gives_the_tasks_outputs() -> None:
    call = peer.QuackCall("m", "f", (), {}, shapes=((),), dtypes=(torch.bfloat16,))
    (loss,) = peer.finish(torch.tensor(2.5), call)  # QuACK's float32 mean loss, for a bf16 task
    assert loss.dtype == torch.bfloat16 and loss.shape == () and loss.item() == 2.5
    two = peer.QuackCall("m", "f", (), {}, shapes=((2, 3), (2, 3)), dtypes=(torch.float32, torch.float32))
    a, b = peer.finish((torch.zeros(6), torch.ones(2, 3)), two)
    assert a.shape == (2, 3) and b.sum() == 6
    with pytest.raises(ValueError, match="returned 1 outputs, the task 2"):
        peer.finish(torch.zeros(6), two)


def test_which_prints_every_task() -> None:
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert peer.main(["--which", "--categories", "loss"]) == 0
    lines = out.getvalue().splitlines()
    assert lines[-1] == "QuACK 0.6.5 takes 3 of 8 tasks"
    assert any(line.startswith("crossentropy-bf16-16384x50257") and " not " in line for line in lines)


# -- bench_builtin.py's columns and summary ------------------------------------------------------------


@pytest.fixture(scope="module")
def bench() -> Any:
    return load_benchmark("bench_builtin")


def test_the_bench_columns_and_summary(bench: Any) -> None:
    ran = {"task": "a", "quack": "ran", "quack_ms": 2.0, "quack_fraction": 0.9, "quack_note": "softmax: ..."}
    assert bench.quack_columns(ran, 1.6)["vs_quack"] == pytest.approx(1.25)
    assert bench.quack_columns(ran, None)["vs_quack"] is None
    assert bench.quack_columns(None, 1.0)["quack"] == "not measured"
    rows = [{"task": "a", **bench.quack_columns(ran, 1.6)}, {"task": "b", **bench.quack_columns({**ran, "task": "b"}, 2.5)},
            {"task": "c", **bench.quack_columns({**ran, "task": "c"}, None)},  # no correct kernel: slower
            {"task": "d", **bench.quack_columns({"task": "d", "quack": "not taken", "quack_note": "no"}, 1.0)},
            {"task": "e", **bench.quack_columns({"task": "e", "quack": "failed", "quack_note": "x"}, 1.0)}]
    summary = bench.quack_summary(rows)
    assert summary["quack_ran"] == 3 and summary["as_fast_as_quack"] == 1 and summary["slower_than_quack"] == ["b", "c"]
    assert summary["vs_quack_geomean"] == pytest.approx((1.25 * 0.8) ** 0.5)
    assert summary["quack_not_taken"] == 1 and summary["quack_failed"] == ["e"]


def test_without_quack_installed_the_bench_says_so_once(bench: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(bench.importlib.util, "find_spec", lambda name: None)
    assert bench.quack_wanted("auto", "roofline") is False
    assert "QuACK (quack-kernels) is not installed" in capsys.readouterr().err
    assert bench.quack_wanted("none", "roofline") is False and bench.quack_wanted("quack", "default") is False
    assert capsys.readouterr().err == ""  # nothing more said when QuACK is not asked for
    monkeypatch.setattr(bench.importlib.util, "find_spec", lambda name: object())
    assert bench.quack_wanted("auto", "roofline") is True


# -- the stored tables -------------------------------------------------------------------------------


def _data(with_quack: bool) -> dict[str, Any]:
    def row(task: str, kernel_ms: float | None, quack: dict[str, Any]) -> dict[str, Any]:
        r = {"task": task, "category": "softmax", "correct": kernel_ms is not None, "reasons": ["ACCEPTED"], "variant": "t256",
             "kernel_ms": kernel_ms, "inductor_ms": 2.0, "vs_inductor": 2.0 / kernel_ms if kernel_ms else None, "bytes": 1e9,
             "kernel_fraction": 0.9 if kernel_ms else None, "inductor_fraction": 0.5}
        return {**r, **quack} if with_quack else r

    rows = [row("s1", 1.0, {"quack": "ran", "quack_ms": 1.2, "quack_fraction": 0.75, "vs_quack": 1.2, "quack_note": "softmax"}),
            row("s2", 1.0, {"quack": "ran", "quack_ms": 0.9, "quack_fraction": 1.0, "vs_quack": 0.9, "quack_note": "softmax"}),
            row("s3", 1.0, {"quack": "not taken", "quack_ms": None, "quack_fraction": None, "vs_quack": None,
                            "quack_note": "QuACK has a softmax but no log-softmax"})]
    summary = {"median_kernel_fraction": 0.9, "tasks_inductor_below_half": 0, "vs_inductor_where_inductor_below_half": None,
               "implausible_inductor": [], "kept": 3, "not_kept": 0, "slowest_kept": 2.0}
    return {"meta": {}, "rows": rows, "roofline_summary": summary, "kernel_roofline": 0.9, "inductor_roofline": 0.5}


def test_a_result_with_quack_has_its_columns_goals_and_refusals() -> None:
    blocks = tables.builtin_roofline(_data(True))
    header = blocks["tasks"].splitlines()[0]
    assert "| x Inductor | QuACK ms | x QuACK | MB moved |" in header and "| Inductor % of copy | QuACK % of copy | variant |" in header
    assert "| s1 | softmax | yes | 1.0000 | 2.0000 | 2.00x | 1.2000 | 1.20x | 1000 | 90% | 50% | 75% | t256 |" in blocks["tasks"]
    assert "| s3 | softmax | yes | 1.0000 | 2.0000 | 2.00x | not taken | - | 1000 | 90% | 50% | - | t256 |" in blocks["tasks"]
    assert "| at least as fast as QuACK, the 2 tasks QuACK ran | 1 of 2 (slower: s2) | all |" in blocks["goals"]
    assert "| geometric mean over QuACK, the 2 tasks QuACK ran | 1.04x | >= 1.05x |" in blocks["goals"]
    assert blocks["quack"].splitlines()[2:] == ["| s3 | not taken | QuACK has a softmax but no log-softmax |"]


def test_a_result_without_quack_renders_as_before() -> None:
    blocks = tables.builtin_roofline(_data(False))
    assert set(blocks) == {"tasks", "goals"} and "QuACK" not in blocks["tasks"] + blocks["goals"]
    assert blocks["tasks"].splitlines()[0] == ("| task | kind | correct | kernel ms | Inductor ms | x Inductor | MB moved "
                                               "| kernel % of copy | Inductor % of copy | variant |")
    for path in sorted((BENCHMARKS / "results").glob("builtin_roofline_*.json")):  # every stored run: no QuACK in it
        data = json.loads(path.read_text())["data"]
        assert set(tables.builtin_roofline(data)) == {"tasks", "goals"}, path.name


def test_measure_task_checks_before_it_times(monkeypatch: pytest.MonkeyPatch) -> None:
    """The GPU run's steps on the CPU, with a stand-in for QuACK's function (not a judge of QuACK:
    the GPU run is): the task's inputs and reference, the call built and run, its outputs compared
    with the judge's rule before any timing; a wrong result is reported, not timed; an error of
    QuACK's is reported with its message."""
    from kevin_backend.generate.builtin.suite import SuiteTask

    source = TASKS["softmax-last-f32-16384x8192"].source.replace("batch_size = 16_384", "batch_size = 64").replace(
        "dim = 8192", "dim = 256")
    task = SuiteTask("softmax-small-f32-64x256", "softmax", source)
    monkeypatch.setitem(peer.FORMS, task.name, peer.Form("softmax"))

    def stand_in(result: Any) -> Any:
        return lambda call: (lambda: peer.finish(result(call.args[0]), call))

    monkeypatch.setattr(peer, "bind", stand_in(lambda rows: torch.softmax(rows, -1)))
    row = peer.measure_task(task, torch.device("cpu"), copy_gbps=1.0, trials=3, warmup=1)
    assert row["quack"] == "ran" and row["quack_exact"] == "float64" and row["quack_ms"] > 0
    assert row["quack_bytes"] == 2 * 64 * 256 * 4
    assert row["quack_fraction"] == pytest.approx(row["quack_bytes"] / (row["quack_ms"] * 1e-3) / 1e9)

    monkeypatch.setattr(peer, "bind", stand_in(lambda rows: torch.softmax(rows, -1) * 1.01))
    row = peer.measure_task(task, torch.device("cpu"), copy_gbps=1.0, trials=3, warmup=1)
    assert row["quack"] == "wrong" and "quack_ms" not in row and "MISMATCH" in row["quack_note"]

    def refuse(rows: torch.Tensor) -> torch.Tensor:
        raise AssertionError("Input N 257 is not divisible by vector size 4")

    monkeypatch.setattr(peer, "bind", stand_in(refuse))
    row = peer.measure_task(task, torch.device("cpu"), copy_gbps=1.0, trials=3, warmup=1)
    assert row == {"task": task.name, "quack": "failed", "quack_note": "AssertionError: Input N 257 is not divisible by vector size 4"}
    assert peer.measure_task(TASKS["sum-dim0-f32-128x1024x1024"], torch.device("cpu"), 1.0, 3, 1)["quack"] == "not taken"


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU's answer")
def test_the_bench_runs_quack_in_a_process_of_its_own(bench: Any, capfd: pytest.CaptureFixture[str]) -> None:
    """Without a GPU, quack_peer.py (started with the bench's arguments, which it accepts) says it
    needs one and measures nothing: the bench then has no QuACK column."""
    assert bench.quack_times([TASKS["softmax-last-f32-16384x8192"]], 3000.0, 5, 120) is None
    err = capfd.readouterr().err
    assert "quack_peer needs a CUDA GPU" in err and "QuACK measured nothing" in err


def test_the_gemm_suite_runs_through_the_search_with_and_without_building_ahead(bench: Any) -> None:
    # `--suite gemm`: the GEMM-epilogue suite's tasks; `--no-build-ahead`: the same writer, no
    # `foresee`, so the search builds each turn's program in its turn (the baseline of the tile-change time)
    from kevin_backend.generate.builtin.builtin_policy import BuiltinPolicy
    from kevin_backend.generate.builtin.gemm_suite import GEMM_SUITE
    from kevin_backend.generate.policy import Foreseeing, TurnReader

    assert [t.name for t in bench.suite_tasks("gemm")] == [t.name for t in GEMM_SUITE]
    plain = bench._NotForeseeing()
    assert isinstance(plain, TurnReader) and not isinstance(plain, Foreseeing) and isinstance(BuiltinPolicy(), Foreseeing)
