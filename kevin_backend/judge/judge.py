"""The judge, stage by stage: static rules, builds, the sandboxed run, and the verdict.

    judge = Judge(build_root)
    result = judge.judge(task_source, candidate_source)            # a JudgeResult
    results = judge.evaluate_many(task_source, [c1, c2, ...])       # several, through the pool
    judge.prepare(4)          # optional, ahead of candidates: the pool's workers start meanwhile
    judge.build_ahead([c3, c4])                                     # builds in the background
    judge.close()                                                   # the pool's workers end

Runs go to a pool of long-lived sandboxed workers (`pool.py`; `workers=0` starts a fresh process
per run instead). The eager and Inductor references are timed once per task, GPU and software
versions (`ReferenceTimes`, kept on disk beside the builds), not again for every candidate. An
accepted candidate's verdict carries its roofline (`measure/roofline.py`): the bytes the task moves, each
side's achieved bandwidth and its fraction of the GPU's copy bandwidth (measured once per GPU and
software, kept beside the builds too).
"""

from __future__ import annotations

import concurrent.futures
import copy
import dataclasses
import hashlib
import json
import logging
import os
import secrets
import threading
import time
import weakref
from pathlib import Path
from typing import Callable, Sequence

import torch

from kevin_backend.toolchain.build import Builder, BuildResult, BuildSpec
from kevin_backend.toolchain.candidate import Candidate
from kevin_backend.toolchain.cpp_preprocess import header_macros
from kevin_backend.judge.result import JudgeResult, JudgeTimings, Mismatch, Reason, Stage
from kevin_backend.measure.roofline import Roofline
from kevin_backend.judge.pool import WorkerPool
from kevin_backend.judge.sandbox import RunConfig, RunOutcome, run_in_sandbox
from kevin_backend.judge.static_judge import judge_static
from kevin_backend.locks import gpu_lock_path

__all__ = ["Judge", "ReferenceTimes", "SUSPICIOUS_SPEEDUP", "roofline_of"]

log = logging.getLogger("kevin_backend.judge")

# A speedup above this over both baselines is re-checked before it counts (KernelBench flags 10x).
SUSPICIOUS_SPEEDUP = 10.0


