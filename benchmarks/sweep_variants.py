"""Every variant the built-in writer has for a roofline-suite task, timed side by side: which of
its mappings (threads per row, vector access, clusters, rows across memory, split rows) runs a
shape fastest, beside Inductor's code and the GPU's copy bandwidth. A probe for the writer's
ranking and its missing forms, not a verdict: the programs are the writer's own, built here and
run in this process; each is checked against eager on one input set (the judge's comparison),
then timed with the judge's timer (queued, L2 flushed before each trial).

    python benchmarks/sweep_variants.py --tasks mean-dim1-f16-64x4096x1024 [--variants 0,8,20]
           [--trials 20] [--jobs 16] [--json FILE]

Prints, per task, every variant's time and fraction of copy bandwidth, fastest first, with
Inductor's and eager's. The search itself (`bench_builtin.py`) tries a few of them per task,
in `variant_ranking.preferred_order`'s order; this shows the whole list.
"""

from __future__ import annotations

import argparse
import concurrent.futures as futures
import hashlib
import json
import multiprocessing
import re
import sys
import time
from pathlib import Path
from typing import Any

import torch


def programs(source: str, picks: str | None) -> tuple[list[tuple[int, str, str]], list[int] | str]:
    """(variant number, its description, its program) for the task's variants (`picks`: some of
    them by number), and the ranking's order; or ([], the writer's reason to decline)."""
    from kevin_backend.generate.builtin.plan import Declined
    from kevin_backend.generate.builtin.planner import plan_task
    from kevin_backend.generate.builtin.program import write_program
    from kevin_backend.generate.builtin.variant_ranking import preferred_order
    from kevin_backend.generate.builtin.variants import variant_number, variants_for

    plan = plan_task(source)
    if isinstance(plan, Declined):
        return [], plan.reason
    variants = variants_for(plan)
    wanted = range(len(variants)) if not picks else [int(p) for p in picks.split(",") if int(p) < len(variants)]
    digest = hashlib.sha256(source.encode()).hexdigest()[:10]
    out = []
    for i in wanted:
        doc = f"Written by kevin's built-in writer, variant {i}."
        out.append((i, variants[i].describe(), write_program(plan, variants[i], name=f"kevin_sweep_{digest}_{i}", doc=doc)))
    return out, [variant_number(plan, name) for name in preferred_order(plan)]


def _build(text: str, name: str) -> tuple[str, str | None]:
    """Load (and so build) one program in a worker process: (name, None) or (name, the error)."""
    from kevin_backend.types import load_program

    try:
        load_program(text, name)
        return name, None
    except Exception as exc:  # noqa: BLE001 - a variant that does not build is a row of the table
        return name, f"{type(exc).__name__}: {str(exc).strip().splitlines()[-1][:200] if str(exc).strip() else ''}"


