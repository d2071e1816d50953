"""The built-in writer's kernels computed on the CPU (tests/kernel_emulator.py: the device code as
written, one fiber per CUDA thread) against PyTorch, on small versions of the suite's
tasks: every kind of row kernel (block, warp and half-warp rows, the row in registers or not,
4- and 8-wide accesses, partial rows in the last block) and of pointwise kernel (vector path with
a tail, per-channel values, strided and boolean inputs). For each task the variants the search
tries first and the one it tries last (for pointwise, also those with several strips per thread). The judge on a GPU remains what accepts a kernel; this
catches a wrong index or a wrong formula without one."""

from __future__ import annotations

import functools
import shutil

import pytest
import torch

from conftest import builtin_partitions
from kernel_emulator import emulate, has_cuda_headers
from kevin_backend.generate.builtin.plan import Plan
from kevin_backend.generate.builtin.planner import plan_task
from kevin_backend.generate.builtin.host_function import returned
from kevin_backend.generate.builtin.program import write_program
from kevin_backend.generate.builtin.variant_fit import can_vectorize_rows, strided_rows
from kevin_backend.generate.builtin.variant_ranking import preferred_order
from kevin_backend.generate.builtin.variants import VARIANTS_ROWS, Variant, variant_named
from kevin_backend.generate.builtin.suite import SuiteTask, _task
from kevin_backend.measure.compare import FALLBACK_RTOL
from kevin_backend.types import load_program

pytestmark = pytest.mark.skipif(shutil.which("g++") is None or not has_cuda_headers(), reason="needs g++ and CUDA's headers")

