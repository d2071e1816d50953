"""`kevin bench` on the CPU: the models' table, JSON and chart; KernelBench tasks with correctness
and fast_p; usage errors; the pieces (timing order, fast_p, JSON round trip) on their own."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import statistics
from typing import Any

import pytest
import torch

from conftest import ReferenceGenerator
from kevin_backend.bench.results import FAST_P, BenchReport, KernelBenchResult, KevinStats, TaskResult, Timing, fast_p
from kevin_backend.measure.interleave import interleaved, round_order, timer
from kevin_backend.cli.main import main

PNG = b"\x89PNG\r\n\x1a\n"
FAST = ["--repeats", "2", "--trials", "2", "--warmup", "1"]

# Tiny KernelBench-format tasks on CPU tensors. The first is the one the backend handles: the test
# puts a kernel for its partition into the cache first.
TASKS = {
    "a_chain": '''
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x, w):
        return torch.sigmoid(x) * w + 1.0


def get_inputs():
    return [torch.randn(16, 32), torch.randn(16, 32)]


def get_init_inputs():
    return []
''',
    "b_softmax": '''
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, scale):
        super().__init__()
        self.scale = scale

    def forward(self, x):
        return torch.softmax(x * self.scale, dim=-1)


def get_inputs():
    return [torch.randn(8, 64)]


def get_init_inputs():
    return [0.125]
''',
    "c_linear_relu": '''
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.linear = nn.Linear(n, n)

    def forward(self, x):
        return torch.relu(self.linear(x)) * 2.0


def get_inputs():
    return [torch.randn(4, 16)]


def get_init_inputs():
    return [16]
''',
}


def _task_dir(tmp_path: Path, tasks: dict[str, str]) -> Path:
    folder = tmp_path / "tasks"
    folder.mkdir()
    for name, source in tasks.items():
        (folder / f"{name}.py").write_text(source)
    (folder / "README.md").write_text("not a task")
    return folder


def test_models_table_json_and_chart(tmp_path: Path, inductor_cache: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out_json, chart, table = tmp_path / "bench.json", tmp_path / "bench.png", tmp_path / "bench.md"
    code = main(["--cache-dir", str(tmp_path / "kevin"), "--no-seed", "bench", "--device", "cpu", "--size", "tiny",
                 "--dtype", "float32", "--models", "mlp", "--workloads", "infer,train", *FAST, "--inductor-cache", str(inductor_cache),
                 "--json", str(out_json), "--chart", str(chart), "--markdown", str(table)])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    data = json.loads(out_json.read_text())
    rows = {(r["model"], r["workload"]): r for r in data["models"]}
    assert set(rows) == {("mlp", "infer"), ("mlp", "train")}
    for row in rows.values():
        assert row["error"] is None
        for compiler in ("eager", "inductor", "kevin"):
            timing = row["timings"][compiler]
            assert timing["median_ms"] > 0 and len(timing["rounds_ms"]) == 2 and all(t > 0 for t in timing["rounds_ms"])
            assert timing["first_call_s"] > 0
        # each run compiles fresh for its own kevin settings: the pass saw the graphs
        assert row["kevin"]["graphs"] >= 1 and row["kevin"]["partitions"] >= 1
    assert set(rows["mlp", "infer"]["deviation"]) == {"inductor", "kevin"}
    assert "Kevin kernels run" in captured.out  # (on a CPU, none: kernels need CUDA)
    assert data["environment"]["device"] == "cpu" and data["environment"]["settings"]["size"] == "tiny"
    assert chart.read_bytes()[:8] == PNG
    assert "| mlp | tiny | float32 | infer |" in captured.out and "| mlp | tiny | float32 | train |" in captured.out
    assert table.read_text() == captured.out
    assert "[1/1] mlp" in captured.err  # progress on stderr
    report = BenchReport.from_dict(data)
    assert report.as_dict() == data


def test_every_size_and_dtype_is_a_row(tmp_path: Path, inductor_cache: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`--size` and `--dtype` take lists: one run per pair, each row saying its size and dtype."""
    out_json = tmp_path / "bench.json"
    code = main(["--cache-dir", str(tmp_path / "kevin"), "--no-seed", "bench", "--device", "cpu", "--size", "tiny",
                 "--dtype", "float32,bfloat16", "--models", "mlp", "--workloads", "infer", *FAST,
                 "--inductor-cache", str(inductor_cache), "--json", str(out_json)])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    data = json.loads(out_json.read_text())
    assert [(r["model"], r["size"], r["dtype"], r["error"]) for r in data["models"]] == [
        ("mlp", "tiny", "float32", None), ("mlp", "tiny", "bfloat16", None)]
    assert all(r["timings"]["kevin"]["median_ms"] > 0 for r in data["models"])
    assert data["environment"]["settings"]["dtype"] == "float32,bfloat16"
    assert "| mlp | tiny | bfloat16 | infer |" in captured.out and "dtype float32,bfloat16" in captured.out
    assert "at size tiny, bfloat16" in captured.err


