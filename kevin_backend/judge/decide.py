"""Whether a search's winning kernel is kept: re-timed against Inductor, with the noise counted.

    retime = SandboxRetimer(judge)                          # the judge's GPU, builds and GPU lock
    outcome = retime(task_source, kernel_source)            # per-round times, A B A B ...
    verdict = decide(outcome.kernel_ms, outcome.inductor_ms, margin=0.03)
    verdict.keep, verdict.ratio, verdict.bound, verdict.reason

The judge times every candidate once; the search's winner (the correct candidate with the lowest
kernel time) earns a KERNEL decision only after a second measurement made for the purpose:

  * interleaved: kernel, Inductor, kernel, Inductor, ... (`interleaved_rounds`), at least
    `MIN_ROUNDS` rounds, each round the median of several trials, so a slow drift of the GPU's
    clock or a neighbour's load falls on both sides alike and pairs of rounds can be compared;
  * in a sandboxed worker process (`retime_worker.py`: generated code never runs in the judge's
    process), holding the GPU's lock exclusively (no correctness run of another worker beside it);
  * as the backend runs each side (the worker's docstring says exactly what a time includes);
  * kept only when the lower confidence bound of Inductor's time over the kernel's exceeds
    1 + margin (`decide`): a gain smaller than the noise is not a gain.

The statistics and the scheduler are plain Python (no torch): they are tested with scripted
timings on any machine. The parent's side of the sandbox reuses the judge's runner (its worker
environment, verdict line and phase parsing).
"""

from __future__ import annotations

import concurrent.futures
import math
import re
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from kevin_backend.judge import sandbox
from kevin_backend.judge.job import RetimeJob
from kevin_backend.measure.memory import host_oom_kills
from kevin_backend.measure.statistics import t_quantile
from kevin_backend.locks import gpu_lock_path

__all__ = [
    "BETWEEN_RUN_SD", "LOOK_CONFIDENCE", "MIN_ROUNDS", "RETIME_LOOKS", "RETIME_CANDIDATE_PHASES", "Decision", "RetimeConfig", "RetimeOutcome", "SandboxRetimer", "decide",
    "retime_in_sandbox",
]

MIN_ROUNDS = 5  # the fewest interleaved rounds a decision is made from
# The spread of a re-timing's mean log ratio from one run (a fresh worker, a fresh compile) to the
# next, beyond its rounds' own noise, from the stored H200 re-timing of a kernel about a tenth
# faster than Inductor (benchmarks/results/gpu_tests/retime_gpu_h200_run9_third.log: 20 runs of 6
# rounds; rounds scatter by 0.057 inside a run, the runs' means by 0.035, 0.026 of it between
# runs). Every re-timing decision counts at least this much noise per run (`decide`'s `between_sd`).
BETWEEN_RUN_SD = 0.026
# A decision still open after a re-timing (the ratio above 1 + margin, its bound not) re-times
# again, fresh runs joined to the earlier ones, at most this many times in all; each look's bound
# at LOOK_CONFIDENCE, so that looking more than once does not keep more ties. Simulated with the
# noise above (tests/test_decide_runs.py): a kernel at exactly 1.03x kept in about 3% of
# decisions, a tie in under 0.1%, a 1.10x kernel in 98-99% (one re-timing of two runs: 71%).
RETIME_LOOKS = 3
LOOK_CONFIDENCE = 0.975

# The re-timing worker's phases in which the candidate's code runs: a crash or hang there is the
# kernel's (no KERNEL decision for it); anywhere else it is the judge's (no decision at all).
RETIME_CANDIDATE_PHASES = frozenset({"load", "init", "kernel-warmup", "retime-kernel"})


# -- statistics -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Decision:
    """The verdict on paired rounds of kernel and Inductor times."""

    keep: bool
    ratio: float  # Inductor's time over the kernel's: the geometric mean of the per-round ratios
    bound: float  # its one-sided lower confidence bound
    needed: float  # 1 + margin: what the bound must exceed
    confidence: float
    rounds: int
    reason: str


