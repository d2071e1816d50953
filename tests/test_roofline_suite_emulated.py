"""The roofline suite's tasks added for issue 35, each at a small size, through the built-in
writer's plan and its kernels run on the CPU (tests/kernel_emulator.py) against PyTorch: the
task's own program with only its size constants made small (odd sizes stay odd, multiples of
three stay so), so the forward, the dtypes and the input layouts are the suite's. For each: the
variant the search tries first at the small size and at the suite's size, the plain kernel,
and (rows that are long in the suite) a row spread over a cluster of two blocks. The full-size
task itself must be planned, not declined."""

from __future__ import annotations

import re
import shutil

import pytest
import torch

from kernel_emulator import emulate, has_cuda_headers
from kevin_backend.generate.builtin.host_function import returned
from kevin_backend.generate.builtin.plan import Plan
from kevin_backend.generate.builtin.planner import plan_task
from kevin_backend.generate.builtin.program import write_program
from kevin_backend.generate.builtin.roofline_suite import ROOFLINE_SUITE
from kevin_backend.generate.builtin.variant_ranking import preferred_order
from kevin_backend.generate.builtin.variants import VARIANTS_ROWS, variant_named
from kevin_backend.measure.compare import FALLBACK_RTOL
from kevin_backend.types import load_program

TASKS = {task.name: task for task in ROOFLINE_SUITE}
ROWS = {v.name: v for v in VARIANTS_ROWS}

# task -> (its size constants at a size the emulator runs in seconds, also a cluster of two blocks)
SMALL: dict[str, tuple[dict[str, int], bool]] = {
    "rmsnorm-last-f32-4096x393216": ({"batch_size": 3, "dim": 3 * 1024}, True),
    "rmsnorm-last-bf16-32768x16384": ({"batch_size": 3, "dim": 2048}, False),
    "rmsnorm-last-bf16-32768x65536": ({"batch_size": 3, "dim": 4096}, True),
    "rmsnorm-last-f16-1Mx64": ({"batch_size": 37, "dim": 64}, False),
    "layernorm-last-bf16-16384x8192": ({"batch_size": 5, "dim": 1024}, False),
    "add-rmsnorm-bf16-32768x4096": ({"batch_size": 5, "dim": 1024}, True),
    "softmax-last-f32-16384x8192": ({"batch_size": 5, "dim": 1024}, False),
    "softmax-last-bf16-32768x16384": ({"batch_size": 3, "dim": 2048}, False),
    "softmax-last-bf16-32768x65536": ({"batch_size": 3, "dim": 4096}, True),
    "softmax-last-bf16-16x4M": ({"batch_size": 2, "dim": 40000}, True),
    "softmax-dim0-bf16-4096x16384": ({"batch_size": 65, "dim": 40}, False),
    "logsoftmax-last-bf16-8192x50257": ({"batch_size": 3, "dim": 2057}, True),
    "max-sum-last-f32-16384x16384": ({"batch_size": 5, "dim": 1024}, True),
    "var-mean-last-f32-8192x65535": ({"batch_size": 3, "dim": 4095}, True),
    "crossentropy-f32-8192x50257": ({"batch_size": 3, "num_classes": 2057}, True),
    "crossentropy-bf16-16384x131072": ({"batch_size": 3, "num_classes": 4096}, True),
    "rmsnorm-channels-last-bf16-32x64x64x512": ({"batch_size": 2, "channels": 40, "height": 3, "width": 7}, False),
}


def small_source(name: str) -> str:
    """The suite task's program with its size constants replaced (each must be there)."""
    source = TASKS[name].source
    for constant, value in SMALL[name][0].items():
        source, found = re.subn(rf"^{constant} = .*$", f"{constant} = {value}", source, flags=re.M)
        assert found == 1, (name, constant)
    return source


def _variants(name: str) -> list[str]:
    full = plan_task(TASKS[name].source)
    small = plan_task(small_source(name))
    assert isinstance(full, Plan) and isinstance(small, Plan), (name, full, small)
    mine = [v for v in preferred_order(small) if ROWS[v].cluster == 1]
    theirs = [v for v in preferred_order(full) if ROWS[v].cluster == 1]
    names = [mine[0], "t256", theirs[0]]  # (a second at the small size: 15 cases, 30 s of CI, no kind not covered)
    if SMALL[name][1]:  # the suite's order puts clusters last for these rows: its first of two blocks
        names.append(next(v for v in preferred_order(full) if ROWS[v].cluster == 2))
    return list(dict.fromkeys(names))


def test_every_added_task_has_a_small_size() -> None:
    assert set(SMALL) <= set(TASKS) and len(SMALL) == 17
    for name in SMALL:
        assert isinstance(plan_task(TASKS[name].source), Plan), name  # planned at the suite's size


CASES = [(name, variant) for name in SMALL for variant in _variants(name)]


@pytest.mark.skipif(shutil.which("g++") is None or not has_cuda_headers(), reason="needs g++ and CUDA's headers")
@pytest.mark.parametrize(("name", "variant"), CASES, ids=[f"{n}-{v}" for n, v in CASES])
def test_added_task_kernel_matches_pytorch_on_the_cpu(name: str, variant: str, tmp_path) -> None:  # type: ignore[no-untyped-def]
    source = small_source(name)
    plan = plan_task(source)
    assert isinstance(plan, Plan)
    module = load_program(source, "emulated_roofline_" + re.sub(r"\W", "_", name))
    torch.manual_seed(0)
    inputs = list(module.get_inputs())
    want = module.Model()(*inputs)
    want = list(want) if isinstance(want, (tuple, list)) else [want]
    program = write_program(plan, variant_named(plan, variant))
    got = emulate(program, inputs, returned(plan), workdir=tmp_path)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        w = w.reshape(g.shape)
        assert g.dtype == w.dtype
        tol = FALLBACK_RTOL.get(w.dtype, 1e-4)  # KernelBench's tolerances
        close = torch.isclose(g.double(), w.double(), rtol=tol, atol=tol, equal_nan=True)
        assert close.all(), (f"{variant}: {(~close).sum().item()} of {close.numel()} elements differ; "
                             f"max abs error {(g.double() - w.double()).abs().max().item():.3g}")
