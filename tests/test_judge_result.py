"""Judge result types: the Kevin score, speedups, feedback text, and a lossless round trip."""

from __future__ import annotations

import json

from kevin_backend.judge.result import JudgeResult, JudgeTimings, Mismatch, Reason, RuleViolation, Stage, score


def test_score_follows_the_kevin_paper() -> None:
    assert score(False, 3.0) == 0.0
    assert score(True, 1.0) == 1.3
    accepted = JudgeResult(Stage.TIMING, Reason.ACCEPTED, timings=JudgeTimings(kernel_ms=0.5, eager_ms=1.0, inductor_ms=0.75, trials=100))
    assert accepted.correct and accepted.score == 0.3 + 2.0
    assert accepted.timings.speedup_vs_inductor == 1.5
    rejected = JudgeResult(Stage.CORRECTNESS, Reason.MISMATCH, timings=JudgeTimings(kernel_ms=0.1, eager_ms=1.0))
    assert not rejected.correct and rejected.score == 0.0
    static_ok = JudgeResult(Stage.STATIC, Reason.STATIC_OK)
    assert not static_ok.correct and static_ok.score == 0.0


def test_round_trip_through_json() -> None:
    result = JudgeResult(
        Stage.CORRECTNESS,
        Reason.MISMATCH,
        feedback="output 0 differs",
        violations=(RuleViolation("no-try-except", "python:3", "try/except is not allowed"),),
        mismatch=Mismatch(0, 0.5, 0.25, 10, 1000, (3, 4), 1.0, 1.5, 2),
        timings=JudgeTimings(None, 1.0, None, 0),
        seeds=(11, 12),
        build_seconds=1.5,
    )
    again = JudgeResult.from_dict(json.loads(json.dumps(result.as_dict())))
    assert again == result
    assert "10 of 1000 elements" in str(result.mismatch) and "[3, 4]" in str(result.mismatch)