def decide(kernel_ms: Sequence[float], inductor_ms: Sequence[float], margin: float = 0.03,
           confidence: float = 0.95, min_rounds: int = MIN_ROUNDS, runs: Sequence[int] | None = None,
           between_sd: float = 0.0) -> Decision:
    """Keep the kernel when it beats Inductor by `margin` beyond the noise.

    `kernel_ms[i]` and `inductor_ms[i]` are round i of an interleaved measurement. Each round
    gives a paired ratio r_i = inductor_i / kernel_i, taken in logarithms (a ratio's noise is
    multiplicative, and log(a/b) = -log(b/a) keeps the two sides symmetric). Pairing removes what
    both sides of a round share (a clock that drifted for both).

    The rounds may come from several runs (`runs`: how many rounds each, in order; one run by
    default): fresh worker processes, fresh compiles. Rounds inside one run share what the run
    drew (its compile, its memory layout, the GPU's state): they scatter less than runs do, so the
    run, not the round, is the unit of independence. Each run's mean log ratio m_j counts once;
    the estimate is their mean m, its variance (1/k^2) * sum_j (s_w^2 / n_j + s_b^2) with s_w the
    rounds' pooled spread inside runs and s_b the spread between runs: the larger of
    `between_sd` (what earlier repeats showed: BETWEEN_RUN_SD for the re-timing) and what these
    runs show. The lower bound exp(m - t * se) (Student's t, n - k degrees of freedom) must
    exceed 1 + margin: a gain within the spread between runs is a tie.

    Raises ValueError for fewer than `min_rounds` rounds, unequal lengths, runs of fewer than two
    rounds or that do not add up, or a time that is not a positive finite number (a measurement
    that went wrong must not look like a verdict)."""
    if len(kernel_ms) != len(inductor_ms):
        raise ValueError(f"unpaired rounds: {len(kernel_ms)} kernel, {len(inductor_ms)} Inductor")
    n = len(kernel_ms)
    if n < max(2, min_rounds):
        raise ValueError(f"{n} rounds; a decision needs at least {max(2, min_rounds)}")
    runs = tuple(runs) if runs else (n,)
    if sum(runs) != n or min(runs) < 2:
        raise ValueError(f"runs of {list(runs)} rounds for {n} rounds (each run needs at least 2)")
    for name, values in (("kernel", kernel_ms), ("Inductor", inductor_ms)):
        bad = [v for v in values if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0)]
        if bad:
            raise ValueError(f"{name} times must be positive and finite, got {bad[0]!r}")
    if not 0.5 <= confidence < 1:
        raise ValueError(f"confidence must be in [0.5, 1), got {confidence}")
    logs = [math.log(i / k) for k, i in zip(kernel_ms, inductor_ms)]
    groups, start = [], 0
    for size in runs:
        groups.append(logs[start:start + size])
        start += size
    means = [statistics.fmean(g) for g in groups]
    k = len(groups)
    within = sum((v - m) ** 2 for g, m in zip(groups, means) for v in g) / (n - k)  # pooled, n - k degrees of freedom
    between = between_sd ** 2
    if k >= 2:  # what these runs show beyond their rounds' own noise
        between = max(between, statistics.variance(means) - statistics.fmean(within / len(g) for g in groups))
    stderr = math.sqrt(sum(within / len(g) + between for g in groups)) / k
    mean = statistics.fmean(means)
    ratio = math.exp(mean)
    bound = math.exp(mean - t_quantile(confidence, n - k) * stderr)
    needed = 1.0 + margin
    keep = bound > needed
    how = f"{n} interleaved rounds" + (f" in {k} runs" if k > 1 else "")
    spread = f"Inductor/kernel {ratio:.3f}x over {how}, {confidence * 100:.3g}% lower bound {bound:.3f}x"
    if keep:
        reason = f"kept: {spread} > {needed:.3f}x"
    elif ratio > needed:
        reason = f"not kept: {spread} <= {needed:.3f}x (the gain is within the noise)"
    else:
        reason = f"not kept: {spread} <= {needed:.3f}x"
    return Decision(keep, ratio, bound, needed, confidence, n, reason)


# -- the schedule -----------------------------------------------------------------------------


# -- the sandboxed re-timing (the parent's side) ------------------------------------------------


