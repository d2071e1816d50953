"""The direct convolution's CUDA source (`direct_conv.py` plans it): the kernel and its host
function `kevin_run`, for one of the plan's tilings.

    cuda, declaration = direct_extension(plan, tiling)

A thread's work, in the order the kernel does it: the filter (and the bias) read once per block
into shared memory (`_filter_fill`; a depthwise thread reads its few words through the cache);
its positions' output index (`_kernel`: a warp along the positions, or, a depthwise or grouped
convolution of a channels-last input, along the channel blocks); each window tap's input values
(`_taps`, `_depthwise_taps`; a channels-last thread's channels a vector at a time, `_vector_taps`)
and their multiply-adds; the epilogue's lines; the stores (`_stores`, a vector at a time where
the thread's channels lie innermost in the output).
"""

from __future__ import annotations

import math

import torch

from kevin_backend.generate.builtin.codegen import C_TYPES, TORCH_DTYPES, cuda_code
from kevin_backend.generate.builtin.direct_conv import DirectConv, DirectTiling, _offset, _thread_channels

__all__ = ["direct_extension"]


def _filter_fill(plan: DirectConv, threads: int) -> list[str]:
    """Lines filling shared memory with the filter, one tap's output channels consecutive, and the bias."""
    cin, cout = plan.channels
    window = plan.w.shape[2:]
    lines = [f"__shared__ __align__(16) float ws[{plan.taps * cout}];",
             f"for (int i = threadIdx.x; i < {plan.taps * cout}; i += {threads}) {{",
             f"    const int co = i % {cout}; int tap = i / {cout};"]
    out_dim, in_dim = (1, 0) if plan.transposed else (0, 1)  # (a transposed convolution's filter: C_in x C_out x window)
    terms = [f"co * {plan.w.stride[out_dim]}LL"]
    for d in reversed(range(len(window))):
        lines.append(f"    const int k{d} = tap % {window[d]}; tap /= {window[d]};")
        terms.append(f"k{d} * {plan.w.stride[2 + d]}LL")
    terms.append(f"tap * {plan.w.stride[in_dim]}LL")
    lines += [f"    ws[i] = kevin_ld(p_in{plan.w.index}, {' + '.join(terms)});", "}"]
    if plan.bias is not None:
        lines += [f"__shared__ float bs[{cout}];",
                  f"for (int i = threadIdx.x; i < {cout}; i += {threads}) bs[i] = kevin_ld(p_in{plan.bias.index}, i * {plan.bias.stride[0]}LL);"]
    return lines + ["__syncthreads();"]


def _outer_index(plan: DirectConv, d: int, size: int) -> list[str]:
    """The input index i{d} of an outer spatial dimension's window tap k{d} at output o{d}, and the
    `continue` of a tap outside the input (or, transposed, one whose position does not divide)."""
    stride, pad, dil = plan.stride[d], plan.padding[d], plan.dilation[d]
    if not plan.transposed:
        return [f"const int i{d} = o{d} * {stride} - {pad} + k{d} * {dil};"] + \
            [f"if ((unsigned)i{d} >= {size}u) continue;"] * bool(pad)
    if stride == 1:
        return [f"const int i{d} = o{d} + {pad} - k{d} * {dil};", f"if ((unsigned)i{d} >= {size}u) continue;"]
    return [f"const int t{d} = o{d} + {pad} - k{d} * {dil};", f"if (t{d} < 0 || t{d} % {stride} != 0) continue;",
            f"const int i{d} = t{d} / {stride};", f"if (i{d} >= {size}) continue;"]


def _inner_index(plan: DirectConv, positions: int, size: int) -> tuple[list[str], str]:
    """The innermost dimension's input index `il` of position `ol + p` at tap k, and the condition
    of reading it (else a zero): inside the input, and, transposed, a position that divides."""
    last = len(plan.out_spatial) - 1
    stride, pad, dil = plan.stride[last], plan.padding[last], plan.dilation[last]
    if not plan.transposed:
        guard = f"(unsigned)il < {size}u" if pad or plan.out_spatial[last] % positions else "true"
        return [f"const int il = (ol + p) * {stride} - {pad} + k{last} * {dil};"], guard
    if stride == 1:
        return [f"const int il = (ol + p) + {pad} - k{last} * {dil};"], f"(unsigned)il < {size}u"
    return ([f"const int tl = (ol + p) + {pad} - k{last} * {dil};", f"const int il = tl / {stride};"],
            f"tl >= 0 && tl % {stride} == 0 && il < {size}")


