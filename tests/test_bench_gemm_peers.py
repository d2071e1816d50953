"""The GEMM bench's peers: cuBLASLt's fused epilogue as a task of its own (computing what the task
computes, where cuBLASLt fuses that epilogue) and Inductor's max-autotune as judge numerics."""

from __future__ import annotations

import dataclasses
import importlib.util
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from test_gemm_plan import LINEAR_GELU, task

ROOT = Path(__file__).resolve().parents[1]


def _bench():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("bench_gemm", ROOT / "benchmarks" / "bench_gemm.py")
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    sys.modules["bench_gemm"] = module
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


@pytest.mark.parametrize("forward, gelu", [("F.relu(F.linear(v[0], v[1], v[2]))", False),
                                           ("F.gelu(v[0] @ v[1].t() + v[2], approximate='tanh')", True)])
def test_the_cublaslt_peer_computes_the_task(forward: str, gelu: bool) -> None:
    from kevin_backend.generate.builtin.gemm_plan import GemmPlan, plan_gemm
    from kevin_backend.types import load_program

    half = "dtype=torch.float16"
    plan = plan_gemm(task(forward, f"torch.randn(2, 64, 32, {half}), torch.randn(48, 32, {half}), torch.randn(48, {half})"))
    assert isinstance(plan, GemmPlan), plan
    # (run here in float32, the CPU's: the plan of its 16-bit twin names the same inputs)
    source = task(forward, "torch.randn(2, 64, 32), torch.randn(48, 32), torch.randn(48)")
    peer = _bench().cublaslt_task(source, plan)
    assert peer is not None and f"use_gelu={gelu})" in peer
    if gelu:
        return  # (torch's CPU form of it is erf's GELU; on a GPU, cuBLASLt's and its fallback are tanh's)
    module = load_program(peer, "kevin_test_cublaslt_peer")
    x, w, b = module.get_inputs()
    got = module.Model(*module.get_init_inputs())(x, w, b)
    torch.testing.assert_close(got, torch.relu(x @ w.t() + b), rtol=1e-4, atol=1e-4)


