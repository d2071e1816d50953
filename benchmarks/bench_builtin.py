"""The built-in writer on its suite: every task through the search and the real judge.

For each task of `kevin_backend/generate/builtin/suite.py`: a search with the built-in policy
(`--trajectories` x `--turns`, default 1 x 3: the plain kernel, then two refinements guided by
the timings), the best correct kernel's speedup over eager and over Inductor. Ends with the
geometric means the goals are stated in: over eager on chains of three or more ops, over
Inductor on reductions and norms.

`--suite gemm` runs the GEMM-epilogue suite (`gemm_suite.py`) through the same search: the
CUTLASS GEMM writer's turns, each a tiling, the ones not yet tried built ahead while the first is
judged (`BuiltinPolicy.foresee`); each turn's build and judge seconds are kept, so the JSON says how
long a new variant took cold (the first turn) and when only its tiling changed (the later ones).
`--no-build-ahead` measures the same without building ahead.

`--suite roofline` runs `kevin_backend/generate/builtin/roofline_suite.py`'s tasks instead. Every
row carries the judge's roofline of the best kernel (`measure/roofline.py`): the bytes the task
moves, and the kernel's and Inductor's fractions of the GPU's copy bandwidth, measured once
before the searches and kept in the JSON's `meta`.

On the roofline suite, QuACK (`quack-kernels`, `pip install -e ".[peers]"`) is timed beside them
when it is installed (`--peers auto`, the default; `--peers quack` asks for it, `--peers none`
leaves it out): before the searches, with the GPU otherwise idle, `benchmarks/quack_peer.py` runs
in a process of its own on the tasks QuACK takes, checks QuACK's outputs against the task's
reference and times it with the judge's timer; its fraction of the copy bandwidth has the same
denominator (the task's bytes over the copy bandwidth measured here). Each row then says
`quack` ("ran", "not taken", "failed", "wrong", "not measured"), `quack_ms`, `quack_fraction`,
`vs_quack` (the kernel's speed over QuACK's: QuACK's time over the kernel's) and `quack_note`
(why not, or what QuACK runs). Without QuACK installed the bench says so once and has no such
columns.

Usage: python benchmarks/bench_builtin.py [--suite default|roofline|gemm] [--tasks a,b] [--no-build-ahead]
       [--categories norm,reduction] [--turns 3] [--trajectories 1] [--at-once 16] [--json FILE]
       [--peers auto|quack|none] [--peer-limit 300]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import importlib.util
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from kevin_backend.generate.builtin.builtin_policy import BuiltinPolicy
from kevin_backend.generate.builtin.suite import SUITE
from kevin_backend.generate.engine import Engine, SearchConfig
from kevin_backend.judge.judge import Judge
from kevin_backend.measure.roofline import copy_bandwidth
from kevin_backend.judge.sandbox import RunConfig


def suite_tasks(name: str) -> tuple:  # type: ignore[type-arg]
    """The tasks of suite `name`: "default" (the built-in writer's suite) or "roofline"."""
    if name == "roofline":
        from kevin_backend.generate.builtin.roofline_suite import ROOFLINE_SUITE

        return tuple(ROOFLINE_SUITE)
    if name == "gemm":
        from kevin_backend.generate.builtin.gemm_suite import GEMM_SUITE

        return tuple(GEMM_SUITE)
    return tuple(SUITE)


class _NotForeseeing:
    """The built-in policy without `foresee` (`--no-build-ahead`): each turn builds its own program."""

    name = "builtin"

    def __init__(self) -> None:
        self._policy = BuiltinPolicy()

    def generate(self, conversations, sampling):  # type: ignore[no-untyped-def]
        return self._policy.generate(conversations, sampling)

    def generate_after(self, conversations, earlier, sampling):  # type: ignore[no-untyped-def]
        return self._policy.generate_after(conversations, earlier, sampling)

    def count_tokens(self, text: str) -> int:
        return self._policy.count_tokens(text)


def roofline_columns(best_result: object) -> dict[str, object]:
    """A row's roofline columns from the best turn's verdict (None where it has none)."""
    roofline = getattr(best_result, "roofline", None)
    return {"bytes": roofline.bytes if roofline else None, "flops": roofline.flops if roofline else None,
            "kernel_gbps": roofline.kernel_gbps if roofline else None,
            "inductor_gbps": roofline.inductor_gbps if roofline else None,
            "kernel_fraction": roofline.kernel_fraction if roofline else None,
            "inductor_fraction": roofline.inductor_fraction if roofline else None}


KEEP_MARGIN = 1.03  # the backend keeps a kernel only this much faster than Inductor (decision.decide_entry's margin)


IMPLAUSIBLE = 20.0


def roofline_summary(rows: list[dict[str, object]]) -> dict[str, object]:
    """The roofline suite's goals from its rows: the median fraction of the copy bandwidth of the
    writer's kernels, their geometric mean over Inductor on the tasks where Inductor moves under
    half the copy bandwidth, and how many kernels the backend would keep (>= KEEP_MARGIN x Inductor;
    below it, Inductor's code runs, so no kept kernel is slower than Inductor)."""
    fractions = sorted(float(r["kernel_fraction"]) for r in rows if r.get("kernel_fraction"))  # type: ignore[arg-type]
    median = None
    if fractions:
        mid = len(fractions) // 2
        median = fractions[mid] if len(fractions) % 2 else (fractions[mid - 1] + fractions[mid]) / 2
    # An Inductor time over IMPLAUSIBLE x eager's is a measurement artifact, not Inductor's code
    # (softmax-last-f32-1Mx64: 248-495 ms in the judge's workers, 0.13 ms alone on the same GPU,
    # `benchmarks/probe_inductor.py`): such tasks are left out of the comparison and named.
    implausible = [str(r["task"]) for r in rows if r.get("inductor_ms") and r.get("eager_ms")
                   and float(r["inductor_ms"]) > IMPLAUSIBLE * float(r["eager_ms"])]  # type: ignore[arg-type]
    low = [r for r in rows if r.get("inductor_fraction") is not None and float(r["inductor_fraction"]) < 0.5  # type: ignore[arg-type]
           and r["task"] not in implausible]
    speedups = [float(r["vs_inductor"]) for r in rows if r.get("vs_inductor")]  # type: ignore[arg-type]
    return {"median_kernel_fraction": median, "tasks_inductor_below_half": len(low),
            "vs_inductor_where_inductor_below_half": geomean([r["vs_inductor"] for r in low]),  # type: ignore[misc]
            "implausible_inductor": implausible,
            "kept": sum(s >= KEEP_MARGIN for s in speedups), "not_kept": sum(s < KEEP_MARGIN for s in speedups),
            "slowest_kept": min((s for s in speedups if s >= KEEP_MARGIN), default=None)}


PEERS = ("auto", "quack", "none")
QUACK_GOAL = 1.05  # issue 35: the writer's kernels at least as fast as QuACK on every task it runs, 1.05x in geomean


def quack_wanted(choice: str, suite: str) -> bool:
    """Whether to time QuACK: on the roofline suite, unless `--peers none`, when it is installed
    (said once when it is not)."""
    if suite != "roofline" or choice == "none":
        return False
    if importlib.util.find_spec("quack") is None:
        print("QuACK (quack-kernels) is not installed: the table has no QuACK column "
              "(pip install -e \".[peers]\" adds it)", file=sys.stderr, flush=True)
        return False
    return True


def quack_times(tasks: list, copy_gbps: float | None, trials: int, limit: float) -> dict[str, dict[str, object]] | None:  # type: ignore[type-arg]
    """QuACK on `tasks` (benchmarks/quack_peer.py, in a process of its own: a crash or a compile
    failure of QuACK's stays there), by task name; what it measured before `limit` seconds, or
    None (said once) when it measured nothing at all: then the table has no QuACK column."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "quack.json"
        command = [sys.executable, str(Path(__file__).with_name("quack_peer.py")), "--tasks", ",".join(t.name for t in tasks),
                   "--trials", str(trials), "--json", str(out)] + (["--copy-gbps", repr(copy_gbps)] if copy_gbps else [])
        try:
            done = subprocess.run(command, timeout=limit)
            if done.returncode != 0:
                print(f"QuACK's run ended with exit code {done.returncode}", file=sys.stderr, flush=True)
        except subprocess.TimeoutExpired:
            print(f"QuACK's run stopped at its limit ({limit:.0f} s): the tasks it had not reached say 'not measured'",
                  file=sys.stderr, flush=True)
        try:
            rows = json.loads(out.read_text())["rows"]
        except (OSError, ValueError, KeyError):
            rows = []
    if not rows:
        print("QuACK measured nothing (its output is above): the table has no QuACK column", file=sys.stderr, flush=True)
        return None
    return {str(r["task"]): r for r in rows}


def quack_columns(measured: dict[str, object] | None, kernel_ms: float | None) -> dict[str, object]:
    """A row's QuACK columns from quack_peer's row for the task (None: not reached)."""
    if measured is None:
        return {"quack": "not measured", "quack_ms": None, "quack_fraction": None, "vs_quack": None, "quack_note": None}
    ms = measured.get("quack_ms")
    return {"quack": measured["quack"], "quack_ms": ms, "quack_fraction": measured.get("quack_fraction"),
            "vs_quack": float(ms) / kernel_ms if ms and kernel_ms else None,  # type: ignore[arg-type]
            "quack_note": measured.get("quack_note")}


def quack_summary(rows: list[dict[str, object]]) -> dict[str, object]:
    """The goals against QuACK over the tasks it ran: how many the writer's kernel is at least as
    fast on (a task without a correct kernel counts as slower), which are slower, and the
    geometric mean of the kernel's speed over QuACK's."""
    ran = [r for r in rows if r.get("quack") == "ran" and r.get("quack_ms")]
    slower = [str(r["task"]) for r in ran if not r.get("vs_quack") or float(r["vs_quack"]) < 1.0]  # type: ignore[arg-type]
    return {"quack_ran": len(ran), "as_fast_as_quack": len(ran) - len(slower), "slower_than_quack": slower,
            "vs_quack_geomean": geomean([r["vs_quack"] for r in ran if r.get("vs_quack")]),  # type: ignore[misc]
            "quack_not_taken": sum(r.get("quack") == "not taken" for r in rows),
            "quack_failed": [str(r["task"]) for r in rows if r.get("quack") in ("failed", "wrong")]}


def geomean(values: list[float]) -> float | None:
    values = [v for v in values if v and v > 0]
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--no-build-ahead", action="store_true", help="no program built before its turn")
    parser.add_argument("--suite", choices=("default", "roofline", "gemm"), default="default",
                        help="the built-in writer's suite, or the memory-bound roofline suite")
    parser.add_argument("--tasks", help="comma-separated task names (default: all)")
    parser.add_argument("--categories", help="comma-separated categories: chain1, chain2, chain3+, reduction, norm")
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--trajectories", type=int, default=1)
    parser.add_argument("--trials", type=int, default=50)
    parser.add_argument("--at-once", type=int, default=16, help="tasks searched at once (timing is still one at a time)")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--peers", choices=PEERS, default="auto",
                        help="roofline suite: time QuACK beside the kernels (auto: when it is installed)")
    parser.add_argument("--peer-limit", type=float, default=300.0, help="seconds for QuACK's run at most")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("bench_builtin needs a CUDA GPU", file=sys.stderr)
        return 2
    tasks = [t for t in suite_tasks(args.suite) if (not args.tasks or t.name in args.tasks.split(","))
             and (not args.categories or getattr(t, "category", "") in args.categories.split(","))]
    rows: list[dict[str, object]] = []
    start = time.perf_counter()
    meta: dict[str, object] = {"suite": args.suite, "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                               "cuda": torch.version.cuda, "date": time.strftime("%Y-%m-%d"),
                               "trajectories": args.trajectories, "turns": args.turns, "trials": args.trials,
                               "build_ahead": not args.no_build_ahead}
    with tempfile.TemporaryDirectory() as tmp:
        judge = Judge(Path(tmp) / "builds", RunConfig(trials=args.trials, warmup=5))
        # measured here, before any search, with the GPU idle; the judge's workers read it back
        meta["copy_gbps"] = copy_bandwidth(torch.device("cuda"), judge.builder.root / "copy_bandwidth")
        peer = quack_times(tasks, meta["copy_gbps"], args.trials, args.peer_limit) if quack_wanted(args.peers, args.suite) else None  # type: ignore[arg-type]
        if peer is not None:
            meta["peers"] = ["quack"]
        engine = Engine(_NotForeseeing() if args.no_build_ahead else BuiltinPolicy(), judge, SearchConfig(trajectories=args.trajectories, turns=args.turns),
                        gpu=torch.cuda.get_device_name(), capability="%d.%d" % torch.cuda.get_device_capability())

        def one(task):  # type: ignore[no-untyped-def]
            began = time.perf_counter()
            result = engine.search(task.source, task.name)
            best = result.best
            t = best.result.timings if best is not None and best.result is not None else None
            reasons = [r.step.result.reason.name if r.step.result else "NO_CODE" for r in result.records]
            return {"task": task.name, "category": getattr(task, "category", args.suite), "correct": best is not None,
                    "variant": best.step.reply.extra.get("variant") if best else None, "turn": best.turn if best else None,
                    "kernel_ms": t.kernel_ms if t else None, "eager_ms": t.eager_ms if t else None, "inductor_ms": t.inductor_ms if t else None,
                    "vs_eager": t.speedup_vs_eager if t else None, "vs_inductor": t.speedup_vs_inductor if t else None,
                    **roofline_columns(best.result if best is not None else None),
                    "reasons": reasons, "stopped": result.stopped,
                    # what the judge told the writer when a turn failed (its own words, shortened)
                    # the job that timed Inductor: how (Inductor's code and chosen configurations) and its
                    # interleaved rounds of the candidate and Inductor
                    "inductor_rounds": [n for r in result.records if r.result is not None and r.result.memory
                                        for n in r.result.memory.get("notes", [])
                                        if n.startswith(("candidate and Inductor timed", "Inductor timed as"))],
                    "feedback": [r.step.result.feedback[:600] for r in result.records
                                 if r.step.result is not None and r.step.result.reason.name != "ACCEPTED"], "seconds": round(time.perf_counter() - began, 1),
                    # each turn: its variant, its build's seconds and, when correct, its time
                    "turns": [{"variant": r.step.reply.extra.get("variant"),
                               "build_seconds": round(r.result.build_seconds or 0, 1) if r.result else None,
                               "judge_seconds": round(r.judge_seconds, 1),
                               "kernel_ms": r.result.timings.kernel_ms if r.result else None} for r in result.records],
                    **(quack_columns(peer.get(task.name), t.kernel_ms if t else None) if peer is not None else {})}

        with concurrent.futures.ThreadPoolExecutor(max(1, args.at_once)) as pool:
            futures = [pool.submit(one, t) for t in tasks]
            for done, future in enumerate(concurrent.futures.as_completed(futures), 1):
                row = future.result()
                rows.append(row)
                if args.json:  # as we go: a run stopped at its time limit keeps what it measured
                    args.json.write_text(json.dumps({"meta": meta, "rows": rows, "partial": True}, indent=1))
                elapsed = time.perf_counter() - start
                eta = elapsed / done * (len(tasks) - done)
                shown = (f"{row['vs_eager']:.2f}x eager, {row['vs_inductor']:.2f}x Inductor" if row["correct"]
                         else f"NOT CORRECT {row['reasons']}: {' | '.join(row['feedback'])}")
                print(f"[{done}/{len(tasks)} {elapsed:.0f}s, eta {eta:.0f}s, load {os.getloadavg()[0]:.0f}] {row['task']}: {shown}", file=sys.stderr, flush=True)
    rows.sort(key=lambda r: [t.name for t in tasks].index(str(r["task"])))
    copy = meta["copy_gbps"]
    print(f"GPU {torch.cuda.get_device_name()}, torch {torch.__version__}, {time.strftime('%Y-%m-%d')}, "
          f"{args.trajectories} x {args.turns} turns, {args.trials} trials, suite {args.suite}, "
          f"copy bandwidth {'not measured' if copy is None else f'{copy:.0f} GB/s'}")
    with_peer = peer is not None
    print("| task | kind | correct | best variant | kernel ms | eager ms | Inductor ms | x eager | x Inductor | MB moved "
          "| kernel % of copy | Inductor % of copy |" + (" QuACK ms | x QuACK | QuACK % of copy |" if with_peer else ""))
    print("|---|---|---|---|---|---|---|---|---|---|---|---|" + ("---|---|---|" if with_peer else ""))
    for r in rows:
        def f(v: object, fmt: str, scale: float = 1.0) -> str:
            return "-" if v is None else format(v * scale, fmt)  # type: ignore[operator]
        quack = (f" {f(r['quack_ms'], '.4f') if r['quack'] == 'ran' else r['quack']} | {f(r['vs_quack'], '.2f')} | "
                 f"{f(r['quack_fraction'], '.0%')} |") if with_peer else ""
        print(f"| {r['task']} | {r['category']} | {'yes' if r['correct'] else 'NO'} | {'-' if r['variant'] is None else r['variant']} | {f(r['kernel_ms'], '.4f')} | "
              f"{f(r['eager_ms'], '.4f')} | {f(r['inductor_ms'], '.4f')} | {f(r['vs_eager'], '.2f')} | {f(r['vs_inductor'], '.2f')} | "
              f"{f(r['bytes'], '.3g', 1e-6)} | {f(r['kernel_fraction'], '.0%')} | {f(r['inductor_fraction'], '.0%')} |{quack}")
    chains = geomean([r["vs_eager"] for r in rows if r["category"] == "chain3+"])  # type: ignore[misc]
    norms = geomean([r["vs_inductor"] for r in rows if r["category"] in ("reduction", "norm")])  # type: ignore[misc]
    correct = sum(bool(r["correct"]) for r in rows)
    print(f"\ncorrect: {correct} of {len(rows)}; geometric mean over eager, chains of 3+ ops: "
          f"{chains if chains is None else f'{chains:.2f}x'} (goal 1.5x); over Inductor, reductions and norms: "
          f"{norms if norms is None else f'{norms:.2f}x'} (goal 1.0x)")
    kernel_roof = geomean([r["kernel_fraction"] for r in rows])  # type: ignore[misc]
    inductor_roof = geomean([r["inductor_fraction"] for r in rows])  # type: ignore[misc]
    if kernel_roof is not None or inductor_roof is not None:
        print(f"geometric mean fraction of the copy bandwidth: kernel "
              f"{'-' if kernel_roof is None else f'{kernel_roof:.0%}'}, Inductor "
              f"{'-' if inductor_roof is None else f'{inductor_roof:.0%}'}")
    roofline = roofline_summary(rows)
    if roofline["median_kernel_fraction"] is not None:
        low = roofline["vs_inductor_where_inductor_below_half"]
        print(f"median fraction of the copy bandwidth, the writer's kernels: {roofline['median_kernel_fraction']:.0%} (goal 80%); "
              f"over Inductor where Inductor is below 50%: {'-' if low is None else f'{low:.2f}x'} "
              f"over {roofline['tasks_inductor_below_half']} tasks (goal 1.5x; left out, Inductor's time over "
              f"{IMPLAUSIBLE:.0f}x eager's: {', '.join(roofline['implausible_inductor']) or 'none'}); kept (>= {KEEP_MARGIN:.2f}x Inductor): "
              f"{roofline['kept']}, tied or slower (Inductor kept): {roofline['not_kept']}")
    if with_peer:
        roofline.update(quack_summary(rows))
        g = roofline["vs_quack_geomean"]
        print(f"QuACK ran {roofline['quack_ran']} tasks (not taken: {roofline['quack_not_taken']}; failed or wrong: "
              f"{', '.join(roofline['quack_failed']) or 'none'}); the writer's kernel at least as fast on "  # type: ignore[arg-type]
              f"{roofline['as_fast_as_quack']} of them (goal: all; slower: {', '.join(roofline['slower_than_quack']) or 'none'}), "  # type: ignore[arg-type]
              f"geometric mean {'-' if g is None else f'{g:.2f}x'} QuACK (goal {QUACK_GOAL:.2f}x)")
    load = os.getloadavg()
    print(f"wall {time.perf_counter() - start:.0f} s, load average {load[0]:.1f} on {os.cpu_count()} CPUs")
    if args.json:
        args.json.write_text(json.dumps({"meta": meta, "rows": rows, "chains_vs_eager": chains, "norms_vs_inductor": norms,
                                         "kernel_roofline": kernel_roof, "inductor_roofline": inductor_roof,
                                         "roofline_summary": roofline}, indent=1))
    return 0 if correct == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
