"""Where the time of one isolated evaluation goes on a GPU: the candidate's process (taken from
the launcher, loaded), sharing an arena, one call, a batch; printed per step.

Usage: python benchmarks/probe_isolation.py
"""

from __future__ import annotations

import sys
import time

import torch

from kevin_backend.judge.candidate_process import Launcher, RemoteModel, shared_folder

TASK = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x, w):
        return torch.sigmoid(x) * w + 1.0


def get_inputs():
    return [torch.randn(4096, 1024), torch.randn(4096, 1024)]


def get_init_inputs():
    return []
'''

CANDIDATE = '''
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x, w):
        return torch.empty_like(x).fill_(1.0)
'''


def main() -> int:
    device = torch.device("cuda")
    torch.empty(1, device=device)
    t = time.perf_counter()
    launcher = Launcher(device, shared_folder())
    print(f"fork server up: {time.perf_counter() - t:.3f} s", flush=True)
    time.sleep(3)  # the spare's CUDA start
    for attempt in range(4):
        steps = []
        t0 = t = time.perf_counter()
        remote = RemoteModel(launcher.take(), device, launcher.folder, time.monotonic() + 120)
        try:
            remote.load({"mode": "candidate", "candidate": CANDIDATE, "task": TASK, "seed": 1})
        except Exception as exc:  # noqa: BLE001
            print("load failed:", getattr(exc, "outcome", exc), remote.process.stderr(40), flush=True)
            raise
        steps.append(("take + load", time.perf_counter() - t))
        x, w = torch.randn(4096, 1024, device=device), torch.randn(4096, 1024, device=device)
        t = time.perf_counter()
        out, after, computed = remote.call([x, w], audit=True)
        steps.append(("first call (arena shared)", time.perf_counter() - t))
        t = time.perf_counter()
        for _ in range(5):
            out, after, computed = remote.call([x, w], audit=True)
        steps.append(("5 calls", time.perf_counter() - t))
        t = time.perf_counter()
        remote.close()
        steps.append(("close", time.perf_counter() - t))
        print(f"attempt {attempt}: total {time.perf_counter() - t0:.3f} s; " + "; ".join(f"{k} {v:.3f}" for k, v in steps),
              float(out[0][0, 0]), computed, flush=True)
        time.sleep(1.0)
    launcher.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