def test_a_1x1_convolutions_peer_multiplies_its_channels_last_rows() -> None:
    """A 1x1 convolution of a channels-last input is a GEMM of its rows of channels: cuBLASLt's peer
    multiplies those rows and gives the output back as N x C_out x H x W; a 3x3 one has no peer."""
    from kevin_backend.generate.builtin.gemm_plan import GemmPlan, plan_gemm
    from kevin_backend.types import load_program

    def conv(size: int, dtype: str) -> str:
        return task("F.relu(F.conv2d(v[0], v[1], v[2], padding=%d))" % (size // 2),
                    f"torch.randn(2, 32, 6, 5, {dtype}).to(memory_format=torch.channels_last), "
                    f"torch.randn(80, 32, {size}, {size}, {dtype}), torch.randn(80, {dtype})")  # (80 output channels: past the direct kernel's 64)

    bench = _bench()
    plan = plan_gemm(conv(1, "dtype=torch.float16"))
    assert isinstance(plan, GemmPlan) and plan.conv, plan
    peer = bench.cublaslt_task(conv(1, "dtype=torch.float32"), plan)  # (run on the CPU in float32)
    assert peer is not None
    module = load_program(peer, "kevin_test_cublaslt_conv_peer")
    x, w, b = module.get_inputs()
    got = module.Model(*module.get_init_inputs())(x, w, b)
    torch.testing.assert_close(got, torch.relu(F.conv2d(x, w, b)), rtol=1e-4, atol=1e-4)
    three = plan_gemm(conv(3, "dtype=torch.float16"))
    assert isinstance(three, GemmPlan) and three.spec.convolution is not None, three
    assert bench.cublaslt_task(conv(3, "dtype=torch.float32"), three) is None


def test_epilogues_cublaslt_does_not_fuse_have_no_peer() -> None:
    from kevin_backend.generate.builtin.gemm_plan import GemmPlan, plan_gemm

    bench = _bench()
    exact_gelu = plan_gemm(LINEAR_GELU)  # erf GELU: cuBLASLt's is tanh's
    no_bias = plan_gemm(task("F.relu(v[0] @ v[1].t())", "torch.randn(64, 32, dtype=torch.float16), "
                             "torch.randn(48, 32, dtype=torch.float16)"))
    assert isinstance(exact_gelu, GemmPlan) and isinstance(no_bias, GemmPlan)
    assert bench.cublaslt_task(LINEAR_GELU, exact_gelu) is None and bench.cublaslt_task("", no_bias) is None


def test_max_autotune_is_named_in_the_judges_numerics() -> None:
    import json

    numerics = _bench().max_autotune_numerics()
    config = json.loads(numerics["inductor_config"])
    assert config.get("max_autotune") is True and "triton.cudagraphs" not in config, config


def test_the_precise_math_and_the_orders_are_variants_of_the_first_tiling() -> None:
    # --precise: the first tiling's program again without the fast math, its extension renamed (a
    # float32 program has none to drop); --orders: the first tiling in each other order of its tiles
    from kevin_backend.generate.builtin.gemm_kernel import FAST_MATH
    from kevin_backend.generate.builtin.gemm_plan import plan_gemm, plan_tilings

    bench = _bench()
    half = "dtype=torch.float16"
    sources = {"f16": task("F.silu(F.linear(v[0], v[1], v[2]))",
                           f"torch.randn(64, 32, {half}), torch.randn(48, 32, {half}), torch.randn(48, {half})"),
               "f32": task("F.silu(F.linear(v[0], v[1], v[2]))", "torch.randn(64, 32), torch.randn(48, 32), torch.randn(48)")}
    plans = {name: plan_gemm(source, arch="sm90") for name, source in sources.items()}
    programs = bench.candidate_programs(plans, sources, lambda plan: plan_tilings(plan)[:2], precise=True)
    first = plan_tilings(plans["f16"])[0].name
    assert sorted(programs) == sorted([(n, t.name) for n in plans for t in plan_tilings(plans[n])[:2]] + [("f16", first + bench.PRECISE)])
    fast, precise = programs[("f16", first)], programs[("f16", first + bench.PRECISE)]
    assert FAST_MATH in fast and FAST_MATH not in precise and "load_inline(name='precise_kevin_gemm_" in precise
    assert precise.replace("precise_", "", 1) == fast.replace(FAST_MATH, "", 1)
    orders = bench.order_variants(plan_tilings(plans["f16"])[0])
    assert [(t.swizzle, t.raster) for t in orders] == list(bench.ORDERS) and len({t.name for t in orders}) == len(orders)
    assert bench.order_variants(plan_tilings(plans["f32"])[0]) == ()  # (CUTLASS 2.x's float32 kernel has no tile scheduler)


def test_the_tilings_the_search_does_not_try_go_only_where_hoppers_kernel_takes_them() -> None:
    from kevin_backend.generate.builtin.gemm_kernel import Epilogue, GemmSpec, GemmTiling
    from kevin_backend.generate.builtin.gemm_plan import plan_gemm

    bench = _bench()
    half = "dtype=torch.float16"
    f16 = plan_gemm(task("F.silu(F.linear(v[0], v[1], v[2]))",
                         f"torch.randn(64, 32, {half}), torch.randn(48, 32, {half}), torch.randn(48, {half})"), arch="sm90")
    f32 = plan_gemm(task("F.silu(F.linear(v[0], v[1], v[2]))", "torch.randn(64, 32), torch.randn(48, 32), torch.randn(48)"), arch="sm90")
    # a product whose output is stored from registers: no epilogue subtile to widen
    direct = dataclasses.replace(f16, spec=GemmSpec("float16", Epilogue(), direct_store=True))
    tail = bench.TAIL_TILINGS
    assert {t.scheduler for t in tail} == {"streamk", "persistent"} and {t.epilogue_n for t in tail} == {0, 64}
    assert all(bench.hopper_takes(f16, t) for t in tail + bench.EXTRA_TILINGS)
    assert not any(bench.hopper_takes(f32, t) for t in tail)  # (CUTLASS 2.x's float32 kernel)
    assert [t.name for t in tail if bench.hopper_takes(direct, t)] == [t.name for t in tail if not t.epilogue_n]
    assert bench.hopper_takes(direct, GemmTiling((256, 128, 64), (2, 1, 1), scheduler="streamk"))


def test_a_short_run_judges_the_wide_ends_a_refused_turn_leads_to() -> None:
    """`--first 2` of a softmax after a 16-bit GEMM: its first two tilings and their ends in
    float32, which a search tries once a turn is refused (the narrow end's rounding, exponentiated,
    is past the judge's bound); a plain GEMM's first two only."""
    from kevin_backend.generate.builtin.gemm_plan import plan_gemm, plan_tilings
    from kevin_backend.generate.builtin.gemm_tail import WideEnd

    half = "dtype=torch.float16"
    inputs = f"torch.randn(64, 32, {half}), torch.randn(48, 32, {half})"
    bench = _bench()
    softmax = plan_gemm(task("torch.softmax(v[0] @ v[1].t(), dim=-1)", inputs), arch="sm90")
    first = bench.first_tilings(softmax, 2)
    assert [type(t) for t in first[2:]] == [WideEnd, WideEnd] and [t.tiling for t in first[2:]] == list(first[:2])
    assert bench.first_tilings(softmax, 0) == plan_tilings(softmax)
    plain = plan_gemm(task("torch.relu(v[0] @ v[1].t())", inputs), arch="sm90")
    assert bench.first_tilings(plain, 2) == plan_tilings(plain)[:2]


def test_a_run_takes_the_matmul_tasks_in_parts_that_cover_them_once() -> None:
    from kevin_backend.generate.builtin.gemm_suite import GEMM_SUITE

    bench = _bench()
    matmuls = [t.name for t in bench.select_tasks("", matmuls=True)]
    assert matmuls == [t.name for t in GEMM_SUITE if t.category != "conv"] and len(matmuls) >= 30
    halves = [[t.name for t in bench.select_tasks("", True, part, 2)] for part in (1, 2)]
    assert sorted(halves[0] + halves[1]) == sorted(matmuls) and abs(len(halves[0]) - len(halves[1])) <= 1
    assert len(bench.select_tasks("")) == len(GEMM_SUITE)  # (neither: every task, the convolutions too)
    named = [t.name for t in bench.select_tasks("mm-relu-f16-8192x8192x8192,conv1d-gelu-f16-64x512x1024", True)]
    assert named[:2] == ["mm-relu-f16-8192x8192x8192", "conv1d-gelu-f16-64x512x1024"] and len(named) == len(matmuls) + 1
    with pytest.raises(SystemExit, match="no suite task mm-nothing"):
        bench.select_tasks("mm-nothing")
