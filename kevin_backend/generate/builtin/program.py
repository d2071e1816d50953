"""CUDA for a `Plan`: the built-in writer's program, a KernelBench-format candidate (ModelNew through
load_inline), from the kernel family the plan and variant call for.

    source = write_program(plan, variant_named(plan, "t256-vector"), name="kevin_ab12")

The families, each a writer of its own:

    pointwise        pointwise_kernel.py   one thread per element (or per vector of them)
    tiled pointwise  tiled_kernel.py       tiles of a transposed plane through shared memory
    row              rows_kernel.py,       a row per warp, block or cluster; rows across memory
                     rows_mappings.py
    split row        split_rows.py         rows too few to fill the GPU, each over several blocks
    final reduction  final_reduction.py    cross-entropy's mean or sum over the rows

Shapes and strides are the task's own, baked in as constants (index math by constants compiles to
multiplications); the host function (host_function.py) checks every input's sizes and strides and
refuses others. The code is split-build friendly (no templates in kernels, a launch per kernel in
the host function). The fixed device code (the prelude, the access helpers, ops.py's device
helpers) comes from cuda/*.cuh.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import torch

from kevin_backend.generate.builtin.codegen import cuda_code, narrow_indices
from kevin_backend.generate.builtin.final_reduction import FinalReductionWriter
from kevin_backend.generate.builtin.host_function import HostWriter, aligned_pointers, launch_args
from kevin_backend.generate.builtin.plan import INDEXED, Plan
from kevin_backend.generate.builtin.pointwise_kernel import PointwiseWriter
from kevin_backend.generate.builtin.rounding import relax_rounding
from kevin_backend.generate.builtin.row_reducers import row_reducers
from kevin_backend.generate.builtin.rows_mappings import rows_kernel
from kevin_backend.generate.builtin.split_rows import SplitRowsWriter
from kevin_backend.generate.builtin.tiled_kernel import TiledWriter, tiled_pairs
from kevin_backend.generate.builtin.variant_fit import cached_values, can_vectorize, can_vectorize_rows, split_width, transposed_plane
from kevin_backend.generate.builtin.variants import Variant

__all__ = ["write_program", "fast_math", "DeviceCode", "Extension", "device_code", "extension"]


@dataclass(frozen=True)
class DeviceCode:
    """A program's kernels, of one family."""

    family: str  # "pointwise", "tiled pointwise", "row", "split-row": the program's docstring says it
    kernels: tuple[str, ...]
    vectorizable: bool  # a vector kernel beside the scalar one, launched where the pointers are aligned
    launches: str | None = None  # the family's own launches (else the host function's rows or pointwise launch)


def device_code(plan: Plan, variant: Variant) -> DeviceCode:
    """The kernels of the family `variant` calls for on `plan` (its 16-bit values relaxed), a
    final reduction's last."""
    indexed = any(r.reduction in INDEXED for r in plan.reductions)
    final = (FinalReductionWriter(plan).kernel(),) if plan.final is not None else ()
    if plan.is_rows and variant.split and not plan.picks:
        split_kernels, launches = SplitRowsWriter(plan, variant.threads, split_width(plan)).write()
        kernels = (row_reducers(Variant(variant.threads), indexed), *(narrow_indices(plan, k) for k in split_kernels))
        return DeviceCode("split-row", (*kernels, *final), False, launches)
    if plan.is_rows:
        vectorizable = variant.vector and can_vectorize_rows(plan) and cached_values(plan, variant, True) > 0
        kernels = (row_reducers(variant, indexed), rows_kernel(plan, variant, "kevin_rows"),
                   *((rows_kernel(plan, variant, "kevin_rows_vec", vector=True),) if vectorizable else ()))
        # (a split variant over a plan with picks takes the rows kernel, its docstring still "split-row")
        return DeviceCode("split-row" if variant.split else "row", (*kernels, *final), vectorizable)
    if variant.tiled and transposed_plane(plan) is not None:
        code, grid = TiledWriter(plan, span=max(1, variant.items)).kernel("kevin_tiled")
        launch = f"    kevin_tiled<<<(unsigned){grid}, 256, 0, stream>>>({launch_args(plan)});"
        if variant.vector and tiled_pairs(plan):  # the paired tiles where every pointer is 4-byte aligned
            paired, pairs_grid = TiledWriter(plan).pairs_kernel("kevin_tiled_vec")
            launch = (f"    if ({aligned_pointers(plan, 4)}) {{\n"
                      f"        kevin_tiled_vec<<<(unsigned){pairs_grid}, 256, 0, stream>>>({launch_args(plan)});\n"
                      f"    }} else {{\n    {launch}\n    }}")
            return DeviceCode("tiled pointwise", (code, paired, *final), False, launch)
        return DeviceCode("tiled pointwise", (code, *final), False, launch)
    vectorizable = variant.vector and can_vectorize(plan)
    kernels = (PointwiseWriter(plan, variant, vector=False).kernel("kevin_pointwise"),
               *((PointwiseWriter(plan, variant, vector=True).kernel("kevin_pointwise_vec"),) if vectorizable else ()))
    return DeviceCode("pointwise", (*kernels, *final), vectorizable)