def test_the_small_size_keeps_the_layers_and_shrinks_the_batch() -> None:
    from kevin_backend.bench.models import describe, make_model

    full, (x_full,) = make_model("mlp", "infer", "meta", size="full")
    small, (x_small,) = make_model("mlp", "infer", "meta", size="small")
    assert [p.shape for p in full.parameters()] == [p.shape for p in small.parameters()]
    assert x_small.shape[0] < x_full.shape[0] and x_small.shape[1:] == x_full.shape[1:]
    assert "batch 16" in describe("mlp", "small")


def test_kernelbench_correctness_and_fast_p(tmp_path: Path, inductor_cache: Path, monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    folder = _task_dir(tmp_path, TASKS)
    cache = tmp_path / "kevin"
    # A "kernel" for a_chain's partition (the test generator's: it runs the task's reference),
    # usable on CPU tensors; the bench's kevin (mode cache) must find it.
    monkeypatch.setenv("KEVIN_CPU_KERNELS", "1")
    monkeypatch.setenv("KEVIN_WRITER", "general")
    from kevin_backend.types import load_program

    task = load_program(TASKS["a_chain"], "a_chain")
    torch.manual_seed(0)
    prewarm = torch.compile(task.Model().eval(), backend="kevin",
                            options={"mode": "generate", "generator": ReferenceGenerator(), "cache_dir": str(cache),
                                     "seed_cache": False})
    with torch.no_grad():
        prewarm(*task.get_inputs())
    torch._dynamo.reset()

    out_json, chart = tmp_path / "kb.json", tmp_path / "kb.png"
    code = main(["--cache-dir", str(cache), "--no-seed", "bench", "--device", "cpu", "--kernelbench", str(folder), *FAST,
                 "--inductor-cache", str(inductor_cache), "--json", str(out_json), "--chart", str(chart)])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    data = json.loads(out_json.read_text())
    assert data["models"] == []  # --kernelbench alone runs the tasks only
    kb = data["kernelbench"]
    tasks = {t["task"]: t for t in kb["tasks"]}
    assert set(tasks) == set(TASKS)
    for t in tasks.values():
        assert t["error"] is None and t["correct"] is True and t["inductor_correct"] is True, t
        assert all(t["timings"][c]["median_ms"] > 0 for c in ("eager", "inductor", "kevin"))
    assert tasks["a_chain"]["kevin"]["hits"] >= 1  # the cached kernel replaced the partition
    assert tasks["a_chain"]["kernel_calls"] > 0 and f"{tasks['a_chain']['kernel_calls']} kernel calls" in captured.out  # and ran
    assert all(t["kernel_calls"] == 0 for name, t in tasks.items() if name != "a_chain")

    # fast_p: in [0, 1] and what the rows say
    result = KernelBenchResult.from_dict(kb)
    assert kb["fast_p"] == result.fast_p_table()
    for baseline in ("eager", "inductor"):
        for p in FAST_P:
            value = kb["fast_p"][baseline][str(p)]
            assert 0.0 <= value <= 1.0
            wins = [t for t in kb["tasks"] if t["correct"] and t["timings"][baseline]["median_ms"] / t["timings"]["kevin"]["median_ms"] > p]
            assert value == pytest.approx(len(wins) / len(kb["tasks"]))
        assert kb["fast_p"][baseline]["0.0"] == 1.0  # fast_0 is the fraction correct
    assert chart.read_bytes()[:8] == PNG
    assert "fast_1" in captured.out and "| a_chain | yes |" in captured.out
    assert "task b_softmax" in captured.err


def test_kernelbench_task_that_fails(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    broken = TASKS["b_softmax"].replace("return torch.softmax(x * self.scale, dim=-1)", "raise RuntimeError('boom')")
    folder = _task_dir(tmp_path, {"broken": broken, "not_a_task": "x = 1\n"})
    code = main(["--cache-dir", str(tmp_path / "kevin"), "bench", "--device", "cpu", "--kernelbench", str(folder),
                 *FAST, "--in-process"])
    captured = capsys.readouterr()
    assert code == 1
    assert "broken: RuntimeError: boom" in captured.err
    assert "not_a_task: ProblemError: problem defines no Model, get_inputs, get_init_inputs" in captured.err
    assert "| broken | error |" in captured.out


def test_kernelbench_task_with_cuda_inputs_runs_on_the_cpu(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A task that makes its inputs with `device="cuda"` (as examples/kernelbench does) runs with
    `--device cpu`: its inputs are made where the bench runs, as the judge makes them. A run of
    tasks alone is one run, whatever --size and --dtype list (the tasks keep their own)."""
    on_cuda = TASKS["a_chain"].replace("torch.randn(16, 32)", 'torch.randn(16, 32, device="cuda")')
    folder = _task_dir(tmp_path, {"on_cuda": on_cuda})
    code = main(["--cache-dir", str(tmp_path / "kevin"), "--no-seed", "bench", "--device", "cpu", "--kernelbench",
                 str(folder), *FAST, "--in-process"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "| on_cuda | yes | yes |" in captured.out
    assert "no models" not in captured.err and captured.err.count("task on_cuda ...") == 1


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--models", "mlp,resnet"], "unknown model 'resnet'; valid models: mlp, cnn, gpt2, llama"),
        (["--workloads", "infer,serve"], "unknown workload 'serve'; valid workloads: infer, train"),
        (["--kernelbench", "{tmp}/missing"], "--kernelbench: no such folder"),
        (["--kernelbench", "{tmp}"], "--kernelbench: no task files (*.py) in"),
        (["--repeats", "0"], "--repeats must be at least 1"),
        (["--round-ms", "-1"], "--round-ms must be at least 0, got -1"),
        (["--precision", "1"], "--precision must be at least 0 and below 1, got 1.0"),
        (["--max-repeats", "0"], "--max-repeats must be at least 1"),
        (["--warmup-rounds", "-1"], "--warmup-rounds must be at least 0"),
        (["--size", "full,huge"], "unknown size 'huge'; valid sizes: full, small, tiny"),
        (["--dtype", "float8"], "unknown dtype 'float8'; valid dtypes: float32, bfloat16, float16"),
        (["--device", "tpu"], "invalid choice: 'tpu'"),
    ],
)
def test_usage_errors(argv: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    device = [] if "--device" in argv else ["--device", "cpu"]
    assert main(["bench", *device, *argv]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without CUDA")
def test_default_device_needs_cuda(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "--models", "mlp"]) == 2
    err = capsys.readouterr().err
    assert "no CUDA device here" in err and "--device cpu" in err


def test_round_order_balances_positions() -> None:
    names = ["eager", "inductor", "kevin"]
    orders = [round_order(names, r) for r in range(6)]
    for name in names:
        assert sorted(o.index(name) for o in orders) == [0, 0, 1, 1, 2, 2]
    seen: list[str] = []
    got = interleaved({n: (lambda n=n: seen.append(n)) for n in names}, "cpu", rounds=3, trials=1, warmup=0)
    assert seen == [n for r in range(3) for n in round_order(names, r)]
    assert all(len(v) == 3 and all(t >= 0 for t in v) for v in got.values())
    assert timer("cpu", trials=3, warmup=1)(lambda: sum(range(1000))) > 0


def test_warmup_rounds_run_every_variant_and_are_not_counted() -> None:
    """The warm-up round runs each variant once more, first, and its (slow) times are dropped."""
    names = ["eager", "inductor", "kevin"]
    calls = {n: 0 for n in names}

    def measure(fn):  # the first call of each variant is the slow one
        return fn()

    def step(name: str) -> float:
        calls[name] += 1
        return 100.0 if calls[name] == 1 else 1.0

    got = interleaved({n: (lambda n=n: step(n)) for n in names}, "cpu", rounds=3, measure=measure, warmup_rounds=1)
    assert calls == {n: 4 for n in names}
    assert got == {n: (1.0, 1.0, 1.0) for n in names}
    with pytest.raises(ValueError, match="warmup_rounds"):
        interleaved({"a": lambda: None}, "cpu", rounds=1, warmup_rounds=-1)


def test_call_by_call_turns_put_drift_within_a_round_on_every_variant_alike() -> None:
    """The machine switches between two speeds 1.6x apart every 8 calls (faster than a round).
    Back to back, two identical variants land on different levels and differ by up to 1.6x in
    a round; taking turns call by call, each round finds them equal."""
    clock = {"calls": 0}

    def level() -> float:  # one call's time: the machine's speed at that moment
        clock["calls"] += 1
        return 1.6 if (clock["calls"] // 8) % 2 else 1.0

    fns = {"inductor": lambda: None, "kevin": lambda: None}
    back = interleaved(fns, "cpu", rounds=6, measure=lambda fn: statistics.median(level() for _ in range(8)),
                       interleave="round")
    ratios = [k / i for k, i in zip(back["kevin"], back["inductor"])]
    assert max(ratios) / min(ratios) >= 1.5  # back to back: the same code looks 1.6x apart

    clock["calls"] = 0
    turns = interleaved(fns, "cpu", rounds=6, trials=8, warmup=0, measure=lambda fn: level(), interleave="call")
    assert all(len(v) == 6 for v in turns.values())
    assert turns["kevin"] == turns["inductor"]  # call by call: equal in every round

    seen: list[str] = []
    traced = {n: (lambda n=n: seen.append(n)) for n in fns}
    interleaved(traced, "cpu", rounds=2, trials=3, warmup=1, measure=lambda fn: fn() or 1.0, interleave="call")
    # each round: the warm-up in the round's order, then the turns, the order rotating call by call
    want = []
    for r in range(2):
        order = round_order(list(fns), r)
        want += order + [n for t in range(3) for n in round_order(order, t)]
    assert seen == want and want[:4] == ["inductor", "kevin", "inductor", "kevin"] and want[4:6] == ["kevin", "inductor"]
    with pytest.raises(ValueError, match="interleave"):
        interleaved(fns, "cpu", rounds=1, interleave="trial")


def test_rounds_go_on_until_the_paired_interval_is_narrow_enough() -> None:
    """With a stop rule, rounds continue after `rounds` until it holds or `max_rounds` are done:
    noisy pairs need more rounds than steady ones, and a rule that never holds stops at the cap."""
    from kevin_backend.bench.common import BenchSettings, precise_enough

    def run(ratios: list[float], max_rounds: int) -> int:
        it = iter(ratios * 100)
        current: dict[str, float] = {}

        def kevin() -> float:
            current["k"] = next(it)
            return current["k"]

        fns = {"inductor": lambda: 1.0, "kevin": kevin}
        got = interleaved(fns, "cpu", rounds=3, measure=lambda fn: fn(), until=lambda s: precise_enough(s, 0.01),
                          max_rounds=max_rounds)
        assert len(got["kevin"]) == len(got["inductor"])
        return len(got["kevin"])

    assert run([1.0, 1.001, 0.999], 45) == 3  # steady: the first 3 rounds are enough
    noisy = run([1.0, 1.08, 0.93, 1.05, 0.96], 200)
    assert 3 < noisy < 200  # noisy: more rounds, until the interval is within +-1%
    assert run([1.0, 1.3, 0.7], 12) == 12  # very noisy: the cap
    assert precise_enough({"eager": [1.0]}, 0.01)  # nothing to compare: no reason to go on
    assert BenchSettings(device="cpu").stop_rule() is None  # on a CPU: exactly `repeats` rounds
    assert BenchSettings(device="cuda", precision=0.0).stop_rule() is None
    assert BenchSettings(device="cuda").stop_rule() is not None
    with pytest.raises(ValueError, match="precision"):
        BenchSettings(device="cpu", precision=1.5)


def test_fast_p_counts_every_task() -> None:
    def task(name: str, correct: bool, eager: float, inductor: float, kevin: float, error: str | None = None) -> TaskResult:
        timings = tuple(Timing(c, (ms,)) for c, ms in (("eager", eager), ("inductor", inductor), ("kevin", kevin)))
        return TaskResult(task=name, correct=correct, timings=timings, error=error)

    tasks = [task("fast", True, 3.0, 2.0, 1.0), task("slow", True, 1.0, 1.0, 2.0), task("wrong", False, 9.0, 9.0, 1.0),
             task("failed", False, 1.0, 1.0, 1.0, error="boom")]
    assert fast_p(tasks, 0.0) == 0.5  # correct ones
    assert fast_p(tasks, 1.0) == 0.25 and fast_p(tasks, 2.0) == 0.25 and fast_p(tasks, 3.0) == 0.0
    assert fast_p(tasks, 1.5, "inductor") == 0.25 and fast_p(tasks, 2.0, "inductor") == 0.0
    assert fast_p([], 1.0) == 0.0
    kb = KernelBenchResult("dir", tuple(tasks))
    assert KernelBenchResult.from_dict(json.loads(json.dumps(kb.as_dict()))) == kb


def test_kevin_stats_from_counters() -> None:
    before = {"graphs": 1, "partitions": 4, "hits": 1, "fallbacks": 0}
    after = {"graphs": 3, "partitions": 10, "hits": 4, "fallbacks": 1, "runtime_errors": 2}
    stats = KevinStats.between(before, after)
    assert (stats.graphs, stats.partitions, stats.hits, stats.fallbacks) == (2, 6, 3, 1)
    assert stats.short() == "3/6 hit, 1 fallback, 2 runtime error"
    assert KevinStats().short() == "cached compile"


def test_worker_that_dies_is_an_error_row(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    dying = TASKS["b_softmax"].replace("return torch.softmax(x * self.scale, dim=-1)", "import os; os._exit(7)")
    folder = _task_dir(tmp_path, {"dies": dying})
    code = main(["--cache-dir", str(tmp_path / "kevin"), "bench", "--device", "cpu", "--kernelbench", str(folder), *FAST])
    captured = capsys.readouterr()
    assert code == 1
    assert "dies: the worker process died (exit status 7)" in captured.err
    assert "| dies | error |" in captured.out


def test_chart_without_matplotlib_is_a_usage_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now raises ImportError
    assert main(["bench", "--device", "cpu", "--models", "mlp", "--chart", str(tmp_path / "c.png")]) == 2
    assert "the chart needs matplotlib" in capsys.readouterr().err
    assert not (tmp_path / "c.png").exists()


def test_reports_of_a_run_made_in_parts_merge_into_one(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from kevin_backend.bench.results import ModelResult

    def row(model: str, kevin_ms: float) -> ModelResult:
        return ModelResult(model=model, workload="infer", timings=(Timing("eager", (2.0, 2.0)), Timing("inductor", (1.0, 1.0)),
                                                                    Timing("kevin", (kevin_ms, kevin_ms))))

    task = TaskResult(task="t", correct=True, timings=(Timing("eager", (1.0,)), Timing("inductor", (0.5,)), Timing("kevin", (0.25,))))
    parts = [BenchReport({"device": "cuda", "command": "kevin bench --models mlp"}, (row("mlp", 0.9),)),
             BenchReport({"device": "cuda", "command": "kevin bench --models gpt2"}, (row("gpt2", 1.1),),
                         KernelBenchResult("examples/kernelbench", (task,)))]
    paths = []
    for i, part in enumerate(parts):
        paths.append(tmp_path / f"part{i}.json")
        paths[-1].write_text(json.dumps(part.as_dict()))
    merged = tmp_path / "all.json"
    assert main(["bench", "--merge", *map(str, paths), "--json", str(merged), "--chart", str(tmp_path / "all.png")]) == 0
    out = capsys.readouterr().out
    data = BenchReport.from_dict(json.loads(merged.read_text()))
    assert [m.model for m in data.models] == ["mlp", "gpt2"]
    assert data.kernelbench is not None and [t.task for t in data.kernelbench.tasks] == ["t"]
    assert "kevin bench --models mlp ; kevin bench --models gpt2" == data.environment["command"]
    assert "| mlp | - | - | infer |" in out and "| gpt2 | - | - | infer |" in out
    assert (tmp_path / "all.png").read_bytes()[:8] == PNG
    (tmp_path / "bad.json").write_text("{}")
    assert main(["bench", "--merge", str(tmp_path / "bad.json")]) == 2


def test_the_kernels_a_model_runs_are_listed(tmp_path: Path) -> None:
    """Each model row lists the partitions kevin kernels run (generated here with the CPU test
    generator, which really replaces them), and the table says them."""
    from conftest import ReferenceGenerator
    from kevin_backend.bench.common import BenchSettings
    from kevin_backend.bench.render import markdown
    from kevin_backend.bench.results import BenchReport
    from kevin_backend.bench.runs import measure_model

    settings = BenchSettings(device="cpu", size="tiny", repeats=1, trials=1, warmup=0, isolate=False, kevin_options={
        "cache_dir": str(tmp_path / "kevin"), "mode": "generate", "cpu_kernels": True, "generator": ReferenceGenerator(),
        "graph_check": True, "margin": -0.99})  # (a negative margin: the check keeps the stand-in kernels)
    (row,) = measure_model("mlp", ["infer"], settings)
    assert row.error is None, row.error
    assert row.kernels and all("ops [" in k for k in row.kernels), row.kernels
    assert row.kernels[0].split()[0] in ("inference", "forward")
    table = markdown(BenchReport({"device": "cpu"}, (row,)))
    assert f"- mlp tiny float32 infer: {row.kernels[0]}" in table
    # the graph-level check's finding is kept with the row and said under the table
    assert row.graph_checks and row.graph_checks[0].startswith("graph check (") and " kept" in row.graph_checks[0], row.graph_checks
    assert f"- mlp tiny float32 infer: {row.graph_checks[0]}" in table
    assert BenchReport.from_dict(BenchReport({"device": "cpu"}, (row,)).as_dict()).models[0].graph_checks == row.graph_checks


def test_a_training_check_made_on_the_second_call_is_what_the_row_says(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A training graph whose kernels are all in its backward is checked on its second call (its
    first compiles the backward). The row reads the check's note and its drops after the timed
    calls: once the row listed kernels the check had dropped as run, and no note (Llama's
    training step in kevin bench, 4 hit and 4 dropped, no line saying why)."""
    from conftest import SlowGenerator
    from kevin_backend.bench import runs
    from kevin_backend.bench.common import BenchSettings
    from kevin_backend.example_models import make_example

    class Loss(torch.nn.Module):
        def __init__(self, inner: torch.nn.Module) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.inner(x).sum()

    def example(name: str, workload: str, device: Any, dtype: Any, size: str) -> Any:
        model, inputs = make_example("mlp")
        return Loss(model), inputs

    monkeypatch.setattr(runs, "make_model", example)
    # the forward's partitions (addmm) get no kernel; the backward's get the test's stand-ins, slower
    # than Inductor's code by a sleep, which the check drops
    generator = SlowGenerator(fail_on=("aten.addmm.default",))
    settings = BenchSettings(device="cpu", size="tiny", repeats=1, trials=1, warmup=0, isolate=False, kevin_options={
        "cache_dir": str(tmp_path / "kevin"), "mode": "generate", "cpu_kernels": True, "generator": generator, "graph_check": True})
    (row,) = runs.measure_model("mlp", ["train"], settings)
    assert row.error is None, row.error
    assert row.kevin.dropped >= 1, row.kevin
    assert any(note.startswith("graph check (") for note in row.graph_checks), row.graph_checks
    assert any(line.startswith("dropped: backward") for line in row.graph_checks), row.graph_checks
    assert not row.kernels, row.kernels  # what the check dropped is not listed as run


def test_kevin_over_inductor_is_paired_round_by_round_with_its_interval() -> None:
    """Rounds drift together (a clock, a neighbour): the ratio of each round's pair is steadier
    than either side, and its interval says whether kevin and Inductor differ beyond the noise."""
    from kevin_backend.bench.render import markdown
    from kevin_backend.bench.results import BenchReport, ModelResult, Timing

    drift = [1.0, 1.3, 0.9, 1.2, 1.1, 0.95, 1.25]
    tie = ModelResult(model="m", workload="infer", timings=(
        Timing("eager", tuple(3.0 * d for d in drift)), Timing("inductor", tuple(2.0 * d for d in drift)),
        Timing("kevin", tuple(2.0 * d * (1.01 if i % 2 else 0.99) for i, d in enumerate(drift)))))
    ratio, low, high = tie.paired()
    assert low < 1.0 < high and abs(ratio - 1.0) < 0.01
    slower = ModelResult(model="m", workload="train", timings=(
        Timing("inductor", tuple(2.0 * d for d in drift)), Timing("kevin", tuple(2.1 * d for d in drift))))
    ratio, low, high = slower.paired()
    assert high < 1.0 and abs(ratio - 2.0 / 2.1) < 1e-9  # the same 5% in every round: no doubt
    assert ModelResult(model="m", workload="x", timings=(Timing("inductor", (1.0,)), Timing("kevin", (1.0,)))).paired() is None
    text = markdown(BenchReport(environment={}, models=(tie, slower)))
    assert f"[{low:.2f}-{high:.2f}]" in text and "tie within the noise" in text
    assert tie.as_dict()["kevin_vs_inductor_paired"][1] < 1.0


def test_a_noisy_ratio_with_no_kevin_kernel_run_is_a_tie() -> None:
    """Where no kevin kernel ran, kevin ran Inductor's code: a ratio whose interval holds 1.00 is
    noise and the tables show a tie; a row whose kernels ran keeps its ratio and interval."""
    from kevin_backend.bench.render import markdown
    from kevin_backend.bench.results import BenchReport, KernelBenchResult, ModelResult, TaskResult, Timing

    noisy = (Timing("eager", (3.0, 3.1, 2.9, 3.0)), Timing("inductor", (2.0, 2.6, 1.5, 2.4)),
             Timing("kevin", (1.7, 2.0, 2.0, 1.8)))
    none_ran = KevinStats(graphs=1, partitions=2, skipped=2)
    skipped = ModelResult(model="mlp", workload="infer", timings=noisy, kevin=none_ran)
    ran = ModelResult(model="mlp", workload="train", timings=noisy, kevin=KevinStats(graphs=1, partitions=2, hits=1),
                      kernels=("forward abc 3 ops [mul, add]",))
    task = TaskResult(task="t", correct=True, inductor_correct=True, timings=noisy, kevin=none_ran)
    ratio, low, high = skipped.paired()
    assert low < 1.0 < high and skipped.speedup("kevin", "inductor") > 1.05  # a "win" that is noise
    text = markdown(BenchReport({"device": "cpu"}, (skipped, ran), KernelBenchResult("kb", (task,))))
    rows = {line.split(" | ")[3] if line.startswith("| mlp") else line.split(" | ")[0]: line for line in text.splitlines()
            if line.startswith(("| mlp", "| t |"))}
    assert "| tie (no kevin kernel ran) |" in rows["infer"]
    assert f"| {ran.speedup('kevin', 'inductor'):.2f}x [{low:.2f}-{high:.2f}] |" in rows["train"]
    assert "| tie (no kevin kernel ran) |" in rows["| t"]


def test_a_short_step_gets_rounds_of_round_ms_on_a_gpu() -> None:
    """Small batches are host-bound: ten 1-ms calls per round let one hiccup of the host decide a
    round, so a round of a short step takes as many calls as fill `round_ms`."""
    from kevin_backend.bench.common import MAX_TRIALS, BenchSettings, probe_ms
    from kevin_backend.bench.results import ModelResult

    gpu = BenchSettings(device="cuda", trials=10, round_ms=200.0)
    assert gpu.trials_for(50.0) == 10  # a long step: the settings' trials
    assert gpu.trials_for(1.0) == 200 and gpu.trials_for(0.4) == MAX_TRIALS  # at most MAX_TRIALS
    assert BenchSettings(device="cuda", round_ms=0.0).trials_for(0.01) == 10  # 0: always --trials
    assert BenchSettings(device="cpu", round_ms=200.0).trials_for(0.01) == 10  # CPU runs (tests) keep theirs
    with pytest.raises(ValueError, match="round_ms >= 0"):
        BenchSettings(device="cpu", round_ms=float("nan"))
    calls: list[str] = []
    took = probe_ms({"a": lambda: calls.append("a"), "b": lambda: (calls.append("b"), sum(range(20000)))}, torch.device("cpu"))
    assert calls == ["a"] * 4 + ["b"] * 4 and 0 <= took < 5  # one untimed call each, then 3 timed; the fastest
    row = ModelResult(model="m", workload="infer", trials=200)
    assert ModelResult.from_dict(row.as_dict()).trials == 200

