"""The judge on a GPU: honest candidates accepted, every hack rejected with the right reason, and
`kevin eval` end to end with JSON out."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from judge_cases import GATED_TASK, HONEST, RUNTIME_HACKS, STATIC_HACKS, Case
from kevin_backend.judge.judge import Judge
from kevin_backend.measure.memory import JUDGE_FLOOR
from kevin_backend.judge.result import Reason, Stage
from kevin_backend.judge.sandbox import RunConfig

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def judge(tmp_path_factory: pytest.TempPathFactory) -> Judge:
    """A judge whose build cache already holds every candidate's extension, built in parallel
    (the tests then measure verdicts, not a queue of cold builds)."""
    import time

    import torch

    from kevin_backend.toolchain.build import BuildSpec
    from kevin_backend.toolchain.candidate import Candidate

    judge = Judge(tmp_path_factory.mktemp("builds"), RunConfig(trials=20, warmup=3))
    major, minor = torch.cuda.get_device_capability()
    specs = [BuildSpec.of(ext, f"{major}.{minor}") for case in HONEST + RUNTIME_HACKS for ext in Candidate.parse(case.source).extensions]
    start = time.perf_counter()
    results = judge.builder.build_many(specs)
    seconds = sorted(r.seconds for r in results)
    print(f"prebuilt {len(specs)} extensions in {time.perf_counter() - start:.1f} s; median build {seconds[len(seconds) // 2]:.1f} s")
    return judge


@pytest.mark.parametrize("case", HONEST, ids=lambda c: c.name)
def test_honest_candidates_are_accepted(judge: Judge, case: Case) -> None:
    result = judge.judge(case.task, case.source)
    print(case.name, result.as_dict()["timings"], f"build {result.build_seconds:.1f} s")
    assert result.reason is Reason.ACCEPTED, result.feedback
    t = result.timings
    assert result.stage is Stage.TIMING and t.kernel_ms and t.eager_ms
    # the Kevin score, from the verdict's own timings: 0.3 for correct + the speedup over eager
    assert result.score == pytest.approx(0.3 + t.eager_ms / t.kernel_ms)


@pytest.mark.parametrize("case", RUNTIME_HACKS, ids=lambda c: c.name)
def test_runtime_hacks_are_rejected_with_the_right_reason(judge: Judge, case: Case) -> None:
    result = judge.judge(GATED_TASK, case.source)
    print(case.name, result.reason.name, result.feedback[:200])
    assert result.reason.name in case.expect.split("|"), result.feedback
    assert result.score == 0.0


@pytest.mark.parametrize("case", STATIC_HACKS, ids=lambda c: c.name)
def test_static_hacks_never_reach_the_build(judge: Judge, case: Case) -> None:
    result = judge.judge(GATED_TASK, case.source)
    assert result.stage is Stage.STATIC and case.expect in {v.rule for v in result.violations}


def test_kevin_eval_json_on_the_gpu(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from kevin_backend.cli.main import main

    (tmp_path / "problem.py").write_text(GATED_TASK)
    (tmp_path / "candidate.py").write_text(HONEST[0].source)
    code = main(["--cache-dir", str(tmp_path / "cache"), "eval", str(tmp_path / "problem.py"), str(tmp_path / "candidate.py"), "--json", "--trials", "20"])
    verdict = json.loads(capsys.readouterr().out)
    print(verdict)
    assert code == 0 and verdict["reason"] == "ACCEPTED" and verdict["timings"]["speedup_vs_eager"] > 0
    memory = verdict["memory"]  # a small task: the judge's extra stays within 3x it plus the flush buffer
    assert 0 <= memory["judge_extra_bytes"] <= memory["budget_bytes"] == max(3 * memory["task_bytes"], JUDGE_FLOOR) + memory["fixed_bytes"]
    # the timing's slots, reported apart: within the judge's bound beside its extra, or their own allowance (<= 4 GiB)
    assert 0 < memory["slot_bytes"] <= max(4 << 30, memory["budget_bytes"] - memory["judge_extra_bytes"])


def test_kevin_eval_over_a_folder_through_the_pool(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from kevin_backend.cli.main import main

    (tmp_path / "problem.py").write_text(GATED_TASK)
    folder = tmp_path / "candidates"
    folder.mkdir()
    expected = {}
    for case in [c for c in HONEST if c.task == GATED_TASK][:2] + RUNTIME_HACKS[:3]:
        (folder / f"{case.name}.py").write_text(case.source)
        expected[f"{case.name}.py"] = case.expect.split("|") if case in RUNTIME_HACKS else ["ACCEPTED"]
    code = main(["--cache-dir", str(tmp_path / "cache"), "eval", str(tmp_path / "problem.py"), str(folder), "--json",
                 "--trials", "10", "--workers", "2"])
    verdicts = {Path(v["candidate"]).name: v for v in json.loads(capsys.readouterr().out)}
    print({k: v["reason"] for k, v in verdicts.items()})
    assert set(verdicts) == set(expected) and code == 1  # some rejected
    for name, v in verdicts.items():
        assert v["reason"] in expected[name], (name, v["feedback"][:300])
