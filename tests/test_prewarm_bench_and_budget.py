"""`kevin prewarm` on the CPU with bench models as the source (the partitions of every graph the
bench compiles) and with a --budget (profile, rank, search in order; each bench model timed end to
end before and after). The rest of prewarm, the plug-ins and why two files:
tests/test_prewarm.py."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from kevin_backend.cache.store import KernelCache
from kevin_backend.config import override
from conftest import full_tier
from test_prewarm import TESTS, _lines, plugin_env  # noqa: F401 (plugin_env: the fixture)


@pytest.mark.parametrize("dtypes", full_tier("float32", None), ids=["float32", "bench-default-dtypes"])  # (80 s and more: the budgeted test below prewarms a bench model by default)
def test_prewarm_of_a_bench_model_covers_what_the_bench_compiles(dtypes: str | None, tmp_path: Path, plugin_env: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    # GPT-2's training step breaks into several graphs (each with its own compile report): the
    # prewarm must take the partitions of all of them, not only the last one's. Without
    # --bench-dtype (the full tier), kevin bench's default dtypes: float32 and bfloat16, each
    # dtype's partitions tasks of their own
    from kevin_backend.backend.report import collecting_reports
    from kevin_backend.bench.models import make_model
    from kevin_backend.cli.main import main

    cache_dir = tmp_path / "cache"
    args = ["--cache-dir", str(cache_dir), "prewarm", "--bench-model", "gpt2", "--bench-size", "tiny",
            "--generator", "prewarm_helpers:reference", *(["--bench-dtype", dtypes] if dtypes else [])]
    with override(KEVIN_CPU_KERNELS=True):
        assert main(args) == 0
    generated = _lines(plugin_env)
    # inference, and the training step's forward and backward graphs, in each dtype
    steps = [(w, d) for d in ((torch.float32,) if dtypes else (torch.float32, torch.bfloat16)) for w in ("infer", "train")]
    assert len(generated) >= 4 * len(steps)
    for workload, dtype in steps:
        torch._dynamo.reset()  # the bench's own steps now find every partition in the cache
        model, inputs = make_model("gpt2", workload, device="cpu", dtype=dtype, size="tiny")
        with override(KEVIN_CPU_KERNELS=True), collecting_reports() as reports:
            compiled = torch.compile(model, backend="kevin", options={"mode": "cache", "cache_dir": str(cache_dir)})
            if workload == "infer":
                with torch.no_grad():
                    compiled(*inputs)
            else:
                compiled(*inputs).backward()
        if workload == "train":
            assert len(reports) > 1  # graph breaks: this test is about them
        statuses = [r.status.value for report in reports for r in report.records()]
        assert statuses and set(statuses) == {"hit"}, (workload, dtype, statuses)
    assert main(["--cache-dir", str(cache_dir), "prewarm", "--bench-model", "nope"]) == 2
    assert main(["--cache-dir", str(cache_dir), "prewarm", "--bench-model", "gpt2", "--bench-dtype", "bf16"]) == 2
    assert "--bench-dtype: unknown dtype 'bf16'; valid dtypes: float32, bfloat16, float16" in capsys.readouterr().err


def test_a_budgeted_prewarm_profiles_ranks_and_searches_in_order(tmp_path: Path, plugin_env: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """--budget: each partition's Inductor code timed once, the searches in order of expected
    gain (one worker: the generator sees them in that order), then the gains table; a budget
    spent by the profile alone searches nothing and leaves every task pending."""
    import json

    from kevin_backend.cli.main import main

    cache_dir = tmp_path / "cache"
    base = ["--cache-dir", str(cache_dir), "prewarm", "--model", f"{TESTS}/prewarm_helpers.py:mlp",
            "--generator", "prewarm_helpers:reference", "--workers", "1"]
    with override(KEVIN_CPU_KERNELS=True):
        assert main([*base, "--budget", "0.1s", "--json", str(tmp_path / "none.json")]) == 0
    out = capsys.readouterr()
    data = json.loads((tmp_path / "none.json").read_text())
    assert _lines(plugin_env) == [] and len(data["unsearched"]) == len(data["profile"]) >= 3
    assert len(KernelCache(cache_dir, None).pending()) == len(data["profile"])  # still pending: a later run resumes
    assert "not searched (pending)" in out.out and "not searched within the budget" in out.out

    with override(KEVIN_CPU_KERNELS=True):
        assert main([*base, "--budget", "30m", "--json", str(tmp_path / "all.json")]) == 0
    out = capsys.readouterr()
    data = json.loads((tmp_path / "all.json").read_text())
    ranked = [p["digest"] for p in data["profile"]]
    gains = [p["expected_gain_ms"] for p in data["profile"]]
    assert all(p["inductor_ms"] and p["inductor_ms"] > 0 for p in data["profile"]), data["profile"]
    assert gains == sorted(gains, reverse=True)
    assert _lines(plugin_env) == ranked  # searched in the ranked order
    assert data["unsearched"] == [] and data["kernels"] == len(ranked)
    assert "| rank | partition |" in out.out and "measured gain of the kernels kept" in out.out
    assert "profiling" in out.err and "searching in order of expected gain" in out.err


def test_budget_ranking_and_parsing() -> None:
    from kevin_backend.prewarm.profile import Profile, gain_table, parse_budget, rank

    assert parse_budget("30m") == 1800 and parse_budget("90s") == 90 and parse_budget("1.5h") == 5400 and parse_budget("12") == 12
    for bad in ("", "0m", "soon", "-3s"):
        with pytest.raises(ValueError, match="expected a duration"):
            parse_budget(bad)
    # 2 runs x (1.0 - 0.2) = 1.6 ms beats 1 x (3.0 - 2.0) = 1.0 ms: share times distance, not time alone
    a = Profile("a" * 32, "norm", 2, 1.0, 0.2)
    b = Profile("b" * 32, "matmul-epilogue", 1, 3.0, 2.0)
    c = Profile("c" * 32, "broken", 1, None, None, error="RuntimeError: x")
    assert [p.name for p in rank([c, b, a])] == ["norm", "matmul-epilogue", "broken"]
    assert a.expected_gain_ms == pytest.approx(1.6) and a.fraction == pytest.approx(0.2)
    table = gain_table(rank([a, b, c]), {"a" * 32: {"status": "kernel", "speedup_vs_inductor": 2.0}, "b" * 32: {"status": "inductor"}})
    assert "| 1 | norm" in table and "| kernel | 0.5000 | 1.0000 |" in table  # 2 x (1.0 - 0.5) measured
    assert "not searched (pending)" in table and "(RuntimeError: x)" in table
    assert "expected gain at the roofline 2.6000 ms" in table and "kept 1.0000 ms" in table


def test_a_budgeted_prewarm_of_a_bench_model_times_it_end_to_end_before_and_after(tmp_path: Path, plugin_env: Path,
                                                                                 capsys: pytest.CaptureFixture[str],
                                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """With bench models as the source, the budgeted run times each model's step as `kevin bench`
    does before profiling and after the searches: kevin ran no kernel before, and the kernels the
    searches stored after. The first turns' builds are asked for before the first timing."""
    import json

    from kevin_backend.cli import prewarm_cmd
    from kevin_backend.cli.main import main

    order: list[str] = []
    build_first, measure = prewarm_cmd._build_first_turns, prewarm_cmd._measure_models
    monkeypatch.setattr(prewarm_cmd, "_build_first_turns", lambda *a: (order.append("build"), build_first(*a))[1])
    monkeypatch.setattr(prewarm_cmd, "_measure_models", lambda *a: (order.append("time"), measure(*a))[1])
    out_json = tmp_path / "summary.json"
    with override(KEVIN_CPU_KERNELS=True):
        assert main(["--cache-dir", str(tmp_path / "cache"), "prewarm", "--bench-model", "mlp", "--bench-size", "tiny",
                     "--bench-dtype", "float32", "--no-train", "--generator", "prewarm_helpers:reference", "--workers", "1",
                     "--budget", "30m", "--json", str(out_json)]) == 0
    out = capsys.readouterr()
    data = json.loads(out_json.read_text())
    (before,), (after,) = data["end_to_end"]["before"], data["end_to_end"]["after"]
    assert before["model"] == after["model"] == "mlp" and before["workload"] == "infer" and after["dtype"] == "float32"
    assert before["error"] is None and after["error"] is None
    assert before["kernels"] == [] and len(after["kernels"]) == data["kernels"] > 0
    assert all(r["timings"][c]["median_ms"] > 0 for r in (before, after) for c in ("inductor", "kevin"))
    assert "| model | workload | dtype | Inductor ms | kevin ms before | kevin ms after |" in out.out
    assert "| mlp | infer | float32 |" in out.out and "timing mlp end to end (cpu, float32, infer)" in out.err
    assert order == ["build", "time", "time"]


