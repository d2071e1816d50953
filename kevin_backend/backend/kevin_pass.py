"""The kevin pass: Inductor's post-grad custom pass that swaps cached kernels into aten graphs.

Inductor runs it on every forward, backward and inference graph it compiles (after AOTAutograd
and decompositions, before its own pattern passes), and includes `uuid()` in its cache key, so
the project's version, settings and cache state decide whether Inductor's cached code is reused.

For each graph:
  1. partition it into fusible subgraphs the writer supports (partition.py; the writer's op
     declaration comes from the writer registry, generate/writers.py)
  2. write each partition as a KernelBench task (task.py) and key it (cache/key.py)
  3. look the key up: a KERNEL entry is loaded (runtime/registry.py, with the builds under this
     compile's cache folder); a miss is recorded as pending (mode cache) or generated (mode
     generate, by the configured `KernelGenerator`, after the same task's kernel from another GPU,
     torch or CUDA in the cache, judged again here: generate/revalidation.py); an INDUCTOR entry
     leaves the partition alone. The partitions are searched one after another; a generator
     that foresees (`ForeseeingGenerator`) is told the later ones first, so their first turns'
     builds run meanwhile. Before the compile's first search this process gives back the
     GPU memory its allocator caches but does not use (cached_memory.py): the judge's workers are
     other processes. A search the judge could not finish (SearchIncomplete: no memory for it, its
     own error) stores no decision: the task is recorded as pending, with the reason
  4. replace each loaded partition by one `kevin::launch` call; Inductor compiles the rest

Every failure before step 4 leaves that partition to Inductor with a recorded reason.
"""

from __future__ import annotations

import functools
import hashlib
import heapq
import json
import logging
import operator
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import torch
import torch.fx as fx
from torch._guards import detect_fake_mode
from torch._inductor import custom_graph_pass

from kevin_backend.version import __version__
from kevin_backend.runtime import op as _launch_op  # noqa: F401  (defines kevin::launch, which the pass calls)
from kevin_backend.runtime import registry as runtime
from kevin_backend.backend.cached_memory import give_back_cached_memory
from kevin_backend.backend.partition import Partition, partition_graph
from kevin_backend.backend.report import (
    CompileReport,
    FallbackReason,
    GraphReport,
    PartitionRecord,
    SearchTime,
    Status,
    kernel_summary,
)
from kevin_backend.backend.task import extract_task
from kevin_backend.runtime.counters import counters
from kevin_backend.cache.format import CacheEntry, EntryKind
from kevin_backend.cache.key import SCHEMA_VERSION, CacheKey, make_key, tensors_device
from kevin_backend.cache.kernel_store import KernelStore
from kevin_backend.config import Config, Mode
from kevin_backend.generate.engine import SearchIncomplete
from kevin_backend.generate.op_support import OpSupport
from kevin_backend.generate.policy import PolicyError
from kevin_backend.generate.kernel_generator import AccountedGenerator, ForeseeingGenerator, KernelGenerator
from kevin_backend.generate.writers import op_support_for
from kevin_backend.measure.roofline import record_fraction
from kevin_backend.types import KernelTask

__all__ = ["KevinPass", "KevinRewriteError"]

log = logging.getLogger("kevin_backend")

# Inductor >= 2.10 tells inference-aware passes whether the graph is an inference graph.
INFERENCE_AWARE: type | None = getattr(custom_graph_pass, "CustomInferenceAwareGraphPass", None)
PassBase: type = INFERENCE_AWARE or custom_graph_pass.CustomGraphPass


class KevinRewriteError(RuntimeError):
    """The graph was being rewritten when something failed: the whole graph must fall back."""


