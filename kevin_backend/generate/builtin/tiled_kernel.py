"""The tiled pointwise kernel family: when an input's contiguous dimension is not the output's last
one (a transpose or permute, `variant_fit.transposed_plane`), tiles of that plane go through
shared memory: read along the input's contiguous dimension, written along the output's, both
coalesced.

    code, grid = TiledWriter(plan, span=2).kernel("kevin_tiled")
    if tiled_pairs(plan):          # every value 16-bit, the plane's sides even
        code, grid = TiledWriter(plan).pairs_kernel("kevin_tiled_vec")   # 64 x 64 tiles, two values an access
"""

from __future__ import annotations

import re
from typing import Sequence

import torch

from kevin_backend.generate.builtin.codegen import KernelWriter, closure, indented, node_code, references
from kevin_backend.generate.builtin.index_math import contiguous_strides, index_terms, layout_in_space
from kevin_backend.generate.builtin.plan import Plan
from kevin_backend.generate.builtin.variant_fit import transposed_plane

__all__ = ["TiledWriter", "tiled_pairs", "PAIR_DTYPES"]

PAIR_DTYPES = (torch.float16, torch.bfloat16)


def tiled_pairs(plan: Plan) -> bool:
    """Whether the tiled kernel's paired form takes the plan: a transposed plane whose two sides
    are even, every input it reads and every output 16-bit, each input that is read along the
    plane's d_in (through the tiles) or along d_out (directly) at even offsets in the other
    dimensions, so that two neighbouring values along that dimension are one 4-byte access from
    a 4-byte aligned pointer (the host checks the pointers)."""
    plane = transposed_plane(plan)
    if plane is None:
        return False
    d_in, d_out = plane
    shape = plan.shape
    if shape[d_in] % 2 or shape[d_out] % 2 or any(o.dtype not in PAIR_DTYPES for o in plan.outputs):
        return False
    for inp in plan.inputs:
        strides = layout_in_space(inp, shape)
        if inp.dtype not in PAIR_DTYPES:
            return False
        along = d_in if strides[d_in] == 1 and strides[d_out] != 1 else d_out
        if strides[along] == 1 and any(st % 2 for d, st in enumerate(strides) if d != along):
            return False
    return True


