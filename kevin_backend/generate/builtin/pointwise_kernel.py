"""The pointwise kernel family: one thread per element (or per 4 elements, 8 of 16-bit values, on
the vector path: 128-bit accesses when every input is read in order and the pointers are aligned,
checked at run time with the scalar kernel as the fallback), grid-stride, every value computed in
float and rounded to its graph dtype where stored, explicitly cast, or compared.

    code = PointwiseWriter(plan, variant, vector=True).kernel("kevin_pointwise_vec")
"""

from __future__ import annotations

from kevin_backend.generate.builtin.codegen import KernelWriter, closure, indented, node_code, references
from kevin_backend.generate.builtin.index_math import element_offset, input_mode
from kevin_backend.generate.builtin.plan import Plan
from kevin_backend.generate.builtin.variant_fit import pointwise_width
from kevin_backend.generate.builtin.variants import Variant

__all__ = ["PointwiseWriter"]


class PointwiseWriter(KernelWriter):
    """A pointwise kernel: each element's inputs loaded, the plan's nodes computed, the outputs
    stored; with `vector`, `pointwise_width` elements per access and the last elements (`numel`
    not a multiple of the width) one by one."""

    def __init__(self, plan: Plan, variant: Variant, vector: bool) -> None:
        super().__init__(plan)
        self.variant, self.vector = variant, vector
        self.out_vars = [o.var for o in plan.outputs]
        self.nodes = closure(plan, self.out_vars, set())
        self.used = references(self.nodes, self.out_vars)
        self.width = pointwise_width(plan) if vector else 1

    def element(self) -> list[str]:
        """One element at linear position `base`: its loads, its values, its stores."""
        plan, cols = self.plan, self.plan.cols
        loads = [f"float {inp.var} = kevin_ld(p_{inp.var}, {element_offset(inp, plan.shape, 'base', f'(base / {cols}LL)', f'(base % {cols}LL)')});"
                 for inp in plan.inputs if inp.var in self.used]
        return [*loads, *(node_code(n) for n in self.nodes), *(f"kevin_st(p_out{k}, base, {v});" for k, v in enumerate(self.out_vars))]

    def vector_group(self) -> list[str]:
        """`width` elements from `base`: each input's values in one access (or one value for all,
        where the input is the same along them), the values computed per element, one access per
        output."""
        plan, cols, width = self.plan, self.plan.cols, self.width
        body: list[str] = []
        for inp in plan.inputs:
            if inp.var not in self.used:
                continue
            mode = input_mode(inp, plan.shape)
            off = element_offset(inp, plan.shape, "base", "base / " + str(cols) + "LL", "base % " + str(cols) + "LL")
            if mode in ("scalar", "row", "general"):  # one value for the 4 (general: broadcast along the row, see can_vectorize)
                one = {"scalar": "0", "row": f"base / {cols}LL"}.get(mode, off)
                body.append(f"float {inp.var}_v[{width}]; {{ const float one = kevin_ld(p_{inp.var}, {one}); "
                            f"for (int e = 0; e < {width}; ++e) {inp.var}_v[e] = one; }}")
            else:
                body.append(f"float {inp.var}_v[{width}]; kevin_ld{width}(p_{inp.var}, {off}, {inp.var}_v);")
        body.append(f"float o_v[{len(self.out_vars)}][{width}];")
        body.append("#pragma unroll")
        body.append(f"for (int e = 0; e < {width}; ++e) {{")
        for inp in plan.inputs:
            if inp.var in self.used:
                body.append(f"    float {inp.var} = {inp.var}_v[e];")
        body.extend("    " + node_code(n) for n in self.nodes)
        body.extend(f"    o_v[{k}][e] = {v};" for k, v in enumerate(self.out_vars))
        body.append("}")
        body.extend(f"kevin_st{width}(p_out{k}, base, o_v[{k}]);" for k in range(len(self.out_vars)))
        return body

    def tail(self) -> str:
        """The vector path's last elements, one by one, by the first threads of block 0."""
        numel, width = self.plan.numel, self.width
        if not self.vector or not numel % width:
            return ""
        return (f"\n    if (blockIdx.x == 0 && threadIdx.x < {numel % width}) {{\n"
                f"        const long long base = {numel // width * width}LL + threadIdx.x;\n        " + indented(self.element(), 8) + "\n    }")

    def kernel(self, name: str) -> str:
        # a block takes `items` consecutive strips of `threads` groups per step of the grid-stride
        # loop; the strips' loads are independent, so they are in flight together
        ins, outs = self.parameters()
        threads, items = self.variant.threads, max(1, self.variant.items)
        inner = indented(self.vector_group() if self.vector else self.element(), 16)
        return self.narrow(f"""
__global__ void __launch_bounds__({threads}) {name}({ins}, {outs}) {{
    const long long n = {self.plan.numel}LL / {self.width};
    const long long step = (long long)gridDim.x * {threads * items};
    for (long long t0 = (long long)blockIdx.x * {threads * items}; t0 < n; t0 += step) {{
        #pragma unroll
        for (int u = 0; u < {items}; ++u) {{
            const long long t = t0 + u * {threads} + threadIdx.x;
            if (t < n) {{
                const long long base = t * {self.width};
                {inner}
            }}
        }}
    }}{self.tail()}
}}
""")