def sweep_task(task: Any, picks: str | None, device: torch.device, copy_gbps: float | None, trials: int,
               pool: futures.Executor) -> dict[str, Any]:
    from kevin_backend.measure.compare import compare_outputs, output_list
    from kevin_backend.measure.inductor import inductor_call
    from kevin_backend.measure.roofline import task_bytes
    from kevin_backend.measure.timer import make_timer
    from kevin_backend.types import load_program

    made, order = programs(task.source, picks)
    if not made:
        return {"task": task.name, "declined": order}
    began = time.perf_counter()
    names = {i: f"sweep_{re.sub(r'[^0-9a-z]', '_', task.name)}_{i}" for i, _, _ in made}
    errors = dict(pool.map(_build, [text for _, _, text in made], [names[i] for i, _, _ in made]))
    built_s = time.perf_counter() - began
    module = load_program(task.source, "sweep_task_" + re.sub(r"\W", "_", task.name))
    torch.manual_seed(0)
    with torch.device(device):
        inputs = list(module.get_inputs())
    model = module.Model(*module.get_init_inputs()).to(device).eval()
    measure = make_timer(device, trials, 5, queued=True)
    rows: list[dict[str, Any]] = []
    with torch.no_grad():
        want = output_list(model(*inputs))
        nbytes = task_bytes(inputs, want)
        torch._dynamo.reset()
        inductor, _ = inductor_call(model, inputs, "inductor")
        base = {"eager": measure(lambda: model(*inputs)), "inductor": measure(inductor)}
        for i, describe, text in made:
            row: dict[str, Any] = {"variant": i, "describe": describe}
            if errors.get(names[i]):
                rows.append({**row, "error": errors[names[i]]})
                continue
            try:
                kernel = load_program(text, names[i]).ModelNew(*module.get_init_inputs()).to(device)
                got = output_list(kernel(*inputs))
                torch.cuda.synchronize(device)
                bad = compare_outputs(got, want, None)
                row["correct"] = bad is None
                if bad is not None:
                    row["mismatch"] = f"{bad.reason} (output {bad.output}, {bad.bad_elements} of {bad.total_elements})"
                del got
                row["ms"] = measure(lambda: kernel(*inputs))
            except Exception as exc:  # noqa: BLE001 - a launch error is a row too
                row["error"] = f"{type(exc).__name__}: {str(exc).strip()[:200]}"
            rows.append(row)
    inputs.clear()

    def fraction(ms: float | None) -> float | None:
        return nbytes / (ms * 1e-3) / (copy_gbps * 1e9) if ms and copy_gbps else None

    for r in rows:
        r["fraction"] = fraction(r.get("ms"))
    return {"task": task.name, "bytes": nbytes, "order": order, "build_s": round(built_s, 1),
            **{f"{k}_ms": v for k, v in base.items()}, **{f"{k}_fraction": fraction(v) for k, v in base.items()},
            "rows": rows}


def show(result: dict[str, Any]) -> None:
    if "declined" in result:
        print(f"{result['task']}: declined ({result['declined']})", flush=True)
        return
    pct = lambda f: f"{f:.0%}" if f is not None else "-"  # noqa: E731
    print(f"{result['task']}: {result['bytes'] / 1e6:.0f} MB; Inductor {result['inductor_ms']:.4f} ms "
          f"({pct(result['inductor_fraction'])} of copy), eager {result['eager_ms']:.4f} ms; built in {result['build_s']} s; "
          f"ranking {result['order'][:6]}", flush=True)
    timed = sorted((r for r in result["rows"] if r.get("ms")), key=lambda r: r["ms"])
    for r in timed + [r for r in result["rows"] if not r.get("ms")]:
        if r.get("ms"):
            flag = "" if r.get("correct") else f"  WRONG: {r.get('mismatch')}"
            print(f"  {r['variant']:>3}  {r['ms']:.4f} ms  {pct(r['fraction']):>4}  x{result['inductor_ms'] / r['ms']:.2f}  "
                  f"{r['describe']}{flag}", flush=True)
        else:
            print(f"  {r['variant']:>3}  {r.get('error')}  {r['describe']}", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", required=True, help="comma-separated roofline-suite task names")
    parser.add_argument("--variants", help="comma-separated variant numbers (default: every variant)")
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--jobs", type=int, default=16, help="programs built at once")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    from kevin_backend.generate.builtin.roofline_suite import ROOFLINE_SUITE

    by_name = {t.name: t for t in ROOFLINE_SUITE}
    unknown = [n for n in args.tasks.split(",") if n not in by_name]
    if unknown:
        print(f"not in the roofline suite: {', '.join(unknown)}", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("sweep_variants needs a CUDA GPU", file=sys.stderr)
        return 2
    from kevin_backend.measure.roofline import copy_bandwidth

    device = torch.device("cuda", torch.cuda.current_device())
    copy = copy_bandwidth(device)
    out: dict[str, Any] = {"gpu": torch.cuda.get_device_name(device), "torch": torch.__version__, "copy_gbps": copy, "tasks": []}
    with futures.ProcessPoolExecutor(args.jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        for name in args.tasks.split(","):
            result = sweep_task(by_name[name], args.variants, device, copy, args.trials, pool)
            torch.cuda.empty_cache()  # the task's inputs and outputs are gone with its call
            out["tasks"].append(result)
            show(result)
            if args.json:
                args.json.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