class TiledWriter(KernelWriter):
    """A pointwise kernel over tiles of 32 (along d_in) x 32 * `span` (along d_out) of the
    (d_in, d_out) plane (`transposed_plane`), one block of 256 threads per tile and position in
    the other dimensions: each input whose contiguous dimension is d_in is read along d_in into
    shared memory (coalesced), then every thread computes one output element per step along d_out
    (coalesced stores), taking such an input's value from the tile and reading the others
    directly. A wider tile keeps more loads in flight per thread (16-bit values move half the
    bytes a load)."""

    def __init__(self, plan: Plan, span: int = 1) -> None:
        super().__init__(plan)
        self.d_in, self.d_out = transposed_plane(plan)  # type: ignore[misc]
        self.span = span
        self.wide = 32 * span  # the tile's extent along d_out
        shape = plan.shape
        self.others = [d for d in range(len(shape)) if d not in (self.d_in, self.d_out)]
        self.tiles_in, self.tiles_out = -(-shape[self.d_in] // 32), -(-shape[self.d_out] // self.wide)
        self.out_vars = [o.var for o in plan.outputs]
        self.nodes = closure(plan, self.out_vars, set())
        self.used = references(self.nodes, self.out_vars)
        # the inputs read through the tiles: contiguous along d_in, not along d_out
        self.tiled = [i for i in plan.inputs if i.var in self.used and layout_in_space(i, shape)[self.d_in] == 1
                      and layout_in_space(i, shape)[self.d_out] != 1]

    def offset(self, strides: Sequence[int], var: str) -> tuple[str, str]:
        """(the declaration of `var`'s offset in the other dimensions, or nothing; its offset at
        (i_in, i_out) of the tile's plane)."""
        shape = self.plan.shape
        base = index_terms("outer", [(shape[d], strides[d]) for d in self.others])
        terms = [f"{var}_base"] if base != "0" else []
        for index, d in (("i_in", self.d_in), ("i_out", self.d_out)):
            if strides[d]:
                terms.append(index if strides[d] == 1 else f"{index} * {strides[d]}LL")
        return f"const long long {var}_base = {base};" if base != "0" else "", " + ".join(terms) or "0"

    def reads(self) -> tuple[list[str], list[str]]:
        """Each input's reads (emitting the tiles' loads and the offsets' declarations): (the
        values taken from the tiles, the values read directly)."""
        shape, wide = self.plan.shape, self.wide
        loads_direct, tile_reads = [], []
        for inp in self.plan.inputs:
            if inp.var not in self.used:
                continue
            decl, load_at = self.offset(layout_in_space(inp, shape), inp.var)
            if decl:
                self.emit(decl)
            if inp in self.tiled:
                # (loops left to the compiler: with `#pragma unroll` on them, a 32 x 32 float transpose
                # measured 0.35 ms on the H200 against 0.28 ms without)
                self.emit(f"for (int j = ty; j < {wide}; j += 8) {{\n"
                          f"        const long long i_in = t_in * 32 + tx, i_out = t_out * {wide} + j;\n"
                          f"        if (i_in < {shape[self.d_in]}LL && i_out < {shape[self.d_out]}LL) "
                          f"tile_{inp.var}[j][tx] = kevin_ld(p_{inp.var}, {load_at});\n    }}")
                tile_reads.append(f"float {inp.var} = tile_{inp.var}[{'tx + 32 * s' if self.span > 1 else 'tx'}][j];")
            else:
                loads_direct.append(f"float {inp.var} = kevin_ld(p_{inp.var}, {load_at});")
        return tile_reads, loads_direct

    def kernel(self, name: str) -> tuple[str, int]:
        """The kernel's code and its grid's size."""
        shape, wide, span = self.plan.shape, self.wide, self.span
        grid = self.begin(f"[{wide}][33]", self.tiles_in, self.tiles_out)
        tile_reads, loads_direct = self.reads()
        out_decl, out_at = self.offset(contiguous_strides(shape), "out")
        if out_decl:
            self.emit(out_decl)
        if self.tiled:
            self.emit("__syncthreads();")
        body = [*tile_reads, *loads_direct, *(node_code(n) for n in self.nodes),
                *(f"kevin_st(p_out{k}, {out_at}, {v});" for k, v in enumerate(self.out_vars))]
        loop = (f"for (int j = ty; j < 32; j += 8) {{\n"
                f"        const long long i_in = t_in * 32 + j, i_out = t_out * {wide} + {'32 * s + ' if span > 1 else ''}tx;\n"
                f"        if (i_in < {shape[self.d_in]}LL && i_out < {shape[self.d_out]}LL) {{\n            {indented(body, 12)}\n"
                "        }\n    }")
        self.emit(f"for (int s = 0; s < {span}; ++s) {{\n    {loop}\n    }}" if span > 1 else loop)
        return self.finish(name), grid

    def begin(self, extents: str, tiles_in: int, tiles_out: int) -> int:
        """Emit each tile's shared array (`extents`, C's) and the block's place (its threads' lane
        `tx` and warp `ty`, its tile `t_in`, `t_out`, its position `outer` in the other
        dimensions); the grid's size."""
        outer = 1
        for d in self.others:
            outer *= self.plan.shape[d]
        self.emit(*(f"__shared__ float tile_{i.var}{extents};" for i in self.tiled))
        self.emit("const int tx = threadIdx.x % 32, ty = threadIdx.x / 32;",
                  f"const long long t_out = blockIdx.x % {tiles_out}LL;",
                  f"const long long t_in = (blockIdx.x / {tiles_out}LL) % {tiles_in}LL;",
                  f"const long long outer = blockIdx.x / {tiles_out * tiles_in}LL;")
        return outer * tiles_in * tiles_out

    def finish(self, name: str) -> str:
        """The kernel `name` of the lines emitted, its index math narrowed where it can be."""
        ins, outs = self.parameters()
        return self.narrow(f"""
__global__ void __launch_bounds__(256) {name}({ins}, {outs}) {{
    {indented(self.lines, 4)}
}}
""")

    def pairs_kernel(self, name: str) -> tuple[str, int]:
        """The paired form (`tiled_pairs`): tiles of 64 x 64 of the plane, each thread's access two
        neighbouring 16-bit values (a warp's load or store one 128-byte stretch, as the 32 x 32
        float kernel's are: a 16-bit value a thread moves half of them), the tiles' inputs read two
        along d_in, the outputs computed and written two along d_out, the other inputs read two
        along d_out where they lie so (else a value each)."""
        plan, shape = self.plan, self.plan.shape
        n_in, n_out = shape[self.d_in], shape[self.d_out]
        grid = self.begin("[64][65]", -(-n_in // 64), -(-n_out // 64))
        pairs, takes = [], []  # the direct inputs' loads before the pair's two values, each value's own
        for inp in plan.inputs:
            if inp.var not in self.used:
                continue
            strides = layout_in_space(inp, shape)
            decl, load_at = self.offset(strides, inp.var)
            if decl:
                self.emit(decl)
            v = inp.var
            if inp in self.tiled:
                self.emit(f"for (int j = ty; j < 64; j += 8) {{\n"
                          f"        const long long i_in = t_in * 64 + 2 * tx, i_out = t_out * 64 + j;\n"
                          f"        if (i_in < {n_in}LL && i_out < {n_out}LL) {{ float a, b; kevin_ld2(p_{v}, {load_at}, a, b); "
                          f"tile_{v}[j][2 * tx] = a; tile_{v}[j][2 * tx + 1] = b; }}\n    }}")
                takes.append(f"float {v} = tile_{v}[2 * tx + q][j];")
            elif strides[self.d_out] == 1:
                pairs.append(f"float {v}_p[2]; kevin_ld2(p_{v}, {load_at}, {v}_p[0], {v}_p[1]);")
                takes.append(f"float {v} = {v}_p[q];")
            elif strides[self.d_out] == 0:
                pairs.append(f"const float {v} = kevin_ld(p_{v}, {load_at});")
            else:
                at_q = re.sub(r"\bi_out\b", "(i_out + q)", load_at)
                takes.append(f"float {v} = kevin_ld(p_{v}, {at_q});")
        out_decl, out_at = self.offset(contiguous_strides(shape), "out")
        if out_decl:
            self.emit(out_decl)
        if self.tiled:
            self.emit("__syncthreads();")
        outs = [f"float o{k}_p[2];" for k in range(len(self.out_vars))]
        body = [*takes, *(node_code(n) for n in self.nodes), *(f"o{k}_p[q] = {v};" for k, v in enumerate(self.out_vars))]
        stores = [f"kevin_st2(p_out{k}, {out_at}, o{k}_p[0], o{k}_p[1]);" for k in range(len(self.out_vars))]
        self.emit(f"for (int j = ty; j < 64; j += 8) {{\n"
                  f"        const long long i_in = t_in * 64 + j, i_out = t_out * 64 + 2 * tx;\n"
                  f"        if (i_in < {n_in}LL && i_out < {n_out}LL) {{\n"
                  f"            {indented([*pairs, *outs], 12)}\n"
                  f"            #pragma unroll\n            for (int q = 0; q < 2; ++q) {{\n"
                  f"                {indented(body, 16)}\n            }}\n"
                  f"            {indented(stores, 12)}\n        }}\n    }}")
        return self.finish(name), grid
