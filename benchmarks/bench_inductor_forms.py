"""Inductor's code for a task as the user writes it, against Inductor's code for the partition the
backend hands over for it: the same computation, two baselines.

The roofline suite's judge times Inductor on each task's `Model` as written (`torch.log_softmax(x,
1)`); the backend's decision times Inductor on the partition's program (`task.py`: the post-grad
aten ops, `amax`, `sub`, `exp`, ... written out). When the two compile to different code, a kernel
can beat one baseline and not the other. For each task this compiles both forms with Inductor,
times them in interleaved rounds under the judge's protocol (`timer.make_timer(queued=True)`), and
records Inductor's code hash and chosen configurations for each (`measure/inductor.inductor_code`).

Usage: python benchmarks/bench_inductor_forms.py --tasks a,b [--rounds 5] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch


def _partition_sources(module: Any, values: list[Any]) -> list[str]:
    """The programs of the partitions the backend makes of `module.Model` (cache mode records
    each miss as a pending task)."""
    from kevin_backend.cache.store import KernelCache

    with tempfile.TemporaryDirectory() as tmp:
        torch._dynamo.reset()
        compiled = torch.compile(module.Model(*module.get_init_inputs()).cuda().eval(), backend="kevin",
                                 options={"mode": "cache", "cache_dir": tmp, "min_partition": 1, "seed_cache": False})
        with torch.no_grad():
            compiled(*values)
        return [p.task.source for p in KernelCache(Path(tmp), None).pending()]


def _compiled(model: torch.nn.Module, values: list[Any]) -> tuple[Any, str]:
    from kevin_backend.measure.inductor import generated_modules, inductor_call, inductor_code

    torch._dynamo.reset()
    mark = generated_modules()
    with torch.no_grad():
        call, how = inductor_call(model, values, "inductor")
    return call, inductor_code(mark)


def compare(task: Any, rounds: int, judge_inputs: bool = False) -> dict[str, Any]:
    from kevin_backend.measure.interleave import interleaved_rounds
    from kevin_backend.measure.timer import make_timer
    from kevin_backend.types import load_program

    module = load_program(task.source, "kevin_forms_task")
    torch.manual_seed(0)
    values = [v.cuda() if isinstance(v, torch.Tensor) else v for v in module.get_inputs()]
    if judge_inputs:  # the judge's own input set (true layouts: each input a view of the memory it spans)
        from kevin_backend.measure.inputs import make_input_set

        values = make_input_set(module, 0, torch.device("cuda")).values
    sources = _partition_sources(module, values)
    if len(sources) != 1:
        return {"task": task.name, "error": f"{len(sources)} partitions (one expected)"}
    partition = load_program(sources[0], "kevin_forms_partition")
    written, written_code = _compiled(module.Model(*module.get_init_inputs()).cuda().eval(), values)
    torch.manual_seed(0)  # the partition's own inputs (a norm's weight may be handed over as a view of another shape)
    own = [v.cuda() if isinstance(v, torch.Tensor) else v for v in partition.get_inputs()]
    handed, handed_code = _compiled(partition.Model().cuda().eval(), own)
    measure = make_timer(torch.device("cuda"), 20, 5, queued=True)
    with torch.no_grad():
        a, b = interleaved_rounds(lambda: measure(written), lambda: measure(handed), rounds)
    return {"task": task.name, "written_ms": statistics.median(a), "partition_ms": statistics.median(b),
            "written_rounds": a, "partition_rounds": b, "written_code": written_code, "partition_code": handed_code,
            "partition_source": sources[0]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", required=True, help="comma-separated roofline-suite task names")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--judge-inputs", action="store_true", help="the judge's input set instead of the task's own tensors")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("bench_inductor_forms needs a CUDA GPU", file=sys.stderr)
        return 2
    from kevin_backend.generate.builtin.roofline_suite import ROOFLINE_SUITE

    names = args.tasks.split(",")
    unknown = sorted(set(names) - {t.name for t in ROOFLINE_SUITE})
    if unknown:
        parser.error(f"not tasks of the roofline suite: {', '.join(unknown)}")
    rows = []
    for task in (t for t in ROOFLINE_SUITE if t.name in names):
        began = time.perf_counter()
        try:
            row = compare(task, args.rounds, args.judge_inputs)
        except Exception as exc:  # noqa: BLE001 - a task that fails is a row that says so
            row = {"task": task.name, "error": f"{type(exc).__name__}: {exc}"[:400]}
        row["seconds"] = round(time.perf_counter() - began, 1)
        rows.append(row)
        if "error" in row:
            print(f"{task.name}: {row['error']}", flush=True)
        else:
            print(f"{task.name}: as written {row['written_ms']:.4f} ms, as the partition {row['partition_ms']:.4f} ms "
                  f"({row['written_ms'] / row['partition_ms']:.2f}x)\n  written:   {row['written_code']}\n"
                  f"  partition: {row['partition_code']}", flush=True)
        if args.json:
            args.json.write_text(json.dumps({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                                             "date": time.strftime("%Y-%m-%d"), "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
