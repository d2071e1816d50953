"""cuDNN's fused graphs as the convolutions' peer (benchmarks/cudnn_peer.py): on the CPU, what each
convolution of the GEMM suite becomes (the graph's steps read from the traced task, or why not); on a
GPU with cuDNN's frontend installed, a graph built, run, checked against the task and timed."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from conftest import load_benchmark
from kevin_backend.generate.builtin.gemm_suite import GEMM_SUITE

TASKS = {task.name: task for task in GEMM_SUITE}
peer = load_benchmark("cudnn_peer")


@pytest.mark.parametrize(("name", "steps"), [
    # the convolution, its own bias (the first add), then the epilogue as the task writes it
    ("conv2d-relu-bias-f32-128x128x32x32", ["conv", "add", "relu", "add"]),
    # hardswish as Inductor's decomposition gives it: x + 3 clamped to [0, 6], times x, over 6
    ("conv2d-hardswish-f16-128x128x32x32", ["conv", "add", "add", "clamp", "clamp", "mul", "div"]),
    # an inference batch norm with its float32 statistics, the cast to bf16 left to cuDNN's float32 intermediates
    ("conv2d-bn-relu-channels-last-bf16-64x256x28x28", ["conv", "sub", "mul", "mul", "add", "relu"]),
    ("conv2d-grouped-bn-relu-bf16-64x128x56x56", ["conv", "sub", "mul", "add", "relu"]),
    ("conv1d-gelu-f16-64x512x1024", ["conv", "add", "gelu"]),
    # a transposed convolution: cuDNN's data gradient of the convolution whose filter it is
    ("conv-transpose2d-sigmoid-scale-f32-128x64x16x16", ["conv", "add", "sigmoid", "mul"]),
])
def test_a_convolution_and_its_pointwise_epilogue_is_one_graph(name: str, steps: list[str]) -> None:
    recipe = peer.conv_recipe(TASKS[name].source)
    assert isinstance(recipe, peer.Recipe), recipe
    assert [s.op for s in recipe.steps] == steps
    assert recipe.steps[1].args[0] == 0  # (every step reads the one before it, or an input, or a number)
    assert all(isinstance(a, int) or a[0] in ("input", "number") for s in recipe.steps[1:] for a in s.args)


def test_operands_broadcast_as_the_output_reads_them_and_numbers_are_kept() -> None:
    hardswish = peer.conv_recipe(TASKS["conv2d-hardswish-f16-128x128x32x32"].source)
    bias = hardswish.steps[1].args[1]
    assert bias[0] == "input" and bias[2] == (1, 128, 1, 1)  # (the conv's (C,) bias, over the channels)
    assert hardswish.steps[2].args[1] == ("number", 3.0) and dict(hardswish.steps[3].params) == {"low": 0.0}
    assert hardswish.steps[-1].args[1] == ("number", 6.0) and hardswish.out_dtype == torch.float16
    grouped = peer.conv_recipe(TASKS["conv2d-grouped-bn-relu-bf16-64x128x56x56"].source)
    assert grouped.groups == 32 and grouped.padding == (1, 1) and grouped.steps[1].args[1][2] == (1, 128, 1, 1)
    transposed = peer.conv_recipe(TASKS["conv-transpose3d-add-hardswish-f32-16x32x16x32x32"].source)
    assert transposed.transposed and transposed.out_shape == (16, 16, 32, 64, 64)  # (its output padding in it)
    assert not hardswish.transposed and transposed.describe().startswith("transposed conv stride 2x2x2 -> add")
    stem = peer.conv_recipe(TASKS["conv2d-stem-bn-silu-bf16-32x3x224x224"].source)
    assert stem.stride == (2, 2) and [s.op for s in stem.steps][-2:] == ["sigmoid", "mul"]


@pytest.mark.parametrize(("name", "why"), [
    ("conv2d-groupnorm-scale-f32-128x128x32x32", "var_mean"),
    ("conv2d-min-tanh-f32-128x3x32x32", "min.dim"),
    ("conv3d-softmax-f32-128x3x16x32x32", "amax"),
])
def test_what_the_graph_does_not_take_says_why(name: str, why: str) -> None:
    recipe = peer.conv_recipe(TASKS[name].source)
    assert isinstance(recipe, peer.Declined) and why in recipe.reason, recipe


def test_which_lists_every_convolution_of_the_suite(capsys: pytest.CaptureFixture[str]) -> None:
    assert peer.main(["--which"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == sum("conv" in name for name in TASKS)
    assert sum("not taken" in line for line in lines) == 3 and sum("conv stride" in line for line in lines) == len(lines) - 3
    with pytest.raises(SystemExit, match="unknown convolution tasks nope"):
        peer.main(["--which", "--tasks", "nope"])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or importlib.util.find_spec("cudnn") is None,
                    reason="needs a GPU and cuDNN's frontend (nvidia-cudnn-frontend)")
def test_a_fused_graph_runs_checked_and_timed_on_the_gpu() -> None:
    # a channels-last bf16 3x3 convolution with its bias and ReLU: cuDNN's runtime fusion's own pattern
    row = peer.measure_task(TASKS["conv2d-3x3-relu-channels-last-bf16-32x128x56x56"], torch.device("cuda"), trials=5, rounds=2)
    assert row["cudnn"] == "ran", row
    assert row["cudnn_ms"] > 0 and row["inductor_ms"] > 0 and len(row["rounds"]["cudnn"]) == 2
