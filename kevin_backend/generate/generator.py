"""The search as the backend's `KernelGenerator`.

    generator = SearchGenerator(make_policy("openai", config), config=config)
    entry = generator.generate(task, key)      # a KERNEL or INDUCTOR CacheEntry

The decision (`decision.py`) re-times the search's winner against Inductor (`judge/decide.py`)
before it keeps a kernel; a re-timing the judge itself could not carry out ends the search
without one (SearchIncomplete), like any other failure of the judge. Policies are made from
their names by the writer registry (`writers.py`).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Sequence

from kevin_backend.cache.format import CacheEntry
from kevin_backend.cache.key import CacheKey
from kevin_backend.config import Config, build_root, env_is_set
from kevin_backend.generate.decision import decide_entry
from kevin_backend.generate.engine import Engine, Progress, SearchConfig, SearchIncomplete, SearchResult
from kevin_backend.generate.judging import ConfigurableJudging, Judging, NumericsRetimer, Retimer
from kevin_backend.generate.log import TrajectoryLog
from kevin_backend.generate.policy import Policy, PolicyError
from kevin_backend.generate.kernel_generator import KernelGenerator
from kevin_backend.generate.writers import make_policy
from kevin_backend.types import KernelTask

__all__ = ["SearchGenerator", "SearchIncomplete", "default_generator"]


class SearchGenerator:
    """A `KernelGenerator`: one search per task, its decision as the cache entry; every turn
    goes to the trajectory log under the cache directory.

    `retimer` re-times a winning kernel against Inductor before it is kept; by default the
    judge's own (`SandboxRetimer.for_judge`: its GPU, build cache and GPU lock), none for a
    scripted judge that builds nothing (its decisions rest on its timings, and say so)."""

    def __init__(self, policy: Policy, judge: Judging | None = None, search: SearchConfig | None = None,
                 config: Config | None = None, log: TrajectoryLog | None = None, progress: Progress | None = None,
                 retimer: Retimer | None = None) -> None:
        self.config = config or Config.from_env()
        self.policy = policy
        self.search = search or SearchConfig(trajectories=self.config.trajectories, turns=self.config.turns,
                                             beam=self.config.beam or None, margin=self.config.margin,
                                             roofline_stop=self.config.roofline_stop or None)
        self._judge = judge
        self.log = log or TrajectoryLog.default(self.config.cache_dir)
        self.progress = progress
        self.name = f"search:{getattr(policy, 'name', type(policy).__name__)}"
        self.results: list[SearchResult] = []
        self._retimer = retimer
        self._last: int | None = None  # the index in `results` of the last `generate` call's search

    @property
    def judge(self) -> Judging:
        if self._judge is None:
            from kevin_backend.judge.judge import Judge

            self._judge = Judge(build_root(self.config.cache_dir))
        return self._judge

    @property
    def retimer(self) -> Retimer | None:
        if self._retimer is None:
            from kevin_backend.judge.decide import SandboxRetimer

            self._retimer = SandboxRetimer.for_judge(self.judge)
        return self._retimer

    def run(self, task: KernelTask, gpu: str = "", capability: str = "",
            numerics: tuple[tuple[str, Any], ...] = ()) -> SearchResult:
        judge = self.judge
        if numerics and isinstance(judge, ConfigurableJudging):  # judged under the settings the key names
            judge = judge.configured(numerics=tuple(numerics))
        engine = Engine(self.policy, judge, self.search, on_record=self.log.write, gpu=gpu,
                        capability=capability, progress=self.progress, numerics=tuple(numerics))
        result = engine.search(task.source, task.name)
        self.results.append(result)
        return result

    def foresee(self, tasks: Sequence[KernelTask], keys: Sequence[CacheKey]) -> None:
        """`tasks` will be searched after the present one (`kernel_generator.ForeseeingGenerator`),
        each under its key in `keys`: the programs their first turns bring are built now, in the
        background, where the policy can say them (`Engine.build_first_turns`; one engine for the
        tasks of one device and numerics, as their messages state them)."""
        groups: dict[tuple[str, str, tuple[tuple[str, Any], ...]], list[str]] = {}
        for task, key in zip(tasks, keys, strict=True):
            groups.setdefault((key.gpu, key.capability, tuple(key.numerics)), []).append(task.source)
        for (gpu, capability, numerics), sources in groups.items():
            Engine(self.policy, self.judge, self.search, gpu=gpu, capability=capability, numerics=numerics).build_first_turns(sources)

    def generate(self, task: KernelTask, key: CacheKey) -> CacheEntry:
        """The search's decision; raises PolicyError when the policy never answered and
        SearchIncomplete when the search was cut short by the judge's or the model server's
        failure (or there is no GPU), so that no decision is cached for them."""
        self._last = len(self.results)
        result = self.run(task, key.gpu, key.capability, key.numerics)
        if not result.records and result.stopped.startswith("policy error"):
            raise PolicyError(result.stopped.removeprefix("policy error: "))
        if result.incomplete:
            raise SearchIncomplete(f"{task.name}: {result.incomplete}")
        return self.decide(result, task, key)

    def decide(self, result: SearchResult, task: KernelTask, key: CacheKey) -> CacheEntry:
        """`result`'s decision, its winner re-timed by `retimer`; the time that takes counts as the
        judge's. A re-timing that failed on the judge's side marks the search incomplete (in
        `results`) and raises SearchIncomplete: nothing is to be cached."""
        start = time.perf_counter()
        try:
            retime = self.retimer
            if key.numerics and isinstance(retime, NumericsRetimer):  # re-timed under the key's settings too
                retime = retime.for_numerics(key.numerics)
            return decide_entry(result, key, task, self.search.margin, retime=retime)
        except SearchIncomplete as exc:
            self._update(result, incomplete=str(exc), stopped=str(exc))
            raise SearchIncomplete(f"{task.name}: {exc}") from None
        finally:
            spent = time.perf_counter() - start
            self._update(result, judge_seconds=result.judge_seconds + spent, decision_seconds=result.decision_seconds + spent)

    def search_account(self) -> dict[str, Any] | None:
        """Where the last `generate` call's search spent its time (`kernel_generator.AccountedGenerator`):
        the writer's calls, the judge's verdicts, the re-timing of the winner; None before any."""
        if self._last is None or self._last >= len(self.results):
            return None
        result = self.results[self._last]
        return {"writer_seconds": result.model_seconds, "judge_seconds": result.judge_seconds - result.decision_seconds,
                "retime_seconds": result.decision_seconds, "turns": len({r.turn for r in result.records}),
                "candidates": sum(r.step.code is not None for r in result.records)}  # (a declined turn wrote none)

    def _update(self, result: SearchResult, **changes: Any) -> None:
        for i in range(len(self.results) - 1, -1, -1):
            if self.results[i] is result or self.results[i].records is result.records:
                self.results[i] = dataclasses.replace(self.results[i], **changes)
                return

    def __repr__(self) -> str:
        return f"SearchGenerator({self.name}, {self.search})"


def default_generator(config: Config) -> KernelGenerator:
    """The generator `generate` mode uses when none is given: a search with the configured policy
    (the built-in writer searches its few variants: 4 trajectories x 3 turns unless set)."""
    policy = make_policy(config.policy, config)
    search = None
    if getattr(policy, "name", "") == "builtin" and not (env_is_set("KEVIN_TRAJECTORIES") or env_is_set("KEVIN_TURNS")) \
            and (config.trajectories, config.turns) == (Config().trajectories, Config().turns):
        search = SearchConfig(trajectories=4, turns=3, beam=None, margin=config.margin,
                              roofline_stop=config.roofline_stop or None)
    return SearchGenerator(policy, search=search, config=config)