def _window(plan: DirectConv, depth: int, body: list[str]) -> list[str]:
    """The window's loops, indented `depth` levels: each outer spatial dimension's taps (its input
    index i{d}; a tap outside the input, or transposed one that does not divide, skipped), then the
    innermost dimension's taps around `body` (which reads k{last}), closed."""
    window, spatial = plan.w.shape[2:], plan.x.shape[2:]
    last, start = len(window) - 1, depth
    lines = []
    for d in range(last):  # (a row of input at a time)
        pad = "    " * depth
        lines += [f"{pad}#pragma unroll", f"{pad}for (int k{d} = 0; k{d} < {window[d]}; ++k{d}) {{"]
        lines += [pad + "    " + line for line in _outer_index(plan, d, spatial[d])]
        depth += 1
    pad = "    " * depth
    lines += [f"{pad}#pragma unroll", f"{pad}for (int k{last} = 0; k{last} < {window[last]}; ++k{last}) {{",
              *(f"{pad}    {line}" for line in body), f"{pad}}}"]
    return lines + ["    " * d + "}" for d in reversed(range(start, depth))]


def _input_at(plan: DirectConv, positions: int, channel: str) -> tuple[list[str], str, str]:
    """The lines finding position `ol + p`'s input index `il` at the current taps, the condition of
    reading it (else a zero) and the input's element offset there in input channel `channel`."""
    spatial = plan.x.shape[2:]
    base = " + ".join([f"n * {plan.x.stride[0]}LL", f"{channel} * {plan.x.stride[1]}LL",
                       *(f"i{d} * {plan.x.stride[2 + d]}LL" for d in range(len(spatial) - 1))])
    index, guard = _inner_index(plan, positions, spatial[-1])
    return index, guard, f"{base} + il * {plan.x.stride[-1]}LL"


def _input_value(plan: DirectConv, positions: int, channel: str) -> tuple[list[str], str]:
    """The lines finding position `ol + p`'s input index `il` at the current taps, and the input's
    value there in input channel `channel` (a zero outside the input)."""
    index, guard, at = _input_at(plan, positions, channel)
    return index, f"({guard}) ? kevin_ld(p_in{plan.x.index}, {at}) : 0.0f"


def _vector(dtype: torch.dtype, count: int, steps: tuple[int, ...]) -> int:
    """Elements one vector access takes of `count` consecutive channels lying innermost (their step
    1, every other step of the tensor a multiple of it): 8 of a 16-bit dtype (16 bytes), 4 (16 or
    8 bytes); 0 where they are not read or stored so."""
    if steps[1] != 1:
        return 0
    width = 8 if dtype != torch.float32 and count % 8 == 0 else 4 if count % 4 == 0 else 0
    return width if width and all(s % width == 0 for k, s in enumerate(steps) if k != 1) else 0


def _vector_lines(op: str, pointer: str, at: str, values: str, count: int, width: int) -> list[str]:
    """`count` consecutive elements at `at` loaded into (or stored from) `values`, `width` at a time."""
    return [f"kevin_{op}{width}({pointer}, {at} + {j}, {values} + {j});" for j in range(0, count, width)]


def _input_width(plan: DirectConv, tiling: DirectTiling) -> int:
    """The vector width of a depthwise or grouped thread's input channels of a channels-last input
    (a depthwise thread's CB, a grouped thread's group's input channels), 0 for scalar reads."""
    return _vector(plan.x.dtype, tiling.channels if plan.depthwise else plan.channels[0], plan.x.stride) if plan.blocked else 0


def _vector_taps(plan: DirectConv, positions: int, first: str, count: int, width: int, uses: list[str]) -> list[str]:
    """A window tap's work at each position: the `count` input channels from `first` on read into
    `xs`, `width` at a time (zeros outside the input), then the multiply-adds `uses`."""
    index, guard, at = _input_at(plan, positions, first)
    loads = _vector_lines("ld", f"p_in{plan.x.index}", at, "xs", count, width)
    body = ["#pragma unroll", f"for (int p = 0; p < {positions}; ++p) {{", *index, f"float xs[{count}];",
            f"if ({guard}) {{", *loads, "} else {", "#pragma unroll", f"for (int e = 0; e < {count}; ++e) xs[e] = 0.0f;", "}",
            *uses, "}"]
    return _window(plan, 0, body[:2] + ["    " + line for line in body[2:-1]] + body[-1:])


