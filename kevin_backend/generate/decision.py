"""The decision: what a search earns in the kernel cache, with its reason.

    entry = decide_entry(result, key, task, margin=0.03, retime=SandboxRetimer(judge))

A search (`engine.py`) ends with its turns; this turns them into a `CacheEntry`: KERNEL when the
best (lowest kernel time) beat Inductor by the margin beyond the noise when re-timed against it,
else INDUCTOR; SearchIncomplete when the re-timing itself failed on the judge's side. The search
loop knows nothing of the cache; `SearchGenerator` (generator.py) calls this after each search.
"""

from __future__ import annotations

from kevin_backend.cache.format import CacheEntry, EntryKind, Retiming, Timings
from kevin_backend.cache.key import CacheKey
from kevin_backend.generate.engine import SearchIncomplete, SearchResult
from kevin_backend.generate.judging import Retimer
from kevin_backend.judge.decide import LOOK_CONFIDENCE, sequential_decision
from kevin_backend.types import KernelTask

__all__ = ["RETIME_FROM", "decide_entry"]

# A best kernel at least this fraction of Inductor's speed by the judge's timings is decided by the
# paired re-timing, whichever side of the bar it landed on: the judge's Inductor time can be an
# earlier candidate's (one per task), and runs drift by up to 7% (a 0.90x kernel needs 14% to
# reach 1.03x). Below it the judge's timings decide: no drift seen between runs closes that gap.
RETIME_FROM = 0.90


def decide_entry(result: SearchResult, key: CacheKey, task: KernelTask, margin: float = 0.03,
                 retime: Retimer | None = None, confidence: float = LOOK_CONFIDENCE) -> CacheEntry:
    """The cache entry `result` earns, with its reason:

    * no correct kernel: INDUCTOR (so the task is not generated again);
    * the best one (`SearchResult.best`) under RETIME_FROM times Inductor's speed by the judge's
      timings (with `retime`; under 1 + `margin` without): INDUCTOR. The judge's Inductor time
      may come from an earlier candidate's rounds, so a kernel near the bar is not decided on it;
    * otherwise, with `retime`: the best kernel and Inductor's code re-timed, interleaved
      (`judge/decide.py`), again while the decision is open (`sequential_decision`); KERNEL when
      the lower confidence bound of Inductor's time over the kernel's exceeds 1 + margin, else
      INDUCTOR; the entry carries the rounds, the bound and the
      reason (`CacheEntry.retiming`). A kernel that crashed, hung or raised while re-timed is not
      kept. A failure of the judge's own (its worker, memory, a timeout of its steps) decides
      nothing: SearchIncomplete;
    * without `retime` (a scripted judge, no GPU): KERNEL on the judge's timings alone, said so
      in the reason.

    A search cut short by the judge's or the model server's failure earns none (ValueError)."""
    if result.incomplete:
        raise ValueError(f"no decision from an incomplete search: {result.incomplete}")
    best = result.best
    if best is None or best.result is None:
        return CacheEntry(key, EntryKind.INDUCTOR, task, None, policy=result.policy,
                          reason=f"no correct kernel in {len(result.records)} turns ({result.stopped})")
    t = best.result.timings
    timings = Timings(eager_ms=t.eager_ms, inductor_ms=t.inductor_ms, kernel_ms=t.kernel_ms)
    record = best.result.as_dict()
    vs_inductor = t.speedup_vs_inductor
    if vs_inductor is None or vs_inductor < (1.0 + margin if retime is None else RETIME_FROM):
        shown = "not measured" if vs_inductor is None else f"{vs_inductor:.3f}x"
        beyond = "" if retime is None else f", below {RETIME_FROM:.2f}x: beyond any drift between runs, not re-timed"
        return CacheEntry(key, EntryKind.INDUCTOR, task, None, timings, result.policy, record,
                          reason=f"best kernel {shown} of Inductor's speed; needs {1 + margin:.2f}x{beyond}")
    assert best.step.code is not None
    if retime is None:
        return CacheEntry(key, EntryKind.KERNEL, task, best.step.code, timings, result.policy, record,
                          reason=f"best kernel {vs_inductor:.3f}x of Inductor's speed by the judge's timings (not re-timed)")
    code = best.step.code
    try:
        outcome, verdict = sequential_decision(lambda: retime(task.source, code), margin, confidence=confidence)
    except ValueError as exc:  # rounds missing or a time not positive: the measurement, not the kernel
        raise SearchIncomplete(f"the re-timing of the best kernel gave no usable rounds: {exc}") from None
    if not outcome.ok and outcome.judge_side:
        raise SearchIncomplete(f"the re-timing of the best kernel failed on the judge's side: {outcome.failure}")
    if not outcome.ok or verdict is None:
        return CacheEntry(key, EntryKind.INDUCTOR, task, None, timings, result.policy, record,
                          reason=f"best kernel not kept: it failed its re-timing: {outcome.failure}")
    retiming = Retiming(outcome.kernel_ms, outcome.inductor_ms, verdict.ratio, verdict.bound, margin, confidence,
                        verdict.keep, verdict.reason, outcome.trials, outcome.device, outcome.protocol, outcome.runs)
    if verdict.keep:
        return CacheEntry(key, EntryKind.KERNEL, task, best.step.code, timings, result.policy, record,
                          reason=verdict.reason, retiming=retiming)
    return CacheEntry(key, EntryKind.INDUCTOR, task, None, timings, result.policy, record,
                      reason=f"best kernel {verdict.reason}", retiming=retiming)