class ReferenceTimes:
    """The eager and Inductor times of a task's references, measured once per (task, GPU,
    software versions, timing protocol) and kept as small JSON files under `root`."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self._lock = threading.Lock()
        self._known: dict[str, tuple[float, float | None]] = {}

    @staticmethod
    def key(task_source: str, config: RunConfig, arch: str) -> str:
        import torch

        gpu = torch.cuda.get_device_name(torch.device(config.device or "cuda")) if torch.cuda.is_available() else "cpu"
        versions = f"{torch.__version__} {torch.version.cuda} {gpu} {arch}"
        protocol = f"{config.trials} {config.warmup} {config.seeds[0]} {config.inductor} {sorted(config.numerics)}"
        return hashlib.sha256(f"{versions}\n{protocol}\n{task_source}".encode()).hexdigest()[:32]

    def get(self, key: str) -> tuple[float, float | None] | None:
        with self._lock:
            if key in self._known:
                return self._known[key]
        try:
            data = json.loads((self.root / f"{key}.json").read_text())
            value = (float(data["eager_ms"]), None if data.get("inductor_ms") is None else float(data["inductor_ms"]))
        except (OSError, ValueError, KeyError, TypeError):
            return None  # not measured yet, or a damaged file: measured again
        with self._lock:
            self._known[key] = value
        return value

    def put(self, key: str, eager_ms: float, inductor_ms: float | None) -> None:
        with self._lock:
            self._known.setdefault(key, (eager_ms, inductor_ms))
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            tmp = self.root / f"{key}.{os.getpid()}.{threading.get_ident()}.tmp"
            tmp.write_text(json.dumps({"eager_ms": eager_ms, "inductor_ms": inductor_ms, "measured": time.time()}))
            os.replace(tmp, self.root / f"{key}.json")
        except OSError as exc:
            log.warning("could not keep the reference times: %s", exc)


class Judge:
    """`workers`: the size of the pool of sandboxed workers runs go to (0: a fresh process per
    run). `reuse_references`: the references' times are measured with the first candidate of a
    task that reaches timing and reused for the later ones (same protocol, same GPU, same
    software), which then skip timing and compiling them."""

    def __init__(self, build_root: Path, config: RunConfig = RunConfig(), jobs: int | None = None,
                 reuse_references: bool = True, workers: int = 4, max_jobs_per_worker: int = 64) -> None:
        self.builder = Builder(Path(build_root), jobs=jobs)
        self.config = config
        self.reuse_references = reuse_references
        self.references = ReferenceTimes(self.builder.root / "reference_times")
        self.workers = workers
        self.max_jobs_per_worker = max_jobs_per_worker
        self._pool: WorkerPool | None = None
        self._lock = threading.Lock()

    @property
    def pool(self) -> WorkerPool | None:
        if self.workers <= 0:
            return None
        with self._lock:
            if self._pool is None:
                self._pool = WorkerPool(self.workers, self.max_jobs_per_worker)
                weakref.finalize(self, self._pool.close)  # a judge dropped unclosed ends its workers
            return self._pool

    def configured(self, **changes: object) -> "Judge":
        """A judge with `changes` to its RunConfig (e.g. a task's `numerics`) that shares this
        one's builds, worker pool and reference times."""
        self.pool  # made now, so that both share it
        view = copy.copy(self)
        view.config = dataclasses.replace(self.config, **changes)  # type: ignore[arg-type]
        return view

    def prepare(self, candidates: int = 1) -> None:
        """Get ready for `candidates` candidates coming (a search's first turn): the pool's workers
        start now, in the background, on this judge's device, and so does the static rules'
        reading of the headers' macros (once a process), so that both overlap the writer's reply
        and the builds instead of following them. Judges nothing; returns at once."""
        _warm_static_rules()
        pool = self.pool
        if pool is None:
            return
        device = str(self.device) if torch.cuda.is_available() else self.config.device
        pool.prestart(min(max(1, candidates), pool.size), device)

    def build_ahead(self, candidates: Sequence[str]) -> None:
        """Build `candidates` in the background, all at once (programs a later turn may bring: a
        later `judge` finds them built); returns at once. A failure is found again, and said, when
        such a candidate is judged."""
        if candidates:
            threading.Thread(target=self._prebuild, args=(list(candidates), True), name="kevin-build-ahead", daemon=True).start()

    def close(self) -> None:
        """End the pool's workers (a later call starts new ones)."""
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.close()

    def __enter__(self) -> "Judge":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def evaluate_many(self, task_source: str, candidates: Sequence[str], at_once: int | None = None,
                      done: Callable[[int, JudgeResult], None] | None = None) -> list[JudgeResult]:
        """Verdicts on several candidates for one task, in order: their builds first, all at once,
        then the runs, as many at once as the pool has workers. `done(index, result)` is called
        as each verdict arrives (a progress display)."""
        if not candidates:
            return []
        built = self._prebuild(candidates)
        at_once = at_once or max(1, self.workers)

        def one(index: int) -> JudgeResult:
            result = self.judge(task_source, candidates[index])
            if index in built and result.build_seconds is not None and built[index] > result.build_seconds:
                # (its builds ran in the batch: the verdict's build time is theirs, not the cache's lookup)
                result = dataclasses.replace(result, build_seconds=built[index])
            if done is not None:
                done(index, result)
            return result

        with concurrent.futures.ThreadPoolExecutor(min(at_once, len(candidates))) as threads:
            return list(threads.map(one, range(len(candidates))))

    def _prebuild(self, candidates: Sequence[str], background: bool = False) -> dict[int, float]:
        """Build every extension of `candidates` at once (failures are reported by `judge`; in the
        `background`: at a lower priority than the turn's own builds); per candidate (its index),
        the seconds its slowest extension's build took in the batch (a cache hit's: its lookup)."""
        import torch

        if not torch.cuda.is_available():
            return {}
        _static_rules_warmed()
        major, minor = torch.cuda.get_device_capability(self.device)
        specs, owners = [], []
        for index, source in enumerate(candidates):
            if judge_static(source).reason is not Reason.STATIC_OK:
                continue
            try:
                mine = [BuildSpec.of(ext, f"{major}.{minor}") for ext in Candidate.parse(source).extensions]
            except Exception:  # noqa: BLE001 - a candidate the parser refuses is judged (and refused) later
                continue
            specs += mine
            owners += [index] * len(mine)
        seconds: dict[int, float] = {}
        if specs:
            try:
                for index, result in zip(owners, self.builder.build_many(specs, background)):
                    seconds[index] = max(seconds.get(index, 0.0), result.seconds)
            except Exception:  # noqa: BLE001 - each candidate's own build is tried again in `judge`
                log.exception("building a batch of candidates failed")
        return seconds

    def judge(self, task_source: str, candidate_source: str) -> JudgeResult:
        """The verdict on one candidate. A failure of the judge's own machinery (memory, a build
        that timed out while the machine was loaded, an exception here) is a judge-side result
        (RESOURCE or INFRA), never a verdict on the candidate."""
        try:
            return self._judge(task_source, candidate_source)
        except Exception as exc:  # noqa: BLE001 - the judge's own failure, never the candidate's
            log.exception("the judge failed on a candidate")
            return JudgeResult(Stage.RUN, Reason.INFRA, feedback=f"the judge failed: {type(exc).__name__}: {exc}")

    def _judge(self, task_source: str, candidate_source: str) -> JudgeResult:
        # 1. static rules: nothing is built or run for a candidate that breaks one
        _static_rules_warmed()
        static = judge_static(candidate_source)
        if static.reason is not Reason.STATIC_OK:
            return static
        if not torch.cuda.is_available():
            return JudgeResult(Stage.BUILD, Reason.NO_GPU, feedback="building and running kernels needs a CUDA GPU")
        device = self.device
        major, minor = torch.cuda.get_device_capability(device)
        arch = f"{major}.{minor}"

        # 2. builds, for this GPU's architecture only, in worker processes
        start = time.perf_counter()
        specs = [BuildSpec.of(ext, arch) for ext in Candidate.parse(candidate_source).extensions]
        for result in self.builder.build_many(specs):
            if not result.ok:
                return self._build_failure(result, time.perf_counter() - start)
        build_seconds = time.perf_counter() - start

        # 3. correctness, timing and the replay check, in the sandbox
        # Several judges and threads may run at once (the generator does): builds, loading and
        # correctness overlap, but the timing of one candidate holds the GPU alone (a file lock
        # shared by every judge using this build root).
        config = dataclasses.replace(self.config, build_root=str(self.builder.root), arch=arch, device=str(device),
                                     gpu_lock=str(gpu_lock_path(self.builder.root, device.index)),
                                     # fresh inputs every evaluation (recorded in the verdict): none known ahead
                                     salt=self.config.salt or secrets.randbelow((1 << 31) - 1) + 1)
        key = ReferenceTimes.key(task_source, config, arch)
        known = self.references.get(key) if self.reuse_references else None
        run_config = config if known is None else dataclasses.replace(config, eager=False, inductor=False)
        result = self._run(task_source, candidate_source, run_config, build_seconds)
        if known is not None and result.timings.kernel_ms is not None:
            result = _with_timings(result, dataclasses.replace(result.timings, eager_ms=known[0], inductor_ms=known[1]))
        elif known is None and result.timings.eager_ms is not None and (result.timings.inductor_ms is not None
                                                                      or not config.inductor):
            self.references.put(key, result.timings.eager_ms, result.timings.inductor_ms)

        # 4. an implausible speedup must hold up on fresh, larger input sets before it counts
        t = result.timings
        if result.correct and min(t.speedup_vs_eager or 0, t.speedup_vs_inductor or float("inf")) > SUSPICIOUS_SPEEDUP:
            recheck = dataclasses.replace(config, seeds=tuple(s + 7919 for s in config.seeds), grow=2)
            again = self._run(task_source, candidate_source, recheck, build_seconds)
            if again.judge_side:
                return again
            if not again.correct or (again.timings.speedup_vs_eager or 0) < (t.speedup_vs_eager or 0) / 2:
                return dataclasses.replace(again, reason=Reason.SUSPICIOUS_SPEEDUP if again.correct else again.reason,
                                           feedback=again.feedback or "the speedup did not hold on fresh inputs",
                                           roofline=None)
        if result.correct and result.roofline is not None and not result.feedback:
            result = dataclasses.replace(result, feedback=f"roofline: {result.roofline.describe()}")
        return result

    @property
    def device(self) -> torch.device:
        """The GPU under test: the configured one, else the current device."""
        device = torch.device(self.config.device or "cuda")
        return torch.device("cuda", torch.cuda.current_device() if device.index is None else device.index)

    def _build_failure(self, result: BuildResult, seconds: float) -> JudgeResult:
        """A build that failed: the candidate's compile error, or the judge's (a timeout while the
        machine was loaded, a full disk, a compiler killed for memory)."""
        if result.infra:
            return JudgeResult(Stage.BUILD, Reason.INFRA, feedback=result.error, build_seconds=seconds)
        reason = Reason.BUILD_TIMEOUT if result.timed_out else Reason.BUILD_ERROR
        return JudgeResult(Stage.BUILD, reason, feedback=result.error, build_seconds=seconds)

    def _run(self, task: str, candidate: str, config: RunConfig, build_seconds: float) -> JudgeResult:
        pool = self.pool
        outcome: RunOutcome = pool.run(task, candidate, config) if pool is not None else run_in_sandbox(task, candidate, config)
        mismatch = None
        if outcome.mismatch:
            mismatch = Mismatch.from_dict(outcome.mismatch)
        feedback = outcome.feedback
        if mismatch is not None:
            feedback = f"wrong values: {mismatch}" + (f"\n{feedback}" if feedback else "")
        timings = JudgeTimings(outcome.kernel_ms, outcome.eager_ms, outcome.inductor_ms, config.trials)
        return JudgeResult(
            stage=Stage(outcome.stage),
            reason=Reason[outcome.reason],
            feedback=feedback,
            mismatch=mismatch,
            timings=timings,
            seeds=config.seeds,
            salt=config.salt,
            build_seconds=build_seconds,
            memory=outcome.memory,
            device=outcome.device or str(config.device or ""),
            exact=outcome.exact,
            roofline=roofline_of(outcome, timings),
            phase_seconds=outcome.phase_seconds,
        )


_warming: list[threading.Thread] = []  # the static rules' warm-up, started at most once a process


def _warm_static_rules() -> None:
    """The static rules read the allowed headers' macros once a process (`header_macros`: a
    preprocessor run over torch's headers, seconds) when a program's conditions need them: read
    now in the background, the first candidate's check finds them known."""
    if _warming:
        return

    def warm() -> None:
        try:
            header_macros()
        except Exception:  # noqa: BLE001 - the check reads them itself, and says what went wrong
            log.debug("reading the headers' macros ahead failed", exc_info=True)

    thread = threading.Thread(target=warm, name="kevin-static-rules-warm", daemon=True)
    _warming.append(thread)
    thread.start()


def _static_rules_warmed() -> None:
    """Wait for a warm-up still reading the headers' macros: a check that needed them would read
    them a second time beside it."""
    for thread in _warming:
        thread.join()


def roofline_of(outcome: RunOutcome, timings: JudgeTimings) -> Roofline | None:
    """An accepted run's roofline from the worker's facts (bytes, FLOPs, copy bandwidth) and the
    run's times; None without a copy bandwidth, or facts the judge cannot read (the verdict
    stands without it)."""
    facts = outcome.roofline
    if outcome.reason != "ACCEPTED" or not facts or not timings.kernel_ms:
        return None
    try:
        copy_gbps = float(facts["copy_gbps"])
        nbytes, flops = int(facts["bytes"]), int(facts.get("flops") or 0)
    except (KeyError, TypeError, ValueError):
        return None
    if not copy_gbps > 0 or nbytes <= 0:
        return None
    return Roofline.of(nbytes, flops, copy_gbps, timings.kernel_ms, timings.eager_ms, timings.inductor_ms)


def _with_timings(result: JudgeResult, timings: JudgeTimings) -> JudgeResult:
    """`result` with other times (the kept reference times), its roofline following them."""
    roofline = result.roofline
    if roofline is not None:
        roofline = roofline.retimed(timings.kernel_ms, timings.eager_ms, timings.inductor_ms)
    return dataclasses.replace(result, timings=timings, roofline=roofline)
