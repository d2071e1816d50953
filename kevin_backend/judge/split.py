"""Split a candidate's CUDA file into a torch-free CUDA part and a host part: the fast build's
first step (docs/BUILD_NOTES.md); `fast_build` compiles the two parts.

Before (one file, nvcc parses all of torch's headers for a few lines of kernel):

    #include <torch/extension.h>
    __global__ void k(const float* x, float* y, int64_t n) { ... }
    torch::Tensor f(torch::Tensor x) {
        auto y = torch::empty_like(x);
        k<<<blocks, 256, 0, at::cuda::getCurrentCUDAStream()>>>(x.data_ptr<float>(), y.data_ptr<float>(), x.numel());
        return y;
    }

After (`Split.device`, for nvcc, no torch headers; `Split.host`, for g++ with torch's headers):

    device:  #include <cuda_runtime.h> ...
             __global__ void k(const float* x, float* y, int64_t n) { ... }
             void kevin_launch_k(dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                                 const float* x, float* y, int64_t n) { k<<<grid, block, smem, stream>>>(x, y, n); }
    host:    #include <torch/extension.h>
             void kevin_launch_k(dim3, dim3, size_t, cudaStream_t, const float* x, float* y, int64_t n);
             torch::Tensor f(torch::Tensor x) { ... kevin_launch_k(blocks, 256, 0, at::cuda::getCurrentCUDAStream(), ...); ... }

A kernel templated on one type (`template <typename scalar_t>`, launched as `k<scalar_t><<<...>>>`
under an `AT_DISPATCH_*` macro) gets a templated launcher, explicitly instantiated in the CUDA
part for the types the macro dispatches (c10::Half and c10::BFloat16 through c10's light headers).
What cannot be split raises SplitError (other templates, namespaces, device code that names torch
types, ...): such a candidate is built whole.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from kevin_backend.judge.static import strip_cpp

__all__ = ["SplitError", "Split", "split_cuda"]


class SplitError(ValueError):
    """The source needs the whole build (the message says what stopped the split)."""


@dataclass(frozen=True)
class Split:
    device: str
    host: str
    launchers: tuple[str, ...]  # one per launched kernel
    templated: bool = False  # some launcher is a template, instantiated for the dispatched types


_TORCH = re.compile(r"\b(torch|at|c10|pybind11|py)::|\bTORCH_|\bAT_|\bPYBIND11|\bTensor\b")
_TORCH_INCLUDE = re.compile(r"#\s*include\s*[<\"](torch|ATen|c10|pybind11|Python)[/.]")
_DEVICE = re.compile(r"\b(__device__|__constant__|__shared__|__managed__)\b")
_KERNEL = re.compile(
    r"__global__\s+(?:__launch_bounds__\s*\([^)]*\)\s*)?void\s+(?:__launch_bounds__\s*\([^)]*\)\s*)?(\w+)\s*\("
)


def _items(code: str, blank: str) -> list[tuple[str, str, int]]:
    """Top-level items (preprocessor lines, declarations, definitions) as (text, blanked text,
    offset of the item's first non-blank character in `code`)."""
    items: list[tuple[str, str, int]] = []
    start, depth, i, n = 0, 0, 0, len(blank)
    while i < n:
        c = blank[i]
        if depth == 0 and c == "#" and blank[start:i].strip() == "":
            end = i
            while True:  # a preprocessor line, with its continuations
                end = blank.find("\n", end)
                if end < 0:
                    end = n
                    break
                if blank[end - 1] != "\\":
                    break
                end += 1
            items.append((code[i:end], blank[i:end], i))
            start = i = end
            continue
        if c in "{(":
            depth += 1
        elif c in "})":
            depth -= 1
            if depth < 0:
                raise SplitError("unbalanced braces")
            if depth == 0 and c == "}":
                j = i + 1
                rest = blank[j:j + 64].lstrip()
                if rest.startswith(";"):
                    j = blank.index(";", j) + 1
                items.append((code[start:j], blank[start:j], start))
                start, i = j, j
                continue
        elif c == ";" and depth == 0:
            items.append((code[start:i + 1], blank[start:i + 1], start))
            start = i + 1
        i += 1
    if blank[start:].strip():
        raise SplitError("text after the last top-level item")
    trimmed = []
    for t, b, at in items:
        if b.strip():
            lead = len(b) - len(b.lstrip())
            trimmed.append((t[lead:], b[lead:], at + lead))
    return trimmed


def _params(text: str) -> list[str]:
    parts, depth, current = [], 0, ""
    for ch in text:
        if ch in "(<[":
            depth += 1
        elif ch in ")>]":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(current.strip())
            current = ""
        else:
            current += ch
    if current.strip():
        parts.append(current.strip())
    return parts


def _balanced(blank: str, open_at: int, opening: str = "(", closing: str = ")") -> int:
    """Index just past the bracket matching the one at `open_at`."""
    depth = 0
    for i in range(open_at, len(blank)):
        if blank[i] == opening:
            depth += 1
        elif blank[i] == closing:
            depth -= 1
            if depth == 0:
                return i + 1
    raise SplitError("unbalanced parentheses in a launch")


# The file name `#line` directives give the candidate's own lines in the device part, so compiler
# errors there point at the candidate's CUDA source (see errors.SourceFile).
SOURCE_NAME = "cuda_sources.cu"


def split_cuda(cuda: str) -> Split:
    blank = strip_cpp(cuda)
    if re.search(r"\bnamespace\b|\bextern\s*\"C\"\s*\{", blank):
        raise SplitError("namespaces and extern blocks are built whole")
    if re.search(r"PYBIND11|pybind11|\bpy::", blank):
        raise SplitError("the CUDA source defines Python bindings")

    def located(text: str, at: int) -> str:
        return f'#line {cuda.count(chr(10), 0, at) + 1} "{SOURCE_NAME}"\n{text}'

    device_pre: list[str] = []
    host_pre: list[str] = []
    device: list[str] = []
    plain: list[str] = []
    types: list[str] = []
    host: list[tuple[str, str]] = []
    declarations: list[str] = []
    kernels: dict[str, list[str]] = {}
    for text, b, at in _items(cuda, blank):
        if b.startswith("#"):
            if _TORCH_INCLUDE.search(text):
                host_pre.append(text)
            else:
                device_pre.append(text)
                host_pre.append(text)
            continue
        torchy, kernel = bool(_TORCH.search(b)), _KERNEL.search(b)
        if kernel or _DEVICE.search(b):
            if torchy:
                raise SplitError("device code names torch types")
            if kernel:
                tparam = None
                if re.search(r"\btemplate\b", b[: kernel.start()]):
                    single = re.fullmatch(r"\s*template\s*<\s*(?:typename|class)\s+(\w+)\s*>\s*", b[: kernel.start()])
                    if single is None:
                        raise SplitError(f"kernel {kernel.group(1)} has template parameters other than one type")
                    tparam = single.group(1)
                close = _balanced(b, kernel.end() - 1)
                params = _params(b[kernel.end():close - 1])
                if any("[" in p or "=" in p for p in params):
                    raise SplitError(f"kernel {kernel.group(1)} has array or default parameters")
                kernels[kernel.group(1)] = (params, tparam)
            device.append(located(text, at))
        elif torchy:
            host.append((text, b))
        elif "<<<" in b:
            # a torch-free host function that launches kernels itself: it is compiled with the
            # kernels and declared to the host code
            if "{" not in b or re.match(r"\s*(static|inline|template)\b", b):
                raise SplitError("a static, inline or templated launching function is built whole")
            device.append(located(text, at))
            declarations.append(text[: b.index("{")].rstrip() + ";")
        elif re.match(r"(struct|class|enum|typedef|using)\b", b) and "(" not in b.split("{", 1)[0]:
            # a type: the same definition in both parts, at namespace scope, so the launchers'
            # signatures name the same type on both sides of the link
            types.append(located(text, at))
        else:
            plain.append(located(text, at))

    launchers: dict[str, str] = {}
    instances: dict[str, set[str]] = {}  # templated kernels: the types to instantiate
    host_code: list[str] = []
    for text, b in host:
        pieces, last = [], 0
        for m in re.finditer(r"\b(\w+)\s*(?:<\s*([\w:]+)\s*>)?\s*<<<", b):
            name, targ = m.group(1), m.group(2)
            if name not in kernels:
                raise SplitError(f"launch of {name}, which is not a kernel of this file")
            params, tparam = kernels[name]
            if (targ is None) != (tparam is None):
                raise SplitError(f"launch of {name} does not match its template parameters")
            config_end = b.find(">>>", m.end())
            if config_end < 0:
                raise SplitError("unterminated launch configuration")
            config = _params(text[m.end():config_end])
            if not 2 <= len(config) <= 4:
                raise SplitError(f"launch of {name} has {len(config)} configuration values")
            config += ["0", "0"][: 4 - len(config)]
            open_paren = b.find("(", config_end + 3)
            if open_paren < 0 or b[config_end + 3:open_paren].strip():
                raise SplitError(f"launch of {name} has no argument list")
            close = _balanced(b, open_paren)
            args = text[open_paren + 1:close - 1]
            launchers.setdefault(name, _launcher(name, params, tparam))
            if targ is not None:
                instances.setdefault(name, set()).update(_instance_types(targ, b))
            call = f"kevin_launch_{name}" + (f"<{targ}>" if targ is not None else "")
            pieces.append(text[last:m.start()] + f"{call}({', '.join(config)}" + (f", {args})" if args.strip() else ")"))
            last = close
        pieces.append(text[last:])
        host_code.append("".join(pieces))
    if not launchers and not declarations:
        raise SplitError("no kernel launch found in host code")

    headers = list(_DEVICE_HEADERS)
    used_types = set().union(*instances.values()) if instances else set()
    headers += [h for t, h in (("c10::Half", "c10/util/Half.h"), ("c10::BFloat16", "c10/util/BFloat16.h")) if t in used_types]
    prelude = "".join(f"#include <{h}>\n" for h in headers)
    generated = '#line 1 "kevin_launchers.cu"'
    explicit = [_instantiation(name, kernels[name][0], kernels[name][1], t) for name in sorted(instances) for t in sorted(instances[name])]
    device_text = "\n".join([prelude, *device_pre, *types, *plain, *device, generated, *launchers.values(), *explicit]) + "\n"
    declarations += [text.split("{", 1)[0].rstrip() + ";" for text in launchers.values()]
    host_text = "\n".join(
        [*host_pre, "#include <cuda_runtime.h>", *types, "namespace {", *plain, "}  // namespace", '#line 1 "kevin_host_code.cpp"', *declarations, *host_code]
    ) + "\n"
    return Split(device_text, host_text, tuple(f"kevin_launch_{n}" for n in launchers), bool(instances))


# What torch's headers would have given a kernel file (the split's device part has none of them).
_DEVICE_HEADERS = (
    "cstddef", "cstdint", "cfloat", "climits", "cmath", "algorithm", "type_traits", "utility",
    "cuda_runtime.h", "cuda_fp16.h", "cuda_bf16.h",
)


def _typed(name: str, params: list[str]) -> list[str]:
    typed = []
    for i, param in enumerate(params):
        m = re.match(r"(.*?)(\w+)\s*$", param, re.S)
        if m is None or not m.group(1).strip():
            raise SplitError(f"cannot read parameter {param!r} of kernel {name}")
        typed.append(f"{m.group(1).strip()} kevin_arg{i}")
    return typed


def _launcher(name: str, params: list[str], tparam: str | None = None) -> str:
    names = [f"kevin_arg{i}" for i in range(len(params))]
    head = ", ".join(["dim3 kevin_grid", "dim3 kevin_block", "size_t kevin_smem", "cudaStream_t kevin_stream", *_typed(name, params)])
    template = f"template <typename {tparam}>\n" if tparam else ""
    kernel = f"{name}<{tparam}>" if tparam else name
    return (
        f"{template}void kevin_launch_{name}({head}) {{\n"
        f"    {kernel}<<<kevin_grid, kevin_block, kevin_smem, kevin_stream>>>({', '.join(names)});\n"
        "}\n"
    )


def _instantiation(name: str, params: list[str], tparam: str | None, type_name: str) -> str:
    """`template void kevin_launch_k<float>(...);`: the launcher for one type, compiled here so the
    host code's call links."""
    assert tparam is not None
    typed = [re.sub(rf"\b{re.escape(tparam)}\b", type_name, p) for p in _typed(name, params)]
    head = ", ".join(["dim3", "dim3", "size_t", "cudaStream_t", *typed])
    return f"template void kevin_launch_{name}<{type_name}>({head});"


# The types a dispatch macro hands its lambda as `scalar_t`.
_DISPATCH_TYPES = {
    "AT_DISPATCH_FLOATING_TYPES": ("float", "double"),
    "AT_DISPATCH_FLOATING_TYPES_AND_HALF": ("float", "double", "c10::Half"),
    "AT_DISPATCH_REDUCED_FLOATING_TYPES": ("c10::Half", "c10::BFloat16"),
}
_SCALAR_NAMES = {"Half": "c10::Half", "BFloat16": "c10::BFloat16", "Float": "float", "Double": "double"}
_CONCRETE = {"float": "float", "double": "double", "at::Half": "c10::Half", "c10::Half": "c10::Half", "half": "c10::Half",
             "at::BFloat16": "c10::BFloat16", "c10::BFloat16": "c10::BFloat16"}


def _instance_types(targ: str, host_text: str) -> set[str]:
    """The types a launch `k<targ><<<...>>>` needs: `targ` itself when concrete, else what the
    host code's dispatch macros hand their lambdas."""
    if targ in _CONCRETE:
        return {_CONCRETE[targ]}
    found: set[str] = set()
    for m in re.finditer(r"\b(AT_DISPATCH_\w+)\s*\(", host_text):
        macro = m.group(1)
        if macro in _DISPATCH_TYPES:
            found.update(_DISPATCH_TYPES[macro])
        elif re.fullmatch(r"AT_DISPATCH_FLOATING_TYPES_AND\d?", macro):
            found.update(("float", "double"))
            head = host_text[m.end(): m.end() + 200]
            found.update(_SCALAR_NAMES[k] for k in re.findall(r"(?:k|ScalarType::)(Half|BFloat16)\b", head.split("[&]")[0]))
        else:
            raise SplitError(f"{macro} dispatches types the fast build does not instantiate")
    if not found:
        raise SplitError(f"cannot tell which types template argument {targ} takes")
    return found
