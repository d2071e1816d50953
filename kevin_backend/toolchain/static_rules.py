"""Static rules: what a kernel program may not do, checked before anything is built, loaded or run.

    violations = check(Candidate.parse(source))       # () when the program breaks no rule
    violations = check_program(source)                 # the same from text (unreadable: a violation)

The rules read the candidate's Python as an AST (static_python.py) and its C++/CUDA as the
preprocessor's output (static_cpp.py, cpp_preprocess.py). They are the first line against reward
hacking and against a program that reaches into the process that loads it: the judge's workers
check every candidate with them, and the runtime checks every cached or imported program with
them before it is loaded. The judge's run-time checks (the dispatch audit, fresh inputs, poisoned
outputs) are the second line.
"""

from __future__ import annotations

from typing import Callable, Iterator, Sequence

from kevin_backend.toolchain.candidate import Candidate, CandidateError
from kevin_backend.toolchain.rule_violation import RuleViolation
from kevin_backend.toolchain.static_cpp import CPP_RULES
from kevin_backend.toolchain.static_python import PYTHON_RULES, TASK_RULES

__all__ = ["RULES", "TASK_RULES", "Rule", "RuleViolation", "check", "check_program", "check_task_program", "rule_ids"]

Rule = Callable[[Candidate], Iterator[RuleViolation]]

# Every rule a kernel program passes, Python's first, in the order violations are reported.
RULES: tuple[Rule, ...] = (*PYTHON_RULES, *CPP_RULES)


def check(candidate: Candidate, rules: Sequence[Rule] = RULES) -> tuple[RuleViolation, ...]:
    """Every rule the candidate breaks, in rule order (empty when it breaks none)."""
    return tuple(v for rule in rules for v in rule(candidate))


def check_program(source: str, rules: Sequence[Rule] = RULES) -> tuple[RuleViolation, ...]:
    """`check` on a program's text; a program that cannot be read breaks "readable-program"."""
    try:
        candidate = Candidate.parse(source)
    except CandidateError as exc:
        return (RuleViolation("readable-program", "", str(exc)),)
    return check(candidate, rules)


def check_task_program(source: str) -> tuple[RuleViolation, ...]:
    """The rules a task program (a Model reference with get_inputs) passes before it is loaded."""
    return check_program(source, TASK_RULES)


def rule_ids(rules: Sequence[Rule] = RULES) -> dict[str, str]:
    """Each rule function's name -> the rule id it reports (from its docstring's first line)."""
    return {rule.__name__: (rule.__doc__ or "").splitlines()[0] for rule in rules}