@dataclass(frozen=True)
class RetimeConfig:
    rounds: int = 6  # interleaved rounds of each run (at least MIN_ROUNDS; even: as many AB as BA)
    runs: int = 2  # runs, each in a fresh worker process with a fresh compile of Inductor's side
    trials: int = 25  # trials per side per round; a round's time is their median
    warmup: int = 3  # untimed calls before each side's trials in every round
    timeout: float = 600.0  # seconds for the kernel's phases, and for each of the judge's steps (the GPU lock's wait included)
    seed: int = 11  # the input set: the judge's first (its timing set)
    device: str | None = None  # "cuda:1"; None: the current device
    build_root: str | None = None  # the judge's build cache: the kernel's load_inline is answered from it
    arch: str | None = None
    gpu_lock: str | None = None  # taken exclusively for the whole interleaved measurement
    compile_backend: str = "inductor"  # what compiles the reference (tests on a CPU use "eager")
    numerics: tuple[tuple[str, Any], ...] = ()  # the task's cache key's settings (the judge's `RunConfig.numerics`)

    def __post_init__(self) -> None:
        if self.rounds < MIN_ROUNDS:
            raise ValueError(f"rounds must be at least {MIN_ROUNDS}, got {self.rounds}")
        if self.runs < 1:
            raise ValueError(f"runs must be at least 1, got {self.runs}")
        if self.trials < 1 or self.warmup < 0:
            raise ValueError("trials must be at least 1 and warmup at least 0")


@dataclass(frozen=True)
class RetimeOutcome:
    """What a re-timing gave: per-round times, or why there are none.

    `failure` empty: `kernel_ms` and `inductor_ms` hold one median per round, paired. Otherwise
    `judge_side` says whose failure it was: the judge's (its worker crashed or timed out in its
    own steps, memory ran out, no GPU: no decision, the task stays pending) or the kernel's (it
    crashed, hung or raised, or the runtime would not run it on these inputs: not kept)."""

    kernel_ms: tuple[float, ...] = ()
    inductor_ms: tuple[float, ...] = ()
    runs: tuple[int, ...] = ()  # rounds of each run, in order (empty: one run of every round)
    failure: str = ""
    judge_side: bool = False
    trials: int = 0
    device: str = ""
    protocol: str = ""  # what each time includes, as the worker measured it
    phase: str = ""  # the worker's last phase

    @property
    def ok(self) -> bool:
        return not self.failure

    @classmethod
    def judge_failure(cls, text: str, phase: str = "") -> "RetimeOutcome":
        return cls(failure=text, judge_side=True, phase=phase)

    @classmethod
    def kernel_failure(cls, text: str, phase: str = "") -> "RetimeOutcome":
        return cls(failure=text, judge_side=False, phase=phase)

    @classmethod
    def join(cls, outcomes: Sequence["RetimeOutcome"]) -> "RetimeOutcome":
        """Successful re-timings' rounds joined in order, with each run's size (the last one's
        protocol, prefixed by how many runs)."""
        if len(outcomes) == 1:
            return outcomes[0]
        last = outcomes[-1]
        runs = tuple(n for o in outcomes for n in (o.runs or (len(o.kernel_ms),)))
        protocol = re.sub(r"^\d+ runs, each in a fresh worker: ", "", last.protocol)
        return cls(tuple(v for o in outcomes for v in o.kernel_ms), tuple(v for o in outcomes for v in o.inductor_ms), runs,
                   trials=last.trials, device=last.device, protocol=f"{len(runs)} runs, each in a fresh worker: {protocol}",
                   phase=last.phase)


def sequential_decision(retime: Callable[[], RetimeOutcome], margin: float, looks: int = RETIME_LOOKS,
                        confidence: float = LOOK_CONFIDENCE) -> tuple[RetimeOutcome, Decision | None]:
    """Re-time (`retime()`: fresh runs) and decide; while the decision is open, re-time again with
    the new runs joined to the earlier ones, at most `looks` re-timings. (The joined outcome, its
    decision), or (the first failed outcome, None). ValueError from `decide` passes through."""
    joined: list[RetimeOutcome] = []
    verdict: Decision | None = None
    for _ in range(looks):
        outcome = retime()
        if not outcome.ok:
            return outcome, None
        joined.append(outcome)
        total = RetimeOutcome.join(joined)
        verdict = decide(total.kernel_ms, total.inductor_ms, margin, confidence, runs=total.runs or None,
                         between_sd=BETWEEN_RUN_SD)
        if verdict.keep or verdict.ratio <= verdict.needed:
            break
    return total, verdict