ROWS = {v.name: v for v in VARIANTS_ROWS}  # the variants by name
R = 5  # rows: not a multiple of the rows a block takes
CASES: list[SuiteTask] = [
    _task("sum-f32", "reduction", "x.sum(-1)", [(R, 1024)], "f32"),
    _task("mean-f16", "reduction", "x.mean(-1, keepdim=True)", [(R, 1024)], "f16"),
    _task("amax-bf16", "reduction", "x.amax(-1)", [(R, 1024)], "bf16"),
    _task("amin-f32-odd", "reduction", "x.amin(-1)", [(3, 1023)], "f32"),
    _task("var-mean-f32", "reduction", "torch.var_mean(x, -1, keepdim=True)", [(R, 1024)], "f32"),
    _task("sum-exp-f32", "reduction", "x.exp().sum(-1)", [(R, 1024)], "f32"),
    _task("center-f16", "reduction", "x - x.mean(-1, keepdim=True)", [(R, 1024)], "f16"),
    _task("long-rows-sum-f32", "reduction", "x.sum(-1)", [(2, 65536)], "f32"),
    _task("softmax-f32", "norm", "torch.softmax(x, -1)", [(R, 1024)], "f32"),
    _task("softmax-f16", "norm", "torch.softmax(x, -1)", [(9, 512)], "f16"),
    _task("softmax-f32-odd", "norm", "torch.softmax(x, -1)", [(3, 1001)], "f32"),
    _task("softmax-short-rows-f32", "norm", "torch.softmax(x, -1)", [(37, 64)], "f32"),
    _task("log-softmax-bf16", "norm", "torch.log_softmax(x, -1)", [(R, 1024)], "bf16"),
    _task("logsumexp-f32", "norm", "torch.logsumexp(x, -1)", [(R, 1024)], "f32"),
    _task("layernorm-affine-f16", "norm", "F.layer_norm(x, (768,), y, z)", [(R, 768), (768,), (768,)], "f16"),
    _task("layernorm-odd-f32", "norm", "F.layer_norm(x, (777,))", [(3, 777)], "f32"),
    # the variance in one read (moments about the row's first value): values far from zero keep it
    _task("layernorm-offset-f32", "norm", "F.layer_norm(x + 100.0, (4096,))", [(R, 4096)], "f32"),
    _task("rmsnorm-bf16", "norm", "(x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6)).to(torch.bfloat16) * y",
          [(3, 4096), (4096,)], "bf16"),
    _task("l2-normalize-f32", "norm", "x / torch.sqrt((x * x).sum(-1, keepdim=True) + 1e-12)", [(R, 1024)], "f32"),
    _task("residual-layernorm-f16", "norm", "F.layer_norm(x + y, (1024,))", [(R, 1024), (R, 1024)], "f16"),
    _task("gated-bf16", "chain3+", "torch.sigmoid(x) * y + 1.0", [(16, 64), (16, 64)], "bf16"),
    _task("mul-bf16-odd", "chain1", "x * y", [(31, 33), (31, 33)], "bf16"),
    _task("hardswish-f32-odd", "chain2", "F.hardswish(x) - y", [(7, 25), (7, 25)], "f32"),
    _task("bias-relu-scale-f16", "chain3+", "torch.relu(x + y) * 0.5", [(16, 64), (64,)], "f16"),
    _task("row-scale-f32", "chain3+", "(x - y) * z", [(16, 64), (16, 1), (16, 1)], "f32"),
    _task("transposed-input-f32", "chain3+", "torch.sigmoid(m0) * x + 1.0", [(40, 24)], "f32",
          ["torch.randn(24, 40, device='cuda').t()"]),
    _task("mask-where-f32", "chain3+", "torch.where(m0, x * 2.0, torch.exp(-x))", [(16, 64)], "f32",
          ["torch.rand(16, 64, device='cuda') > 0.5"]),
    _task("batchnorm-relu-f32", "chain3+",
          "torch.relu((x - y[:, None, None]) * torch.rsqrt(z + 1e-5)[:, None, None] * w[:, None, None] + v[:, None, None])",
          [(2, 8, 5, 4), (8,), (8,), (8,), (8,)], "f32"),
    _task("channel-bias-gelu-f16", "chain2", "F.gelu(x + y.view(1, -1, 1, 1))", [(2, 8, 3, 4), (8,)], "f16"),
    _task("six-ops-bf16-odd", "chain3+", "torch.sigmoid(-torch.abs(x - y) * 3.0 + 1.0) * z", [(21, 23)] * 3, "bf16"),
    # 16-bit outputs: KEVIN_FAST_MATH's formulas (tanh through exp, log(1 + e^x)), over a range that
    # saturates tanh and sigmoid and takes softplus past its threshold both ways
    _task("fast-math-chain-bf16", "chain3+",
          "torch.tanh(F.softplus(x * 12.0)) * torch.sigmoid(y * 30.0) + F.silu(x * 30.0) + F.mish(y) + F.gelu(x, approximate='tanh')",
          [(16, 64), (16, 64)], "bf16"),
    _task("fast-math-tanh-f16", "chain2", "torch.tanh(x * 0.001) * 1000.0 + torch.tanh(y * 20.0)", [(16, 64), (16, 64)], "f16"),
    # reductions over other dimensions than the last, several, all; index reductions; std
    _task("sum-dim0-f32", "reduction", "x.sum(0)", [(37, 6, 33)], "f32"),
    _task("mean-dim1-keepdim-f16", "reduction", "x.mean(1, keepdim=True)", [(3, 40, 33)], "f16"),
    _task("amax-dims02-f32", "reduction", "x.amax((0, 2))", [(3, 7, 45)], "f32"),
    _task("sum-all-f32", "reduction", "x.sum()", [(9, 130)], "f32"),
    _task("std-dim1-f32", "reduction", "x.std(1)", [(4, 50, 9)], "f32"),
    _task("var-mean-dims12-bf16", "reduction", "torch.var_mean(x, (1, 2), correction=0)", [(3, 10, 21)], "bf16"),
    _task("argmax-dim1-f32", "reduction", "x.argmax(1)", [(4, 77, 5)], "f32"),
    _task("argmin-last-f16", "reduction", "x.argmin(-1, keepdim=True)", [(6, 300)], "f16"),
    _task("max-dim0-f32", "reduction", "torch.max(x, 0)", [(70, 3, 11)], "f32"),
    _task("min-dim2-bf16", "reduction", "torch.min(x, 2)", [(3, 5, 129)], "bf16"),
    _task("argmax-all-f32", "reduction", "x.argmax()", [(7, 91)], "f32"),
    _task("softmax-dim1-f32", "norm", "torch.softmax(x, 1)", [(2, 300, 17)], "f32"),
    _task("log-softmax-dim0-bf16", "norm", "torch.log_softmax(x, 0)", [(65, 40)], "bf16"),
    _task("rmsnorm-dim1-f32", "norm", "x / torch.sqrt(torch.mean(x ** 2, dim=1, keepdim=True) + 1e-5)", [(2, 24, 5, 7)], "f32"),
    _task("instance-stats-f32", "norm", "(x - x.mean((2, 3), keepdim=True)) * torch.rsqrt(x.var((2, 3), keepdim=True, correction=0) + 1e-5)",
          [(2, 3, 9, 11)], "f32"),
    _task("l2-normalize-dim0-f16", "norm", "x / torch.linalg.vector_norm(x, 2, 0, keepdim=True)", [(130, 24)], "f16"),
    _task("frobenius-f32", "norm", "x / torch.norm(x, p='fro')", [(13, 29)], "f32"),
    _task("softmax-transposed-f32", "norm", "torch.softmax(m0, -1)", [], "f32", ["torch.randn(70, 20, device='cuda').t()"]),
    # inputs read through views that move their dimensions; norms and losses built on them
    _task("transpose-contiguous-f32", "chain1", "x.transpose(1, 2).contiguous()", [(3, 10, 7)], "f32"),
    _task("permute-mul-f16", "chain2", "x.permute(0, 2, 1) * y", [(3, 10, 7), (3, 7, 10)], "f16"),
    _task("view-merge-softmax-f32", "norm", "torch.softmax(x.view(6, 70), -1)", [(6, 7, 10)], "f32"),
    # a batch of one viewed in (as a compiled model at batch size 1 views a matmul's rows back): the same
    # elements in the same order
    _task("view-batch-of-one-gelu-f32", "chain3+", "F.gelu(x.view(1, 12, 40)) * y", [(12, 40), (1, 12, 40)], "f32"),
    _task("view-batch-of-one-tanh-bf16", "chain2", "torch.tanh(x.view(1, 12, 40) * 0.5) + 1.0", [(12, 40)], "bf16"),
    _task("batchnorm-inference-f32", "norm", "F.batch_norm(x, y, z.abs() + 0.5, w, v, training=False, eps=1e-5)",
          [(2, 8, 5, 4), (8,), (8,), (8,), (8,)], "f32"),
    _task("instancenorm-f32", "norm", "F.instance_norm(x)", [(2, 3, 9, 11)], "f32"),
    _task("kl-div-f32", "loss", "F.kl_div(torch.log(m0), m1, reduction='batchmean')", [], "f32",
          ["torch.rand(6, 40, device='cuda').softmax(-1)", "torch.rand(6, 40, device='cuda').softmax(-1)"]),
    _task("mse-f32", "loss", "F.mse_loss(x, y)", [(5, 300), (5, 300)], "f32"),
    # an input transposed against the output: 32 x 32 tiles through shared memory, partial tiles at the edges
    _task("tiled-transpose-f16", "chain1", "x.transpose(1, 2).contiguous()", [(2, 45, 70)], "f16"),
    _task("tiled-permute-bias-f32", "chain3+", "torch.relu(x.permute(0, 2, 1) + y) * z", [(3, 40, 33), (40,), (3, 33, 40)], "f32"),
    _task("tiled-transposed-input-bf16", "chain3+", "torch.sigmoid(m0) * x + 1.0", [(40, 48)], "bf16",
          ["torch.randn(48, 40, device='cuda', dtype=torch.bfloat16).t()"]),
    # 16-bit values, the plane's sides even: 64 x 64 tiles read and written two values an access,
    # partial tiles at the edges, an input read two along the output's rows and one broadcast over them
    _task("tiled-pairs-permute-bias-f16", "chain3+", "torch.relu(x.permute(0, 2, 1) + y) * z", [(3, 70, 66), (70,), (3, 66, 70)], "f16"),
    # a full value seen in another shape of the same order: group norm's affine over [N, C, H, W]
    _task("groupnorm-affine-f32", "norm", "F.group_norm(x, 4, y, z, eps=1e-5)", [(2, 8, 5, 6), (8,), (8,)], "f32"),
    _task("groupnorm-affine-bf16", "norm", "F.group_norm(x, 2, y, z)", [(3, 6, 4, 9), (6,), (6,)], "bf16"),
    # few long rows, each split over several blocks (split.py)
    _task("split-layernorm-f32", "norm", "F.layer_norm(x, (40000,))", [(3, 40000)], "f32"),
    _task("split-softmax-f16", "norm", "torch.softmax(x, -1)", [(2, 20000)], "f16"),
    # (a softmax over 20000 values is about 5e-5 each, under the tolerance; its log shows the sum)
    _task("split-log-softmax-f32", "norm", "torch.log_softmax(x * 4.0, -1)", [(2, 20000)], "f32"),
    _task("split-sum-all-f32", "reduction", "x.sum()", [(7, 10000)], "f32"),
    # 73 chunks: the combine's warp takes two or three a lane, then its shuffle tree; two sums' levels
    _task("split-max-plus-sum-f32", "reduction", "x.amax() + x.sum()", [(1, 300_000)], "f32"),
    _task("split-var-mean-bf16", "reduction", "torch.var_mean(x, -1)", [(3, 17000)], "bf16"),
    _task("split-max-dim0-f32", "reduction", "torch.max(x, 0)", [(20000, 3)], "f32"),
    _task("split-argmin-all-f32", "reduction", "x.argmin()", [(50, 400)], "f32"),
    _task("split-mse-f32", "loss", "F.mse_loss(x, y)", [(4, 5000), (4, 5000)], "f32"),
    _task("split-std-dims12-f32", "reduction", "x.std((1, 2))", [(2, 150, 130)], "f32"),
    # one pass of shifted moments per chunk: values far from zero (mean 100, deviation 1) keep their variance
    _task("split-layernorm-offset-f32", "norm", "F.layer_norm(x + 100.0, (40000,))", [(3, 40000)], "f32"),
    # rows across memory with outputs along them: written through shared-memory tiles (partial tiles, partial blocks)
    _task("layernorm-channels-last-f16", "norm", "F.layer_norm(m0, (40,), x, y)", [(40,), (40,)], "f16",
          ["torch.randn(2, 40, 3, 7, device='cuda', dtype=torch.float16).permute(0, 2, 3, 1)"]),
    _task("l2norm-transposed-rows-f32", "norm", "m0 / torch.norm(m0, p=2, dim=1, keepdim=True)", [], "f32",
          ["torch.randn(45, 37, device='cuda').t()"]),
    # the max and the sum of exponentials in one read of the row (online softmax): -inf entries, a
    # range wide enough that every new maximum rescales the running sum
    _task("softmax-masked-f32", "norm", "torch.softmax(x.masked_fill(m0, float('-inf')), -1)", [(R, 1024)], "f32",
          ["torch.rand(5, 1024, device='cuda') > 0.7"]),
    _task("softmax-wide-range-f32", "norm", "torch.softmax(x * 40.0, -1)", [(R, 1024)], "f32"),
    # the online softmax over float rows mostly -inf (a float mask added): whole steps of a
    # thread's columns are -inf before its max is finite, and add nothing
    _task("softmax-mostly-masked-f32", "norm", "torch.softmax(x + m0, -1)", [(R, 1024)], "f32",
          ["torch.where(torch.rand(5, 1024, device='cuda') > 0.3, float('-inf'), 0.0)"]),
    # the max an output too, in rows holding a NaN (NaN, as torch's), written out by hand
    _task("max-and-softmax-nan-f32", "norm",
          "(lambda z: (lambda m: (m, (z - m).exp() / (z - m).exp().sum(-1, keepdim=True)))(z.amax(-1, keepdim=True)))"
          "(x.masked_fill(m0, float('nan')))", [(R, 1024)], "f32",
          ["torch.rand(5, 1024, device='cuda') > 0.999"]),
    # short rows of 16-bit values: 8 threads a row, one 8-wide access each
    _task("layernorm-short-rows-bf16", "norm", "F.layer_norm(x, (64,))", [(37, 64)], "bf16"),
    # cross-entropy: int64 targets, the log-probability picked at each row's target, a final launch over the rows
    _task("cross-entropy-f32", "loss", "F.cross_entropy(x, m0)", [(37, 300)], "f32", ["torch.randint(0, 300, (37,), device='cuda')"]),
    _task("cross-entropy-bf16-ignore", "loss", "F.cross_entropy(x, m0, ignore_index=3)", [(40, 8)], "bf16",
          ["torch.randint(0, 8, (40,), device='cuda')"]),
    _task("cross-entropy-sum-f16", "loss", "F.cross_entropy(x, m0, reduction='sum')", [(9, 1000)], "f16",
          ["torch.randint(0, 1000, (9,), device='cuda')"]),
    _task("cross-entropy-none-f32", "loss", "F.cross_entropy(x, m0, reduction='none')", [(9, 64)], "f32",
          ["torch.randint(0, 64, (9,), device='cuda')"]),
]