def _taps(plan: DirectConv, positions: int, width: int) -> list[str]:
    """The multiply-adds: for each input channel and window tap, the positions' input values, then
    each output channel's filter word times each."""
    cin, cout = plan.channels
    count, channel = _thread_channels(plan.grouped, cout)  # (grouped: the group's CB output channels from c0 on)
    tap = "ci"
    for d, size in enumerate(plan.w.shape[2:]):
        tap = f"({tap} * {size} + k{d})"
    if width:  # (a channels-last input: each tap's group input channels read a vector at a time, then used)
        return _vector_taps(plan, positions, f"(c0 / CB * {cin})", cin, width, [
            "#pragma unroll", f"for (int ci = 0; ci < {cin}; ++ci) {{", f"    const float* wt = ws + {tap} * {cout};",
            "    #pragma unroll", f"    for (int c = 0; c < {count}; ++c) acc[p][c] = fmaf(xs[ci], wt[{channel}], acc[p][c]);", "}"])
    index, value = _input_value(plan, positions, f"(c0 / CB * {cin} + ci)" if plan.grouped else "ci")
    body = [f"const float* wt = ws + {tap} * {cout};",
            f"float xv[{positions}];",
            "#pragma unroll",
            f"for (int p = 0; p < {positions}; ++p) {{",
            *(f"    {line}" for line in index),
            f"    xv[p] = {value};",
            "}",
            "#pragma unroll",
            f"for (int c = 0; c < {count}; ++c) {{",
            f"    const float wv = wt[{channel}];",
            "    #pragma unroll",
            f"    for (int p = 0; p < {positions}; ++p) acc[p][c] = fmaf(xv[p], wv, acc[p][c]);",
            "}"]
    return [f"for (int ci = 0; ci < {cin}; ++ci) {{", *_window(plan, 1, body), "}"]


def _depthwise_taps(plan: DirectConv, positions: int, count: int, width: int) -> list[str]:
    """A depthwise convolution's multiply-adds: for each window tap, each of the thread's CB
    (`count`) channels, its filter word (read through the cache) times its own input channel's
    values (of a channels-last input: read `width` channels at a time)."""
    dims = len(plan.w.shape) - 2
    filt = " + ".join([f"(c0 + c) * {plan.w.stride[0]}LL", *(f"k{d} * {plan.w.stride[2 + d]}LL" for d in range(dims))])
    if width:  # (a channels-last input: the thread's CB channels at a position, read a vector at a time)
        return _vector_taps(plan, positions, "c0", count, width, [
            "#pragma unroll", f"for (int c = 0; c < CB; ++c) acc[p][c] = fmaf(xs[c], kevin_ld(p_in{plan.w.index}, {filt}), acc[p][c]);"])
    index, value = _input_value(plan, positions, "(c0 + c)")
    body = ["#pragma unroll",
            "for (int c = 0; c < CB; ++c) {",
            f"    const float wv = kevin_ld(p_in{plan.w.index}, {filt});",
            "    #pragma unroll",
            f"    for (int p = 0; p < {positions}; ++p) {{",
            *(f"        {line}" for line in index),
            f"        const float xv = {value};",
            "        acc[p][c] = fmaf(xv, wv, acc[p][c]);",
            "    }",
            "}"]
    return _window(plan, 0, body)


def _stores(plan: DirectConv, block: int) -> list[str]:
    """Each output stored at position `ol + p`: a value over the channels, each of the thread's
    (a depthwise or grouped thread's `block` channels lying innermost: a vector at a time), or one."""
    _, cout = plan.channels
    count, channel = _thread_channels(plan.blocked, cout)
    lines = []
    for k, o in enumerate(plan.outputs):
        width = _vector(o.dtype, block, o.steps) if plan.blocked and o.per_channel else 0
        if width:
            lines += _vector_lines("st", f"p_out{k}", _offset(o.steps, "c0"), o.var, block, width)
        elif o.per_channel:
            lines += ["#pragma unroll", f"for (int c = 0; c < {count}; ++c) kevin_st(p_out{k}, {_offset(o.steps, channel)}, {o.var}[c]);"]
        else:
            lines.append(f"kevin_st(p_out{k}, {_offset(o.steps, '0')}, {o.var});")
    return lines