def retime_in_sandbox(task_source: str, kernel_source: str, config: RetimeConfig = RetimeConfig()) -> RetimeOutcome:
    """Re-time `kernel_source` against Inductor's code for `task_source` in a fresh worker process
    (`python -m kevin_backend.judge.retime_worker`), as `sandbox.run_in_sandbox` runs the judge's:
    its own process group killed on timeout, a verdict line prefixed by a token only the worker
    knows (the kernel's prints cannot pose as one), the last phase it announced saying whose a
    crash or hang was."""
    job = RetimeJob(
        task=task_source, kernel=kernel_source, rounds=config.rounds,
        trials=config.trials, warmup=config.warmup, seed=config.seed, device=config.device,
        build_root=config.build_root, arch=config.arch, gpu_lock=config.gpu_lock,
        compile_backend=config.compile_backend,
        numerics=tuple(config.numerics),
    )
    kills = host_oom_kills()
    try:
        end = sandbox.run_worker_process("kevin_backend.judge.retime_worker", job, config.timeout, RETIME_CANDIDATE_PHASES)
    except OSError as exc:
        return RetimeOutcome.judge_failure(f"the re-timing worker did not start: {exc}")
    if end.timed_out:
        if end.hung:
            return RetimeOutcome.kernel_failure(f"the kernel did not finish its re-timing in {config.timeout:.0f} s "
                                                f"(step '{end.phase}')", end.phase)
        return RetimeOutcome.judge_failure(f"the re-timing's step '{end.phase}' did not finish within its limits "
                                           f"({config.timeout:.0f} s a step)",
                                           end.phase)
    if end.verdict is None:
        after = host_oom_kills()
        return _death(end.phase, end.err, end.returncode, kills is not None and after is not None and after > kills)
    return _outcome(end.verdict, end.phase, config)


def retime_runs(task_source: str, kernel_source: str, config: RetimeConfig) -> RetimeOutcome:
    """`config.runs` re-timings, each in a fresh worker (a fresh compile of Inductor's side, a
    fresh load of the kernel), their rounds joined in order with the runs' sizes; the first
    failure is the outcome.

    Where a GPU lock keeps their measurements apart (`config.gpu_lock`: each run holds it alone
    from its warm-up round, Inductor's compile included, to its last round), every run's worker
    starts at once: a run's start (torch, CUDA, the kernel's and Inductor's processes) overlaps
    the measurement of the run before it instead of following it. Without a lock they run one
    after another."""
    if config.runs > 1 and config.gpu_lock:
        with concurrent.futures.ThreadPoolExecutor(config.runs) as threads:
            outcomes = list(threads.map(lambda _: retime_in_sandbox(task_source, kernel_source, config), range(config.runs)))
    else:
        outcomes = []
        for _ in range(config.runs):
            outcomes.append(retime_in_sandbox(task_source, kernel_source, config))
            if not outcomes[-1].ok:
                break
    failed = next((outcome for outcome in outcomes if not outcome.ok), None)
    return failed if failed is not None else RetimeOutcome.join(outcomes)


def _death(phase: str, err: str, returncode: int | None, host_oom_kill: bool = False) -> RetimeOutcome:
    """The worker died without a verdict: an illegal address is the kernel's wherever it
    surfaced, lack of memory is the machine's (the judge held the kernel to its memory bound), a
    SIGKILL while the host's out-of-memory killer killed is the machine's too (the kernel runs in
    a process of its own, whose death the worker reports; the worker's own is not the kernel's),
    anything else is the kernel's in its phases and the judge's in the judge's."""
    text = err.lower()
    code = returncode if returncode is not None else 0
    how = f"signal {-code}" if code < 0 else f"exit status {code}"
    tail = sandbox.tail(err)
    if code == -9 and host_oom_kill:
        return RetimeOutcome.judge_failure(f"the host's out-of-memory killer ended the re-timing worker in its step "
                                           f"'{phase}' ({how}): no decision", phase)
    if any(sign in text for sign in ("illegal memory access", "misaligned address")):
        return RetimeOutcome.kernel_failure(f"the GPU reported a fault during the re-timing ({how}): {tail}", phase)
    if "out of memory" in text:
        return RetimeOutcome.judge_failure(f"the re-timing ran out of memory in its step '{phase}' ({how}): {tail}", phase)
    if phase in RETIME_CANDIDATE_PHASES:
        return RetimeOutcome.kernel_failure(f"the kernel crashed its re-timing in step '{phase}' ({how}): {tail}", phase)
    return RetimeOutcome.judge_failure(f"the re-timing worker died in its step '{phase}' ({how}): {tail}", phase)


