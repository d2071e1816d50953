"""The KernelBench corpus: problems in the published format and candidate kernel programs written
the way language models write them, each with the verdict the judge owes it.

    problems/<problem>.py               class Model, get_inputs(), get_init_inputs() (inputs on the CPU)
    candidates/<problem>__<label>.py    class ModelNew (load_inline); its docstring's first line says
                                        what it is, then `Expect: ACCEPTED` or `Expect: REASON|REASON...`

An expectation names judge Reason names (ACCEPTED, MISMATCH, NAN_INF, INPUT_MUTATED,
REPLAYED_OUTPUT, SHAPE_MISMATCH, DTYPE_MISMATCH, ILLEGAL_ADDRESS, ...) or static rule ids
(`no-try-except`, `no-pytorch-compute`, ...); several acceptable outcomes are separated by `|`.

    from kb_corpus.corpus import load_corpus, verdict_matches
    for case in load_corpus():
        result = judge.judge(case.problem_source, case.candidate_source)
        assert verdict_matches(case, result.reason.name, [v.rule for v in result.violations])
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

__all__ = ["CorpusCase", "ROOT", "PROBLEMS", "CANDIDATES", "load_corpus", "problem_names", "problem_source",
           "parse_expect", "is_rule_id", "verdict_matches"]

ROOT = Path(__file__).resolve().parent
PROBLEMS = ROOT / "problems"
CANDIDATES = ROOT / "candidates"

_EXPECT = re.compile(r"^\s*Expect:\s*(\S.*?)\s*$", re.MULTILINE)


@dataclass(frozen=True)
class CorpusCase:
    name: str  # the candidate's file name without .py, e.g. "softmax__online_warp"
    problem: str  # the problem's name, e.g. "softmax"
    problem_source: str
    candidate_source: str
    expect: frozenset[str]  # acceptable verdicts: {"ACCEPTED"}, {"MISMATCH", "NAN_INF"}, {"no-try-except"}
    honest: bool  # expected to be accepted

    @property
    def summary(self) -> str:
        """The first line of the candidate's docstring."""
        doc = ast.get_docstring(ast.parse(self.candidate_source)) or ""
        return doc.strip().splitlines()[0] if doc.strip() else ""


def is_rule_id(expectation: str) -> bool:
    """Static rule ids are lower-case with dashes (`no-try-except`); Reason names are upper case."""
    return expectation == expectation.lower() and "-" in expectation


def verdict_matches(case: CorpusCase, reason: str, rules: Iterable[str] = ()) -> bool:
    """Whether a verdict (a Reason name, and the ids of the static rules broken, if any) is one the
    case expects: its Reason name, or for a static expectation one of the expected rules broken."""
    if reason in case.expect:
        return True
    return any(is_rule_id(v) for v in case.expect) and bool(case.expect & set(rules))


def parse_expect(candidate_source: str, name: str = "<candidate>") -> frozenset[str]:
    """The `Expect:` line of a candidate's module docstring, as a set of acceptable verdicts."""
    doc = ast.get_docstring(ast.parse(candidate_source))
    if not doc:
        raise ValueError(f"{name}: the candidate has no module docstring")
    match = _EXPECT.search(doc)
    if match is None:
        raise ValueError(f"{name}: the docstring has no 'Expect:' line")
    values = frozenset(v.strip() for v in match.group(1).split("|") if v.strip())
    if not values:
        raise ValueError(f"{name}: empty 'Expect:' line")
    return values


def problem_names() -> list[str]:
    return sorted(p.stem for p in PROBLEMS.glob("*.py") if not p.name.startswith("_"))


def problem_source(name: str) -> str:
    """The source of problems/<name>.py."""
    path = PROBLEMS / f"{name}.py"
    if not path.is_file():
        raise FileNotFoundError(f"no problem named {name!r} in {PROBLEMS}")
    return path.read_text()


def load_corpus() -> list[CorpusCase]:
    """Every candidate, with its problem and expectation, sorted by name."""
    cases = []
    for path in sorted(CANDIDATES.glob("*.py")):
        if path.name.startswith("_"):
            continue
        name = path.stem
        if "__" not in name:
            raise ValueError(f"{path.name}: a candidate is named <problem>__<label>.py")
        problem = name.split("__", 1)[0]
        source = path.read_text()
        expect = parse_expect(source, path.name)
        cases.append(CorpusCase(name=name, problem=problem, problem_source=problem_source(problem),
                                candidate_source=source, expect=expect, honest=expect == frozenset({"ACCEPTED"})))
    return cases
