"""Every candidate of the KernelBench corpus through the real judge on a GPU: honest ones
accepted, wrong and dishonest ones rejected with the reason their story gives. The problems make
their inputs on the CPU at 256-512 MiB, as published problems do."""

from __future__ import annotations

import collections
import concurrent.futures
import json
import os
import time
from pathlib import Path

import pytest
import torch

from kb_corpus.corpus import is_rule_id, load_corpus, verdict_matches

pytestmark = pytest.mark.gpu


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_every_corpus_candidate_gets_its_verdict() -> None:
    from kevin_backend.toolchain.build import BuildSpec
    from kevin_backend.toolchain.candidate import Candidate
    from kevin_backend.judge.judge import Judge
    from kevin_backend.judge.sandbox import RunConfig

    cases = [c for c in load_corpus() if not any(is_rule_id(e) for e in c.expect)]
    from kevin_backend.config import Config

    # the user's build cache: the other GPU tests then find these builds done
    judge = Judge(Config.from_env().cache_dir / "builds", RunConfig(trials=5, warmup=1, inductor=False))
    major, minor = torch.cuda.get_device_capability()
    specs = [BuildSpec.of(ext, f"{major}.{minor}") for c in cases for ext in Candidate.parse(c.candidate_source).extensions]
    start = time.perf_counter()
    judge.builder.build_many(specs)
    print(f"built {len(specs)} extensions in {time.perf_counter() - start:.0f} s")

    def one(case):  # type: ignore[no-untyped-def]
        began = time.perf_counter()
        result = judge.judge(case.problem_source, case.candidate_source)
        return case, result, time.perf_counter() - began

    with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
        outcomes = list(pool.map(one, cases))
    rows, wrong = [], []
    for case, result, seconds in outcomes:
        ok = verdict_matches(case, result.reason.name, [v.rule for v in result.violations])
        rows.append({"candidate": case.name, "expect": sorted(case.expect), "verdict": result.reason.name, "right": ok,
                     "exact": result.exact, "seconds": round(seconds, 1), "build_seconds": result.build_seconds,
                     "feedback": result.feedback[:300], "memory": result.memory})
        print(f"{'ok ' if ok else 'BAD'} {case.name:48s} {result.reason.name:16s} expect {'|'.join(sorted(case.expect))}")
        if not ok:
            wrong.append(f"{case.name}: {result.reason.name} ({result.feedback[:400]})")
    out = os.environ.get("KEVIN_TEST_OUT")
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / "kb_corpus_verdicts.json").write_text(json.dumps(rows, indent=1))
    honest = sum(c.honest for c in cases)
    right = sum(r["right"] for r in rows)
    print(f"right verdicts: {right} of {len(rows)} ({honest} honest, {len(rows) - honest} wrong)")
    # the judge's extra memory, for every run that got as far as measuring it, within its bound
    over = [f"{r['candidate']}: extra {r['memory']['judge_extra_bytes']} > bound {r['memory']['budget_bytes']} "
            f"(task {r['memory']['task_bytes']}; peak in step {r['memory'].get('peak_step')}; by step [held at its start, "
            f"its peak]: {r['memory'].get('steps')})"
            for r in rows if r["memory"] and r["memory"]["judge_extra_bytes"] > r["memory"]["budget_bytes"]]
    exacts = collections.Counter(r["exact"] for r in rows)
    print(f"exact references: {dict(exacts)}; over the memory bound: {len(over)}")
    assert not wrong, "\n".join(wrong)
    assert not over, "\n".join(over)
    assert exacts["float64"] + exacts["float32"] >= len(rows) // 2, exacts  # the exact rule, not the fallback, decides most
