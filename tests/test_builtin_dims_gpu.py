"""The built-in writer's reductions over any dimensions on a GPU (`-m gpu`; skipped without one):
tasks of the roofline suite at their real sizes (hundreds of MiB, inputs made on the CPU) that
reduce a middle dimension, the first one, several or all of them, index reductions (argmax,
argmin, max.dim, min.dim), norms over non-last dimensions, rows split over several blocks, and
inputs transposed against the output. Each task's first variant in the
writer's order is judged by the real judge: it must be planned (not declined) and ACCEPTED.
Times against Inductor's and the fraction of the roofline are printed, not asserted (a
benchmark's job: `benchmarks/bench_builtin.py --suite roofline`)."""

from __future__ import annotations

import concurrent.futures

import pytest

pytestmark = pytest.mark.gpu

TASKS = ["sum-dim0-f32-128x1024x1024", "sum-dim1-f32-128x1024x1024", "mean-dim1-f16-64x4096x1024", "max-dim0-f32-64x2048x1024",
         "argmax-dim1-f32-32x2048x2048", "argmin-dim0-bf16-256x1024x1024", "min-dim1-f32-128x1024x1024", "max-dim2-f16-128x1024x1024",
         "softmax-mid-f32-128x4096x64", "logsoftmax-mid-bf16-64x8192x128", "rmsnorm-dim1-f32-16x64x256x256",
         "layernorm-chw-f32-16x64x256x256", "l2norm-dim0-f16-16384x8192", "frobenius-f32-16x64x256x256",
         "softmax-transposed-input-f32-16384x4096", "l2norm-transposed-input-f32-8192x16384",
         # rows split over several blocks (few long rows, whole-tensor reductions)
         "layernorm-last-f32-16x4M", "softmax-last-f32-8x4M", "sum-all-f32-16M", "smoothl1-f32-8192x8192", "kldiv-f32-8192x8192",
         # inputs transposed against the output (tiles through shared memory); norms planned through views
         "transpose-contiguous-f32-32x4096x1024", "permute-mul-f16-64x1024x2048", "relu-add-permuted-input-f32-32x4096x512",
         "batchnorm-infer-f32-16x64x256x256", "instancenorm-f32-16x64x256x256"]


def test_reductions_over_any_dimensions_are_accepted(tmp_path_factory: pytest.TempPathFactory) -> None:
    from kevin_backend.generate.builtin.plan import Plan
    from kevin_backend.generate.builtin.planner import plan_task
    from kevin_backend.generate.builtin.program import write_program
    from kevin_backend.generate.builtin.variant_ranking import preferred_order
    from kevin_backend.generate.builtin.variants import variant_named
    from kevin_backend.generate.builtin.roofline_suite import ROOFLINE_SUITE
    from kevin_backend.judge.judge import Judge
    from kevin_backend.judge.sandbox import RunConfig

    by_name = {t.name: t for t in ROOFLINE_SUITE}
    judge = Judge(tmp_path_factory.mktemp("builds"), RunConfig(trials=10, warmup=2), workers=4)

    def one(name: str) -> tuple[str, object, object]:
        plan = plan_task(by_name[name].source)
        if not isinstance(plan, Plan):
            return name, plan, None
        variant = variant_named(plan, preferred_order(plan)[0])
        return name, variant, judge.judge(by_name[name].source, write_program(plan, variant))

    failures = []
    try:
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            for name, variant, result in pool.map(one, TASKS):
                if result is None:
                    failures.append((name, f"declined: {variant}"))
                    continue
                t, roof = result.timings, getattr(result, "roofline", None)
                fraction = ""
                if roof is not None and roof.kernel_fraction is not None:
                    fraction = f"{roof.kernel_fraction:.0%} of copy bandwidth"
                    if roof.inductor_fraction is not None:
                        fraction += f" (Inductor {roof.inductor_fraction:.0%})"
                print(f"{name:42s} {result.reason.name:10s} {t.speedup_vs_inductor or 0:.2f}x inductor {fraction}  [{variant.describe()}]")
                if not result.correct:
                    failures.append((name, result.reason.name, result.feedback[:600]))
    finally:
        close = getattr(judge, "close", None)
        if close is not None:
            close()
    assert not failures, failures