def _outcome(verdict: dict[str, Any], phase: str, config: RetimeConfig) -> RetimeOutcome:
    status = verdict.get("status")
    if status == "kernel":
        return RetimeOutcome.kernel_failure(str(verdict.get("feedback", "the kernel failed its re-timing")), phase)
    if status != "ok":
        return RetimeOutcome.judge_failure(f"{verdict.get('reason', 'INFRA')}: {verdict.get('feedback', '')}", phase)
    try:
        kernel_ms = tuple(float(v) for v in verdict["kernel_ms"])
        inductor_ms = tuple(float(v) for v in verdict["inductor_ms"])
    except (KeyError, TypeError, ValueError) as exc:
        return RetimeOutcome.judge_failure(f"the re-timing worker's answer is malformed ({type(exc).__name__}: {exc})", phase)
    if len(kernel_ms) != config.rounds or len(inductor_ms) != config.rounds \
            or not all(math.isfinite(v) and v > 0 for v in kernel_ms + inductor_ms):
        return RetimeOutcome.judge_failure(f"the re-timing worker returned {len(kernel_ms)} kernel and {len(inductor_ms)} "
                                           f"Inductor rounds of {config.rounds}, or a time that is not positive", phase)
    return RetimeOutcome(kernel_ms, inductor_ms, (len(kernel_ms),), trials=int(verdict.get("trials", config.trials)),
                         device=str(verdict.get("device", "")), protocol=str(verdict.get("protocol", "")), phase=phase)


class SandboxRetimer:
    """Re-timing on a judge's GPU with its build cache and its GPU lock (the file every one of the
    judge's workers locks, so the re-timing runs alone on the GPU): `retimer(task, kernel)`.

    The judge's device, architecture and lock are resolved at each call (a judge made on a
    machine without a GPU has none until then); with no GPU the re-timing is the judge's failure.
    """

    def __init__(self, judge: Any, config: RetimeConfig | None = None) -> None:
        self.judge = judge
        self.config = config or RetimeConfig()

    def resolved(self) -> RetimeConfig:
        import dataclasses

        import torch

        device = self.judge.device
        major, minor = torch.cuda.get_device_capability(device)
        root = Path(self.judge.builder.root)
        seeds = getattr(getattr(self.judge, "config", None), "seeds", None) or (self.config.seed,)
        # the judge's own GPU lock file (`Judge._judge`: gpu<index>.lock under its build root)
        numerics = tuple(getattr(getattr(self.judge, "config", None), "numerics", ()) or ())
        return dataclasses.replace(self.config, device=str(device), arch=f"{major}.{minor}", build_root=str(root),
                                   gpu_lock=str(gpu_lock_path(root, device.index)), seed=int(seeds[0]), numerics=numerics)

    def for_numerics(self, numerics: tuple[tuple[str, Any], ...]) -> "SandboxRetimer":
        """This retimer for a task judged under `numerics` (its cache key's settings)."""
        configured = getattr(self.judge, "configured", None)
        return SandboxRetimer(configured(numerics=tuple(numerics)), self.config) if configured and numerics else self

    def __call__(self, task_source: str, kernel_source: str) -> RetimeOutcome:
        try:
            import torch

            if not torch.cuda.is_available():
                return RetimeOutcome.judge_failure("no CUDA GPU to re-time the kernel on")
            config = self.resolved()
        except Exception as exc:  # noqa: BLE001 - the judge's own failure: no decision
            return RetimeOutcome.judge_failure(f"the re-timing could not be set up: {type(exc).__name__}: {exc}")
        return retime_runs(task_source, kernel_source, config)

    @classmethod
    def for_judge(cls, judge: Any, config: RetimeConfig | None = None) -> "SandboxRetimer | None":
        """The retimer of a judge that builds and runs kernels (has a `builder` and a `device`),
        else None (a test's scripted judge: its decisions rest on its own timings)."""
        if getattr(judge, "builder", None) is None or not hasattr(type(judge), "device"):
            return None
        return cls(judge, config)
