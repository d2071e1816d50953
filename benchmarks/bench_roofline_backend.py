"""The roofline suite's tasks as models, compiled by the backend in generate mode.

`bench_builtin.py --suite roofline` measures the built-in writer's kernels through the judge
alone. This runs the same tasks the way a user meets them: each task's `Model` compiled with
`torch.compile(model, backend="kevin", options={"mode": "generate", "policy": "builtin", ...})`
on its own inputs, so the partitioner, the search, the decision (re-timed against Inductor,
noise accounted for) and the runtime all take part. For every task it records what the compile
report says of each partition (generated, or Inductor kept and why; the kernel's speedup and its
fraction of the copy bandwidth) and whether the compiled model's outputs match the model's.

With `--from RESULTS.json` (a `bench_builtin.py --suite roofline --json` file, or one stored under
`benchmarks/results/`) it runs only the
tasks whose kernel beat Inductor there by the keep margin, and says for each whether the backend
kept a kernel, which is what it should do for all of them.

With `--at-once N`, N tasks are compiled side by side, each in a process of its own (one kernel
cache, so one build folder and one GPU lock for all their judges and graph checks: timings
never overlap, builds and correctness passes do).

Usage: python benchmarks/bench_roofline_backend.py [--from builtin_roofline.json] [--tasks a,b]
       [--turns 2] [--margin 1.03] [--at-once 1] [--json FILE] [--resume EARLIER.json]

`--resume` continues a run cut short by a time limit: the earlier JSON's tasks are skipped and its
rows carried into the new JSON.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch


def run_task(task, cache: Path, turns: int) -> dict[str, object]:  # type: ignore[no-untyped-def]
    import kevin_backend
    from kevin_backend.types import load_program

    module = load_program(task.source, "kevin_roofline_model")
    torch.manual_seed(0)
    inputs = [t.cuda() if isinstance(t, torch.Tensor) else t for t in module.get_inputs()]
    model = module.Model(*module.get_init_inputs()).cuda().eval()
    torch._dynamo.reset()
    began = time.perf_counter()
    # min_partition 1: a task of one op (a sum over dim 0) is a partition of its own
    compiled = torch.compile(model, backend="kevin", options={
        "mode": "generate", "cache_dir": str(cache), "policy": "builtin", "trajectories": 1, "turns": turns,
        "min_partition": 1, "seed_cache": False})
    with torch.no_grad():
        got, want = compiled(*inputs), model(*inputs)
    seconds = time.perf_counter() - began
    report = kevin_backend.last_report()
    got_list = list(got) if isinstance(got, (tuple, list)) else [got]
    want_list = list(want) if isinstance(want, (tuple, list)) else [want]
    match = all(g.shape == w.shape and torch.allclose(g.double(), w.double(), rtol=1e-2, atol=1e-2, equal_nan=True)
                for g, w in zip(got_list, want_list))
    records = report.records() if report is not None else []
    return {"task": task.name, "match": match, "seconds": round(seconds, 1), "report": str(report),
            "partitions": [{"status": r.status.value, "ops": len(r.ops), "reason": r.reason.value if r.reason else None,
                            "detail": r.detail, "vs_inductor": r.speedup_vs_inductor, "roofline_fraction": r.roofline_fraction}
                           for r in records],
            "kept": any(r.status.value == "generated" for r in records)}


ROW = "kevin-roofline-row "  # the prefix of a worker's last line: its row as JSON


def _in_worker(task, cache: Path, turns: int) -> dict[str, object]:  # type: ignore[no-untyped-def]
    """`run_task` in a process of its own (`--worker`): its row, or an error row that says why."""
    command = [sys.executable, __file__, "--worker", task.name, "--cache", str(cache), "--turns", str(turns)]
    done = subprocess.run(command, capture_output=True, text=True)
    rows = [line[len(ROW):] for line in done.stdout.splitlines() if line.startswith(ROW)]
    if rows:
        return json.loads(rows[-1])
    tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
    return {"task": task.name, "match": False, "kept": False, "partitions": [],
            "error": f"the worker ended with code {done.returncode}: {tail}"[:500]}


def _one(task, cache: Path, turns: int) -> dict[str, object]:  # type: ignore[no-untyped-def]
    try:
        return run_task(task, cache, turns)
    except Exception as exc:  # noqa: BLE001 - a task that fails is a row that says so, not the end of the run
        return {"task": task.name, "match": False, "kept": False, "error": f"{type(exc).__name__}: {exc}"[:500], "partitions": []}


def _shown(row: dict[str, object]) -> str:
    best = [p for p in row["partitions"] if p["status"] == "generated"]  # type: ignore[union-attr,index]
    if best and best[0]["vs_inductor"]:
        return f"kept, {best[0]['vs_inductor']:.2f}x Inductor, {best[0]['roofline_fraction'] or 0:.0%} of copy"
    return "Inductor kept: " + ("; ".join(f"{p['status']} {p['reason'] or ''} {p['detail'] or ''}".strip()  # type: ignore[index]
                                          for p in row["partitions"]) or str(row.get("error", "")))  # type: ignore[union-attr]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--from", dest="source", type=Path, help="bench_builtin.py --suite roofline JSON: its winners only")
    parser.add_argument("--tasks", help="comma-separated task names")
    parser.add_argument("--margin", type=float, default=1.03, help="a winner beat Inductor by at least this (--from)")
    parser.add_argument("--turns", type=int, default=2)
    parser.add_argument("--at-once", type=int, default=1, help="tasks compiled side by side, each in its own process")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--resume", type=Path, help="an earlier run's --json (one device call's worth): its tasks are not run "
                        "again, its rows are kept in this run's JSON")
    parser.add_argument("--worker", help=argparse.SUPPRESS)  # one task in this process; its row on the last line
    parser.add_argument("--cache", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("bench_roofline_backend needs a CUDA GPU", file=sys.stderr)
        return 2
    if args.at_once < 1:
        parser.error(f"--at-once must be at least 1, got {args.at_once}")
    from kevin_backend.generate.builtin.roofline_suite import ROOFLINE_SUITE

    if args.worker:
        task = next((t for t in ROOFLINE_SUITE if t.name == args.worker), None)
        if task is None or args.cache is None:
            parser.error(f"--worker needs a task of the suite and --cache, got {args.worker!r}")
        print(ROW + json.dumps(_one(task, args.cache, args.turns)), flush=True)
        return 0

    wanted = set(args.tasks.split(",")) if args.tasks else None
    expected: dict[str, float] = {}
    if args.source:
        found = json.loads(args.source.read_text())
        for row in found["rows"] if "rows" in found else found["data"]["rows"]:  # bench_builtin's JSON, or as stored
            if row.get("vs_inductor") and row["vs_inductor"] >= args.margin:
                expected[row["task"]] = row["vs_inductor"]
        wanted = set(expected) if wanted is None else wanted & set(expected)
    earlier: list[dict[str, object]] = json.loads(args.resume.read_text())["rows"] if args.resume else []
    done = {str(r["task"]) for r in earlier}
    everything = [t for t in ROOFLINE_SUITE if wanted is None or t.name in wanted]
    order = {t.name: i for i, t in enumerate(everything)}
    tasks = [t for t in everything if t.name not in done]
    meta = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "date": time.strftime("%Y-%m-%d"),
            "turns": args.turns, "margin": args.margin, "at_once": args.at_once}
    rows: list[dict[str, object]] = list(earlier)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        cache = Path(tmp) / "cache"
        if args.at_once == 1:
            results = (_one(task, cache, args.turns) for task in tasks)
        else:
            pool = concurrent.futures.ThreadPoolExecutor(args.at_once)
            futures = [pool.submit(_in_worker, task, cache, args.turns) for task in tasks]
            results = (f.result() for f in concurrent.futures.as_completed(futures))
        for n, row in enumerate(results, 1):
            row["judge_vs_inductor"] = expected.get(str(row["task"]))
            rows.append(row)
            rows.sort(key=lambda r: order.get(str(r["task"]), len(order)))
            torch.cuda.empty_cache()
            print(f"[{n}/{len(tasks)} {time.perf_counter() - started:.0f}s] {row['task']}: "
                  f"{'match' if row['match'] else 'OUTPUTS DIFFER'}, {_shown(row)}", file=sys.stderr, flush=True)
            if args.json:
                args.json.write_text(json.dumps({"meta": meta, "rows": rows, "partial": len(rows) < len(everything)}, indent=1))
    if args.json:  # (also when every task was in the resumed run)
        args.json.write_text(json.dumps({"meta": meta, "rows": rows, "partial": len(rows) < len(everything)}, indent=1))
    kept = sum(bool(r["kept"]) for r in rows)
    matched = sum(bool(r["match"]) for r in rows)
    print(f"GPU {meta['gpu']}, torch {meta['torch']}, {meta['date']}: {kept} of {len(rows)} tasks kept a kernel, "
          f"{matched} of {len(rows)} outputs match")
    return 0 if matched == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