@functools.lru_cache(maxsize=None)
def _code_hash() -> str:
    """A hash of the package's own source: a code change invalidates Inductor's cached graphs."""
    root = Path(__file__).resolve().parents[1]
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        digest.update(path.relative_to(root).as_posix().encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


@dataclass(frozen=True)
class _Swap:
    """A partition to replace by `kevin::launch(digest, ...)`, with the call's fake outputs."""

    partition: Partition
    digest: str
    out_vals: list[Any]


class KevinPass(PassBase):  # type: ignore[misc, valid-type]
    """`dropped` maps kernels' digests to why they stay out of this compile (the graph-level
    check found the graph slower with them): those partitions are Inductor's. A pass with
    `counting` off (the check's variants of a graph) leaves the process's counters alone."""

    def __init__(self, config: Config, cache: KernelStore, report: CompileReport, support: OpSupport | None = None,
                 dropped: dict[str, str] | None = None, counting: bool = True) -> None:
        self.config = config
        self.cache = cache
        self.report = report
        self.support: OpSupport = support or op_support_for(config)
        self.dropped = dict(dropped or {})
        self._count = counters.add if counting else (lambda name, n=1: None)
        self._default_generator: KernelGenerator | None = None
        self._policy_down: str | None = None
        self._gave_back = False  # the allocator's cache emptied before this compile's first search
        self._incomplete: dict[str, str] = {}  # keys whose search could not finish this compile: why

    def _generator(self) -> KernelGenerator:
        """The configured generator, else a search with the configured policy (made once)."""
        if self.config.generator is not None:
            # (`Config` checked that it has a generate method; the foundation cannot name the type)
            return cast(KernelGenerator, self.config.generator)
        if self._default_generator is None:
            from kevin_backend.generate.generator import default_generator

            self._default_generator = default_generator(self.config)
        return self._default_generator

    def uuid(self) -> str:
        state = {
            "kevin": __version__,
            "code": _code_hash(),
            "schema": SCHEMA_VERSION,
            "config": self.config.fingerprint(),
            "support": self.support.name,
            "cache": self.cache.fingerprint(),
            "dropped": sorted(self.dropped),
        }
        return hashlib.sha256(json.dumps(state, sort_keys=True).encode()).hexdigest()

    def __call__(self, graph: fx.Graph, is_inference: bool | None = None) -> None:
        kind = _graph_kind(graph, is_inference)
        graph_report = GraphReport(graph_id=len(self.report.graphs), kind=kind, nodes=len(graph.nodes))
        self.report.graphs.append(graph_report)
        self._count("graphs")
        start = time.perf_counter()
        try:
            swaps = self._decide_all(graph, graph_report)
        except Exception as exc:  # the pass never breaks a compile: this graph is Inductor's
            graph_report.error = f"{type(exc).__name__}: {exc}"
            log.warning("kevin pass failed on %s graph (%s); Inductor compiles all of it", kind, graph_report.error)
            self._count("fallbacks")
            swaps = []
        if swaps:
            try:
                replaced: dict[fx.Node, fx.Node] = {}
                for swap in swaps:
                    _rewrite(graph, swap, replaced)
                _stable_toposort(graph)
                graph.lint()
            except Exception as exc:
                raise KevinRewriteError(f"rewriting the {kind} graph failed: {exc}") from exc
        graph_report.seconds = time.perf_counter() - start

    # -- decisions ---------------------------------------------------------------------------

    def _decide_all(self, graph: fx.Graph, graph_report: GraphReport) -> list[_Swap]:
        plan = partition_graph(graph, self.support, self.config.min_partition, self.config.max_partition)
        graph_report.left_out = plan.left_out
        kind = graph_report.kind
        looked = [self._look_up(partition, kind) for partition in plan.partitions]
        # The kernels the cache holds are built all at once before they load one by one (a seed
        # cache on a fresh machine costs the slowest build, not the sum); a failure here is met
        # again, and reported, when its partition loads.
        kernels = [f.entry for f in looked if isinstance(f, _Found) and f.entry is not None and f.entry.kind is EntryKind.KERNEL]
        if len(kernels) > 1:
            try:
                runtime.prebuild(kernels, self.config)
            except Exception as exc:  # noqa: BLE001
                log.info("kevin: building the cached kernels at once failed: %s", exc)
        self._foresee([f for f in looked if isinstance(f, _Found) and f.entry is None])
        swaps: list[_Swap] = []
        for partition, found in zip(plan.partitions, looked):
            self._count("partitions")
            record, swap = (found, None) if isinstance(found, PartitionRecord) else self._decide(partition, kind, found)
            graph_report.partitions.append(record)
            self._count(_COUNTER_OF_STATUS[record.status])
            if swap is not None:
                swaps.append(swap)
        return swaps

    def _foresee(self, missing: list["_Found"]) -> None:
        """In generate mode, the tasks searched after the first of this graph told to a generator
        that foresees (`ForeseeingGenerator`): their first turns' builds start now, in the
        background, instead of each after the search before it."""
        if self.config.mode is not Mode.GENERATE or len(missing) < 2 or self._policy_down is not None:
            return
        try:
            generator = self._generator()
            if isinstance(generator, ForeseeingGenerator):
                generator.foresee([f.task for f in missing[1:]], [f.key for f in missing[1:]])
        except Exception as exc:  # noqa: BLE001 - each search builds its own programs anyway
            log.info("kevin: building the later partitions' first programs ahead failed: %s", exc)

    def _known_kernel(self, generator: KernelGenerator, task: KernelTask, key: CacheKey) -> CacheEntry | None:
        """The same task's kernel from another GPU, torch or CUDA in the cache, judged again here
        by the generator's judge and kept (`generate/revalidation.py`), or None: then it searches."""
        from kevin_backend.generate.revalidation import first_known

        known = first_known(generator, self.cache, task, key)
        return None if known is None else known.entry

    def _look_up(self, partition: Partition, kind: str) -> PartitionRecord | _Found:
        """The partition as a standalone task, its key and the cache's entry; or the record of
        why it stops here."""
        try:
            task = extract_task(partition, graph_kind=kind)
            key = make_key(task, tensors_device(n.meta.get("val") for n in partition.inputs + partition.outputs))
        except Exception as exc:
            return _record(partition, kind, Status.FALLBACK, FallbackReason.EXTRACTION_ERROR, _short(exc))
        ids = {"key": key.digest, "key_dict": key.as_dict(), "task": task.name}
        devices = {s.device for s in task.inputs + task.outputs}
        if devices != {"cuda"} and not self.config.cpu_kernels:
            return _record(partition, kind, Status.SKIPPED, FallbackReason.NEEDS_CUDA, "/".join(sorted(devices)), **ids)
        try:
            entry = self.cache.get(key)
        except Exception as exc:
            return _record(partition, kind, Status.FALLBACK, FallbackReason.LOOKUP_ERROR, _short(exc), **ids)
        return _Found(task, key, entry, ids)

    def _decide(self, partition: Partition, kind: str, found: _Found) -> tuple[PartitionRecord, _Swap | None]:
        task, key, entry, ids = found.task, found.key, found.entry, found.ids

        def record(status: Status, reason: FallbackReason | None = None, detail: str = "", **kw: Any) -> PartitionRecord:
            return _record(partition, kind, status, reason, detail, **kw)

        # the cache decides, or the generator does
        status = Status.HIT
        if entry is None:
            if self.config.mode is Mode.CACHE:
                if self.config.record_pending:
                    try:
                        if self.cache.record_pending(key, task):
                            self._count("pending_recorded")
                    except Exception as exc:
                        return record(Status.MISS, detail=f"pending not recorded: {_short(exc)}", **ids), None
                    return record(Status.PENDING, **ids), None
                return record(Status.MISS, **ids), None
            if self._policy_down is not None:  # asked once this compile; not again per partition
                return record(Status.FALLBACK, FallbackReason.POLICY_ERROR, self._policy_down, **ids), None
            try:  # an earlier partition of this compile with the same key may have generated it meanwhile
                entry = self.cache.get(key)
            except Exception as exc:
                return record(Status.FALLBACK, FallbackReason.LOOKUP_ERROR, _short(exc), **ids), None
        search: SearchTime | None = None
        if entry is None:
            generated = self._generate(partition, kind, task, key, ids)
            if isinstance(generated, PartitionRecord):
                return generated, None
            entry, search = generated
            status = Status.GENERATED
        speedup = entry.speedup_vs_inductor
        if entry.kind is EntryKind.INDUCTOR:
            return record(Status.INDUCTOR, detail=entry.reason, search=search, **ids), None
        if key.digest in self.dropped:
            return record(Status.DROPPED, detail=self.dropped[key.digest], speedup_vs_inductor=speedup, search=search,
                          **ids), None

        # load the kernel and check it against the partition on fake tensors
        try:
            kernel = runtime.load_entry(entry, self.config)
        except runtime.KernelMismatch as exc:
            return record(Status.FALLBACK, FallbackReason.KERNEL_MISMATCH, _short(exc), search=search, **ids), None
        except runtime.RejectedProgram as exc:
            return record(Status.FALLBACK, FallbackReason.REJECTED_PROGRAM, _short(exc), search=search, **ids), None
        except Exception as exc:
            return record(Status.FALLBACK, FallbackReason.LOAD_ERROR, _short(exc), search=search, **ids), None
        runtime.register(kernel)
        try:
            out_vals = _fake_outputs(partition, key.digest)
        except Exception as exc:
            return record(Status.FALLBACK, FallbackReason.KERNEL_MISMATCH, _short(exc), search=search, **ids), None
        return (record(status, detail=kernel_summary(entry.kernel_source), speedup_vs_inductor=speedup,
                       roofline_fraction=record_fraction(entry.judge_record), search=search, **ids),
                _Swap(partition, key.digest, out_vals))

    def _generate(self, partition: Partition, kind: str, task: KernelTask, key: CacheKey,
                  ids: dict[str, Any]) -> tuple[CacheEntry, SearchTime] | PartitionRecord:
        """The generator's decision for a miss, stored, and how long its search took; or the
        record of why there is none: the writer down (asked no more this compile), the search
        cut short (the task left pending, no decision stored), the generator's error."""
        if key.digest in self._incomplete:  # a partition like an earlier one: not searched again this compile
            return _record(partition, kind, Status.PENDING, FallbackReason.SEARCH_INCOMPLETE, self._incomplete[key.digest],
                           **ids)
        if not self._gave_back:  # once per compile, before the first search's judges run
            self._gave_back = True
            self._give_back_cached_memory()
        start = time.perf_counter()
        generator: KernelGenerator | None = None

        def took() -> SearchTime:
            account = generator.search_account() if isinstance(generator, AccountedGenerator) else None
            return SearchTime(time.perf_counter() - start, **(account or {}))

        try:
            generator = self._generator()
            entry = self._known_kernel(generator, task, key) or generator.generate(task, key)
            if not isinstance(entry, CacheEntry) or entry.key != key:
                raise TypeError("generate() must return a CacheEntry for the key it was given")
            self.cache.put(entry, replace=True)
        except PolicyError as exc:
            self._policy_down = _short(exc)
            log.warning("kevin: the kernel writer could not answer: %s; Inductor compiles the rest", exc)
            return _record(partition, kind, Status.FALLBACK, FallbackReason.POLICY_ERROR, self._policy_down,
                           search=took(), **ids)
        except SearchIncomplete as exc:
            return self._left_pending(partition, kind, task, key, exc, took(), ids)
        except Exception as exc:
            return _record(partition, kind, Status.FALLBACK, FallbackReason.GENERATOR_ERROR, _short(exc), search=took(), **ids)
        return entry, took()

    def _left_pending(self, partition: Partition, kind: str, task: KernelTask, key: CacheKey, exc: SearchIncomplete,
                      search: SearchTime, ids: dict[str, Any]) -> PartitionRecord:
        """A search that could not finish (the judge's own failure, RESOURCE among them, or the
        writer's server's part-way): no decision is stored; the task is recorded for `kevin
        prewarm` and Inductor runs the partition, the reason in the report."""
        detail = self._incomplete[key.digest] = _short(exc)
        log.warning("kevin: the search of partition %d (%s) could not finish: %s; Inductor runs it, and the task is "
                    "left for `kevin prewarm`", partition.index, kind, detail)
        if not self.config.record_pending:
            return _record(partition, kind, Status.MISS, FallbackReason.SEARCH_INCOMPLETE, detail, search=search, **ids)
        try:
            if self.cache.record_pending(key, task):
                self._count("pending_recorded")
        except Exception as pending_exc:
            return _record(partition, kind, Status.MISS, FallbackReason.SEARCH_INCOMPLETE,
                           f"{detail}; pending not recorded: {_short(pending_exc)}", search=search, **ids)
        return _record(partition, kind, Status.PENDING, FallbackReason.SEARCH_INCOMPLETE, detail, search=search, **ids)

    def _give_back_cached_memory(self) -> None:
        """Empty this process's CUDA allocator cache (the judge's workers are other processes and
        cannot use what it holds) and say so in the report."""
        try:
            released = give_back_cached_memory()
        except Exception as exc:  # the search goes on: the judge may still find the memory it needs
            self.report.notes.append(f"could not give back the GPU memory cached by this process: {_short(exc)}")
            return
        self.report.released = self.report.released + released
        for release in released:
            log.info("kevin: before the search, %s", release.describe())


@dataclass(frozen=True)
class _Found:
    task: KernelTask
    key: CacheKey
    entry: CacheEntry | None
    ids: dict[str, Any]  # the record's key, key_dict and task name


def _record(partition: Partition, kind: str, status: Status, reason: FallbackReason | None = None, detail: str = "",
            **kw: Any) -> PartitionRecord:
    if reason is not None:
        log.info("kevin: partition %d (%s) -> %s: %s %s", partition.index, kind, status.value, reason.value, detail)
    return PartitionRecord(partition.index, partition.ops, status, reason=reason, detail=detail, **kw)


_COUNTER_OF_STATUS = {
    Status.HIT: "hits",
    Status.GENERATED: "generated",
    Status.PENDING: "misses",
    Status.MISS: "misses",
    Status.INDUCTOR: "inductor_winners",
    Status.SKIPPED: "skipped",
    Status.FALLBACK: "fallbacks",
    Status.DROPPED: "dropped",
}


def _short(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}"
    return text if len(text) < 300 else text[:297] + "..."


def _graph_kind(graph: fx.Graph, is_inference: bool | None) -> str:
    if any(n.op == "placeholder" and n.name.startswith("tangents") for n in graph.nodes):
        return "backward"
    if is_inference is None:
        return "forward"
    return "inference" if is_inference else "forward"


def _fake_outputs(partition: Partition, digest: str) -> list[Any]:
    """Run `kevin::launch` on the partition's fake inputs; check it matches the partition's outputs."""
    vals = [n.meta["val"] for n in partition.inputs]
    fake_mode = detect_fake_mode(vals + [n.meta["val"] for n in partition.outputs])
    if fake_mode is None:
        raise RuntimeError("graph has no fake tensors")
    with fake_mode:
        outs = torch.ops.kevin.launch.default(digest, vals, True)
    expected = [n.meta["val"] for n in partition.outputs]
    if len(outs) != len(expected):
        raise RuntimeError(f"kernel returns {len(outs)} outputs, partition has {len(expected)}")
    for i, (got, want) in enumerate(zip(outs, expected)):
        if got.shape != want.shape or got.dtype != want.dtype:
            raise RuntimeError(f"output {i}: kernel gives {tuple(got.shape)} {got.dtype}, partition {tuple(want.shape)} {want.dtype}")
    return list(outs)


# -- the rewrite -----------------------------------------------------------------------------


def _rewrite(graph: fx.Graph, swap: _Swap, replaced: dict[fx.Node, fx.Node]) -> None:
    """Replace the partition's nodes by one `kevin::launch` call and a getitem per output.

    Before:  a = relu(x); b = mul(a, y); use(b)
    After:   k = kevin.launch("<digest>", [x, y]); b_new = k[0]; use(b_new)

    `replaced` maps outputs of partitions rewritten earlier to their getitems: a partition may
    read another's output.
    """
    part = swap.partition
    anchor = part.nodes[-1]
    inputs = [replaced.get(n, n) for n in part.inputs]
    with graph.inserting_after(anchor):
        call = graph.call_function(torch.ops.kevin.launch.default, (swap.digest, inputs, _has_symbols(inputs)))
    call.meta["val"] = swap.out_vals
    # With the op's needs_exact_strides tag, Inductor hands the kernel inputs with exactly these
    # strides (the ones in the cache key) only when the node records them here.
    call.meta["eager_input_vals"] = ((swap.digest, [n.meta["val"] for n in inputs], call.args[2]), {})
    results = []
    cursor = call
    for i, (old, val) in enumerate(zip(part.outputs, swap.out_vals)):
        with graph.inserting_after(cursor):
            item = graph.call_function(operator.getitem, (call, i))
        item.meta["val"] = val
        for key in ("stack_trace", "nn_module_stack", "source_fn_stack"):
            if key in old.meta:
                item.meta[key] = old.meta[key]
        results.append(item)
        cursor = item
    for old, new in zip(part.outputs, results):
        old.replace_all_uses_with(new)
        replaced[old] = new
    for node in reversed(part.nodes):
        if node.users:
            raise KevinRewriteError(f"{node.name} still has users outside its partition")
        graph.erase_node(node)


def _has_symbols(nodes: list[fx.Node]) -> bool:
    """True when some input's sizes or strides are symbolic (dynamic shapes): the launch must
    then check at run time that the sizes are the ones the kernel was verified on."""
    for n in nodes:
        val = n.meta["val"]
        if any(isinstance(s, torch.SymInt) for s in (*val.shape, *val.stride())):
            return True
    return False


def _stable_toposort(graph: fx.Graph) -> None:
    """Reorder nodes so every node follows its inputs, moving as few nodes as possible.

    Needed when a value read outside a partition is used before the partition's last node: the
    launch call sits after the last node, so such users must move below it.
    """
    nodes = list(graph.nodes)
    position = {n: i for i, n in enumerate(nodes)}
    pending = {n: len(n.all_input_nodes) for n in nodes}
    last = len(nodes)
    ready = [(position[n] if n.op != "output" else last, position[n]) for n in nodes if pending[n] == 0]
    heapq.heapify(ready)
    order: list[fx.Node] = []
    while ready:
        _, i = heapq.heappop(ready)
        node = nodes[i]
        order.append(node)
        for user in node.users:
            pending[user] -= 1
            if pending[user] == 0:
                heapq.heappush(ready, (position[user] if user.op != "output" else last, position[user]))
    if len(order) != len(nodes):
        raise KevinRewriteError("the rewritten graph has a cycle")
    if order == nodes:
        return
    for before, after in zip(order, order[1:]):
        before.append(after)