@dataclass(frozen=True)
class Extension:
    """What a program's load_inline takes for `plan`: the CUDA source, the declaration of its host
    function `kevin_run` (one tensor, or a list of them for several outputs), and the family."""

    cuda: str
    declaration: str
    family: str


def extension(plan: Plan, variant: Variant) -> Extension:
    """The CUDA source and the host function's declaration of `plan`'s kernels in `variant`."""
    plan = relax_rounding(plan)
    code = device_code(plan, variant)
    host = HostWriter(plan, variant, code.vectorizable, code.launches).text()
    clusters = plan.is_rows and variant.cluster > 1 and not variant.split
    cuda = "\n".join([cuda_code("prelude.cuh"), *(["#include <cooperative_groups.h>"] if clusters else []),
                      *(["#define KEVIN_FAST_MATH 1"] if fast_math(plan) else []), cuda_code("device_helpers.cuh"),
                      cuda_code("access.cuh"), *code.kernels, host])
    returns = "torch::Tensor" if len(plan.outputs) == 1 else "std::vector<torch::Tensor>"
    params = ", ".join(f"torch::Tensor {i.var}" for i in plan.inputs)
    return Extension(cuda, f"{returns} kevin_run({params});", code.family)


def write_program(plan: Plan, variant: Variant, name: str | None = None, doc: str = "") -> str:
    """A KernelBench-format candidate (ModelNew through load_inline) computing `plan`."""
    digest = hashlib.sha256(repr((plan, variant)).encode()).hexdigest()[:10]
    name = name or f"kevin_builtin_{digest}"
    made = extension(plan, variant)
    cuda = made.cuda
    args = ", ".join(i.var for i in plan.inputs)
    ret = "ext.kevin_run(" + args + ")" if len(plan.outputs) == 1 else "tuple(ext.kevin_run(" + args + "))"
    doc = doc or f"Written by kevin's built-in writer: {made.family} kernel, {variant.describe()}."
    return (
        f'"""{doc}"""\n'
        "import torch\nimport torch.nn as nn\nfrom torch.utils.cpp_extension import load_inline\n\n"
        f"cuda_source = r'''{cuda}'''\n\n"
        f"cpp_source = '{made.declaration}'\n\n"
        f"ext = load_inline(name='{name}', cpp_sources=cpp_source, cuda_sources=cuda_source, functions=['kevin_run'],\n"
        "                  extra_cuda_cflags=['-O3'])\n\n\n"
        "class ModelNew(nn.Module):\n"
        "    def __init__(self, *init_inputs):\n"
        "        super().__init__()\n\n"
        f"    def forward(self, {args}):\n"
        f"        return {ret}\n"
    )


def fast_math(plan: Plan) -> bool:
    """Whether the kernel's math may take the device's fast intrinsics (device_helpers.cuh): every
    output is float16 or bfloat16, whose rounding dwarfs their few float32 ulps."""
    return bool(plan.outputs) and all(o.dtype in (torch.float16, torch.bfloat16) for o in plan.outputs)
