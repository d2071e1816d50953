"""The judge, stage by stage: static rules, builds, the sandboxed run, and the verdict.

    judge = Judge(build_root)
    result = judge.judge(task_source, candidate_source)   # a JudgeResult
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import threading
import time
from pathlib import Path

import torch

from kevin_backend.judge.build import Builder, BuildResult, BuildSpec
from kevin_backend.judge.candidate import Candidate
from kevin_backend.judge.result import JudgeResult, JudgeTimings, Mismatch, Reason, Stage
from kevin_backend.judge.runner import RunConfig, run_in_sandbox
from kevin_backend.judge.static_judge import judge_static

__all__ = ["Judge", "SUSPICIOUS_SPEEDUP"]

log = logging.getLogger("kevin_backend.judge")

# A speedup above this over both baselines is re-checked before it counts (KernelBench flags 10x).
SUSPICIOUS_SPEEDUP = 10.0


class Judge:
    """`reuse_inductor`: Inductor's time for a task is measured with the first candidate that
    reaches timing and reused for the later candidates of the same task (same trials, same
    inputs, same GPU), which then skip compiling the reference; each worker process would
    otherwise spend seconds compiling the same baseline again."""

    def __init__(self, build_root: Path, config: RunConfig = RunConfig(), jobs: int | None = None,
                 reuse_inductor: bool = True) -> None:
        self.builder = Builder(Path(build_root), jobs=jobs)
        self.config = config
        self.reuse_inductor = reuse_inductor
        self._inductor_ms: dict[str, float] = {}
        self._lock = threading.Lock()

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
                                     gpu_lock=str(self.builder.root / f"gpu{device.index}.lock"))
        baseline = hashlib.sha256(f"{arch} {device} {config.trials} {config.warmup} {config.seeds[0]}\n{task_source}".encode()).hexdigest()
        with self._lock:
            known = self._inductor_ms.get(baseline) if self.reuse_inductor and config.inductor else None
        result = self._run(task_source, candidate_source, dataclasses.replace(config, inductor=known is None and config.inductor),
                           build_seconds)
        if known is not None and result.timings.kernel_ms is not None:
            result = dataclasses.replace(result, timings=dataclasses.replace(result.timings, inductor_ms=known))
        elif known is None and result.timings.inductor_ms is not None:
            with self._lock:
                self._inductor_ms.setdefault(baseline, result.timings.inductor_ms)

        # 4. an implausible speedup must hold up on fresh, larger input sets before it counts
        t = result.timings
        if result.correct and min(t.speedup_vs_eager or 0, t.speedup_vs_inductor or float("inf")) > SUSPICIOUS_SPEEDUP:
            recheck = dataclasses.replace(config, seeds=tuple(s + 7919 for s in config.seeds), grow=2)
            again = self._run(task_source, candidate_source, recheck, build_seconds)
            if again.judge_side:
                return again
            if not again.correct or (again.timings.speedup_vs_eager or 0) < (t.speedup_vs_eager or 0) / 2:
                return dataclasses.replace(again, reason=Reason.SUSPICIOUS_SPEEDUP if again.correct else again.reason,
                                           feedback=again.feedback or "the speedup did not hold on fresh inputs")
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
        outcome = run_in_sandbox(task, candidate, config)
        mismatch = None
        if outcome.mismatch:
            mismatch = Mismatch.from_dict(outcome.mismatch)
        feedback = outcome.feedback
        if mismatch is not None:
            feedback = f"wrong values: {mismatch}" + (f"\n{feedback}" if feedback else "")
        return JudgeResult(
            stage=Stage(outcome.stage),
            reason=Reason[outcome.reason],
            feedback=feedback,
            mismatch=mismatch,
            timings=JudgeTimings(outcome.kernel_ms, outcome.eager_ms, outcome.inductor_ms, config.trials),
            seeds=config.seeds,
            build_seconds=build_seconds,
            memory=outcome.memory,
            device=outcome.device or str(config.device or ""),
            exact=outcome.exact,
        )
