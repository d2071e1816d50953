"""Inductor's time for a roofline-suite task, measured four ways, to find where a judge's number
comes from when it disagrees with a plain script.

  judge-direct   the judge's protocol: `inductor_call` (the one graph's compiled function, no
                 Dynamo guards) on the judge's input set, timed with the judge's timer
  judge-guarded  the same compiled model called through Dynamo, on the same inputs
  plain          `torch.compile(model)` on inputs made by `get_inputs()` on the GPU, timed with
                 CUDA events
  eager          the model itself

Usage: python benchmarks/probe_inductor.py --tasks softmax-last-f32-1Mx64 [--code DIR]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", required=True)
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--code", type=Path, help="write Inductor's generated code here")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 2
    from kevin_backend.measure.interleave import measure_ms
    from kevin_backend.generate.builtin.roofline_suite import ROOFLINE_SUITE
    from kevin_backend.measure.inputs import make_input_set
    from kevin_backend.measure.inductor import inductor_call
    from kevin_backend.measure.timer import make_timer
    from kevin_backend.types import load_program

    device = torch.device("cuda")
    for name in args.tasks.split(","):
        (suite_task,) = [t for t in ROOFLINE_SUITE if t.name == name]
        task = load_program(suite_task.source, name.replace("-", "_"))
        torch._dynamo.reset()
        model = task.Model(*task.get_init_inputs()).to(device).eval()
        values = make_input_set(task, 0, device).values
        shown = [(tuple(v.shape), tuple(v.stride()), str(v.dtype)) for v in values if isinstance(v, torch.Tensor)]
        print(f"{name}: inputs {shown}", flush=True)
        if args.code:
            args.code.mkdir(parents=True, exist_ok=True)
            torch._logging.set_logs(output_code=True)
        with torch.no_grad():
            direct, how = inductor_call(model, values, "inductor")
        if args.code:
            torch._logging.set_logs()
        judge_timer = make_timer(device, args.trials, 5, queued=True)
        with torch.no_grad():
            rows = {"judge-direct": judge_timer(direct)}
            guarded = torch.compile(model)
            rows["judge-guarded"] = judge_timer(lambda: guarded(*values))
            rows["judge-guarded (events)"] = measure_ms(lambda: guarded(*values), device, args.trials, 5)
            torch.manual_seed(0)
            with device:
                plain_inputs = list(task.get_inputs())
            torch._dynamo.reset()
            plain = torch.compile(model)
            rows["plain"] = measure_ms(lambda: plain(*plain_inputs), device, args.trials, 5)
            rows["plain, judge's inputs"] = measure_ms(lambda: plain(*values), device, args.trials, 5)
            rows["eager"] = measure_ms(lambda: model(*values), device, args.trials, 5)
        print(f"  ({how})")
        for key, ms in rows.items():
            print(f"  {key:28s} {ms:10.4f} ms", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