def _judge_first_variants(names: list[str], tmp_path_factory: pytest.TempPathFactory, workers: int = 2,
                          pick: int | None = None) -> list[tuple]:
    """Each named roofline task's first variant in the writer's order (or, with `pick`, the first
    cluster variant among the first `pick`, None if there is none), written and judged by the real
    judge: (name, variant, program text, result)."""
    from kevin_backend.generate.builtin.plan import Plan
    from kevin_backend.generate.builtin.planner import plan_task
    from kevin_backend.generate.builtin.program import write_program
    from kevin_backend.generate.builtin.variant_ranking import preferred_order
    from kevin_backend.generate.builtin.variants import variant_named
    from kevin_backend.generate.builtin.roofline_suite import ROOFLINE_SUITE
    from kevin_backend.judge.judge import Judge
    from kevin_backend.judge.sandbox import RunConfig

    by_name = {t.name: t for t in ROOFLINE_SUITE}
    judge = Judge(tmp_path_factory.mktemp("builds"), RunConfig(trials=10, warmup=2), workers=workers)

    def one(name: str) -> tuple:
        plan = plan_task(by_name[name].source)
        assert isinstance(plan, Plan), f"{name}: declined: {plan}"
        order = preferred_order(plan)
        if pick is not None:
            clusters = [n for n in order[:pick] if variant_named(plan, n).cluster > 1] if plan.is_rows else []
            if not clusters:
                return name, None, "", None
            order = clusters
        variant = variant_named(plan, order[0])
        program = write_program(plan, variant)
        return name, variant, program, judge.judge(by_name[name].source, program)

    try:
        with concurrent.futures.ThreadPoolExecutor(workers) as pool:
            return list(pool.map(one, names))
    finally:
        close = getattr(judge, "close", None)
        if close is not None:
            close()


CLUSTER_TASKS = ["l2norm-dim1-f32-32768x65535", "crossentropy-bf16-16384x50257", "instancenorm-f32-16x64x256x256"]


def test_rows_beyond_one_block_run_over_a_thread_block_cluster(tmp_path_factory: pytest.TempPathFactory) -> None:
    """On a GPU with clusters (Hopper and later), a row too long for one block's registers gets a
    cluster kernel (`__cluster_dims__`, partials combined through distributed shared memory) among
    the writer's first two variants (a two-turn search measures it), and the real judge accepts
    it. Fails when the cluster variant is ranked out or its kernel is wrong."""
    import torch

    if torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("thread-block clusters need compute capability 9.0")
    failures = []
    for name, variant, program, result in _judge_first_variants(CLUSTER_TASKS, tmp_path_factory, pick=2):
        if variant is None:
            failures.append((name, "no cluster variant among the first two"))
            continue
        roof = getattr(result, "roofline", None)
        fraction = f"{roof.kernel_fraction:.0%} of copy bandwidth" if roof is not None and roof.kernel_fraction else ""
        print(f"{name:42s} {result.reason.name:10s} {result.timings.speedup_vs_inductor or 0:.2f}x inductor {fraction} "
              f"[{variant.describe()}]")
        if not variant.cluster or "__cluster_dims__" not in program:
            failures.append((name, f"not a cluster kernel: {variant.describe()}"))
        elif not result.correct:
            failures.append((name, result.reason.name, result.feedback[:600]))
    assert not failures, failures


FAST_MATH_TASKS = ["silu-add-sigmoid-bf16-32768x8192", "tanh-softplus-sigmoid-f16-65536x4096",
                   "gelu-softplus-sigmoid-tanh-bf16-32768x16384", "logsoftmax-last-f16-65536x2048"]


def test_sixteen_bit_activation_chains_use_fast_math_and_stay_correct(tmp_path_factory: pytest.TempPathFactory) -> None:
    """A kernel whose outputs are all float16 or bfloat16 is written with the fast intrinsics
    (`KEVIN_FAST_MATH`) and still passes the judge's tolerance check over fresh inputs. Fails
    when fast math is not applied or loses the outputs' precision."""
    failures = []
    for name, variant, program, result in _judge_first_variants(FAST_MATH_TASKS, tmp_path_factory):
        roof = getattr(result, "roofline", None)
        fraction = f"{roof.kernel_fraction:.0%} of copy bandwidth" if roof is not None and roof.kernel_fraction else ""
        print(f"{name:42s} {result.reason.name:10s} {result.timings.speedup_vs_inductor or 0:.2f}x inductor {fraction} "
              f"[{variant.describe()}]")
        if "#define KEVIN_FAST_MATH" not in program:
            failures.append((name, "no fast math"))
        elif not result.correct:
            failures.append((name, result.reason.name, result.feedback[:600]))
    assert not failures, failures
