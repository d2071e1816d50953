"""`kevin generate TASK.py`: search for a fast kernel for one KernelBench-format task.

Runs the generator's loop (`generate/engine.py`) with the chosen policy and the judge, shows each
turn as it finishes, ends with a table per turn and the winner, stores the decision in the
kernel cache (a kernel that beat Inductor, else Inductor) and logs every turn under
`<cache>/trajectories/`.

The task's inputs are placed on the GPU under test (`--device cuda:N`, default the current device)
whatever device the program makes them on, and the cache key names that GPU.

The arguments (the policy's name, the counts, the task file) are checked before a GPU is looked
for or a policy made. Exit codes: 0 a kernel beat Inductor, 1 none did (Inductor stays), 2 usage error, 3 no decision:
the search was cut short by the judge's or the model server's failure (nothing is stored; the
task can be generated again).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from kevin_backend.cli.main import EXIT_FAILED, EXIT_NO_VERDICT, EXIT_OK, EXIT_USAGE, CommandError, require_cuda
from kevin_backend.config import POLICY_NAMES, Config, ConfigError, build_root, check_policy_name
from kevin_backend.generate.writers import argument_problem, policy_help

__all__ = ["register"]

_DESCRIPTION = """\
Search for a kernel for one KernelBench-format task with a kernel-writing policy: N trajectories
x T turns, each reply judged (static rules, build, sandboxed correctness and timing) and the
verdict fed back; the best correct kernel is re-timed against Inductor and cached only if it
beats it by the margin, else the "Inductor wins" decision is cached. Every turn is logged under
<cache>/trajectories/. Needs a CUDA GPU to judge on."""


def register(subparsers: argparse._SubParsersAction, parents: list[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser("generate", parents=parents, help="search for a fast kernel for one KernelBench task",
                              description=_DESCRIPTION, epilog=policy_help(),
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("task", type=Path, help="KernelBench-format task: Model, get_inputs, get_init_inputs")
    p.add_argument("--policy", help=f"{POLICY_NAMES} (default: KEVIN_POLICY, auto)")
    p.add_argument("--trajectories", type=int, help="parallel trajectories (default: KEVIN_TRAJECTORIES, 16)")
    p.add_argument("--turns", type=int, help="refinement turns (default: KEVIN_TURNS, 8)")
    p.add_argument("--beam", type=int, help="keep the best K trajectories after each turn (default: KEVIN_BEAM; 0: none)")
    p.add_argument("--patience", type=int, help="stop a trajectory after this many turns without improving")
    p.add_argument("--roofline-stop", type=float, metavar="FRACTION",
                   help="stop a trajectory once its best kernel reaches this fraction of the GPU's copy bandwidth "
                   "(default: KEVIN_ROOFLINE_STOP, 0.9; 0: never)")
    p.add_argument("--temperature", type=float, default=0.9)
    p.add_argument("--max-tokens", type=int, default=16384, help="longest reply, in tokens")
    p.add_argument("--seed", type=int, help="sampling seed")
    p.add_argument("--trials", type=int, default=100, help="the judge's timing trials")
    p.add_argument("--margin", type=float, default=0.03, help="how much faster than Inductor a kernel must be to win")
    p.add_argument("--no-store", action="store_true", help="do not write the decision to the kernel cache")
    p.add_argument("--device", default=None, help="the GPU under test, e.g. cuda:1 (default: the current device)")
    p.add_argument("--json", type=Path, help="also write the search's summary here")
    p.set_defaults(handler=_generate)


def _generate(args: argparse.Namespace, config: Config) -> int:
    import torch

    from kevin_backend.cache.key import DeviceInfo, make_key
    from kevin_backend.cli.eval_cmd import _device
    from kevin_backend.cache.store import KernelCache
    from kevin_backend.generate.engine import SearchConfig
    from kevin_backend.generate.generator import SearchGenerator, SearchIncomplete
    from kevin_backend.generate.writers import make_policy
    from kevin_backend.generate.policy import PolicyError, Sampling
    from kevin_backend.judge.judge import Judge
    from kevin_backend.judge.sandbox import RunConfig
    from kevin_backend.judge.static_judge import ProblemError, check_problem
    from kevin_backend.types import KernelTask

    _check_numbers(args)
    policy_name = args.policy or config.policy
    if isinstance(policy_name, str):
        try:
            check_policy_name(policy_name)
        except ConfigError as exc:
            raise CommandError(f"--policy: {exc}" if args.policy else str(exc), EXIT_USAGE) from None
        problem = argument_problem(policy_name)
        if problem:
            raise CommandError(f"policy {policy_name}: {problem}", EXIT_USAGE)
    try:
        source = args.task.read_text()
    except OSError as exc:
        raise CommandError(f"cannot read task {args.task}: {exc.strerror or exc}", EXIT_USAGE) from exc
    try:
        check_problem(source)
    except ProblemError as exc:
        raise CommandError(f"{args.task}: {exc}", EXIT_USAGE) from exc
    trajectories = args.trajectories if args.trajectories is not None else config.trajectories
    try:
        search = SearchConfig(
            trajectories=trajectories,
            turns=args.turns if args.turns is not None else config.turns,
            beam=(args.beam if args.beam is not None else config.beam) or None,
            patience=args.patience,
            margin=args.margin,
            roofline_stop=(args.roofline_stop if args.roofline_stop is not None else config.roofline_stop) or None,
            sampling=Sampling(temperature=args.temperature, max_tokens=args.max_tokens, seed=args.seed),
        )
    except ValueError as exc:
        raise CommandError(str(exc), EXIT_USAGE) from exc
    require_cuda("generating kernels needs a CUDA GPU to judge them on")
    try:
        policy = make_policy(policy_name, config)
    except (ValueError, ConfigError, PolicyError) as exc:
        raise CommandError(str(exc), EXIT_USAGE) from exc
    device = _device(args.device)
    try:
        task = KernelTask.from_program(args.task.stem, source, device)
    except Exception as exc:
        raise CommandError(f"{args.task}: running the task failed: {type(exc).__name__}: {exc}", EXIT_USAGE) from exc

    judge = Judge(build_root(config.cache_dir), RunConfig(trials=args.trials, device=device))
    generator = SearchGenerator(policy, judge, search, config, progress=_Display(search).event)
    key = make_key(task, DeviceInfo.detect("cuda", torch.device(device).index))
    print(f"kevin generate {task.name}: policy {generator.name}, {search.trajectories} trajectories x "
          f"{search.turns} turns{f', beam {search.beam}' if search.beam else ''}; log {generator.log.path}", file=sys.stderr)
    result = generator.run(task, key.gpu, key.capability)
    if result.incomplete:
        print(_table(result))
        print(f"stopped: {result.stopped}")
        print(f"no decision: {result.incomplete}; nothing stored (run it again)")
        return EXIT_NO_VERDICT
    try:
        entry = generator.decide(result, task, key)  # the winner re-timed against Inductor first
    except SearchIncomplete as exc:
        print(_table(result))
        print(f"no decision: {exc}; nothing stored (run it again)")
        return EXIT_NO_VERDICT
    print(_table(result))
    best = result.best
    print(f"stopped: {result.stopped}")
    print(f"cost: {result.prompt_tokens} prompt + {result.completion_tokens} completion tokens, "
          f"{result.model_seconds:.1f} s in the model, {result.judge_seconds:.1f} s in the judge, {result.wall_seconds:.1f} s wall")
    if best is not None and best.result is not None:
        t = best.result.timings
        print(f"best: trajectory {best.trajectory} turn {best.turn + 1}: {t.kernel_ms:.4f} ms, "
              f"{_x(t.speedup_vs_eager)} eager, {_x(t.speedup_vs_inductor)} Inductor")
    if entry.retiming is not None:
        r = entry.retiming
        print(f"re-timed: {r.rounds} interleaved rounds of {r.trials} trials: kernel "
              f"{sorted(r.kernel_ms)[len(r.kernel_ms) // 2]:.4f} ms, Inductor {sorted(r.inductor_ms)[len(r.inductor_ms) // 2]:.4f} ms "
              f"(median rounds, GPU time)")
    print(f"decision: {entry.kind.value}" + (f" ({entry.reason})" if entry.reason else ""))
    if not args.no_store:
        if result.records:
            with KernelCache.from_config(config) as cache:
                cache.put(entry, replace=True)
            print(f"stored in {config.cache_dir} as {key.digest[:12]}")
    if args.json:
        args.json.write_text(json.dumps(_summary(result, entry), indent=1))
    return EXIT_OK if entry.kind.value == "kernel" else EXIT_FAILED


def _check_numbers(args: argparse.Namespace) -> None:
    """The counts and settings, before the task runs or a GPU is looked for (a 0 is refused, not
    taken for the default)."""
    for flag, value, least in (("--trajectories", args.trajectories, 1), ("--turns", args.turns, 1),
                               ("--beam", args.beam, 0), ("--patience", args.patience, 1),
                               ("--max-tokens", args.max_tokens, 1), ("--trials", args.trials, 1)):
        if value is not None and value < least:
            raise CommandError(f"{flag} must be at least {least}, got {value}", EXIT_USAGE)
    for flag, number in (("--temperature", args.temperature), ("--margin", args.margin),
                         ("--roofline-stop", 0.0 if args.roofline_stop is None else args.roofline_stop)):
        if not number >= 0:  # also refuses nan
            raise CommandError(f"{flag} must be >= 0, got {number}", EXIT_USAGE)
    if args.beam and args.trajectories is not None and args.beam > args.trajectories:
        raise CommandError(f"--beam ({args.beam}) must not exceed --trajectories ({args.trajectories})", EXIT_USAGE)


def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


class _Display:
    """One line per finished turn on stderr: what the replies earned, the best so far."""

    def __init__(self, search: Any) -> None:
        self.search = search
        self.best: float | None = None

    def event(self, kind: str, data: dict[str, Any]) -> None:
        if kind != "turn":
            return
        records = data["records"]
        outcomes = Counter(r.step.result.reason.name if r.step.result else "NO_CODE" for r in records)
        for r in records:
            if r.speedup is not None and (self.best is None or r.speedup > self.best):
                self.best = r.speedup
        shown = ", ".join(f"{k.lower()} {v}" for k, v in outcomes.most_common())
        print(f"  turn {data['turn'] + 1}/{self.search.turns}: {len(records)} replies [{shown}]; best so far "
              f"{_x(self.best)} eager; model {data['model_seconds']:.1f} s, judge {data['judge_seconds']:.1f} s",
              file=sys.stderr, flush=True)


def _table(result: Any) -> str:
    turns = sorted({r.turn for r in result.records})
    lines = ["| turn | replies | no code | rules | build | run | wrong | correct | best x eager | best x Inductor |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for turn in turns:
        rows = [r for r in result.records if r.turn == turn]
        kinds = Counter(_kind(r) for r in rows)
        correct = [r for r in rows if r.correct and r.result is not None]
        best = max(correct, key=lambda r: r.speedup or 0.0) if correct else None
        lines.append(f"| {turn + 1} | {len(rows)} | {kinds['no code']} | {kinds['rules']} | {kinds['build']} | "
                     f"{kinds['run']} | {kinds['wrong']} | {len(correct)} | "
                     f"{_x(best.speedup) if best else '-'} | {_x(best.result.timings.speedup_vs_inductor) if best else '-'} |")
    return "\n".join(lines)


def _kind(record: Any) -> str:
    result = record.step.result
    if result is None:
        return "no code"
    stage = result.stage.value
    if result.correct:
        return "correct"
    return {"static": "rules", "build": "build", "run": "run"}.get(stage, "wrong")


def _summary(result: Any, entry: Any) -> dict[str, Any]:
    best = result.best
    return {
        "task": result.name, "policy": result.policy, "stopped": result.stopped, "decision": entry.kind.value,
        "reason": entry.reason, "turns": len({r.turn for r in result.records}), "records": len(result.records),
        "best": None if best is None or best.result is None else {
            "trajectory": best.trajectory, "turn": best.turn, **best.result.as_dict()["timings"]},
        "retiming": None if entry.retiming is None else entry.retiming.as_dict(),
        "reasons": dict(Counter(r.step.result.reason.name if r.step.result else "NO_CODE" for r in result.records)),
        "prompt_tokens": result.prompt_tokens, "completion_tokens": result.completion_tokens,
        "model_seconds": result.model_seconds, "judge_seconds": result.judge_seconds, "wall_seconds": result.wall_seconds,
    }
