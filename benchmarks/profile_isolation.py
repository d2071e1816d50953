"""Where a timed batch's time goes with the candidate in its own process (GPU): judges one honest
CUDA candidate (building it), then drives a candidate's process and the references' process
directly over slots of the task's inputs and prints, per batch, the judge's clock and the
process's own marks (inputs wrapped, calls queued, device synchronised, outputs described).

Usage: python benchmarks/profile_isolation.py [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from judge_cases import HONEST  # noqa: E402

from kevin_backend.judge.candidate_process import Launcher, RemoteModel, shared_folder  # noqa: E402
from kevin_backend.judge.judge import Judge  # noqa: E402
from kevin_backend.judge.sandbox import RunConfig  # noqa: E402
from kevin_backend.judge.shared_values import arena_bytes  # noqa: E402
from kevin_backend.judge.timing_phase import fill, make_slots, timed_batch  # noqa: E402
from kevin_backend.measure.inputs import make_input_set  # noqa: E402
from kevin_backend.types import load_program  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    case = HONEST[0]
    device = torch.device("cuda")
    rows: dict[str, object] = {"case": case.name}
    with tempfile.TemporaryDirectory() as tmp:
        judge = Judge(Path(tmp) / "builds", RunConfig(trials=20, warmup=2), workers=1)
        result = judge.judge(case.task, case.source)
        rows["verdict"] = result.reason.name
        for _ in range(3):  # warm: where a judged candidate's time goes, phase by phase
            again = judge.judge(case.task, case.source)
            print("phases (s):", ", ".join(f"{k} {v:.3f}" for k, v in sorted((again.phase_seconds or {}).items(),
                                                                              key=lambda kv: -kv[1])), flush=True)
            rows.setdefault("phase_seconds", []).append(again.phase_seconds)
        judge.close()
        task = load_program(case.task, "kevin_task")
        launcher = Launcher(device, shared_folder())
        deadline = time.monotonic() + 600
        kernel = RemoteModel(launcher.take(), device, launcher.folder, deadline)
        major, minor = torch.cuda.get_device_capability(device)
        kernel.load({"mode": "candidate", "candidate": case.source, "task": case.task, "seed": 11,
                     "build_root": str(judge.builder.root), "arch": f"{major}.{minor}", "numerics": {}})
        reference = RemoteModel(launcher.take(), device, launcher.folder, deadline, trusted=True)
        reference.load({"mode": "reference", "task": case.task, "seed": 11, "numerics": {}, "compile_backend": "inductor"})
        sample = make_input_set(task, 11, device)
        for count_limit in (2, 8, 32):
            slots = make_slots(arena_bytes(sample.values), device, launcher.folder, lambda count, n, c=count_limit: count <= c)
            kernel.share(slots.arena)
            reference.share(slots.arena)
            for index in range(4):
                fill(task, 11, device, slots, index)
                for name, remote, entry in (("kernel", kernel, "model"), ("inductor", reference, "inductor"),
                                            ("eager", reference, "eager")):
                    ms, reply = timed_batch(device, remote, slots, entry, [])
                    # (the profile flag is asked for on a second, identical batch)
                    start = time.perf_counter()
                    profiled = remote.request({"op": "batch", "calls": slots.descs, "entry": entry, "profile": True}, "profile")
                    wall = (time.perf_counter() - start) * 1e3
                    line = (f"slots {slots.count} round {index} {name}: {ms:.4f} ms/call; profiled batch {wall:.3f} ms: "
                            + ", ".join(f"{k} {v:.3f}" for k, v in profiled.get("profile", {}).items()))
                    print(line, flush=True)
                    rows[f"{slots.count}/{index}/{name}"] = {"ms_per_call": ms, "batch_ms": wall, **profiled.get("profile", {})}
        kernel.close()
        reference.close()
        launcher.close()
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