@functools.cache
def _plan(source: str) -> Plan | str:
    """The task's plan, made once per process (the parametrisation below makes every case's at
    collection; a Plan is frozen, so the cases of one task share it)."""
    return plan_task(source)


def _variants(task: SuiteTask) -> list[tuple[SuiteTask, str]]:
    plan = _plan(task.source)
    assert isinstance(plan, Plan), (task.name, plan)
    order = preferred_order(plan)
    if plan.is_rows and not ROWS[order[0]].split:  # the split variants have cases of their own (and a
        order = [v for v in order if not ROWS[v].split]  # 1024-thread block per row is slow to emulate)
    if plan.is_rows:  # so do the cluster variants (test_a_row_over_a_cluster_matches_pytorch)
        order = [v for v in order if ROWS[v].cluster == 1]
    # the plain kernel; pointwise: several strips per thread, 4-wide or not
    extra = ["t256"] if plan.is_rows else ["t256", "t128-vector-items2", "t256-vector-items4"]
    last = [order[-1]]
    if plan.is_rows and strided_rows(plan):  # rows across a warp: one thread per row, and rows in registers
        # (the cluster-spread ones: test_rows_across_memory_spread_over_a_cluster_match_pytorch)
        # (and the blocks of 256 such rows, a few threads each)
        extra = [v.name for v in VARIANTS_ROWS if v.columns and (v.threads == 1 or v.cache or v.rows_per_block == 256) and v.cluster == 1]
        last = []  # (a 1024-thread block per row, over a few hundred rows, takes a minute to emulate)
    head = order[:2]
    if plan.is_rows and not strided_rows(plan) and order[0] != "t256":  # the ranked first, and the plain kernel in
        head = order[:1]  # `extra`: as many cases as when the plain kernel came first
    return [(task, v) for v in dict.fromkeys([*head, *last, *extra])]


