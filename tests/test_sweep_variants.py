"""benchmarks/sweep_variants.py on the CPU: the programs it would build for a task (every variant
of the writer's list once, or those picked, each named for its variant), and its refusals."""

from __future__ import annotations

import re

import pytest

from conftest import load_benchmark
from kevin_backend.generate.builtin.planner import plan_task
from kevin_backend.generate.builtin.roofline_suite import ROOFLINE_SUITE
from kevin_backend.generate.builtin.variants import variants_for

sweep = load_benchmark("sweep_variants")
TASKS = {t.name: t for t in ROOFLINE_SUITE}


def test_every_variant_of_a_rows_task_is_written_once_with_its_number() -> None:
    source = TASKS["mean-dim1-f16-64x4096x1024"].source
    made, order = sweep.programs(source, None)
    variants = variants_for(plan_task(source))
    assert [i for i, _, _ in made] == list(range(len(variants)))
    assert sorted(order) == list(range(len(variants)))  # the ranking: every variant once
    for i, describe, text in made:
        assert describe == variants[i].describe()
        assert re.search(rf"name='kevin_sweep_\w+_{i}'", text), i
    assert len({text for _, _, text in made}) == len(made)  # no two variants the same program


def test_picked_variants_only_and_numbers_past_the_list_dropped() -> None:
    source = TASKS["permute-mul-f16-64x1024x2048"].source  # a pointwise task: 9 variants
    made, _ = sweep.programs(source, "7,8,99")
    assert [i for i, _, _ in made] == [7, 8]


def test_a_task_outside_the_suite_is_refused_by_name(capsys: pytest.CaptureFixture[str]) -> None:
    assert sweep.main(["--tasks", "softmax-last-f32-16x1M,no-such-task"]) == 2
    assert "no-such-task" in capsys.readouterr().err
