"""The direct convolution's kernels, exactly as written, run on the CPU (tests/kernel_emulator.py)
against the task's own model in float64: every task of `direct_conv_tasks.py` (the suite's at a
smaller batch and image) through every variant its plan offers (one to four positions a thread, a
block of 64 to 256 threads), and the KernelBench level-2 problems of `level2_conv_tasks.py`. The GPU
test (`test_direct_conv_gpu.py`) judges the same programs on a GPU; this one holds the kernel's
indexing, padding, strides, dilation, broadcasts and epilogue to the model wherever CI runs."""

from __future__ import annotations

import re
import shutil
import pytest
import torch

from direct_conv_tasks import DIRECT_TASKS

# a smaller batch and image for the suite's tasks (their own sizes hold millions of outputs)
_SMALLER = {"batch_size": 2, "depth": 6, "height": 13, "width": 12}
_PROGRAM_ARG = re.compile(r"v(\d+)|self\.get_parameter\('([\w.]+)'\)")


def _smaller(source: str) -> str:
    for name, value in _SMALLER.items():
        source = re.sub(rf"^{name} = \d+$", f"{name} = {value}", source, flags=re.M)
    # (sizes given together: `height, width = 32, 32`)
    source = re.sub(r"^depth, height, width = \d+, \d+, \d+$", "depth, height, width = {depth}, {height}, {width}".format(**_SMALLER),
                    source, flags=re.M)
    return re.sub(r"^height, width = \d+, \d+$", "height, width = {height}, {width}".format(**_SMALLER), source, flags=re.M)


