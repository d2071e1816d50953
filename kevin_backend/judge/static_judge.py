"""The static stage as a verdict: read a problem and a candidate, apply the rules, say why."""

from __future__ import annotations

import ast

from kevin_backend.toolchain.candidate import Candidate, CandidateError
from kevin_backend.judge.result import JudgeResult, Reason, Stage
from kevin_backend.toolchain.static_rules import check

__all__ = ["ProblemError", "check_problem", "judge_static"]


class ProblemError(ValueError):
    """The problem file is not a KernelBench task (a usage error, not the candidate's fault)."""


def check_problem(source: str) -> None:
    """Raise ProblemError unless `source` defines Model, get_inputs and get_init_inputs."""
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        raise ProblemError(f"problem is not valid Python (line {exc.lineno}: {exc.msg})") from exc
    names = {n.name for n in tree.body if isinstance(n, (ast.ClassDef, ast.FunctionDef))}
    missing = [n for n in ("Model", "get_inputs", "get_init_inputs") if n not in names]
    if missing:
        raise ProblemError(f"problem defines no {', '.join(missing)} (a KernelBench task needs all three)")


def judge_static(candidate_source: str) -> JudgeResult:
    """The static verdict: STATIC_OK, or the rules broken (feedback lists them, one per line)."""
    try:
        candidate = Candidate.parse(candidate_source)
    except CandidateError as exc:
        return JudgeResult(Stage.STATIC, Reason.SYNTAX_ERROR, feedback=f"The program cannot be read: {exc}")
    violations = check(candidate)
    if not violations:
        return JudgeResult(Stage.STATIC, Reason.STATIC_OK)
    reason = Reason.NO_MODELNEW if any(v.rule == "defines-modelnew" for v in violations) else Reason.RULE_VIOLATION
    feedback = "The kernel program breaks these rules:\n" + "\n".join(f"- {v}" for v in violations)
    return JudgeResult(Stage.STATIC, reason, feedback=feedback, violations=violations)
