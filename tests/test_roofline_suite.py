"""The roofline suite's tasks are well-formed KernelBench programs at the sizes they claim: each
loads, builds its inputs on the CPU (checked here on meta tensors, so nothing of those sizes is
allocated), holds between 64 MiB and 8 GiB of input storage, and its forward runs on them. The
suite covers every category, every dtype, a non-contiguous input, int64 targets, reductions over
each dim of a 3-D tensor, forwards with several outputs, the odd sizes where the tail was, and
the shapes of issue 35's comparison with QuACK. What the built-in writer plans or declines is
printed, not judged."""

from __future__ import annotations

import ast
import re
from typing import Any

import pytest
import torch
import torch.utils._pytree as pytree

from kevin_backend.generate.builtin.plan import Declined, Plan
from kevin_backend.generate.builtin.planner import plan_task
from kevin_backend.generate.builtin.roofline_suite import CATEGORIES, ROOFLINE_SUITE, task_bytes
from kevin_backend.types import load_program

MiB, GiB = 2**20, 2**30
TASKS = {task.name: task for task in ROOFLINE_SUITE}


def _meta(source: str, name: str) -> tuple[list[torch.Tensor], Any]:
    module = load_program(source, "roofline_" + re.sub(r"\W", "_", name))
    assert module.get_init_inputs() == []
    with torch.device("meta"):
        inputs = list(module.get_inputs())
        model = module.Model()
        out = model(*inputs)
    assert not list(model.parameters()) and not list(model.buffers())
    return inputs, out


def _get_inputs_source(source: str) -> str:
    tree = ast.parse(source)
    (fn,) = [node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == "get_inputs"]
    return ast.get_source_segment(source, fn) or ""


def _reduced_dims(source: str) -> set[int]:
    """The dims named by `dim=` in the forward of a task over a 3-D input."""
    return {int(d) for d in re.findall(r"\bdim=(-?\d)", source.split("def get_inputs")[0])}


@pytest.mark.parametrize("name", list(TASKS))
def test_task_is_well_formed(name: str) -> None:
    source = TASKS[name].source
    assert TASKS[name].category in CATEGORIES
    for line in ("import torch\n", "import torch.nn as nn\n", "import torch.nn.functional as F\n"):
        assert line in source
    made = _get_inputs_source(source)
    assert not re.search(r"device\s*=|\.cuda\(|\.to\(", made), made  # made on the CPU

    inputs, out = _meta(source, name)
    assert inputs and all(isinstance(t, torch.Tensor) and t.device.type == "meta" for t in inputs)
    held = sum(t.untyped_storage().nbytes() for t in inputs)
    assert 64 * MiB <= held <= 8 * GiB, f"{name}: {held / MiB:.1f} MiB of inputs"
    assert all(isinstance(t, torch.Tensor) for t in pytree.tree_leaves(out))
    assert task_bytes(source)[0] == held


def test_suite_coverage() -> None:
    assert len(ROOFLINE_SUITE) >= 60
    assert len(TASKS) == len(ROOFLINE_SUITE), "task names are unique"
    assert {t.category for t in ROOFLINE_SUITE} == set(CATEGORIES)

    dtypes: set[torch.dtype] = set()
    strided = int64 = 0
    dims3d: set[int] = set()
    several = 0
    for task in ROOFLINE_SUITE:
        inputs, out = _meta(task.source, task.name)
        several += isinstance(out, tuple) and len(out) >= 2
        dtypes |= {t.dtype for t in inputs}
        strided += any(not t.is_contiguous() for t in inputs)
        int64 += any(t.dtype == torch.int64 for t in inputs)
        if task.category == "reduction" and inputs[0].dim() == 3:
            dims3d |= _reduced_dims(task.source)
    assert {torch.float32, torch.float16, torch.bfloat16} <= dtypes
    assert strided >= 1 and int64 >= 1
    assert {0, 1, 2} <= dims3d
    assert several >= 4  # max and indices, max and sum, variance and mean, a norm and its residual stream


# Issue 35's comparison with QuACK: (what, dtype, rows, columns) of each shape it measured
QUACK_TABLE = [("softmax", torch.float32, 4096, 393216), ("rmsnorm", torch.float32, 4096, 393216),
               ("softmax", torch.bfloat16, 32768, 16384), ("softmax", torch.bfloat16, 32768, 65536),
               ("rmsnorm", torch.bfloat16, 32768, 65536), ("rmsnorm", torch.bfloat16, 32768, 16384),
               ("softmax", torch.float32, 16384, 8192), ("crossentropy", torch.bfloat16, 16384, 131072),
               ("crossentropy", torch.float32, 8192, 50257), ("crossentropy", torch.bfloat16, 16384, 50257)]


@pytest.mark.parametrize(("what", "dtype", "rows", "columns"), QUACK_TABLE)
def test_the_shapes_compared_with_quack_are_in_the_suite(what: str, dtype: torch.dtype, rows: int, columns: int) -> None:
    found = []
    for task in ROOFLINE_SUITE:
        if task.name.startswith(what + "-"):
            x = _meta(task.source, task.name)[0][0]
            if x.dtype == dtype and tuple(x.shape) == (rows, columns) and x.is_contiguous():
                found.append(task.name)
    assert len(found) == 1, found


@pytest.mark.parametrize("columns", [50257, 65535, 393216, 64, 4_194_304])
def test_rows_of_the_tail_sizes_are_kept(columns: int) -> None:
    """Rows of the odd sizes and of both ends of the range, in more than one task each."""
    have = [t.name for t in ROOFLINE_SUITE if _meta(t.source, t.name)[0][0].shape[-1] == columns]
    assert len(have) >= 2, have


def test_writer_plans_or_declines() -> None:
    """Which tasks the built-in writer takes on, and why it declines the rest (printed: run with -s)."""
    rows = []
    for task in ROOFLINE_SUITE:
        plan = plan_task(task.source)
        assert isinstance(plan, (Plan, Declined)), type(plan)
        rows.append((task.name, "declined" if isinstance(plan, Declined) else "planned",
                     plan.reason if isinstance(plan, Declined) else ""))
    width = max(len(name) for name, _, _ in rows)
    print(f"\n{'task':<{width}}  {'writer':<8}  reason")
    for name, verdict, reason in rows:
        print(f"{name:<{width}}  {verdict:<8}  {reason[:160]}")
    print(f"{sum(v == 'planned' for _, v, _ in rows)} planned, {sum(v == 'declined' for _, v, _ in rows)} declined")