def _reference(task: SuiteTask) -> tuple[Plan, list[torch.Tensor], list[torch.Tensor]]:
    """The task's plan, its inputs on the CPU and PyTorch's outputs for them."""
    plan = _plan(task.source)
    assert isinstance(plan, Plan)
    module = load_program(task.source.replace("device='cuda'", "device='cpu'"), "emulated_task")
    torch.manual_seed(0)
    inputs = list(module.get_inputs())
    want = module.Model()(*inputs)
    return plan, inputs, list(want) if isinstance(want, (tuple, list)) else [want]


@pytest.mark.parametrize(("task", "variant"), [p for t in CASES for p in _variants(t)], ids=lambda x: x if isinstance(x, str) else x.name)
def test_kernel_matches_pytorch_on_the_cpu(task: SuiteTask, variant: str, tmp_path) -> None:  # type: ignore[no-untyped-def]
    plan, inputs, want = _reference(task)
    program = write_program(plan, variant_named(plan, variant))
    got = emulate(program, inputs, returned(plan), workdir=tmp_path)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        w = w.reshape(g.shape)
        tol = FALLBACK_RTOL.get(w.dtype, 1e-4)  # KernelBench's tolerances
        close = torch.isclose(g.double(), w.double(), rtol=tol, atol=tol, equal_nan=True)
        assert close.all(), (f"{(~close).sum().item()} of {close.numel()} elements differ; "
                             f"max abs error {(g.double() - w.double()).abs().max().item():.3g}")


