"""The roofline suite's tasks as models, compiled by the backend in generate mode.

`bench_builtin.py --suite roofline` measures the built-in writer's kernels through the judge
alone. This runs the same tasks the way a user meets them: each task's `Model` compiled with
`torch.compile(model, backend="kevin", options={"mode": "generate", "policy": "builtin", ...})`
on its own inputs, so the partitioner, the search, the decision (re-timed against Inductor,
noise accounted for) and the runtime all take part. For every task it records what the compile
report says of each partition (generated, or Inductor kept and why; the kernel's speedup and its
fraction of the copy bandwidth) and whether the compiled model's outputs match the model's.

With `--from RESULTS.json` (a `bench_builtin.py --suite roofline --json` file) it runs only the
tasks whose kernel beat Inductor there by the keep margin, and says for each whether the backend
kept a kernel, which is what it should do for all of them.

Usage: python benchmarks/bench_roofline_backend.py [--from builtin_roofline.json] [--tasks a,b]
       [--turns 2] [--margin 1.03] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--from", dest="source", type=Path, help="bench_builtin.py --suite roofline JSON: its winners only")
    parser.add_argument("--tasks", help="comma-separated task names")
    parser.add_argument("--margin", type=float, default=1.03, help="a winner beat Inductor by at least this (--from)")
    parser.add_argument("--turns", type=int, default=2)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("bench_roofline_backend needs a CUDA GPU", file=sys.stderr)
        return 2
    from kevin_backend.generate.builtin.roofline_suite import ROOFLINE_SUITE

    wanted = set(args.tasks.split(",")) if args.tasks else None
    expected: dict[str, float] = {}
    if args.source:
        for row in json.loads(args.source.read_text())["rows"]:
            if row.get("vs_inductor") and row["vs_inductor"] >= args.margin:
                expected[row["task"]] = row["vs_inductor"]
        wanted = set(expected) if wanted is None else wanted & set(expected)
    tasks = [t for t in ROOFLINE_SUITE if wanted is None or t.name in wanted]
    meta = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "date": time.strftime("%Y-%m-%d"),
            "turns": args.turns, "margin": args.margin}
    rows: list[dict[str, object]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for n, task in enumerate(tasks, 1):
            try:
                row = run_task(task, Path(tmp) / "cache", args.turns)
            except Exception as exc:  # noqa: BLE001 - a task that fails is a row that says so, not the end of the run
                row = {"task": task.name, "match": False, "kept": False, "error": f"{type(exc).__name__}: {exc}"[:500], "partitions": []}
            row["judge_vs_inductor"] = expected.get(task.name)
            rows.append(row)
            torch.cuda.empty_cache()
            best = [p for p in row["partitions"] if p["status"] == "generated"]  # type: ignore[union-attr,index]
            shown = (f"kept, {best[0]['vs_inductor']:.2f}x Inductor, {best[0]['roofline_fraction'] or 0:.0%} of copy"
                     if best and best[0]["vs_inductor"] else "Inductor kept: " + "; ".join(
                         f"{p['status']} {p['reason'] or ''} {p['detail'] or ''}".strip() for p in row["partitions"]) or row.get("error", ""))  # type: ignore[union-attr]
            print(f"[{n}/{len(tasks)}] {task.name}: {'match' if row['match'] else 'OUTPUTS DIFFER'}, {shown}", file=sys.stderr, flush=True)
            if args.json:
                args.json.write_text(json.dumps({"meta": meta, "rows": rows, "partial": n < len(tasks)}, indent=1))
    kept = sum(bool(r["kept"]) for r in rows)
    matched = sum(bool(r["match"]) for r in rows)
    print(f"GPU {meta['gpu']}, torch {meta['torch']}, {meta['date']}: {kept} of {len(rows)} tasks kept a kernel, "
          f"{matched} of {len(rows)} outputs match")
    return 0 if matched == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