def test_a_budgeted_prewarm_builds_its_gemm_searches_first_programs_before_timing(tmp_path: Path, hopper_with_cutlass,  # type: ignore[no-untyped-def]
                                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """With the built-in writer, the budget's prewarm hands the judge of its cache's build folder
    each GEMM search's first programs (one per trajectory, the very ones the workers' searches
    then write) to build in the background, before it times the models; a pointwise task's
    (seconds to build) are not foreseen. A user's generator or a model's policy: nothing."""
    import re

    from kevin_backend.cli.prewarm_cmd import _build_first_turns
    from kevin_backend.config import build_root
    from kevin_backend.generate.builtin.gemm_suite import GEMM_SUITE
    from kevin_backend.generate.builtin.suite import SUITE
    from kevin_backend.generate.builtin.builtin_policy import BuiltinPolicy
    from kevin_backend.generate.policy import Sampling
    from kevin_backend.generate.prompts import build_messages
    from kevin_backend.judge.judge import Judge
    from kevin_backend.prewarm.sources import WorkItem
    from kevin_backend.types import KernelTask, TensorSpec

    handed: list[tuple[Path, list[str]]] = []
    monkeypatch.setattr(Judge, "build_ahead", lambda judge, programs: handed.append((judge.builder.root, list(programs))))
    spec = TensorSpec((64, 64), (64, 1), "float16", "cuda")
    gemm = next(t.source for t in GEMM_SUITE if t.name == "mlp-up-gelu-f16-8192x768x3072")
    pointwise = next(t.source for t in SUITE if t.name == "gated-f32")
    key = type("Key", (), {"gpu": "NVIDIA H200", "capability": "9.0", "digest": "k" * 32, "numerics": ()})()
    todo = [WorkItem(key, KernelTask(f"t{i}", source, (spec,), (spec,), (), f"{i}" * 32), "bench:gpt2:train:bfloat16")  # type: ignore[arg-type]
            for i, source in enumerate((pointwise, gemm))]
    cache_dir = tmp_path / "cache"
    setup = {"cache_dir": str(cache_dir), "policy": "builtin", "generator": None, "search": {"trajectories": 2, "turns": 2, "beam": None}}

    _build_first_turns(todo, setup)
    ((root, programs),) = handed
    assert root == build_root(cache_dir)
    messages = build_messages(gemm, "NVIDIA H200", [], 100_000)
    written = [re.findall(r"```python\n(.*?)```", r.text, re.S)[0] for r in BuiltinPolicy().generate([messages] * 2, Sampling())]
    assert programs == written and len(set(programs)) == 2 and all("cutlass" in p for p in programs)

    handed.clear()
    _build_first_turns(todo, {**setup, "generator": "prewarm_helpers:reference"})
    _build_first_turns(todo, {**setup, "policy": "openai"})
    assert handed == []
