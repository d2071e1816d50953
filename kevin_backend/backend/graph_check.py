"""The graph-level check: a graph keeps its kernels only when it runs faster with them.

A kernel is judged alone, against Inductor's code for its partition. In a model it runs through
`kevin::launch`: a call with its own host cost that Inductor cannot fuse across, so a kernel
faster than Inductor's code for its partition can still make the graph slower. So the backend
times each compiled graph as the model runs it, with and without its kernels, and keeps only
the kernels that make it faster:

    variants     with several kernels, each alone against none (Inductor alone); then, from the
                 best one alone, the others added while the graph gets faster, and each kept one
                 dropped when the graph is as fast without it; then the rest together
                 (`choose`); one kernel, more than MAX_ALONE, or dynamic shapes: all against none
    when         on the graph's first call, outside Dynamo's compile (a training graph's backward
                 is compiled by its first backward, and its kernels are known only then)
    inputs       copies of the first call's arguments (the graph may write into its inputs: the
                 model's own tensors are never touched), with the same requires_grad
    one step     the compiled graph called, then backward through its outputs that need
                 gradients: a training graph's forward and backward both count
    timing       interleaved rounds (`measure.interleave.interleaved`), on a GPU of about ROUND_MS of
                 steps each (`round_trials`), decided on the paired
                 rounds by `judge.decide.decide`: a variant beats another when the lower
                 confidence bound of the other's time over its own exceeds 1 + min(margin, 0),
                 the confidence corrected for the number of comparisons (Holm, Bonferroni);
                 a comparison still open after its rounds is measured again (LOOKS)
    stored       <cache_dir>/graph_checks/<key>.json, keyed by the graph's code, its inputs'
                 layouts, the GPU and the versions; reused while the kernel cache is unchanged,
                 so the next compile does not measure again
    confirmed    kernels kept by one process's rounds are timed once more, kept against none, by
                 the first compile in another process (`confirm`): a machine's state drifts between
                 processes (clocks, the host's load, a step bound by its launches), and repeats in
                 one process are weaker evidence than repeats across them. They stay only if they
                 hold there too (CONFIRMATIONS processes in all); a set dropped stays dropped

A failure of the check itself (memory, an exception) keeps none of the kernels: Inductor's code
runs the graph, the report and the log say why, and the failure is never stored. Under dynamic
shapes the kernels serve the sizes they were verified for: a call with other sizes runs
Inductor's code for the whole graph, compiled once (`GraphCheck`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import secrets
import statistics
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
import torch.fx as fx

from kevin_backend.version import __version__
from kevin_backend.backend.report import CompileReport, Status
from kevin_backend.cache.kernel_store import KernelStore
from kevin_backend.cache.key import DeviceInfo, tensors_device
from kevin_backend.runtime.counters import counters

__all__ = ["GraphOutcome", "GraphCheck", "choose", "confirm", "graph_key", "load_outcome", "store_outcome"]

log = logging.getLogger("kevin_backend")

ROUNDS = 7  # interleaved rounds per comparison
LOOKS = 2  # a comparison still open after its rounds is measured again, at most this many times in all (`_Pairs.decide`)
TRIALS = 10  # timed steps per round at least (the median counts)
ROUND_MS = 50.0  # a round times about this long of each variant's steps: a short graph gets more trials
MAX_TRIALS = 200
MAX_ALONE = 12  # beyond this many kernels, only all or none
CONFIDENCE = 0.95  # per step of the choice: no kernel kept by noise in 95% of checks (`choose`)
TOGETHER_SHARE = 0.5  # of the first step's error rate: for the kernels not kept, tried together (`choose`)
CONFIRMATIONS = 2  # processes whose rounds must keep a graph's kernels before its stored outcome stands unmeasured
PROCESS = secrets.token_hex(8)  # this process, as a stored outcome names the one that measured it last

Compiled = Callable[..., Any]


@dataclass
class GraphOutcome:
    """What the check found for one graph: the kernels kept, the ones dropped and why."""

    kept: list[str]
    dropped: dict[str, str]
    summary: str
    rounds_ms: dict[str, list[float]] = field(default_factory=dict)  # variant -> per-round median ms
    cache_fingerprint: str = ""
    confirmed: int = 1  # processes whose rounds kept the kernels (`confirm`)
    process: str = PROCESS  # the process that measured it last

    def as_dict(self) -> dict[str, Any]:
        return {"kept": self.kept, "dropped": self.dropped, "summary": self.summary, "rounds_ms": self.rounds_ms,
                "cache_fingerprint": self.cache_fingerprint, "confirmed": self.confirmed, "process": self.process,
                "date": time.strftime("%Y-%m-%d %H:%M:%S")}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "GraphOutcome":
        kept, dropped, confirmed = data["kept"], data["dropped"], data.get("confirmed", 1)
        if not (isinstance(kept, list) and all(isinstance(k, str) for k in kept) and isinstance(dropped, dict)
                and all(isinstance(k, str) and isinstance(v, str) for k, v in dropped.items())):
            raise ValueError("kept must be a list of digests and dropped a mapping of digests to reasons")
        if not isinstance(confirmed, int) or isinstance(confirmed, bool) or confirmed < 1:
            raise ValueError(f"confirmed must be a count of processes, not {confirmed!r}")
        return cls(kept, dropped, str(data.get("summary", "")), dict(data.get("rounds_ms", {})),
                   str(data.get("cache_fingerprint", "")), confirmed, str(data.get("process", "")))

    @property
    def unconfirmed(self) -> bool:
        """Kernels kept on fewer processes' rounds than CONFIRMATIONS, none of them this one:
        the first compile here times them again (`confirm`)."""
        return bool(self.kept) and self.confirmed < CONFIRMATIONS and self.process != PROCESS


# -- the choice ------------------------------------------------------------------------------


def choose(digests: Sequence[str], variant: Callable[[frozenset[str]], Callable[[], Any]],
           measure: Callable[[dict[str, Callable[[], Any]]], dict[str, Sequence[float]]], margin: float,
           alone: bool = True) -> GraphOutcome:
    """Which of `digests` the graph keeps: the set that makes it fastest, found greedily.

    `variant(kept)` is one step of the graph compiled with only the kernels in `kept` (asked
    once per set); `measure(steps)` times named steps in interleaved rounds (per name, each
    round's ms). One set beats another when `decide` keeps it with the margin min(`margin`, 0):
    a gain within the noise is no gain, and a negative margin (pipeline tests) keeps slower
    kernels here as it does for partitions.

        screen   each kernel alone against none; Holm's correction over these comparisons
        add      from the best winner alone, each other winner (best first) joins when the
                 graph with it beats the graph without it; Bonferroni over these comparisons
        drop     each kept kernel but the last added leaves when the graph with it no longer
                 beats the graph without it; Bonferroni over these comparisons
        together the kernels not kept and not surely slower alone, all at once, join when the
                 graph with them beats the graph with the kept ones (or none): small gains show
                 summed that do not alone; the screen and this share the first step's error
                 rate (TOGETHER_SHARE)

    Each step's comparisons are a family whose chance of keeping a kernel by noise is at most
    1 - CONFIDENCE. With one kernel, more than MAX_ALONE, or `alone` off: all against none."""
    every = frozenset(digests)
    pairs = _paired(variant, measure, margin)
    if len(every) == 1 or len(every) > MAX_ALONE or not alone:
        whole = pairs.decide(every, frozenset(), CONFIDENCE)
        if whole.keep:
            return GraphOutcome(sorted(every), {}, f"all {len(every)} kept: the graph with them, {_words(whole)}", pairs.rounds)
        why = f"the graph with {'it' if len(every) == 1 else 'them'}: {_words(whole)}"
        return GraphOutcome([], {d: why for d in every}, f"{len(every)} dropped: {why}", pairs.rounds)
    dropped: dict[str, str] = {}
    winners = _screen(pairs, sorted(every), dropped)
    kept = _drop(pairs, _add(pairs, winners, dropped), dropped)
    joined, together = _rest_together(pairs, frozenset(kept), dropped)
    how = (f"{pairs.count} paired comparisons, {CONFIDENCE:.0%} per step with Holm's or Bonferroni's correction; "
           f"the best alone: {_words(winners[0][1])}" if winners else f"{pairs.count} paired comparisons")
    if joined:
        how = f"{len(joined)} of them only together, the graph with them: {together}; {how}"
        kept += sorted(joined)
    summary = (f"all {len(every)} kept ({how})" if len(kept) == len(every) else
               f"{len(kept)} of {len(every)} kept ({how})" if kept else
               f"all {len(every)} dropped: none makes the graph faster alone or with the others ({how})")
    return GraphOutcome(sorted(kept), dropped, summary, pairs.rounds)


def _paired(variant: Callable[[frozenset[str]], Callable[[], Any]],
            measure: Callable[[dict[str, Callable[[], Any]]], dict[str, Sequence[float]]], margin: float) -> "_Pairs":
    """The comparisons of a check with the margin min(`margin`, 0): the graph must be faster with
    the kernels, no more (a positive margin is the partitions' own), no less unless told so."""
    return _Pairs(variant, measure, min(margin, 0.0))


def confirm(stored: GraphOutcome, digests: Sequence[str], variant: Callable[[frozenset[str]], Callable[[], Any]],
            measure: Callable[[dict[str, Callable[[], Any]]], dict[str, Sequence[float]]], margin: float) -> GraphOutcome:
    """A stored outcome that kept kernels, timed again in this process: the graph with the kernels
    it runs (`digests`, the kept ones) against Inductor alone, as `choose` decides one set against
    none. Held: the outcome counts one more process. Not held: every kernel is dropped with the
    reason, and the outcome needs no confirming again."""
    every = frozenset(digests)
    if not every:  # (none of them runs here: nothing to time)
        return stored
    pairs = _paired(variant, measure, margin)
    verdict = pairs.decide(every, frozenset(), CONFIDENCE)
    if verdict.keep:
        rounds = {**stored.rounds_ms, **{f"confirmed: {name}": ms for name, ms in pairs.rounds.items()}}
        return replace(stored, confirmed=stored.confirmed + 1, process=PROCESS, rounds_ms=rounds,
                       summary=f"{stored.summary}; confirmed in another process: the graph with them, {_words(verdict)}")
    why = f"kept by the check in another process, not here: the graph with them, {_words(verdict)}"
    dropped = {**stored.dropped, **{d: why for d in every}}
    return GraphOutcome([], dropped, f"{len(every)} dropped, not confirmed: {why}", pairs.rounds, stored.cache_fingerprint)


def _rest_together(pairs: "_Pairs", kept: frozenset[str], dropped: dict[str, str]) -> tuple[frozenset[str], str]:
    """The kernels not kept and not surely slower alone (the screen's rounds show no loss beyond
    the noise), all joined at once to those kept (or to none): each may save too little of the
    graph's time to show alone, while together they show. Decided on fresh rounds at the
    share of the first step's error rate the screen left (TOGETHER_SHARE), so that tied kernels
    are kept by noise no more often than before. The ones that joined (taken out of `dropped`)
    and the comparison in words; if none did, each hopeful one's reason says so too."""
    hopeful = frozenset(d for d in dropped if not pairs.slower.get(d, False))
    if not hopeful:
        return frozenset(), ""
    verdict = pairs.decide(kept | hopeful, kept, 1 - (1 - CONFIDENCE) * TOGETHER_SHARE)
    words = _words(verdict, _JOINED if kept else "Inductor/kevin")
    if verdict.keep:
        for d in hopeful:
            del dropped[d]
        return hopeful, words
    for d in hopeful:
        dropped[d] += f"; with the others not slower alone ({len(hopeful)}): {words}"
    return frozenset(), words


def _screen(pairs: "_Pairs", digests: list[str], dropped: dict[str, str]) -> list[tuple[str, Any]]:
    """Each kernel alone against none, with Holm's step-down correction: the comparisons taken
    from the strongest evidence down, the i-th (from 0) of m at 1 - a / (m - i), with a the step's
    error rate less the share `_rest_together` keeps, stopping at the first that fails. The winners
    with their decisions, best first."""
    from kevin_backend.judge.decide import decide

    timed = {d: pairs.times(frozenset([d]), frozenset()) for d in digests}
    order = sorted(digests, key=lambda d: -_evidence(*timed[d], pairs.margin))
    winners: list[tuple[str, Any]] = []
    share = (1 - CONFIDENCE) * (1 - TOGETHER_SHARE)
    for i, d in enumerate(order):
        verdict = decide(*timed[d], margin=pairs.margin, confidence=1 - share / (len(order) - i))
        pairs.slower[d] = decide(timed[d][1], timed[d][0], margin=0.0, confidence=CONFIDENCE).keep
        if verdict.keep and len(winners) == i:
            winners.append((d, verdict))
        else:
            after = "" if not verdict.keep else " (a kernel with stronger evidence was not kept: Holm's correction stops there)"
            dropped[d] = f"the graph with it alone: {_words(verdict)}{after}"
    return sorted(winners, key=lambda w: -w[1].ratio)


def _add(pairs: "_Pairs", winners: list[tuple[str, Any]], dropped: dict[str, str]) -> list[str]:
    """From the best winner alone, each other winner joins when the graph with it beats the
    graph without it. The kept kernels in the order they joined."""
    if not winners:
        return []
    kept = [winners[0][0]]
    confidence = 1 - (1 - CONFIDENCE) / max(1, len(winners) - 1)
    for d, _ in winners[1:]:
        verdict = pairs.decide(frozenset(kept + [d]), frozenset(kept), confidence)
        if verdict.keep:
            kept.append(d)
        else:
            dropped[d] = f"wins alone, but not together with {_label(kept)}: {_words(verdict, _JOINED)}"
    return kept


def _drop(pairs: "_Pairs", kept: list[str], dropped: dict[str, str]) -> list[str]:
    """Each kept kernel but the last to join (its joining was this very comparison) leaves when
    the graph with it no longer beats the graph without it, the others kept as they stand."""
    tried = kept[:-1] if len(kept) > 1 else []
    confidence = 1 - (1 - CONFIDENCE) / max(1, len(tried))
    for d in tried:
        others = [k for k in kept if k != d]
        verdict = pairs.decide(frozenset(kept), frozenset(others), confidence)
        if not verdict.keep:
            kept = others
            dropped[d] = f"the graph with {_label(others)} is as fast without it: {_words(verdict, _JOINED)}"
    return kept


class _Pairs:
    """Paired comparisons of variants: each set's step asked for once, each comparison's rounds
    kept (for the stored outcome) and counted."""

    def __init__(self, variant: Callable[[frozenset[str]], Callable[[], Any]],
                 measure: Callable[[dict[str, Callable[[], Any]]], dict[str, Sequence[float]]], margin: float) -> None:
        self._variant, self._measure, self.margin = variant, measure, margin
        self._steps: dict[frozenset[str], Callable[[], Any]] = {}
        self.rounds: dict[str, list[float]] = {}  # "<comparison>. <set>" -> per-round median ms
        self.count = 0
        self.slower: dict[str, bool] = {}  # the screen's: the graph with the kernel alone surely slower

    def _step(self, kept: frozenset[str]) -> Callable[[], Any]:
        if kept not in self._steps:
            self._steps[kept] = self._variant(kept)
        return self._steps[kept]

    def times(self, faster: frozenset[str], slower: frozenset[str]) -> tuple[list[float], list[float]]:
        """Rounds of the graph with the kernels in `faster` and with those in `slower` (the
        claim is the first's): per round, each one's ms."""
        first, second = self._step(faster), self._step(slower)
        got = self._measure({"with": first, "without": second})
        self.count += 1
        self.rounds[f"{self.count}. {_label(faster)}"] = list(got["with"])
        self.rounds[f"{self.count}. {_label(slower)}"] = list(got["without"])
        return list(got["with"]), list(got["without"])

    def decide(self, faster: frozenset[str], slower: frozenset[str], confidence: float) -> Any:
        """The claim that `faster` beats `slower`, at `confidence` over LOOKS looks: a comparison
        still open after its rounds (the gain above the threshold, its bound not) is measured
        again and decided on all its rounds; each look at its share of the error rate."""
        from kevin_backend.judge.decide import decide

        each = 1 - (1 - confidence) / LOOKS
        with_ms, without_ms = self.times(faster, slower)
        verdict = decide(with_ms, without_ms, margin=self.margin, confidence=each)
        for _ in range(LOOKS - 1):
            if verdict.keep or verdict.ratio <= verdict.needed:
                break
            more_with, more_without = self.times(faster, slower)
            with_ms, without_ms = with_ms + more_with, without_ms + more_without
            verdict = decide(with_ms, without_ms, margin=self.margin, confidence=each)
        return verdict


def _evidence(faster_ms: Sequence[float], slower_ms: Sequence[float], margin: float) -> float:
    """The paired t statistic of log(slower / faster) against log(1 + margin): the order of the
    comparisons' p-values (they share their number of rounds) for Holm's correction."""
    logs = [math.log(s / f) for f, s in zip(faster_ms, slower_ms)]
    gain = statistics.fmean(logs) - math.log1p(margin)
    spread = statistics.stdev(logs) / math.sqrt(len(logs)) if len(logs) > 1 else 0.0
    return gain / spread if spread > 0 else math.copysign(math.inf, gain) if gain else 0.0


def _label(kept: Sequence[str] | frozenset[str]) -> str:
    return "{" + ", ".join(d[:12] for d in sorted(kept)) + "}" if kept else "none"


_JOINED = "the graph's time without it over with it"  # the ratio of an add or drop comparison


def _words(decision: Any, ratio: str = "Inductor/kevin") -> str:
    return (f"{ratio} {decision.ratio:.3f}x over {decision.rounds} interleaved rounds, "
            f"{decision.confidence * 100:.4g}% lower bound {decision.bound:.3f}x (needs > {decision.needed:.3f}x)")


# -- stored outcomes -------------------------------------------------------------------------


def graph_key(gm: fx.GraphModule, example_inputs: Sequence[Any], settings: dict[str, Any]) -> str:
    """The graph's identity for a stored outcome: its code, its inputs' layouts, the GPU, the
    versions and the settings that change what it compiles to."""
    specs: list[Any] = []
    for value in example_inputs:
        if isinstance(value, torch.Tensor):
            specs.append([list(value.shape), list(value.stride()), str(value.dtype), str(value.device),
                          bool(value.requires_grad)])
        else:
            specs.append(repr(value))
    device = tensors_device(example_inputs)
    gpu = DeviceInfo.detect(device.type, device.index).name if device is not None and device.type == "cuda" else "cpu"
    text = json.dumps({"code": gm.code, "inputs": specs, "grad": torch.is_grad_enabled(), "gpu": gpu,
                       "torch": torch.__version__, "kevin": __version__, "settings": settings}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def load_outcome(root: Path, key: str) -> GraphOutcome | None:
    """The stored outcome, or None (absent, or unreadable: then it is measured again)."""
    path = root / f"{key}.json"
    try:
        return GraphOutcome.from_dict(json.loads(path.read_text()))
    except FileNotFoundError:
        return None
    except Exception as exc:  # noqa: BLE001 - a corrupt record is measured again, not trusted
        log.warning("kevin: the stored graph check %s is unreadable (%s: %s); measuring again", path, type(exc).__name__, exc)
        return None


def store_outcome(root: Path, key: str, outcome: GraphOutcome) -> None:
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f".{key}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(outcome.as_dict(), indent=1))
    os.replace(tmp, root / f"{key}.json")


# -- the check around a compiled graph ---------------------------------------------------------


def _copies(args: Sequence[Any]) -> list[Any]:
    """The arguments copied with their layouts (`clone_layout`: strides, storage offset, a stride-0
    broadcast stays one row) and requires_grad: what the graph writes into, and the gradients its
    backward accumulates, land in the copies."""
    from kevin_backend.measure.inputs import clone_layout

    with torch.no_grad():
        return [clone_layout(a.detach()).requires_grad_(a.requires_grad) if isinstance(a, torch.Tensor) else a for a in args]


def _step(fn: Compiled, inputs: list[Any]) -> Callable[[], Any]:
    """One step of the graph as the model runs it: the call, and backward when it trains."""
    grads: list[Any] = []

    def run() -> None:
        out = fn(*inputs)
        outs = [o for o in (out if isinstance(out, (list, tuple)) else [out])
                if isinstance(o, torch.Tensor) and o.requires_grad and o.grad_fn is not None]
        if outs:
            if len(grads) != len(outs):
                grads[:] = [torch.ones_like(o) for o in outs]
            torch.autograd.backward(outs, grads)

    return run


class GraphCheck:
    """The callable Dynamo gets for a graph: on the first call, the check (module docstring);
    then the chosen variant, and under dynamic shapes Inductor's code for sizes the kernels were
    not verified on."""

    def __init__(self, compiled: Compiled, compile_variant: Callable[[dict[str, str] | None], Compiled],
                 report: CompileReport, store: Path | None, key: str, cache: KernelStore, margin: float,
                 sizes: list[tuple[int, Any]], outcome: GraphOutcome | None = None, other_sizes: Compiled | None = None) -> None:
        # a stored outcome stands as it is, unless its kernels were kept by another process's rounds alone
        self._confirming = outcome is not None and outcome.unconfirmed
        measuring = outcome is None or self._confirming
        self.chosen: Compiled | None = None if measuring else compiled
        self._all = compiled
        # (it holds the compile's example inputs: let go once the check no longer needs it)
        self._compile_variant: Callable[[dict[str, str] | None], Compiled] | None = compile_variant if measuring else None
        self._report = report
        self._store = store
        self._key = key
        self._cache = cache
        self._margin = margin
        # dynamic shapes only: (argument index, the size the kernels were verified on), and
        # Inductor's code for the graph with symbolic sizes (compiled in Dynamo's compile: a
        # compile later, from real arguments, would specialize them)
        self._sizes = sizes
        self._other_sizes = other_sizes
        self._waited = 0  # calls run before any kernel was known
        self.outcome = outcome

    def __call__(self, *args: Any) -> Any:
        for index, want in self._sizes:
            a = args[index]
            if (tuple(a.shape) if isinstance(a, torch.Tensor) else a) != want:
                return self._other_sizes(*args)  # type: ignore[misc]
        if self.chosen is None:
            if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
                return self._all(*args)  # no timing under capture: the next call checks
            if not self._kernels():
                # No kernel yet: a training graph's backward is compiled by its first backward,
                # and its kernels are known only then. One call runs as it is; if the next call
                # still finds no kernel, there is nothing to check (and no copies are made).
                self._waited += 1
                if self._waited > 1:
                    self.chosen, self._compile_variant = self._all, None
                return self._all(*args)
            self.chosen = self._check(args)
            self._compile_variant = None
        return self.chosen(*args)

    def _kernels(self) -> list[str]:
        """The kernels this compile put in the graph; for a stored outcome timed again, the ones
        it kept where the compile left no record of them (Inductor's own cache served its code)."""
        found = sorted({r.key for r in self._report.records() if r.key and r.status in (Status.HIT, Status.GENERATED)})
        if not found and self._confirming and self.outcome is not None:
            return sorted(self.outcome.kept)
        return found

    def _check(self, args: Sequence[Any]) -> Compiled:
        # the steps it times draw random numbers (dropout): the model's own stream of them must
        # not depend on whether a check ran
        with torch.random.fork_rng(devices=list(range(torch.cuda.device_count())) if torch.cuda.is_available() else []):
            return self._checked(args)

    def _checked(self, args: Sequence[Any]) -> Compiled:
        started = time.perf_counter()
        counters.add("graph_checks_confirmed" if self._confirming else "graph_checks")
        compile_variant = self._compile_variant
        assert compile_variant is not None
        compiled: dict[frozenset[str], Compiled] = {}  # the variants compiled so far, by their kept kernels
        if self._other_sizes is not None:
            # symbolic sizes: variants compiled now, from real arguments, would lose them;
            # so all kernels or none (Inductor's code compiled with the graph)
            compiled[frozenset()] = self._other_sizes
        try:
            inputs = _copies(args)
            first = _step(self._all, inputs)
            first()  # compiles the backward (if no backward ran yet), whose kernels count too
            digests = self._kernels()
            compiled[frozenset(digests)] = self._all
            device = next((a.device for a in inputs if isinstance(a, torch.Tensor)), torch.device("cpu"))

            def variant(kept: frozenset[str]) -> Callable[[], Any]:
                if kept not in compiled:
                    compiled[kept] = compile_variant({d: "" for d in digests if d not in kept} if kept else None)
                step = _step(compiled[kept], inputs)
                step()  # its first call compiles (and its backward)
                return step

            lock = _gpu_lock(self._cache, device)
            if self._confirming and self.outcome is not None:
                outcome = confirm(self.outcome, digests, variant, _Timing(device, lock), self._margin)
            else:
                outcome = choose(digests, variant, _Timing(device, lock), self._margin, alone=self._other_sizes is None)
        except Exception as exc:  # noqa: BLE001 - the check's failure: nothing says the kernels help
            return self._failed(exc, compiled, compile_variant)
        outcome.cache_fingerprint = _fingerprint(self._cache)
        self.outcome = outcome
        self._note(outcome, time.perf_counter() - started)
        if self._store is not None:
            try:
                store_outcome(self._store, self._key, outcome)
            except OSError as exc:
                log.warning("kevin: could not store the graph check (%s)", exc)
        if not outcome.dropped:
            return self._all
        return compiled.get(frozenset(outcome.kept)) or compile_variant(outcome.dropped)

    def _failed(self, exc: Exception, compiled: dict[frozenset[str], Compiled],
                compile_variant: Callable[[dict[str, str] | None], Compiled]) -> Compiled:
        """The check failed (memory, an exception): no kernel has shown that it makes the graph
        faster, so Inductor's code runs the graph; the report and the log say why. Not stored:
        the next compile checks again. Only when Inductor's code cannot be compiled either do
        the kernels stay (the one compiled graph there is)."""
        text = _why(exc)
        try:
            inductor = compiled.get(frozenset()) or compile_variant(None)
        except Exception as again:  # noqa: BLE001 - nothing else to run: the graph as compiled
            self._report.notes.append(f"graph check failed ({text}), and Inductor's code for the graph did not compile "
                                      f"({_why(again)}); the kernels stay as the partitions' decisions put them")
            log.warning("kevin: the graph check failed (%s) and Inductor's code did not compile (%s); keeping the kernels",
                        text, _why(again))
            return self._all
        mark_dropped(self._report, {d: f"the graph check failed ({text}): Inductor's code runs the graph"
                                    for d in self._kernels()})
        self._report.notes.append(f"graph check failed ({text}); none of its kernels run: Inductor's code runs the graph")
        log.warning("kevin: the graph check failed (%s); the graph runs Inductor's code, without its kernels", text)
        return inductor

    def _note(self, outcome: GraphOutcome, seconds: float) -> None:
        mark_dropped(self._report, outcome.dropped)
        self._report.graph_check_seconds += seconds
        self._report.notes.append(f"graph check ({seconds:.1f} s): {outcome.summary}")


def _why(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"


def mark_dropped(report: CompileReport, dropped: dict[str, str]) -> None:
    """The report's records of dropped kernels say so, with the reason."""
    for graph in report.graphs:
        for i, r in enumerate(graph.partitions):
            if r.key in dropped and r.status in (Status.HIT, Status.GENERATED):
                graph.partitions[i] = replace(r, status=Status.DROPPED, detail=dropped[r.key] or "dropped by the graph check")
                counters.add("dropped")


def _fingerprint(cache: KernelStore) -> str:
    try:
        return str(cache.fingerprint())
    except Exception:  # noqa: BLE001
        return ""


def _gpu_lock(cache: KernelStore, device: torch.device) -> Path | None:
    """The GPU lock of the judges that use this kernel cache (under `config.build_root`, where
    `SearchGenerator`'s judge builds): a check holds it while it times, so that no search's
    correctness run or timing shares the GPU with its rounds. None on a CPU."""
    if device.type != "cuda":
        return None
    cache_dir = cache.cache_dir
    from kevin_backend.config import build_root
    from kevin_backend.locks import gpu_lock_path

    root = build_root(cache_dir)
    root.mkdir(parents=True, exist_ok=True)
    return gpu_lock_path(root, device.index)


class _Timing:
    """The check's timer: each step's per-round medians over ROUNDS interleaved rounds. With
    `adapt` (by default on a GPU) a round's trials follow the graph's step length
    (`round_trials`), probed once a check, on its first comparison (its variants differ by a few
    kernels); on the CPU, where the rounds of a compiled test model are short and the timing costs
    its host, TRIALS."""

    def __init__(self, device: torch.device, lock: Path | None = None, adapt: bool | None = None) -> None:
        self.device, self.lock = device, lock
        self.adapt = device.type == "cuda" if adapt is None else adapt
        self.trials: int | None = None

    def __call__(self, steps: dict[str, Callable[[], Any]]) -> dict[str, Sequence[float]]:
        from kevin_backend.measure.interleave import interleaved, timer
        from kevin_backend.locks import gpu_hold

        with gpu_hold(self.lock, shared=False):  # alone on the GPU while the variants are timed
            if self.trials is None:
                probe = min(timer(self.device, 3, 1)(step) for step in steps.values()) if self.adapt else math.nan
                self.trials = round_trials(probe)
            return interleaved(steps, self.device, ROUNDS, measure=timer(self.device, self.trials, 2))


def round_trials(step_ms: float) -> int:
    """Timed steps per round for a step of `step_ms`: a round of about ROUND_MS, from TRIALS to
    MAX_TRIALS: a 1.7 ms inference step is timed 30 times a round, as long as a 5 ms training
    step's 10 take, where 10 calls of it would make a round of 17 ms."""
    if not math.isfinite(step_ms) or step_ms <= 0:
        return TRIALS
    return max(TRIALS, min(MAX_TRIALS, math.ceil(ROUND_MS / step_ms)))
