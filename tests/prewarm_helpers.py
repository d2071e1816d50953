"""Plug-ins for the prewarm tests: generators (loaded by prewarm's worker processes by name) and
a model factory. A generator appends each task it is asked for to the file named by
KEVIN_TEST_GENERATOR_LOG, so a test can see what was generated, and when."""

from __future__ import annotations

import os
import time
from types import SimpleNamespace
from typing import Any

import torch

from conftest import ReferenceGenerator


class _Logged(ReferenceGenerator):
    def __init__(self, delay: float = 0.0) -> None:
        super().__init__()
        self.delay = delay
        self.log = os.environ.get("KEVIN_TEST_GENERATOR_LOG")
        self.results: list[SimpleNamespace] = []  # as a SearchGenerator's: the time each task waited on whom

    def generate(self, task: Any, key: Any) -> Any:
        time.sleep(self.delay)
        entry = super().generate(task, key)
        self.results.append(SimpleNamespace(model_seconds=self.delay, judge_seconds=0.25))
        if self.log:
            with open(self.log, "a") as f:
                f.write(f"{key.digest} {os.getpid()}\n")
        return entry


def reference() -> _Logged:
    return _Logged()


def slow() -> _Logged:
    return _Logged(delay=1.5)


def stuck() -> _Logged:
    """A search that runs for minutes (a worker's lifeline is tested while it is in one)."""
    return _Logged(delay=300.0)


def mlp() -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.LayerNorm(64), torch.nn.GELU(), torch.nn.Linear(64, 16))
    return model, (torch.randn(8, 32),)


def task_program(i: int) -> str:
    return f'''import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x, y):
        return torch.sigmoid(x) * y + {i}.0


def get_inputs():
    return [torch.randn(16, 32), torch.randn(16, 32)]


def get_init_inputs():
    return []
'''