def test_the_emulation_catches_a_wrong_kernel(tmp_path) -> None:  # type: ignore[no-untyped-def]
    plan, inputs, (want,) = _reference(next(t for t in CASES if t.name == "softmax-f16"))
    program = write_program(plan, ROWS[preferred_order(plan)[1]])
    assert "= 1.0f / v4;" in program
    shapes = returned(plan)
    (right,) = emulate(program, inputs, shapes, workdir=tmp_path)
    (wrong,) = emulate(program.replace("= 1.0f / v4;", "= 0.5f / v4;"), inputs, shapes, workdir=tmp_path)  # half the sum
    assert torch.allclose(right.float(), want.float(), atol=1e-2, rtol=1e-2)
    assert not torch.allclose(wrong.float(), want.float(), atol=1e-2, rtol=1e-2)


@pytest.mark.parametrize(("forward", "dtype"), [("torch.max(x, 1)", "f32"), ("torch.min(x, 1)", "f32"), ("x.argmax(1)", "f32"),
                                             ("x.transpose(1, 2).argmin(-1)", "f32"), ("torch.max(x, -1)", "f16")])
def test_index_reductions_take_the_first_extreme_and_a_nan_first(forward: str, dtype: str, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Ties everywhere (values from four integers) and NaNs in one row: torch's positions are the
    first of the extreme, and the first NaN's in a row that has one. The columns mapping, a block
    per row, and (rows along memory: the f16 case, over the last dim) the vector path's 8-wide
    accesses."""
    last = forward.endswith("-1)") and "transpose" not in forward
    shape = (4, 3, 304) if last else (4, 304, 3)
    task = _task("index-ties", "reduction", forward, [shape], dtype)
    plan = plan_task(task.source)
    assert isinstance(plan, Plan)
    torch.manual_seed(0)
    x = torch.randint(0, 4, (4, 304, 3)).to({"f32": torch.float32, "f16": torch.float16}[dtype])
    x[1, 17, 0] = x[1, 200, 0] = float("nan")
    x[2, 40:, 2] = float("-inf")
    if last:  # the same rows, along memory
        x = x.transpose(1, 2).contiguous()
    want = load_program(task.source, "index_ties").Model()(x)
    want = list(want) if isinstance(want, (tuple, list)) else [want]
    vector = [n for n in preferred_order(plan)[:3] if ROWS[n].vector] if can_vectorize_rows(plan) else []
    assert bool(vector) == last  # rows along memory have a vector path, rows across it do not
    for name in dict.fromkeys([preferred_order(plan)[0], "t256", *vector[:1]]):
        got = emulate(write_program(plan, ROWS[name]), [x], returned(plan), workdir=tmp_path)
        for g, w in zip(got, want):
            w = w.reshape(g.shape)
            assert g.dtype == w.dtype and torch.equal(g.isnan(), w.isnan()) and torch.equal(g.nan_to_num(), w.nan_to_num()), \
                (ROWS[name].describe(), g, w)


def test_a_comparison_sees_the_rounded_value_eager_compares(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Values stay in float between ops (`relax_rounding`), except those a comparison reads: in
    float16, (0.5 - 2^-12) + 2^-13 rounds (to even) to 0.5, so eager's `>= 0.5` is true there,
    while the unrounded sum is below 0.5. Every element sits on that tie; the kernel's booleans
    must be eager's, in the plain and the 8-wide kernel alike."""
    task = _task("compare-at-a-tie-f16", "chain2", "((x + y) >= 0.5).to(x.dtype) + torch.sigmoid(x + y)", [(8, 64), (8, 64)], "f16")
    plan = plan_task(task.source)
    assert isinstance(plan, Plan)
    x = torch.full((8, 64), 0.5 - 2 ** -12, dtype=torch.float16)
    y = torch.full((8, 64), 2 ** -13, dtype=torch.float16)
    want = load_program(task.source, "compare_tie").Model()(x, y)
    assert (want >= 1.0).all()  # eager: every comparison true
    for name in ("t256", "t256-vector"):
        (got,) = emulate(write_program(plan, variant_named(plan, name)), [x, y], returned(plan), workdir=tmp_path)
        assert torch.equal(got >= 1.0, want >= 1.0), name
        assert torch.allclose(got.float(), want.float(), atol=2e-3, rtol=0)


def test_long_runs_per_thread_are_summed_with_compensation(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A thread that adds thousands of values keeps a Kahan compensation: 8 million values in [0, 1)
    summed by one thread (the columns mapping's one thread per row) and by a block of 256 come out
    within one float32 step of the exact sum, where one thread's plain running sum drifts by
    thousands of steps."""
    task = _task("sum-long", "reduction", "x.sum(-1)", [(1, 8_000_000)], "f32")
    plan = plan_task(task.source)
    assert isinstance(plan, Plan)
    torch.manual_seed(0)
    x = torch.rand(1, 8_000_000)
    exact = x.double().sum(-1).item()
    step = torch.finfo(torch.float32).eps * 2 ** 21  # float32's spacing between 2^21 and 2^22 (the sum is near 4e6)
    one_thread = next(v for v in VARIANTS_ROWS if v.columns and v.threads == 1)
    for variant in (ROWS["t256"], one_thread):
        program = write_program(plan, variant)
        assert "isfinite(t)" in program
        (got,) = emulate(program, [x], [((1,), torch.float32)], workdir=tmp_path)
        assert abs(got.double().item() - exact) <= step, (variant.describe(), got.item(), exact)


def _assert_matches(got: list[torch.Tensor], want: list[torch.Tensor], what: str) -> None:
    """Emulated outputs against PyTorch's: index outputs exactly, floats within KernelBench's tolerance."""
    for g, w in zip(got, want):
        w = w.reshape(g.shape)
        if not w.is_floating_point():
            assert torch.equal(g, w), (what, g, w)
            continue
        tol = FALLBACK_RTOL.get(w.dtype, 1e-4)
        close = torch.isclose(g.double(), w.double(), rtol=tol, atol=tol, equal_nan=True)
        assert close.all(), (what, f"{(~close).sum().item()} of {close.numel()} elements differ; "
                             f"max abs error {(g.double() - w.double()).abs().max().item():.3g}")


CLUSTER_CASES = [
    # rows too long for one block's registers (1024 threads x 32 values), held by a cluster's
    _task("cluster-l2norm-f32", "norm", "x / torch.sqrt((x * x).sum(-1, keepdim=True) + 1e-12)", [(2, 40000)], "f32"),
    _task("cluster-softmax-bf16", "norm", "torch.softmax(x, -1)", [(2, 40000)], "bf16"),
    _task("cluster-layernorm-f32", "norm", "F.layer_norm(x + 100.0, (40001,))", [(2, 40001)], "f32"),
    _task("cluster-argmax-max-f32", "reduction", "torch.max(x, -1)", [(3, 40000)], "f32"),
    # cross-entropy: the pick at the target by the cluster's first thread, then the final launch over the rows
    _task("cluster-cross-entropy-bf16", "loss", "F.cross_entropy(x, m0)", [(3, 40000)], "bf16",
          ["torch.randint(0, 40000, (3,), device='cuda')"]),
]


@pytest.mark.parametrize("task", CLUSTER_CASES, ids=lambda t: t.name)
def test_a_row_over_a_cluster_matches_pytorch(task: SuiteTask, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A thread-block cluster per row (the emulator runs a cluster's blocks together, each with its
    own shared memory): the row read into the cluster's registers, each reduction combined
    across the blocks' shared memory, the outputs written; scalar and vector paths."""
    plan, inputs, want = _reference(task)
    candidates = [v for v in VARIANTS_ROWS if v.cluster == 2 and not v.columns]
    assert len(candidates) == 2
    for variant in candidates:
        program = write_program(plan, variant)
        assert "__cluster_dims__(2, 1, 1)" in program and "map_shared_rank" in program
        assert f"float in0_r[{-(-40001 // 2048) if 'layernorm' in task.name else -(-40000 // 2048)}]" in program or variant.vector \
            or "cross" in task.name
        _assert_matches(emulate(program, inputs, returned(plan), workdir=tmp_path), want, variant.describe())



SPREAD_CASES = [
    # rows across memory (a reduction over a middle dim; a transposed input), each row's columns
    # spread over a cluster's blocks: softmax (outputs in the input's layout), the transposed
    # input's softmax (outputs staged through shared-memory tiles), 16-bit, a centred reduction,
    # index reductions; 44 or 120 rows (a cluster's last rows outside the tensor), rows of 300
    _task("spread-softmax-mid-f32", "norm", "torch.softmax(x, 1)", [(3, 300, 40)], "f32"),
    _task("spread-logsoftmax-mid-bf16", "norm", "torch.log_softmax(x, 1)", [(2, 300, 22)], "bf16"),
    _task("spread-softmax-transposed-f32", "norm", "torch.softmax(m0, -1)", [(44, 300)], "f32",
          ["torch.randn(300, 44, device='cuda').t()"]),
    _task("spread-standardize-mid-f16", "norm", "(x - x.mean(1, keepdim=True)) / x.std(1, keepdim=True)", [(2, 300, 22)], "f16"),
    _task("spread-max-dim1-f32", "reduction", "torch.max(x, 1)", [(3, 300, 40)], "f32"),
]
SPREAD_VARIANTS = [Variant(32, rows_per_block=8, columns=True, cache=True, cluster=2),   # a thread's tile one register
                   Variant(16, rows_per_block=8, columns=True, cache=True, cluster=4),   # two registers a tile per thread
                   Variant(16, rows_per_block=8, columns=True, cluster=2),              # the row not kept: a loop over it
                   Variant(4, rows_per_block=8, columns=True, cache=True, cluster=8)]   # fewer threads a row than blocks


@pytest.mark.parametrize("task", SPREAD_CASES, ids=lambda t: t.name)
def test_rows_across_memory_spread_over_a_cluster_match_pytorch(task: SuiteTask, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A cluster's blocks on the same neighbouring rows, each holding its tiles of the rows'
    columns (the emulator runs a cluster's blocks together, each with its own shared memory):
    partials combined per block, then across the blocks by distributed shared memory; against
    PyTorch, exact positions for the index reductions. The suite's variants of this kind are
    these with 32 rows a block."""
    plan, inputs, want = _reference(task)
    assert strided_rows(plan)
    for variant in SPREAD_VARIANTS:
        program = write_program(plan, variant)
        assert f"__cluster_dims__({variant.cluster}, 1, 1)" in program and "map_shared_rank" in program
        assert ("tile0[row_in_block][c - tile_c]" in program) == ("transposed" in task.name), variant.describe()
        _assert_matches(emulate(program, inputs, returned(plan), workdir=tmp_path), want, variant.describe())
    suite = [v for v in VARIANTS_ROWS if v.columns and v.cluster > 1]
    assert suite and all(v.rows_per_block == 32 and v.cache for v in suite)


@pytest.mark.parametrize(("reduction", "dtype", "ignore"), [("mean", torch.float32, -100), ("mean", torch.bfloat16, 3),
                                                           ("sum", torch.float16, -100), ("none", torch.float32, 3)])
def test_cross_entropy_as_inductor_decomposes_it_is_one_kernel(reduction: str, dtype: torch.dtype, ignore: int, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """F.cross_entropy reaches the backend as a log-softmax, int64 mask and select ops, a gather at
    the targets and sums over the rows. Declared as one partition, its task folds back to
    nll_loss_forward: one row kernel and the final launch, matching PyTorch, ignored targets
    included. Without the fold the gather and the int64 ops are left out, the log-probabilities
    are written out in full and the backend keeps Inductor (what an H200 run showed)."""
    from kevin_backend.backend.partition import LeftOutReason
    from kevin_backend.backend.task import extract_task

    def loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.cross_entropy(logits, targets, reduction=reduction, ignore_index=ignore)

    torch.manual_seed(0)
    rows, classes = 37, 300
    logits = torch.randn(rows, classes).to(dtype)
    targets = torch.randint(0, classes, (rows,))
    targets[::5] = ignore if ignore >= 0 else -100
    plan_of_graph = builtin_partitions(loss, logits, targets)
    (part,) = plan_of_graph.partitions
    assert "aten.gather.default" in part.ops
    assert not [lo for lo in plan_of_graph.left_out if lo.reason is not LeftOutReason.GRAPH_IO]
    plan = plan_task(extract_task(part).source)
    assert isinstance(plan, Plan), plan
    assert (plan.final.op if plan.final else "none") == reduction
    program = write_program(plan, variant_named(plan, preferred_order(plan)[0]))
    inputs = [targets if n.meta["val"].dtype is torch.int64 else logits for n in part.inputs]  # (in the partition's order)
    (got,) = emulate(program, inputs, returned(plan), workdir=tmp_path)
    want = loss(logits, targets)
    tol = FALLBACK_RTOL.get(dtype, 1e-4)
    assert torch.allclose(got.double().reshape(want.shape), want.double(), rtol=tol, atol=tol), (got, want)


@pytest.mark.parametrize(("dtype", "upcast"), [(torch.bfloat16, True), (torch.float32, True), (torch.bfloat16, False)])
def test_a_training_steps_cross_entropy_returns_what_its_backward_keeps(dtype: torch.dtype, upcast: bool, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A causal LM's training step (transformers' loss: the logits in float32, targets ignored at
    -100) hands the backend a forward that also returns what its backward keeps: each row's max,
    each row's log of its sum of exponentials, and the count of targets not ignored (nll's total
    weight). The writer takes it as one row kernel and the final launch, which stores the count
    beside the mean, and every output matches the partition's own program. Without the count
    (read as the fold's total weight), the int64 mask stays in the task and the writer declines
    it: Inductor kept the whole loss. Without the upcast (the loss in bfloat16), the count is a
    bfloat16 scalar too."""
    from kevin_backend.backend.task import extract_task

    def loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.cross_entropy(logits.float() if upcast else logits, targets)

    torch.manual_seed(0)
    rows, classes = 37, 300
    logits = torch.randn(rows, classes).to(dtype).requires_grad_()
    targets = torch.randint(0, classes, (rows,))
    targets[::5] = -100
    (part,) = builtin_partitions(loss, logits, targets, training=True).partitions
    task = extract_task(part)
    assert len(task.outputs) == 4 and "aten.gather.default" in part.ops
    plan = plan_task(task.source)
    assert isinstance(plan, Plan), plan
    assert plan.final is not None and plan.final.op == "mean" and plan.final.count_at is not None
    assert [shape for shape, _ in returned(plan)] == [tuple(o.shape) for o in task.outputs]
    program = write_program(plan, variant_named(plan, preferred_order(plan)[0]))
    inputs = [targets if n.meta["val"].dtype is torch.int64 else logits.detach() for n in part.inputs]
    got = emulate(program, inputs, returned(plan), workdir=tmp_path)
    want = load_program(task.source, "emulated_ce").Model()(*inputs)
    assert len(got) == len(want) == 4
    tol = 1e-4 if upcast else FALLBACK_RTOL[dtype]
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and torch.allclose(g.double().reshape(w.shape), w.double(), rtol=tol, atol=tol), (g, w)
    count = got[plan.final.count_at]
    assert count.item() == (targets != -100).sum().item() == 29
    torch.testing.assert_close(got[-1].double(), loss(logits.detach(), targets).double(), rtol=tol, atol=tol)


def test_softplus_as_inductor_decomposes_it_calls_the_writers_own_softplus_helper(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Inductor hands the backend softplus as `where(x > 20, x, log1p(exp(x)))` over float32. The
    plan computes log1p(exp(x)) by the helper the writer's own softplus calls (`kevin_log1p_exp`:
    __logf(1 + __expf(x)) under fast math, where the precise log1pf had made the kernel half
    again as long), and the result still matches PyTorch. An exp read by anything else is left
    as it is."""
    from kevin_backend.backend.task import extract_task

    def chain(x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.softplus(torch.tanh(x)) - torch.sigmoid(x) * 0.1

    torch.manual_seed(0)
    x = (torch.randn(16, 200) * 4).to(torch.float16)
    (part,) = builtin_partitions(chain, x).partitions
    assert "aten.log1p.default" in part.ops
    plan = plan_task(extract_task(part).source)
    assert isinstance(plan, Plan), plan
    exprs = [n.expr or "" for n in plan.nodes]
    assert any(e.startswith("kevin_log1p_exp(") for e in exprs) and not any("log1pf(" in e for e in exprs), exprs
    program = write_program(plan, variant_named(plan, preferred_order(plan)[0]))
    assert "#define KEVIN_FAST_MATH" in program
    (got,) = emulate(program, [x], returned(plan), workdir=tmp_path)
    want = chain(x)
    assert torch.allclose(got.double().reshape(want.shape), want.double(), rtol=FALLBACK_RTOL[torch.float16], atol=FALLBACK_RTOL[torch.float16])

    shared = plan_task(_task("exp-read-twice", "chain3+", "(lambda e: torch.log1p(e) + e)(torch.exp(x))", [(4, 64)], "f32").source)
    assert isinstance(shared, Plan) and [n.expr for n in shared.nodes][:2] == ["expf(in0)", "log1pf(v0)"]


def test_training_batch_norm_updates_its_running_statistics_in_the_same_kernel(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """KernelBench's BatchNorm problem runs `nn.BatchNorm2d` in training mode: the backend's
    partition reduces each channel over (N, H, W) and also returns the new running mean and
    variance, computed from the old ones ([C] inputs, met by the batch's [C] statistics). The
    writer reads those inputs as per-row values (once declined: "a value of shape [8] does not
    broadcast to the iteration space [4, 8, 16, 16]"), and all three outputs match PyTorch."""
    from kevin_backend.backend.task import extract_task

    torch.manual_seed(0)
    norm = torch.nn.BatchNorm2d(8)
    with torch.no_grad():
        norm.running_mean.uniform_(-1, 1), norm.running_var.uniform_(0.5, 2), norm.weight.uniform_(0.5, 2), norm.bias.uniform_(-1, 1)
    x = torch.randn(4, 8, 16, 16) * 3 + 1
    (part,) = builtin_partitions(norm, x).partitions
    plan = plan_task(extract_task(part).source)
    assert isinstance(plan, Plan), plan
    assert len(plan.outputs) == 3 and plan.reduced_dims == (0, 2, 3)
    by_shape = {(8,): [norm.running_mean.clone(), norm.running_var.clone()], (8, 1, 1): [norm.weight.detach()[:, None, None],
                                                                                       norm.bias.detach()[:, None, None]]}
    inputs = [x if n.meta["val"].dim() == 4 else by_shape[tuple(n.meta["val"].shape)].pop(0) for n in part.inputs]
    mean_before, var_before = norm.running_mean.clone(), norm.running_var.clone()
    with torch.no_grad():
        want_y = norm(x)
    got = emulate(write_program(plan, variant_named(plan, preferred_order(plan)[0])), inputs, returned(plan), workdir=tmp_path)
    want = {"y": want_y, "mean": norm.running_mean, "var": norm.running_var}
    assert not torch.equal(want["mean"], mean_before) and not torch.equal(want["var"], var_before)
    got_by = {"y": next(g for g in got if g.dim() == 4)}
    small = [g for g in got if g.dim() == 1]
    got_by["mean"], got_by["var"] = small  # (in the partition's output order: mean, then variance)
    for key, w in want.items():
        assert torch.allclose(got_by[key].reshape(w.shape), w, rtol=1e-4, atol=1e-4), key