def _emulated(program: str, model: torch.nn.Module, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    """The program's kernel run on `inputs` (and the model's parameters, where its forward passes
    them): its outputs, each laid out with the strides the program gives it."""
    from kernel_emulator import emulate

    call = re.search(r"ext\.kevin_run\((.*)\)$", program, re.M)
    assert call is not None, "the program's forward calls its kernel"
    args = []
    for value, parameter in _PROGRAM_ARG.findall(call[1]):
        args.append(inputs[int(value)] if value else model.get_parameter(parameter).detach())
    layouts = [([int(n) for n in sizes.split(",")], [int(s) for s in strides.split(",")]) for sizes, strides in
               re.findall(r"empty_strided\(\{([\d, ]*)\}, \{([\d, ]*)\}", program)]
    dtypes = re.findall(r"empty_strided\([^;]*?dtype\(torch::k(\w+)\)\)", program)
    assert layouts and len(dtypes) == len(layouts), "each output allocated with its sizes, strides and dtype"
    kinds = {"Float32": torch.float32, "Float": torch.float32, "Half": torch.float16, "Float16": torch.float16,
             "BFloat16": torch.bfloat16}
    spans = [(1 + sum((n - 1) * s for n, s in zip(sizes, strides)),) for sizes, strides in layouts]
    flat = emulate(program, args, [(span, kinds[d]) for span, d in zip(spans, dtypes)])
    return [torch.as_strided(f, sizes, strides) for f, (sizes, strides) in zip(flat, layouts)]


def _reference(source: str) -> tuple[torch.nn.Module, list[torch.Tensor], list[torch.Tensor]]:
    """The task's model, its inputs (seeded) and its outputs computed in float64 (a cast to a 16-bit
    dtype inside the model still rounds there)."""
    from kevin_backend.types import load_program

    module = load_program(source, "kevin_test_direct_emulated")
    torch.manual_seed(0)
    model = module.Model(*module.get_init_inputs())
    inputs = list(module.get_inputs())
    exact = [v.double() if v.is_floating_point() else v for v in inputs]
    with torch.no_grad():
        wide = __import__("copy").deepcopy(model).double()
        want = wide(*exact)
    return model, inputs, list(want) if isinstance(want, (tuple, list)) else [want]


def _close(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    """Within a few of the output dtype's roundings of the float64 value (float32 sums in another
    order than float64's; a 16-bit output's one rounding)."""
    assert got.shape == want.shape, (what, got.shape, want.shape)
    eps = {torch.float32: 2e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}[got.dtype]
    scale = want.abs().mean().item() + 1e-30
    err = (got.double() - want.double()).abs()
    bound = eps * (want.double().abs() + scale) * 4
    bad = int((err > bound).sum())
    assert bad == 0, f"{what}: {bad} of {err.numel()} elements outside the bound; worst {float((err / bound).max()):.3g}x"


def _variants(source: str) -> list[tuple[str, str]]:
    from kevin_backend.generate.builtin.direct_conv import DirectConv
    from kevin_backend.generate.builtin.gemm_plan import plan_gemm, plan_tilings, write_gemm_program

    plan = plan_gemm(source, arch="sm90")
    assert isinstance(plan, DirectConv), plan
    return [(t.name, write_gemm_program(plan, t, task_source=source)) for t in plan_tilings(plan) if t.name.startswith("direct")]


def _emulator_or_skip() -> None:
    from kernel_emulator import has_cuda_headers

    if shutil.which("g++") is None or not has_cuda_headers():
        pytest.skip("needs g++ and CUDA's headers (the kernel emulator)")


@pytest.mark.parametrize("name", sorted(DIRECT_TASKS))
def test_every_direct_variant_computes_the_task(name: str) -> None:
    _emulator_or_skip()
    source = _smaller(DIRECT_TASKS[name])
    model, inputs, want = _reference(source)
    variants = _variants(source)
    assert len(variants) >= 2, [v for v, _ in variants]
    for variant, program in variants:
        got = _emulated(program, model, inputs)
        assert len(got) == len(want), (variant, len(got), len(want))
        for k, (g, w) in enumerate(zip(got, want)):
            _close(g, w, f"{name}, {variant}, output {k}")


def test_kernelbench_level2_problems_compute_their_convolutions_partition() -> None:
    """Each level-2 problem's first direct variant, on the problem whole where the direct kernel
    takes it whole (a convolution and its epilogue with nothing after it that the kernel leaves out)."""
    from level2_conv_tasks import LEVEL2

    _emulator_or_skip()
    # (poolings and instance norms after the convolution: the partitioner's cut, in test_direct_conv.py)
    whole = _taken_whole_and_matching({name: source for name, (source, _, _) in LEVEL2.items()})
    assert len(whole) >= 5 and any("transpose" in n for n in whole), whole


def _taken_whole_and_matching(sources: dict[str, str]) -> list[str]:
    """The problems the direct kernel takes whole (at `_smaller`'s sizes), each one's first variant
    emulated and compared with its model in float64."""
    from kevin_backend.generate.builtin.direct_conv import DirectConv
    from kevin_backend.generate.builtin.gemm_plan import plan_gemm

    whole = []
    for name, source in sorted(sources.items()):
        source = _smaller(source)
        if not isinstance(plan_gemm(source, arch="sm90"), DirectConv):
            continue
        whole.append(name)
        model, inputs, want = _reference(source)
        variant, program = _variants(source)[0]
        got = _emulated(program, model, inputs)
        for k, (g, w) in enumerate(zip(got, want)):
            _close(g, w, f"{name}, {variant}, output {k}")
    return whole


def test_more_level2_problems_compute_their_convolutions_partition() -> None:
    """The published-habit problems the direct kernel takes whole (its outcome "direct", nothing after
    the convolution that the kernel leaves out), each compared with the problem's model in float64."""
    from level2_conv_tasks import PUBLISHED

    _emulator_or_skip()
    # (a pooling after it, a batch norm in training mode: their own partitions)
    whole = _taken_whole_and_matching({name: source for name, (source, outcome) in PUBLISHED.items() if outcome == "direct"})
    assert {"conv2d-min-tanh-tanh", "conv2d-divide-leakyrelu", "conv3d-leakyrelu-sum-clamp-gelu", "conv2d-grouped-relu"} <= set(whole), whole