def _kernel(plan: DirectConv, tiling: DirectTiling) -> tuple[str, int]:
    """The kernel's source and the threads it launches."""
    threads, positions = tiling.threads, tiling.positions
    _, cout = plan.channels
    spatial = plan.out_spatial
    chunks = -(-spatial[-1] // positions)
    blocked = plan.blocked  # (a depthwise or grouped thread's channels: CB from c0 on)
    blocks = cout // tiling.channels if blocked else 1
    total = plan.x.shape[0] * math.prod(spatial[:-1]) * chunks * blocks
    tensors = {t.index: t for t in (plan.x, plan.w, plan.bias, *plan.operands) if t is not None}
    params = [f"const {C_TYPES[tensors[i].dtype]}* __restrict__ p_in{i}" for i in plan.reads] + \
             [f"{C_TYPES[o.dtype]}* __restrict__ p_out{k}" for k, o in enumerate(plan.outputs)]
    # a warp's threads along the positions (coalesced in a plain layout), or, a depthwise or grouped
    # convolution of a channels-last input, along its channel blocks first (each thread's CB channels the
    # next ones in memory, and its group's input channels)
    channels_inner = blocked and plan.x.stride[1] == 1
    index = [f"const int c0 = (int)(t % {blocks}) * CB; long long r = t / {blocks};"] if channels_inner else []
    index.append(f"const int ol = (int)(r % {chunks}) * {positions}; r /= {chunks};" if channels_inner else
                 f"const int ol = (int)(t % {chunks}) * {positions}; long long r = t / {chunks};")
    for d in reversed(range(len(spatial) - 1)):
        index.append(f"const int o{d} = (int)(r % {spatial[d]}); r /= {spatial[d]};")
    if blocked and not channels_inner:
        index.append(f"const int c0 = (int)(r % {blocks}) * CB; r /= {blocks};")
    index.append("const long long n = r;")
    if plan.depthwise:  # (no shared memory: a warp's threads read the same filter words, from the cache)
        count, fill = "CB", [f"constexpr int CB = {tiling.channels};"]
        init = f"kevin_ld(p_in{plan.bias.index}, (c0 + c) * {plan.bias.stride[0]}LL)" if plan.bias is not None else "0.0f"
    elif plan.grouped:  # (the whole filter in shared memory, a thread reading its group's words)
        count, fill = "CB", [f"constexpr int CB = {tiling.channels};", *_filter_fill(plan, threads)]
        init = "bs[c0 + c]" if plan.bias is not None else "0.0f"
    else:
        count, fill = str(cout), _filter_fill(plan, threads)
        init = "bs[c]" if plan.bias is not None else "0.0f"
    # (a grouped block fills the whole filter, C_out x C_in / groups x window words, then computes ROUNDS
    # of its threads' outputs: one round left a 64-thread block 72 words to fill for 16 outputs a thread)
    rounds = _rounds(plan)
    first = f"((long long)blockIdx.x * {rounds} + round) * {threads}" if rounds > 1 else f"(long long)blockIdx.x * {threads}"
    work = [f"const long long t = {first} + threadIdx.x;",
            f"if (t >= {total}LL) return;", *index,
            f"float acc[{positions}][{count}];", "#pragma unroll",
            f"for (int p = 0; p < {positions}; ++p) {{", "    #pragma unroll",
            f"    for (int c = 0; c < {count}; ++c) acc[p][c] = {init};", "}",
            *(_depthwise_taps(plan, positions, tiling.channels, _input_width(plan, tiling)) if plan.depthwise
              else _taps(plan, positions, _input_width(plan, tiling))),
            "#pragma unroll", f"for (int p = 0; p < {positions}; ++p) {{",
            f"    if (ol + p >= {spatial[-1]}) break;",
            *("    " + line for line in (*plan.body, *_stores(plan, tiling.channels))), "}"]
    body = [*fill, *([f"for (int round = 0; round < {rounds}; ++round) {{", *("    " + line for line in work), "}"]
                     if rounds > 1 else work)]
    return (f"__global__ void __launch_bounds__({threads}) kevin_direct_conv({', '.join(params)}) {{\n"
            + "\n".join("    " + line for line in body) + "\n}\n"), total


def _rounds(plan: DirectConv) -> int:
    """Rounds of a block's threads after one fill of the filter: 8 for a grouped convolution's whole
    filter, 1 otherwise (a one-group filter serves each thread's every output channel)."""
    return 8 if plan.grouped else 1


def direct_extension(plan: DirectConv, tiling: DirectTiling) -> tuple[str, str]:
    """The CUDA source of `plan`'s kernel in `tiling` and its host function `kevin_run`, and the
    host function's declaration."""
    kernel, total = _kernel(plan, tiling)
    tensors = {t.index: t for t in (plan.x, plan.w, plan.bias, *plan.operands) if t is not None}
    first = f"in{plan.x.index}"
    checks = []
    for i in plan.reads:
        t = tensors[i]
        sizes, strides = ", ".join(map(str, t.shape)), ", ".join(map(str, t.stride))
        checks.append(f'    TORCH_CHECK(in{i}.is_cuda() && in{i}.scalar_type() == {TORCH_DTYPES.get(t.dtype, "torch::kBool")} && '
                      f'in{i}.sizes() == torch::IntArrayRef({{{sizes}}}) && in{i}.strides() == torch::IntArrayRef({{{strides}}}), '
                      f'"kevin kernel: input {i} must be {str(t.dtype).replace("torch.", "")} of sizes [{sizes}] and strides [{strides}]");')
    # (a channels-last depthwise or grouped thread's input channels read a vector at a time: the input's
    # start on that vector's boundary, as torch allocates; a view that starts between fails here, never reads amiss)
    width = _input_width(plan, tiling)
    if width:
        size = width * torch.empty((), dtype=plan.x.dtype).element_size()
        checks.append(f'    TORCH_CHECK(reinterpret_cast<uintptr_t>({first}.data_ptr()) % {size} == 0, '
                      f'"kevin kernel: input {plan.x.index} must start on a {size}-byte boundary (the kernel reads {width} channels at a time)");')
    allocs = [f"    auto out{k} = torch::empty_strided({{{', '.join(map(str, o.shape))}}}, {{{', '.join(map(str, o.stride))}}}, "
              f"{first}.options().dtype({TORCH_DTYPES[o.dtype]}));" for k, o in enumerate(plan.outputs)]
    args = [f"reinterpret_cast<const {C_TYPES[tensors[i].dtype]}*>(in{i}.data_ptr())" for i in plan.reads] + \
           [f"reinterpret_cast<{C_TYPES[o.dtype]}*>(out{k}.data_ptr())" for k, o in enumerate(plan.outputs)]
    params = ", ".join(f"torch::Tensor in{i}" for i in plan.reads)
    returns = "torch::Tensor" if len(plan.outputs) == 1 else "std::vector<torch::Tensor>"
    ret = "out0" if len(plan.outputs) == 1 else "{" + ", ".join(f"out{k}" for k in range(len(plan.outputs))) + "}"
    host = (f"{returns} kevin_run({params}) {{\n" + "\n".join(checks) + "\n"
            f"    const c10::cuda::CUDAGuard guard({first}.device());\n"
            f"    cudaStream_t stream = c10::cuda::getCurrentCUDAStream({first}.get_device()).stream();\n"
            + "\n".join(allocs) + "\n"
            f"    const long long blocks = ({total}LL + {tiling.threads * _rounds(plan) - 1}) / {tiling.threads * _rounds(plan)};\n"
            f"    if (blocks > 0) kevin_direct_conv<<<(unsigned)blocks, {tiling.threads}, 0, stream>>>({', '.join(args)});\n"
            f"    return {ret};\n}}\n")
    # (the precise math whatever the outputs' dtype: the multiply-adds take the time, and a fast tanh's
    # 2^-11 before a subtraction cost an f16 value its bound on the H100, 1 element of 165888)
    cuda = "\n".join([cuda_code("prelude.cuh"), cuda_code("device_helpers.cuh"),
                      cuda_code("access.cuh"), kernel, host])
    return cuda, f"{returns} kevin_run({params});"
