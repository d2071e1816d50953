"""The GEMM-epilogue suite's tasks are KernelBench programs that do what their names and docstrings
say: each loads, makes its inputs on the CPU (run here on meta tensors, so nothing of the suite's
sizes is allocated), its forward runs, returns the shapes and dtype of its `Output:` line, and
reaches a matmul or a convolution (the aten ops the forward dispatches are recorded) in the dtype
its name says. The suite holds at least 30 tasks of every category, at
least 8 convolutions, f32, f16 and bf16, weights as parameters and as forward inputs, and the
sizes the issue asks for."""

from __future__ import annotations

import ast
import functools
import re
from dataclasses import dataclass
from typing import Any

import pytest
import torch
import torch.utils._pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from kevin_backend.generate.builtin.gemm_suite import CATEGORIES, GEMM_SUITE
from kevin_backend.types import load_program

TASKS = {task.name: task for task in GEMM_SUITE}
aten = torch.ops.aten
MATMULS = {aten.mm.default, aten.addmm.default, aten.bmm.default, aten.baddbmm.default, aten.convolution.default}
DTYPES = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}


class _Recorder(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: set[Any] = set()
        self.matmul_dtypes: set[torch.dtype] = set()  # of the tensors a matmul or convolution takes

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        self.ops.add(func)
        if func in MATMULS:
            self.matmul_dtypes |= {a.dtype for a in pytree.tree_leaves(args) if isinstance(a, torch.Tensor)}
        return func(*args, **(kwargs or {}))


@dataclass(frozen=True)
class Run:
    inputs: list[Any]
    outputs: list[torch.Tensor]
    ops: frozenset[Any]
    matmul_dtypes: frozenset[torch.dtype]
    parameters: list[torch.Tensor]


@functools.lru_cache(maxsize=None)
def _run(name: str) -> Run:
    """The task's forward on meta tensors: its inputs, outputs, the aten ops it dispatched."""
    module = load_program(TASKS[name].source, "gemm_suite_" + re.sub(r"\W", "_", name))
    with torch.device("meta"):
        inputs = list(module.get_inputs())
        model = module.Model(*module.get_init_inputs())
        recorder = _Recorder()
        with recorder, torch.no_grad():
            out = model(*inputs)
    outputs = [t for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]
    return Run(inputs, outputs, frozenset(recorder.ops), frozenset(recorder.matmul_dtypes), list(model.parameters()))


def _claimed(source: str) -> tuple[list[list[int]], list[torch.dtype]]:
    """The shapes and dtypes of the Model docstring's `Output:` line: each shape's dtype after it,
    or one after them all."""
    line = re.search(r"^\s*Output: (.*)$", source, re.M)
    assert line, "the docstring names no output"
    found = re.findall(r"(\[[\d, ]*\])\s*([a-z]\w*)?", line.group(1))
    last = getattr(torch, line.group(1).rstrip(")").split()[-1])
    return ([[int(d) for d in re.findall(r"\d+", s)] for s, _ in found],
            [getattr(torch, dtype) if dtype else last for _, dtype in found])


def _made_on_cpu(source: str) -> str:
    (fn,) = [n for n in ast.parse(source).body if isinstance(n, ast.FunctionDef) and n.name == "get_inputs"]
    return ast.get_source_segment(source, fn) or ""


@pytest.mark.parametrize("name", list(TASKS))
def test_task_does_what_it_says(name: str) -> None:
    source = TASKS[name].source
    assert TASKS[name].category in CATEGORIES
    for line in ("import torch\n", "import torch.nn as nn\n", "import torch.nn.functional as F\n", "def get_init_inputs():"):
        assert line in source
    assert not re.search(r"device\s*=|\.cuda\(|\.to\(", _made_on_cpu(source))

    run = _run(name)
    shapes, dtypes = _claimed(source)
    assert [list(t.shape) for t in run.outputs] == shapes
    assert [t.dtype for t in run.outputs] == dtypes
    assert run.ops & MATMULS, f"no matmul or convolution in {sorted(map(str, run.ops))}"
    named = DTYPES[next(part for part in name.split("-") if part in DTYPES)]
    assert run.matmul_dtypes == {named}, run.matmul_dtypes
    assert all(p.dtype == named for p in run.parameters)


def test_suite_coverage() -> None:
    assert len(GEMM_SUITE) >= 30 and len(TASKS) == len(GEMM_SUITE), "at least 30 tasks, names unique"
    count = {c: sum(t.category == c for t in GEMM_SUITE) for c in CATEGORIES}
    assert count["conv"] >= 8 and min(count.values()) >= 4, count
    runs = {name: _run(name) for name in TASKS}
    assert {d for name in TASKS for d in DTYPES if f"-{d}-" in name} == set(DTYPES)
    with_parameters = [n for n, r in runs.items() if r.parameters]
    weights_as_inputs = [n for n, r in runs.items() if not r.parameters]
    assert len(with_parameters) >= 10 and len(weights_as_inputs) >= 10
    ops = set().union(*(r.ops for r in runs.values()))
    assert {aten.mm.default, aten.addmm.default, aten.bmm.default, aten.baddbmm.default, aten.convolution.default} <= ops
    transposed = [n for n, r in runs.items() if "conv-transpose" in n]
    assert len(transposed) >= 2
    dims = [[int(d) for d in m.split("x")] for n in TASKS if (m := n.rsplit("-", 1)[1]) and "x" in m]
    assert max(max(d) for d in dims) >= 16384 and any(8192 in d for d in dims)
    assert any(50257 in d for d in dims) and any(d % 8 for ds in dims for d in ds if d > 100)  # vocab, awkward sizes
    assert any(not t.is_contiguous() for r in runs.values() for t in r.inputs if isinstance(t, torch.Tensor))
    assert any(len(r.outputs) == 3 for r in runs.values())  # Q, K and V


def test_the_convolution_goals_tasks_are_those_whose_epilogue_moves_a_fifth_of_the_convolutions_bytes() -> None:
    # what a convolution's epilogue moves as a kernel of its own (its output read, the tensors it
    # reads, the task's output written) over what the convolution moves: every suite convolution
    # counts; one whose output is far smaller than its input (64 -> 1 channel, stride 4) does not
    from kevin_backend.generate.builtin.gemm_suite import epilogue_share
    from test_gemm_plan import task

    shares = {t.name: epilogue_share(t.source) for t in GEMM_SUITE if t.category == "conv"}
    assert all(share is not None and share >= 0.2 for share in shares.values()), shares
    # a 3x3 f16 convolution 128 -> 128 of 128 images of 32 x 32, padded: its input and output the same size;
    # the epilogue reads that output and writes one as large
    image = 128 * 128 * 32 * 32 * 2
    assert shares["conv2d-hardswish-f16-128x128x32x32"] == pytest.approx(2 * image / (2 * image + 128 * 128 * 9 * 2 + 128 * 2))
    small = epilogue_share(task("torch.relu(F.conv2d(v[0], v[1], stride=4))", "torch.randn(8, 64, 64, 64), torch.randn(1, 64, 3, 3)"))
    assert small is not None and small < 0.05, small
    assert epilogue_share(task("torch.relu(v[0] @ v[1])", "torch.randn(64, 32), torch.randn(32, 16)")) is None
