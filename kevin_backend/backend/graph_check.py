"""The graph-level check: a graph keeps its kernels only when it runs faster with them.

A kernel is judged alone, against Inductor's code for its partition. In a model it runs through
`kevin::launch`: a call with its own host cost that Inductor cannot fuse across, so a kernel
faster than Inductor's code for its partition can still make the graph slower. So the backend
times each compiled graph as the model runs it, with and without its kernels, and keeps only
the kernels that make it faster:

    variants     all kernels (what the kevin pass made) against none (Inductor alone); when all
                 do not win and there are several kernels, each kernel alone against none, then
                 the winners together
    when         on the graph's first call, outside Dynamo's compile (a training graph's backward
                 is compiled by its first backward, and its kernels are known only then)
    inputs       copies of the first call's arguments (the graph may write into its inputs: the
                 model's own tensors are never touched), with the same requires_grad
    one step     the compiled graph called, then backward through its outputs that need
                 gradients: a training graph's forward and backward both count
    timing       interleaved rounds (`bench.timing.interleaved`), decided on the paired rounds by
                 `judge.decide.decide`: a variant wins when the lower confidence bound of
                 Inductor's time over its own exceeds 1 + min(margin, 0)
    stored       <cache_dir>/graph_checks/<key>.json, keyed by the graph's code, its inputs'
                 layouts, the GPU and the versions; reused while the kernel cache is unchanged,
                 so the next compile does not measure again

A failure of the check itself (memory, an exception) keeps the per-partition decisions, is
noted in the report, and is never stored. Under dynamic shapes the kernels serve the sizes they
were verified for: a call with other sizes runs Inductor's code for the whole graph, compiled
once (`_Dispatch`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
import torch.fx as fx

from kevin_backend.version import __version__
from kevin_backend.backend.report import CompileReport, Status
from kevin_backend.cache.kernel_store import KernelStore
from kevin_backend.runtime.counters import counters

__all__ = ["GraphOutcome", "GraphCheck", "choose", "graph_key", "load_outcome", "store_outcome"]

log = logging.getLogger("kevin_backend")

ROUNDS = 7  # interleaved rounds per comparison
TRIALS = 10  # timed steps per round (the median counts)
MAX_ALONE = 12  # beyond this many kernels, only all or none

Compiled = Callable[..., Any]


@dataclass
class GraphOutcome:
    """What the check found for one graph: the kernels kept, the ones dropped and why."""

    kept: list[str]
    dropped: dict[str, str]
    summary: str
    rounds_ms: dict[str, list[float]] = field(default_factory=dict)  # variant -> per-round median ms
    cache_fingerprint: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {"kept": self.kept, "dropped": self.dropped, "summary": self.summary, "rounds_ms": self.rounds_ms,
                "cache_fingerprint": self.cache_fingerprint, "date": time.strftime("%Y-%m-%d %H:%M:%S")}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "GraphOutcome":
        kept, dropped = data["kept"], data["dropped"]
        if not (isinstance(kept, list) and all(isinstance(k, str) for k in kept) and isinstance(dropped, dict)
                and all(isinstance(k, str) and isinstance(v, str) for k, v in dropped.items())):
            raise ValueError("kept must be a list of digests and dropped a mapping of digests to reasons")
        return cls(kept, dropped, str(data.get("summary", "")), dict(data.get("rounds_ms", {})),
                   str(data.get("cache_fingerprint", "")))


# -- the choice ------------------------------------------------------------------------------


def choose(digests: Sequence[str], variant: Callable[[frozenset[str]], Callable[[], Any]],
           measure: Callable[[dict[str, Callable[[], Any]]], dict[str, Sequence[float]]], margin: float,
           alone: bool = True) -> GraphOutcome:
    """Which of `digests` the graph keeps.

    `variant(kept)` is one step of the graph compiled with only the kernels in `kept`;
    `measure(steps)` times named steps in interleaved rounds (per name, each round's ms). A
    variant beats Inductor alone (`variant(frozenset())`) when `decide` keeps it with the margin
    min(`margin`, 0): a gain within the noise is no gain, and a negative margin (pipeline tests)
    keeps slower kernels here as it does for partitions. With `alone` off, only all or none."""
    from kevin_backend.judge.decide import decide

    margin = min(margin, 0.0)
    every = frozenset(digests)
    none = variant(frozenset())
    rounds: dict[str, list[float]] = {}

    def versus(name: str, kept: frozenset[str]) -> Any:
        times = measure({name: variant(kept), "inductor": none})
        rounds[name] = list(times[name])
        rounds.setdefault("inductor", list(times["inductor"]))
        return decide(times[name], times["inductor"], margin=margin)

    whole = versus("all", every)
    if whole.keep:
        return GraphOutcome(sorted(every), {}, f"all {len(every)} kept: the graph with them, {_words(whole)}", rounds)
    if len(every) == 1 or len(every) > MAX_ALONE or not alone:
        why = f"the graph with {'it' if len(every) == 1 else 'them'}: {_words(whole)}"
        return GraphOutcome([], {d: why for d in every}, f"{len(every)} dropped: {why}", rounds)
    alone = {d: versus(f"only {d[:12]}", frozenset([d])) for d in sorted(every)}
    winners = frozenset(d for d, v in alone.items() if v.keep)
    dropped = {d: f"the graph with it alone: {_words(v)}" for d, v in alone.items() if not v.keep}
    if len(winners) > 1:
        together = versus("winners", winners)
        if not together.keep:  # each wins alone, not together: the best one stays
            best = max(winners, key=lambda d: alone[d].bound)
            dropped.update({d: f"wins alone, but the graph with the winners together: {_words(together)}"
                            for d in winners - {best}})
            winners = frozenset([best])
    summary = (f"{len(winners)} of {len(every)} kept (the graph with all: {_words(whole)})" if winners
               else f"all {len(every)} dropped (the graph with all: {_words(whole)})")
    return GraphOutcome(sorted(winners), dropped, summary, rounds)


def _words(decision: Any) -> str:
    return (f"Inductor/kevin {decision.ratio:.3f}x over {decision.rounds} interleaved rounds, "
            f"{decision.confidence:.0%} lower bound {decision.bound:.3f}x (needs > {decision.needed:.3f}x)")


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
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
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
        self.chosen: Compiled | None = compiled if outcome is not None else None
        self._all = compiled
        # (it holds the compile's example inputs: let go once the check no longer needs it)
        self._compile_variant: Callable[[dict[str, str] | None], Compiled] | None = compile_variant if outcome is None else None
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
        return sorted({r.key for r in self._report.records() if r.key and r.status in (Status.HIT, Status.GENERATED)})

    def _check(self, args: Sequence[Any]) -> Compiled:
        # the steps it times draw random numbers (dropout): the model's own stream of them must
        # not depend on whether a check ran
        with torch.random.fork_rng(devices=list(range(torch.cuda.device_count())) if torch.cuda.is_available() else []):
            return self._checked(args)

    def _checked(self, args: Sequence[Any]) -> Compiled:
        started = time.perf_counter()
        counters.add("graph_checks")
        compile_variant = self._compile_variant
        assert compile_variant is not None
        try:
            inputs = _copies(args)
            first = _step(self._all, inputs)
            first()  # compiles the backward (if no backward ran yet), whose kernels count too
            digests = self._kernels()
            compiled: dict[frozenset[str], Compiled] = {frozenset(digests): self._all}
            if self._other_sizes is not None:
                # symbolic sizes: variants compiled now, from real arguments, would lose them;
                # so all kernels or none (Inductor's code compiled with the graph)
                compiled[frozenset()] = self._other_sizes
            device = next((a.device for a in inputs if isinstance(a, torch.Tensor)), torch.device("cpu"))

            def variant(kept: frozenset[str]) -> Callable[[], Any]:
                if kept not in compiled:
                    compiled[kept] = compile_variant({d: "" for d in digests if d not in kept} if kept else None)
                step = _step(compiled[kept], inputs)
                step()  # its first call compiles (and its backward)
                return step

            lock = _gpu_lock(self._cache, device)
            outcome = choose(digests, variant, lambda steps: _measure(steps, device, lock), self._margin,
                             alone=self._other_sizes is None)
        except Exception as exc:  # noqa: BLE001 - the check's failure: the partitions' decisions stand
            text = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
            self._report.notes.append(f"graph check failed ({text}); the kernels stay as the partitions' decisions put them")
            log.warning("kevin: the graph check failed (%s); keeping the kernels", text)
            return self._all
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

    def _note(self, outcome: GraphOutcome, seconds: float) -> None:
        mark_dropped(self._report, outcome.dropped)
        self._report.notes.append(f"graph check ({seconds:.1f} s): {outcome.summary}")


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


def _measure(steps: dict[str, Callable[[], Any]], device: torch.device, lock: Path | None = None) -> dict[str, Sequence[float]]:
    from kevin_backend.measure.interleave import interleaved, timer
    from kevin_backend.locks import gpu_hold

    with gpu_hold(lock, shared=False):  # alone on the GPU while the variants are timed
        return interleaved(steps, device, ROUNDS, measure=timer(device, TRIALS, 2))
