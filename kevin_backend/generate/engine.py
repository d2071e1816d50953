"""The generator's loop: a kernel-writing policy proposes, the judge answers, the policy refines.

    engine = Engine(policy, judge, SearchConfig(trajectories=16, turns=8, beam=4))
    result = engine.search(task_source, name="task")     # a SearchResult
    entry = decide_entry(result, key, task, margin=0.03, retime=SandboxRetimer(judge))
    # (decision.py) KERNEL if the best (lowest kernel time) beat Inductor by the margin beyond
    # the noise when re-timed against it, else INDUCTOR; SearchIncomplete if the re-timing failed

One search runs N trajectories for up to T turns. A judge that can (`PreparingJudging`) starts its
workers as the search begins, while the first replies are written and built. Each turn:

  1. the conversation of every live trajectory is built (`prompts.build_messages`: earlier chain
     of thought dropped, summaries kept, oldest turns cut at the token budget)
  2. one batched policy call answers all of them
  3. the judge checks every reply's program, several at once (builds run in parallel; the judge
     times one candidate at a time on the GPU); meanwhile a `Foreseeing` policy's next programs
     are built in the background, for the turns to come
  4. each trajectory's best score is updated; one that has not improved for `patience` turns
     stops, and so does one whose best correct kernel reached `roofline_stop` of the GPU's copy
     bandwidth (the judge's roofline: little is left to gain); with `beam=k`, the k best
     trajectories are kept and copied back up to N

Every turn becomes a `TurnRecord` (the messages sent, the reply, the verdict, the cost), written
to the trajectory log (`log.py`) as it happens: the RL trainer's input.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from kevin_backend.generate.judging import BatchJudging, BuildingAhead, Judging, PreparingJudging
from kevin_backend.generate.policy import (EarlierTurn, Foreseeing, Message, Policy, PolicyError, Reply, Sampling, TokenCounter,
                                           TurnReader)
from kevin_backend.generate.prompts import Turn, build_messages, extract_code, prompt_version
from kevin_backend.judge.result import JudgeResult, Reason, Stage

__all__ = ["SearchConfig", "SearchIncomplete", "TurnRecord", "SearchResult", "Engine", "select_beam", "Progress"]

log = logging.getLogger("kevin_backend.generate")


class SearchIncomplete(RuntimeError):
    """The search could not reach a decision worth caching: no GPU to judge on, the judge's own
    failure (memory, an error of its own, a failed re-timing of the winner), or the model server's
    failure part-way. The task stays pending and a later prewarm tries it again."""


@dataclass(frozen=True)
class SearchConfig:
    trajectories: int = 16
    turns: int = 8
    beam: int | None = None  # keep the best k trajectories after each turn, copied back up to `trajectories`
    patience: int | None = None  # a trajectory stops after this many turns without a better score
    margin: float = 0.03  # a kernel must beat Inductor's time by this fraction to win the cache
    max_prompt_tokens: int = 16384
    sampling: Sampling = field(default_factory=Sampling)
    judge_workers: int = 8  # candidates judged at once (builds in parallel)
    # A trajectory stops once its best correct kernel moves the task's bytes at this fraction of
    # the GPU's measured copy bandwidth (`measure/roofline.py`): a memory-bound kernel there has at
    # most 1/fraction left to gain, not worth more turns. None: never (every turn runs); verdicts
    # without a roofline (a CPU judge, no bandwidth measured) never stop a trajectory.
    roofline_stop: float | None = 0.9

    def __post_init__(self) -> None:
        if self.trajectories < 1 or self.turns < 1:
            raise ValueError("trajectories and turns must be at least 1")
        if self.beam is not None and not 1 <= self.beam <= self.trajectories:
            raise ValueError(f"beam must be between 1 and trajectories ({self.trajectories}), got {self.beam}")
        if self.patience is not None and self.patience < 1:
            raise ValueError("patience must be at least 1")
        if self.roofline_stop is not None and not self.roofline_stop > 0:
            raise ValueError(f"roofline_stop must be a positive fraction of the copy bandwidth, got {self.roofline_stop}")


@dataclass(frozen=True)
class TurnRecord:
    """One turn of one trajectory."""

    trajectory: int
    turn: int  # 0-based
    parent: int | None  # the trajectory this one was copied from by the beam; None if none
    messages: tuple[Message, ...]  # what the policy was sent
    step: Turn  # the reply, its code and summary, the verdict, the feedback that follows
    score: float  # the judge's score (0 when there was no code or a rule was broken)
    model_seconds: float  # the batched policy call this reply came from
    judge_seconds: float

    @property
    def result(self) -> JudgeResult | None:
        return self.step.result

    @property
    def correct(self) -> bool:
        return self.step.result is not None and self.step.result.correct

    @property
    def speedup(self) -> float | None:
        return self.step.result.timings.speedup_vs_eager if self.correct and self.step.result else None


@dataclass(frozen=True)
class SearchResult:
    name: str
    records: tuple[TurnRecord, ...]
    stopped: str  # why the search ended
    model_seconds: float
    judge_seconds: float
    wall_seconds: float
    policy: str
    # Why the search was cut short by the judge's or the model server's failure ("" when it was
    # not): its records are not a fair search, so no decision is made from them.
    incomplete: str = ""
    # The share of `judge_seconds` its decision took (the winner re-timed against Inductor:
    # `generator.SearchGenerator.decide`); 0 before the decision.
    decision_seconds: float = 0.0

    @property
    def best(self) -> TurnRecord | None:
        """The correct turn with the lowest kernel time (None if none was correct); the earlier
        turn on a tie. Not the highest speedup over eager: a speedup divides by an eager time
        that need not come from the same measurement, so a fast eager sample would let a slower
        kernel look better."""
        correct = [r for r in self.records if r.correct and r.result is not None and r.result.timings.kernel_ms]
        return min(correct, key=lambda r: (r.result.timings.kernel_ms, r.turn, r.trajectory)) if correct else None  # type: ignore[union-attr]

    @property
    def prompt_tokens(self) -> int:
        return sum(r.step.reply.prompt_tokens for r in self.records)

    @property
    def completion_tokens(self) -> int:
        return sum(r.step.reply.completion_tokens for r in self.records)


@dataclass
class _Trajectory:
    id: int
    parent: int | None
    turns: list[Turn]
    best: float = -math.inf
    stale: int = 0
    done: bool = False
    roofline: float = 0.0  # the highest fraction of the copy bandwidth a correct kernel reached
    why: str = ""  # why it stopped before the last turn: "declined", "patience" or "roofline"


def select_beam(best_scores: Sequence[float], keep: int, total: int) -> list[int]:
    """Beam bookkeeping: the indices of the trajectories to continue, `total` of them, made of
    the `keep` best (by best score so far; earlier index on ties), each repeated as evenly as
    possible, best first."""
    order = sorted(range(len(best_scores)), key=lambda i: (-best_scores[i], i))[:keep]
    if not order:
        return []
    return [order[i % len(order)] for i in range(total)]


Progress = Callable[[str, dict[str, Any]], None]  # (event, details): "turn", "done"


class Engine:
    def __init__(self, policy: Policy, judge: Judging, config: SearchConfig = SearchConfig(),
                 on_record: Callable[[TurnRecord, "SearchContext"], None] | None = None,
                 gpu: str = "", capability: str = "", progress: Progress | None = None,
                 numerics: tuple[tuple[str, Any], ...] = ()) -> None:
        self.policy = policy
        self.numerics = numerics  # the task's cache key's settings, which its message states (`prompts.task_message`)
        self.judge = judge
        self.config = config
        self.on_record = on_record
        self.gpu = gpu
        self.capability = capability
        self.progress = progress
        self._count = policy.count_tokens if isinstance(policy, TokenCounter) else None

    def search(self, task_source: str, name: str = "task") -> SearchResult:
        cfg = self.config
        start = time.perf_counter()
        trajectories = [_Trajectory(i, None, []) for i in range(cfg.trajectories)]
        records: list[TurnRecord] = []
        model_seconds = judge_seconds = 0.0
        stopped = f"all {cfg.turns} turns"
        incomplete = ""
        context = SearchContext(name, task_source, self.policy_name, cfg.sampling, prompt_version(), self.gpu)
        self._prepare_judge()
        for turn in range(cfg.turns):
            live = [t for t in trajectories if not t.done]
            # 1. the conversations, earlier reasoning dropped, cut at the token budget
            conversations = [
                build_messages(task_source, self.gpu, t.turns, cfg.max_prompt_tokens, self._count, capability=self.capability,
                               numerics=self.numerics)
                for t in live
            ]
            # 2. one batched policy call
            sampling = cfg.sampling if cfg.sampling.seed is None else dataclasses.replace(
                cfg.sampling, seed=cfg.sampling.seed + 1000 * turn)
            t0 = time.perf_counter()
            try:
                if isinstance(self.policy, TurnReader):  # the earlier turns as data too
                    earlier = [[EarlierTurn(s.reply, s.result) for s in t.turns] for t in live]
                    replies = self.policy.generate_after(conversations, earlier, sampling)
                else:
                    replies = self.policy.generate(conversations, sampling)
            except PolicyError as exc:
                stopped = f"policy error: {exc}"
                incomplete = stopped
                log.warning("search %s stopped at turn %d: %s", name, turn, exc)
                break
            spent = time.perf_counter() - t0
            model_seconds += spent
            if len(replies) != len(live):
                raise PolicyError(f"policy {self.policy_name} returned {len(replies)} replies for {len(live)} conversations")
            # 3. the judge on every reply, several at once (the next turns' foreseen programs built meanwhile)
            if turn + 1 < cfg.turns:
                self._build_ahead(conversations, live, replies, cfg.turns - turn - 1)
            t0 = time.perf_counter()
            verdicts = self._judge_all(task_source, replies)
            lost = [i for i, v in enumerate(verdicts) if v[1] is not None and v[1].judge_side and v[1].reason is not Reason.NO_GPU]
            if lost:  # the judge's own failure (memory, an error of its own): once more, one at a time
                again = self._judge_all(task_source, [replies[i] for i in lost], workers=1)
                for i, v in zip(lost, again):
                    verdicts[i] = v
            judged = time.perf_counter() - t0
            judge_seconds += judged
            # 4. bookkeeping: records, best scores, patience
            for traj, messages, reply, (code, result, seconds) in zip(live, conversations, replies, verdicts):
                step = Turn.of(reply, result, code)
                score = result.score if result is not None else 0.0
                record = TurnRecord(traj.id, turn, traj.parent, tuple(messages), step, score, spent, seconds)
                records.append(record)
                if self.on_record is not None:
                    self.on_record(record, context)
                traj.turns.append(step)
                if reply.finish_reason == "declined":  # the writer does not take this task
                    traj.done, traj.why = True, "declined"
                    continue
                if result is not None and result.correct and result.roofline is not None:
                    traj.roofline = max(traj.roofline, result.roofline.kernel_fraction or 0.0)
                if score > traj.best:
                    traj.best, traj.stale = score, 0
                else:
                    traj.stale += 1
                    if cfg.patience is not None and traj.stale >= cfg.patience:
                        traj.done, traj.why = True, "patience"
                if cfg.roofline_stop is not None and traj.roofline >= cfg.roofline_stop:
                    traj.done, traj.why = True, "roofline"
            if self.progress is not None:
                self.progress("turn", {"turn": turn, "records": records[-len(live):], "model_seconds": spent,
                                       "judge_seconds": judged})
            if any(v[1] is not None and v[1].reason is Reason.NO_GPU for v in verdicts):
                stopped = incomplete = "no GPU to judge on"
                break
            failed = next((v[1] for v in verdicts if v[1] is not None and v[1].judge_side), None)
            if failed is not None:
                stopped = incomplete = f"the judge could not judge a kernel ({failed.reason.name}: {failed.feedback[:300]})"
                log.warning("search %s stopped at turn %d: %s", name, turn, stopped)
                break
            if cfg.beam is not None and turn + 1 < cfg.turns:
                trajectories = self._beam(trajectories)
            if all(t.done for t in trajectories):  # (the beam's too; in the last turn too: the reason, not "all N turns")
                stopped = self._stopped(trajectories, records)
                break
        result = SearchResult(name, tuple(records), stopped, model_seconds, judge_seconds,
                              time.perf_counter() - start, self.policy_name, incomplete)
        if self.progress is not None:
            self.progress("done", {"result": result})
        return result

    def _prepare_judge(self) -> None:
        """The judge's workers start now, beside the first turn's writing and building (a judge's
        failure to prepare is no failure of the search: its first verdicts will say what is wrong)."""
        if not isinstance(self.judge, PreparingJudging):
            return
        try:
            self.judge.prepare(min(self.config.trajectories, self.config.judge_workers))
        except Exception:  # noqa: BLE001
            log.exception("the judge could not prepare its workers")

    def _build_ahead(self, conversations: Sequence[Sequence[Message]], live: Sequence[_Trajectory],
                     replies: Sequence[Reply], turns_left: int) -> None:
        """The programs a `Foreseeing` policy says the `turns_left` next turns may bring, handed to
        a judge that builds ahead (`BuildingAhead`), in the background; the search never waits for them."""
        if not isinstance(self.policy, Foreseeing) or not isinstance(self.judge, BuildingAhead):
            return
        try:
            earlier = [[*(EarlierTurn(s.reply, s.result) for s in t.turns), EarlierTurn(reply, None)]
                       for t, reply in zip(live, replies)]
            programs = [p for p in self.policy.foresee(conversations, earlier, turns_left) if p]
            if programs:
                self.judge.build_ahead(programs)
        except Exception:  # noqa: BLE001 - a guess that failed: the builds happen in their turn
            log.exception("building the foreseen programs ahead failed")

    def build_first_turns(self, task_sources: Sequence[str]) -> None:
        """Hand a judge that builds ahead the programs the first turns of searches of
        `task_sources` will bring, where a `Foreseeing` policy can say them before it is asked (a
        compile's later partitions, built in the background while its first is searched)."""
        if not isinstance(self.policy, Foreseeing) or not isinstance(self.judge, BuildingAhead):
            return
        programs: list[str] = []
        try:
            for source in task_sources:
                first = build_messages(source, self.gpu, [], self.config.max_prompt_tokens, self._count, capability=self.capability,
                                       numerics=self.numerics)
                conversations = [first] * self.config.trajectories
                programs += [p for p in self.policy.foresee(conversations, [[] for _ in conversations], self.config.turns)
                             if p and p not in programs]
            if programs:
                self.judge.build_ahead(programs)
        except Exception:  # noqa: BLE001 - a guess that failed: the builds happen in their turn
            log.exception("building the first turns' programs ahead failed")

    def _stopped(self, trajectories: Sequence[_Trajectory], records: Sequence[TurnRecord]) -> str:
        """Why a search ended with every trajectory stopped (declined, patience, or at the roofline),
        whether before its last turn or in it; the most telling reason first."""
        cfg = self.config
        declined = [r for r in records if r.step.reply.finish_reason == "declined"]
        if declined:
            return f"the policy declined the task: {declined[-1].step.reply.text}"
        reached = [t for t in trajectories if t.why == "roofline"]
        if not reached:
            return f"no trajectory improved for {cfg.patience} turns"
        best = max(t.roofline for t in reached)
        text = (f"roofline: {len(reached)} of {len(trajectories)} trajectories reached {cfg.roofline_stop:.0%} of the "
                f"GPU's copy bandwidth (best kernel at {best:.0%})")
        if len(reached) < len(trajectories):
            text += f"; the others did not improve for {cfg.patience} turns"
        return text

    @property
    def policy_name(self) -> str:
        return str(getattr(self.policy, "name", type(self.policy).__name__))

    def _judge_all(self, task_source: str, replies: Sequence[Reply],
                   workers: int | None = None) -> list[tuple[str | None, JudgeResult | None, float]]:
        def one(reply: Reply) -> tuple[str | None, JudgeResult | None, float]:
            t0 = time.perf_counter()
            code = extract_code(reply.text) if reply.ok else None
            if code is None:
                return None, None, 0.0
            try:
                result = self.judge.judge(task_source, code)
            except Exception as exc:  # the judge's own failure: no verdict on the candidate
                log.exception("the judge failed on a candidate")
                result = JudgeResult(Stage.RUN, Reason.INFRA, feedback=f"the judge failed: {type(exc).__name__}: {exc}")
            return code, result, time.perf_counter() - t0

        if isinstance(self.judge, BatchJudging):  # the judge's own batch: every build at once, then its worker pool
            codes = [extract_code(r.text) if r.ok else None for r in replies]
            todo = [c for c in codes if c is not None]
            t0 = time.perf_counter()
            try:
                results = iter(self.judge.evaluate_many(task_source, todo, workers or self.config.judge_workers))
            except Exception as exc:  # the judge's own failure: no verdict on any candidate
                log.exception("the judge failed on a batch of candidates")
                failed = JudgeResult(Stage.RUN, Reason.INFRA, feedback=f"the judge failed: {type(exc).__name__}: {exc}")
                results = iter([failed] * len(todo))
            each = (time.perf_counter() - t0) / max(1, len(todo))
            return [(c, next(results), each) if c is not None else (None, None, 0.0) for c in codes]
        workers = max(1, min(workers or self.config.judge_workers, len(replies)))
        with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool:
            return list(pool.map(one, replies))

    def _beam(self, trajectories: list[_Trajectory]) -> list[_Trajectory]:
        cfg = self.config
        assert cfg.beam is not None
        chosen = select_beam([t.best for t in trajectories], cfg.beam, cfg.trajectories)
        next_id = max(t.id for t in trajectories) + 1
        out: list[_Trajectory] = []
        used: set[int] = set()
        for index in chosen:
            source = trajectories[index]
            if index not in used:  # the kept trajectory continues under its own id
                used.add(index)
                out.append(source)
            else:
                out.append(_Trajectory(next_id, source.id, list(source.turns), source.best, source.stale, source.done,
                                       source.roofline, source.why))
                next_id += 1
        return out


@dataclass(frozen=True)
class SearchContext:
    """What every record of one search shares (for the trajectory log)."""

    task: str
    task_source: str
    policy: str
    sampling: Sampling
    prompt_version: str
    gpu: str
    started: float = field(default_factory=time.time)
