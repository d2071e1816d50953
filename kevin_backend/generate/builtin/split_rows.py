"""Rows too few to fill the GPU, each split over several blocks (the built-in writer's third
kernel family, for rows plans).

    split_count(plan)                                   # blocks per row: 1 when the plan is not worth splitting
    kernels, launches = SplitRowsWriter(plan, threads, width).write()

A rows plan with few long rows (16 rows of 4M elements, a loss summed over a whole tensor) gives
one block per row: a handful of the GPU's multiprocessors busy, the rest idle. Here every row is
cut into `S` chunks, one block each, and every reduction takes two launches:

  * `kevin_part<L>`: each block reduces its chunk (the operand computed per element from the
    inputs and the row's values known so far) to one partial, written to a workspace;
  * `kevin_comb<L>`: one thread per row combines the row's `S` partials in chunk order (index
    reductions keep the first position; a plain sum, max or min takes a warp per row, each lane
    its chunks in order, then a fixed shuffle tree), finishes the value (a mean divides, a half
    rounds) and stores it with the row's state.

A centred reduction (var, var_mean, std) is one level: each block sums its values' differences
from a shift (its chunk's first value) and their squares, which gives the chunk's count, mean and
sum of squared deviations without a division per element; the combine merges the chunks' triples
in order (Chan's pairwise update). Softmax's max and its sum of exp(x - max) are one level as
well: each chunk's max and its sum rescaled as the max grows, the combine rescaling the chunks'
sums to the row's max. `kevin_out` then writes the full-size outputs chunk by chunk, the
chunks in the reverse order (its first blocks re-read what the partial launch read last, from the
L2 cache), and the row-size outputs once per row; a plan without full-size outputs (a loss, a
sum over everything) has no `kevin_out`: its last combine writes them. Each launch reads the row
once: a layer norm reads its input twice and writes once, where one block per row would leave most
of the GPU idle. The launches run in order on the current stream; the workspaces are allocated by
the host function with the outputs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Sequence

from kevin_backend.generate.builtin.codegen import (C_TYPES, COMPENSATE_AFTER, ROUNDING, KernelWriter, RowOffsets, closure,
                                                    node_code, references, row_values)
from kevin_backend.generate.builtin.gpu_properties import gpu_properties
from kevin_backend.generate.builtin.plan import CENTERED, INDEXED, Kind, Plan, PlanNode, Reduction, online_partner

__all__ = ["split_count", "SplitRowsWriter", "SPLIT_MIN_COLS"]

# Rows shorter than this are not split (one block per row reads them fast enough).
SPLIT_MIN_COLS = 16384
# Partial per block: a chunk is at least this long.
_MIN_CHUNK = 4096


def split_count(plan: Plan) -> int:
    """Blocks per row: enough for about four blocks per multiprocessor, chunks of at least
    `_MIN_CHUNK` elements, at most 1024; 1 when the rows fill the GPU (its multiprocessors: fewer
    just queue) or are short."""
    sms = gpu_properties().multiprocessors
    if not plan.is_rows or plan.cols < SPLIT_MIN_COLS or plan.rows >= 2 * sms:
        return 1
    return max(1, min(-(-4 * sms // plan.rows), plan.cols // _MIN_CHUNK, 1024))


# Rows a combine block of 256 threads takes, by level kind: a plain sum, max or min a warp per
# row, the others (joins that are not a simple operator) a thread per row.
_COMBINE_ROWS = {"sum": 8, "moments": 256, "arg": 256, "online": 256}


@dataclass(frozen=True)
class _Level:
    red: PlanNode
    kind: str  # "sum" (a plain reduction), "moments" (a centred one: count, mean, squared deviations), "arg",
    #            "online" (a max and the sum of exp(x - max) after it: softmax's, `online_partner`)
    partner: PlanNode | None = None  # "online": the sum


def _levels(plan: Plan) -> list[_Level]:
    levels: list[_Level] = []
    fused: set[str] = set()
    for red in plan.reductions:
        partner = online_partner(plan, red)
        if red.var in fused:
            continue
        if partner is not None:
            levels.append(_Level(red, "online", partner))
            fused.add(partner.var)
        elif red.reduction in INDEXED:
            levels.append(_Level(red, "arg"))
        elif red.reduction in CENTERED:
            levels.append(_Level(red, "moments"))
        else:
            levels.append(_Level(red, "sum"))
    return levels


class SplitRowsWriter(KernelWriter):
    """The kernels and launches of `plan` split into `split_count(plan)` blocks per row, `threads`
    threads per block. `width` > 1: the per-element operands are contiguous along the row, and
    the kernels read (and write) them `width` at a time when their pointers are 16-byte aligned
    (a branch in each kernel; else one at a time)."""

    def __init__(self, plan: Plan, threads: int, width: int = 0) -> None:
        super().__init__(plan)
        self.threads = threads
        self.width = width if width > 1 else 0
        self.splits = split_count(plan)
        cols = plan.cols
        chunk = -(-cols // self.splits)
        self.chunk = -(-chunk // 8) * 8
        self.slots: dict[str, int] = {}  # float row values kept between launches: var -> slot
        self.index_slots: dict[str, int] = {}  # int64 ones
        self.indexed = any(r.reduction in INDEXED for r in plan.reductions)

    # -- pieces shared by the launches ---------------------------------------------------------

    def _offsets(self) -> RowOffsets:
        return RowOffsets(self.plan, output=True)

    def _row_state(self, parts: RowOffsets, lines: list[str]) -> set[str]:
        """Code that makes the row's known values (kept ones, row-size inputs, row-size pointwise
        values of them) and the row parts of every offset; the names now available."""
        plan, rows = self.plan, self.plan.rows
        lines.extend(parts.declarations())
        available: set[str] = set()
        for var, slot in self.slots.items():
            lines.append(f"const float {var} = p_rv[{slot}LL * {rows}LL + row];")
            available.add(var)
        for var, slot in self.index_slots.items():
            lines.append(f"const int64_t {var} = p_rvi[{slot}LL * {rows}LL + row];")
            available.add(var)
        for inp in plan.inputs:
            if inp.kind is Kind.ROW:
                lines.append(f"const float {inp.var} = kevin_ld(p_{inp.var}, {parts.at(inp.var)});")
                available.add(inp.var)
        lines.extend(row_values(plan, available))
        return available

    def _element(self, parts: RowOffsets, targets: list[str], available: set[str]) -> list[str]:
        """Per element: the loads and node code that compute `targets`."""
        needed = closure(self.plan, targets, available)
        used = references(needed, targets)
        loads = [f"float {i.var} = kevin_ld(p_{i.var}, {parts.at(i.var)});"
                 for i in self.plan.inputs if i.kind is Kind.FULL and i.var in used]
        return [*loads, *(node_code(n) for n in needed)]

    def _loop(self, parts: RowOffsets, body: list[str], stores: Sequence[tuple[int, str]] = ()) -> str:
        """The chunk's loop over `body` (an element's loads, node code and step; `stores`: the
        outputs written, (output index, value)). With a vector width, a branch on the pointers'
        alignment: `width` elements per access where they are 16-byte aligned."""
        t = self.threads
        scalar = [*body, *(f"kevin_st(p_out{k}, {parts.at('out')}, {v});" for k, v in stores)]
        inner = "\n        ".join(scalar)
        plain = f"#pragma unroll 4\n    for (long long c = c_begin + lane; c < c_end; c += {t}) {{\n        {inner}\n    }}"
        if not self.width:
            return plain
        w = self.width
        full = [i.var for i in self.plan.inputs if i.kind is Kind.FULL]
        used = [v for v in full if any(re.match(rf"float {v} = kevin_ld\(", line) for line in body)]
        element = [line for line in body if not any(re.match(rf"float {v} = kevin_ld\(", line) for v in used)]
        pointers = [f"p_{v}" for v in full] + [f"p_out{k}" for k, _ in stores]
        aligned = " | ".join(f"reinterpret_cast<uintptr_t>({p})" for p in pointers) or "0"
        head = [*(f"float {v}_v[{w}]; kevin_ld{w}(p_{v}, {parts.at(v, 'c0')}, {v}_v);" for v in used),
                *(f"float o{k}_v[{w}];" for k, _ in stores)]
        per = [*(f"const float {v} = {v}_v[k];" for v in used), *element, *(f"o{k}_v[k] = {v};" for k, v in stores)]
        tail = [f"kevin_st{w}(p_out{k}, {parts.at('out', 'c0')}, o{k}_v);" for k, _ in stores]
        vec = (f"for (long long c0 = c_begin + (long long)lane * {w}; c0 < c_end; c0 += {t * w}) {{\n"
               + "".join(f"        {line}\n" for line in head)
               + f"        #pragma unroll\n        for (int k = 0; k < {w}; ++k) {{\n            const long long c = c0 + k;\n"
               + "".join(f"            {line}\n" for line in per) + "        }\n"
               + "".join(f"        {line}\n" for line in tail) + "    }")
        return f"if ((({aligned}) & 15) == 0) {{\n    {vec}\n    }} else {{\n    {plain}\n    }}"

    def _header(self, name: str, params: str, splits: int) -> str:
        cols = self.plan.cols
        chunk = self.chunk if splits > 1 else cols
        shared = (f"__shared__ float smem[{max(1, self.threads // 32)}];"
                  + (f" __shared__ int64_t smem_i[{max(1, self.threads // 32)}];" if self.indexed else ""))
        # the outputs' launch takes the chunks in the reverse order: its first blocks read what the
        # last partial launch read last, while it is still in the L2 cache
        block = "(long long)(gridDim.x - 1u - blockIdx.x)" if name == "kevin_out" else "(long long)blockIdx.x"
        return (f"__global__ void __launch_bounds__({self.threads}) {name}({params}) {{\n"
                f"    {shared}\n"
                "    const int row_in_block = 0;\n    const int lane = threadIdx.x;\n"
                f"    const long long block = {block};\n"
                f"    const long long row = block / {splits};\n"
                f"    const long long c_begin = (block % {splits}) * {chunk}LL;\n"
                f"    const long long c_end = c_begin + {chunk}LL < {cols}LL ? c_begin + {chunk}LL : {cols}LL;\n")

    def _pointers(self, outputs: bool) -> list[str]:
        ins = [f"const {C_TYPES[i.dtype]}* __restrict__ p_{i.var}" for i in self.plan.inputs]
        outs = [f"{C_TYPES[o.dtype]}* __restrict__ p_out{k}" for k, o in enumerate(self.plan.outputs)] if outputs else []
        return [*ins, *outs]

    def _params(self, outputs: bool) -> str:
        return ", ".join([*self._pointers(outputs), "const float* __restrict__ p_rv", "const int64_t* __restrict__ p_rvi"])

    # -- the launches --------------------------------------------------------------------------

    def _partial(self, index: int, level: _Level) -> str:
        red = level.red
        parts = self._offsets()
        lines: list[str] = []
        available = self._row_state(parts, lines)
        assert red.operand is not None
        body = self._element(parts, [red.operand], available)
        value = red.operand
        per_thread = self.chunk // self.threads
        if level.kind == "arg":
            op = "max" if red.reduction in (Reduction.ARGMAX, Reduction.MAX_DIM) else "min"
            lines.append(f"float acc = {'-INFINITY' if op == 'max' else 'INFINITY'}; int64_t acc_i = INT64_MAX;")
            step = f"kevin_arg_step_{op}(acc, acc_i, {value}, (int64_t)c);"
            finish = [f"kevin_row_reduce_arg{op}(acc, acc_i, smem, smem_i, row_in_block, lane);",
                      "if (lane == 0) { p_ws[blockIdx.x] = acc; p_wsi[blockIdx.x] = acc_i; }"]
        elif level.kind == "online":  # the chunk's max and its sum of exp(x - max), rescaled as the max grows
            lines.append("float acc = -INFINITY, acc2 = 0.0f;")
            step = f"kevin_online_step(acc, acc2, {value});"
            finish = ["const float row_max = kevin_row_reduce_max(acc, smem, row_in_block, lane);",
                      "acc2 = kevin_row_reduce_add(kevin_online_rescale(acc2, acc, row_max), smem, row_in_block, lane);",
                      "if (lane == 0) { p_ws[3LL * blockIdx.x] = row_max; p_ws[3LL * blockIdx.x + 1] = acc2; }"]
        elif level.kind == "moments":
            # the chunk's values less a shift (its first value, close to the mean for any offset
            # the data has): their sum and sum of squares give its mean and squared deviations
            first = "\n            ".join([*body, f"shift = {value};"])
            lines.append(f"float shift = 0.0f;\n    if (c_begin < c_end) {{\n        const long long c = c_begin;\n"
                         f"            {first}\n    }}")
            lines.append("float acc = 0.0f, acc2 = 0.0f;")
            step = f"{{ const float d = ({value}) - shift; acc = acc + d; acc2 = acc2 + d * d; }}"
            finish = ["acc = kevin_row_reduce_add(acc, smem, row_in_block, lane);",
                      "acc2 = kevin_row_reduce_add(acc2, smem, row_in_block, lane);",
                      "if (lane == 0) {\n        const float n = c_end > c_begin ? (float)(c_end - c_begin) : 0.0f;\n"
                      "        p_ws[3LL * blockIdx.x] = n;\n"
                      "        p_ws[3LL * blockIdx.x + 1] = n > 0.0f ? shift + acc / n : 0.0f;\n"
                      "        p_ws[3LL * blockIdx.x + 2] = n > 0.0f ? fmaxf(acc2 - acc * (acc / n), 0.0f) : 0.0f;\n    }"]
        else:
            op = {Reduction.AMAX: "max", Reduction.AMIN: "min"}.get(red.reduction, "add")
            init = {"max": "-INFINITY", "min": "INFINITY"}.get(op, "0.0f")
            lines.append(f"float acc = {init};")
            if op == "add" and per_thread > COMPENSATE_AFTER:  # Kahan, as the rows kernels
                lines.append("float acc_c = 0.0f;")
                step = (f"{{ const float y = ({value}) - acc_c; const float t = acc + y; "
                        "acc_c = isfinite(t) ? (t - acc) - y : 0.0f; acc = t; }")
            else:
                step = {"add": f"acc = acc + {value};", "max": f"acc = kevin_maximum(acc, {value});",
                        "min": f"acc = kevin_minimum(acc, {value});"}[op]
            finish = [f"acc = kevin_row_reduce_{op}(acc, smem, row_in_block, lane);", "if (lane == 0) p_ws[blockIdx.x] = acc;"]
        lines.append(self._loop(parts, [*body, step]))
        lines.extend(finish)
        params = self._params(False) + ", float* __restrict__ p_ws" + (", int64_t* __restrict__ p_wsi" if self.indexed else "")
        return self._header(f"kevin_part{index}", params, self.splits) + "    " + "\n    ".join(lines) + "\n}\n"

    def _combine(self, index: int, level: _Level, finish: bool = False) -> str:
        """One thread per row: the row's partials in chunk order, then the finished value(s) kept.
        `finish` (the last level of a plan without full-size outputs): the row's values and
        outputs too, in place of a launch of `kevin_out`."""
        red, rows, splits, cols = level.red, self.plan.rows, self.splits, self.plan.cols
        rnd = ROUNDING.get(red.dtype, "")
        if _COMBINE_ROWS[level.kind] == 8:  # a warp per row (see the plain case below)
            lines = ["const long long row = ((long long)blockIdx.x * 256LL + threadIdx.x) >> 5;",
                     "const int wl = (int)(threadIdx.x & 31u);", f"const bool valid = row < {rows}LL;"]
        else:
            lines = ["const long long row = (long long)blockIdx.x * 256LL + threadIdx.x;", f"if (row >= {rows}LL) return;"]
        keep: list[tuple[str, str, bool]] = []  # (var, expression, int64)
        if level.kind == "arg":
            op = "max" if red.reduction in (Reduction.ARGMAX, Reduction.MAX_DIM) else "min"
            lines.append(f"float acc = {'-INFINITY' if op == 'max' else 'INFINITY'}; int64_t acc_i = INT64_MAX;")
            lines.append(f"for (int s = 0; s < {splits}; ++s) kevin_arg_join_{op}(acc, acc_i, p_ws[row * {splits}LL + s], "
                         f"p_wsi[row * {splits}LL + s]);")
            if red.reduction in (Reduction.ARGMAX, Reduction.ARGMIN):
                keep.append((red.var, "acc_i", True))
            else:
                keep += [(f"{red.var}_0", f"{rnd}(acc)", False), (f"{red.var}_1", "acc_i", True), (red.var, f"{rnd}(acc)", False)]
        elif level.kind == "online":  # the chunks' maxima, then their sums rescaled to the row's
            assert level.partner is not None
            lines.append("float m = -INFINITY, acc = 0.0f;")
            lines.append(f"for (int s = 0; s < {splits}; ++s) m = kevin_maximum(m, p_ws[(row * {splits}LL + s) * 3LL]);")
            lines.append(f"for (int s = 0; s < {splits}; ++s) acc += kevin_online_rescale(p_ws[(row * {splits}LL + s) * 3LL + 1], "
                         f"p_ws[(row * {splits}LL + s) * 3LL], m);")
            keep += [(red.var, f"{rnd}(m)", False),
                     (level.partner.var, f"{ROUNDING.get(level.partner.dtype, '')}(acc)", False)]
        elif level.kind == "moments":  # the chunks' (count, mean, squared deviations) merged in order
            r = red.reduction
            lines.append("float n = 0.0f, mean = 0.0f, acc = 0.0f;")
            lines.append(f"for (int s = 0; s < {splits}; ++s) {{\n        const long long k = (row * {splits}LL + s) * 3LL;\n"
                         "        const float nb = p_ws[k];\n"
                         "        if (nb > 0.0f) {\n            const float nn = n + nb, d = p_ws[k + 1] - mean;\n"
                         "            mean += d * (nb / nn);\n            acc += p_ws[k + 2] + d * d * (n * (nb / nn));\n"
                         "            n = nn;\n        }\n    }")
            denom = f"({cols}.0f - {red.correction:.1f}f)"
            if r is Reduction.STD:
                keep.append((red.var, f"{rnd}(sqrtf(acc / {denom}))", False))
            elif r is Reduction.VAR:
                keep.append((red.var, f"{rnd}(acc / {denom})", False))
            else:  # var_mean
                keep += [(f"{red.var}_0", f"{rnd}(acc / {denom})", False), (f"{red.var}_1", f"{rnd}(mean)", False),
                         (red.var, f"{rnd}(acc / {denom})", False)]
        else:
            op = {Reduction.AMAX: "kevin_maximum(acc, v)", Reduction.AMIN: "kevin_minimum(acc, v)"}.get(red.reduction, "acc + v")
            init = {Reduction.AMAX: "-INFINITY", Reduction.AMIN: "INFINITY"}.get(red.reduction, "0.0f")
            # a warp per row: each lane its chunks in order, then a fixed shuffle tree (one thread
            # reading hundreds of partials one after another took microseconds of a 30 us sum)
            lines.append(f"float acc = {init};")
            lines.append(f"if (valid) for (int s = wl; s < {splits}; s += 32) {{ const float v = p_ws[row * {splits}LL + s]; acc = {op}; }}")
            lines.append(f"for (int o = 16; o > 0; o >>= 1) {{ const float v = __shfl_xor_sync(0xffffffffu, acc, o); acc = {op}; }}")
            lines.append("if (!valid) return;")
            r = red.reduction
            if r is Reduction.MEAN:
                keep.append((red.var, f"{rnd}(acc / {cols}.0f)", False))
            else:
                keep.append((red.var, f"{rnd}(acc)", False))
        for var, expr, is_index in keep:
            table = self.index_slots if is_index else self.slots
            slot = table.setdefault(var, len(table))
            lines.append(f"{'p_rvi' if is_index else 'p_rv'}[{slot}LL * {rows}LL + row] = {expr};")
        params = ("const float* __restrict__ p_ws, " + ("const int64_t* __restrict__ p_wsi, " if self.indexed else "")
                  + "float* __restrict__ p_rv, int64_t* __restrict__ p_rvi")
        if finish:  # the row's values from the state just kept (this thread's own writes), then its outputs
            self._row_state(self._offsets(), lines)
            lines.append(" ".join(f"kevin_st(p_out{k}, row, {o.var});" for k, o in enumerate(self.plan.outputs)))
            params += ", " + ", ".join(self._pointers(True))
        return (f"__global__ void __launch_bounds__(256) kevin_comb{index}({params}) {{\n    "
                + "\n    ".join(lines) + "\n}\n")

    def _output(self) -> tuple[str, int]:
        plan = self.plan
        full = [(k, o) for k, o in enumerate(plan.outputs) if o.kind is Kind.FULL]
        splits = self.splits if full else 1
        parts = self._offsets()
        lines: list[str] = []
        available = self._row_state(parts, lines)
        if full:
            body = self._element(parts, [o.var for _, o in full], available)
            lines.append(self._loop(parts, body, [(k, o.var) for k, o in full]))
        row_outs = [(k, o) for k, o in enumerate(plan.outputs) if o.kind is Kind.ROW]
        if row_outs:
            stores = " ".join(f"kevin_st(p_out{k}, row, {o.var});" for k, o in row_outs)
            lines.append(f"if (c_begin == 0 && lane == 0) {{ {stores} }}")
        return self._header("kevin_out", self._params(True), splits) + "    " + "\n    ".join(lines) + "\n}\n", splits

    def write(self) -> tuple[list[str], str]:
        plan, rows, splits = self.plan, self.plan.rows, self.splits
        kernels, launches = [], []
        first = plan.inputs[0].var
        ins = [f"reinterpret_cast<const {C_TYPES[i.dtype]}*>({i.var}.data_ptr())" for i in plan.inputs]
        outs = [f"reinterpret_cast<{C_TYPES[o.dtype]}*>(out{k}.data_ptr())" for k, o in enumerate(plan.outputs)]
        ws = "reinterpret_cast<float*>(ws.data_ptr())"
        wsi = ["reinterpret_cast<int64_t*>(wsi.data_ptr())"] if self.indexed else []
        state = ["reinterpret_cast<float*>(rv.data_ptr())", "reinterpret_cast<int64_t*>(rvi.data_ptr())"]
        levels = _levels(plan)
        # no full-size output (a loss, a sum over everything): the last combine writes the outputs,
        # one launch fewer (a few microseconds of a 30-170 us task on the H200)
        fused = not any(o.kind is Kind.FULL for o in plan.outputs)
        for index, level in enumerate(levels):
            kernels.append(self._partial(index, level))
            launches.append(f"    kevin_part{index}<<<(unsigned){rows * splits}, {self.threads}, 0, stream>>>"
                            f"({', '.join([*ins, *state, ws, *wsi])});")
            finish = fused and index == len(levels) - 1
            kernels.append(self._combine(index, level, finish))
            args = [ws, *wsi, *state, *((*ins, *outs) if finish else ())]
            launches.append(f"    kevin_comb{index}<<<(unsigned){-(-rows // _COMBINE_ROWS[level.kind])}, 256, 0, stream>>>"
                            f"({', '.join(args)});")
        if not fused:
            code, out_splits = self._output()
            kernels.append(code)
            launches.append(f"    kevin_out<<<(unsigned){rows * out_splits}, {self.threads}, 0, stream>>>({', '.join([*ins, *outs, *state])});")
        workspaces = [
            f"    auto ws = torch::empty({{{rows * splits * 3}}}, {first}.options().dtype(torch::kFloat32));",
            *([f"    auto wsi = torch::empty({{{rows * splits}}}, {first}.options().dtype(torch::kInt64));"] if self.indexed else []),
            f"    auto rv = torch::empty({{{max(1, len(self.slots)) * rows}}}, {first}.options().dtype(torch::kFloat32));",
            f"    auto rvi = torch::empty({{{max(1, len(self.index_slots)) * rows}}}, {first}.options().dtype(torch::kInt64));",
        ]
        return kernels, "\n".join([*workspaces, *launches])
