"""The tiled pointwise kernel family: when an input's contiguous dimension is not the output's last
one (a transpose or permute, `variant_fit.transposed_plane`), tiles of that plane go through
shared memory: read along the input's contiguous dimension, written along the output's, both
coalesced.

    code, grid = TiledWriter(plan, span=2).kernel("kevin_tiled")
"""

from __future__ import annotations

from typing import Sequence

from kevin_backend.generate.builtin.codegen import KernelWriter, closure, indented, node_code, references
from kevin_backend.generate.builtin.index_math import contiguous_strides, index_terms, layout_in_space
from kevin_backend.generate.builtin.plan import Plan
from kevin_backend.generate.builtin.variant_fit import transposed_plane

__all__ = ["TiledWriter"]


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
        tiles_in, tiles_out = self.tiles_in, self.tiles_out
        outer = 1
        for d in self.others:
            outer *= shape[d]
        self.emit(*(f"__shared__ float tile_{i.var}[{wide}][33];" for i in self.tiled))
        self.emit("const int tx = threadIdx.x % 32, ty = threadIdx.x / 32;",
                  f"const long long t_out = blockIdx.x % {tiles_out}LL;",
                  f"const long long t_in = (blockIdx.x / {tiles_out}LL) % {tiles_in}LL;",
                  f"const long long outer = blockIdx.x / {tiles_out * tiles_in}LL;")
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
        ins, outs = self.parameters()
        kernel = f"""
__global__ void __launch_bounds__(256) {name}({ins}, {outs}) {{
    {indented(self.lines, 4)}
}}
"""
        return self.narrow(kernel), outer * tiles_in * tiles_out
