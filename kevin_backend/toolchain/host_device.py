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

The file is read as top-level items (preprocessor lines, declarations, definitions) in their
namespaces (named ones are kept, anonymous ones dropped: one file is one translation unit either
way). Each item goes where it can compile, in the file's order:

  device part only   kernels, `__device__` functions and variables, top-level `__shared__`
  both parts         preprocessor lines (torch's includes to the host part only), types (the host
                     copy without the bodies of `__device__`-only member functions), using
                     declarations, `__host__ __device__` functions, torch-free helpers and
                     constants (host copies in an anonymous namespace, launches rewritten)
  device part, declared to the host
                     a torch-free function that launches kernels itself
  host part only     what names torch (`torch::`, `at::`, `c10::`, `TORCH_*`, `AT_*`, `C10_*`)

Host code reaches device code through generated functions in the device part:

  k<<<g, b, s, st>>>(args)            -> kevin_launch_k(g, b, s, st, args)
  k<T, 256><<<...>>>(args)            -> kevin_launch_k<T, 256>(...), a launcher template
  cudaFuncSetAttribute(k, ...)        -> cudaFuncSetAttribute(kevin_kernel_k(), ...) (the kernel's address)
  cudaMemcpyToSymbol(c_w, ...)        -> c_w is, in the host part, a reference to the device
                                         variable's host shadow (kevin_symbol_c_w())
  LAUNCH(256) with #define LAUNCH(B) k<B><<<...>>>(...)
                                      -> the macro expanded first (same line count)

A launcher template is instantiated in the device part for the template arguments the host code
launches it with. Those are read from the source: literals, constants in scope at the launch
(copied into the instantiating function), `scalar_t` under an `AT_DISPATCH_*` macro (one
instantiation per dispatched type; c10::Half and c10::BFloat16 through c10's light headers), and
a host function template's own parameters (from its calls with explicit template arguments,
followed through callers). Device code may name a few light torch things (at::Half, c10::BFloat16,
at::opmath_type, at::acc_type, C10_WARP_SIZE and the other C10_ macros); anything else of torch's
in device code, template arguments the source does not show, and other constructs the split cannot
place raise SplitError with the construct named: such a candidate is built whole.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass, field

from kevin_backend.toolchain.cpp_text import KERNEL_ATTRIBUTES, strip_cpp

__all__ = ["SplitError", "Split", "split_cuda", "SOURCE_NAME"]


class SplitError(ValueError):
    """The source needs the whole build (the message says what stopped the split)."""


@dataclass(frozen=True)
class Split:
    device: str
    host: str
    launchers: tuple[str, ...]  # one per launched kernel
    templated: bool = False  # some launcher is a template, instantiated for the template arguments read from the source


# The file name `#line` directives give the candidate's own lines in the device part, so compiler
# errors there point at the candidate's CUDA source (see errors.SourceFile).
SOURCE_NAME = "cuda_sources.cu"

_TORCH = re.compile(r"\b(torch|at|c10|pybind11|py)::|\bTORCH_|\bAT_|\bC10_|\bPYBIND11|\bTensor\b")
_TORCH_INCLUDE = re.compile(r"#\s*include\s*[<\"](torch|ATen|c10|pybind11|Python)[/.]")
# Headers only nvcc can read: the device part alone gets them.
_DEVICE_INCLUDE = re.compile(r"#\s*include\s*[<\"](cub/|cooperative_groups|mma\.h|cuda/|thrust/|cuda_pipeline|cuda_awbarrier|"
                             r"sm_\d+_intrinsics|curand_kernel|curand_philox|device_launch_parameters)")
_DEVICE_ONLY_NAMES = re.compile(r"\b(cooperative_groups|cub|nvcuda|wmma|thrust|curandState\w*)\b")
_DEVICE = re.compile(r"\b(__device__|__constant__|__shared__|__managed__)\b")
_KERNEL = re.compile(r"__global__\s+" + KERNEL_ATTRIBUTES + r"void\s+" + KERNEL_ATTRIBUTES + r"(\w+)\s*\(")
_ATTRIBUTES = re.compile(r"\b(?:__align__|alignas|__launch_bounds__|__cluster_dims__|__maxnreg__|__attribute__|__declspec)"
                         r"\s*\((?:[^()]|\([^()]*\))*\)")

# Torch names device code may use, and what the device part then includes or defines.
_DEVICE_TORCH = {
    "at::Half": "half", "c10::Half": "half", "at::BFloat16": "bf16", "c10::BFloat16": "bf16",
    "at::opmath_type": "opmath", "at::OpMathType": "opmath", "c10::opmath_type": "opmath",
    "at::acc_type": "acc", "at::AccumulateType": "acc",
}
_DEVICE_MACROS = {
    "C10_WARP_SIZE", "C10_HOST_DEVICE", "C10_DEVICE", "C10_HOST", "C10_LAUNCH_BOUNDS_0", "C10_LAUNCH_BOUNDS_1",
    "C10_LAUNCH_BOUNDS_2", "C10_LIKELY", "C10_UNLIKELY", "C10_RESTRICT", "C10_ALWAYS_INLINE",
    "C10_MAX_THREADS_PER_BLOCK", "CUDA_KERNEL_ASSERT",
}
_TORCH_TOKEN = re.compile(r"\b(?:(?:torch|at|c10|pybind11|py)(?:\s*::\s*\w+)+|TORCH_\w+|AT_\w+|C10_\w+|CUDA_KERNEL_ASSERT|PYBIND11\w*|Tensor)\b")

# What torch's headers would have given a kernel file (the split's device part has none of them).
_DEVICE_HEADERS = (
    "cstddef", "cstdint", "cfloat", "climits", "cmath", "cstdio", "cassert", "limits", "algorithm", "type_traits",
    "utility", "cuda_runtime.h", "cuda_fp16.h", "cuda_bf16.h",
)

_KEYWORDS = frozenset(
    "sizeof alignof true false int unsigned signed long short char float double bool void const constexpr volatile "
    "static_cast reinterpret_cast const_cast dynamic_cast decltype nullptr typename template auto size_t int64_t "
    "int32_t int16_t int8_t uint64_t uint32_t uint16_t uint8_t std return if else new delete this struct class "
    "enum operator noexcept".split()
)


@dataclass
class _Item:
    text: str  # the candidate's text
    blank: str  # the same with comments and string contents blanked
    at: int  # offset in the file
    ns: tuple[str, ...]  # enclosing named namespaces


@dataclass
class _TParam:
    kind: str  # "type" or "value"
    name: str
    type: str  # a value parameter's type
    default: str | None


@dataclass
class _Kernel:
    name: str
    ns: tuple[str, ...]
    params: list[str]
    template: str | None  # the template parameter list as written, without the angle brackets
    tparams: list[_TParam]
    first: int  # index of the item that declares it first


@dataclass
class _Site:
    """A launch or address of a templated kernel in host code, to be instantiated."""

    kernel: _Kernel
    args: str  # template arguments as written ("" for all defaults)
    qual: str  # the qualifier written before the kernel's name ("a::" or "")
    what: str  # "launch" or "kernel": which generated template it names
    item: int
    pos: int  # offset in the item


@dataclass
class _State:
    items: list[_Item]
    kernels: dict[str, list[_Kernel]] = field(default_factory=dict)
    # device variable -> (item, typedef for the host part or "" when it cannot have one, __managed__)
    variables: dict[str, tuple[int, str, bool]] = field(default_factory=dict)
    host_copy: dict[int, str] = field(default_factory=dict)  # item -> host text (rewritten)


def split_cuda(cuda: str) -> Split:
    """The two parts of `cuda` (module docstring), or SplitError naming what the split cannot take."""
    try:
        return _split_cuda(cuda)
    except SplitError:
        raise
    except Exception as exc:  # a source the reader does not follow: the whole build takes it
        raise SplitError(f"the split could not read this source ({type(exc).__name__}: {exc})") from exc


def _split_cuda(cuda: str) -> Split:
    cuda = _expand_launch_macros(cuda)
    blank = strip_cpp(cuda)
    if re.search(r"PYBIND11|pybind11|\bpy::", blank):
        raise SplitError("the CUDA source defines Python bindings")
    items = _items(cuda, blank)
    state = _State(items)

    # What each item is.
    kinds: list[str] = []
    needs: set[str] = set()
    for index, item in enumerate(items):
        kinds.append(_classify(item, index, state, needs))

    # Host copies: launches and kernel addresses rewritten; the sites that need instantiations.
    sites: list[_Site] = []
    launched: dict[str, _Kernel] = {}
    accessed: dict[str, _Kernel] = {}
    for index, item in enumerate(items):
        if kinds[index] in ("host", "plain", "hostdevice"):
            state.host_copy[index] = _rewrite_host(item, index, state, sites, launched, accessed)
    if not launched and not any(k == "launching" for k in kinds):
        raise SplitError("no kernel launch found in host code")
    used_variables = _variables_used_by_host(state, kinds)

    # Instantiations for the templated launchers and kernel addresses.
    explicit: list[str] = []
    sinks: list[str] = []
    concrete_types: set[str] = set()
    done: set[tuple[str, str, tuple[str, ...]]] = set()
    for site in sites:
        alternatives = _resolve(state, kinds, site.item, site.pos, site.args, 0, f"the {'launch' if site.what == 'launch' else 'address'} of kernel {site.kernel.name}")
        if len(alternatives) > 64:
            raise SplitError(f"the launch of {site.kernel.name} needs more than 64 instantiations")
        for alt in alternatives:
            legacy = _concrete_type(site, alt)
            if legacy is not None:
                key = (site.what + site.kernel.name, legacy, site.kernel.ns)
                if key not in done:
                    done.add(key)
                    concrete_types.add(legacy)
                    explicit.append(_wrap(site.kernel.ns, _instantiation(site.kernel, legacy, site.what)))
                continue
            for line in alt.lines:
                concrete_types.update(t for t in _CONCRETE.values() if t in line)
                _check_device_torch(strip_cpp(line), needs, f"a template argument of the launch of {site.kernel.name}")
            target = f"{site.qual}kevin_{site.what}_{site.kernel.name}<{site.args}>"
            body = "\n".join([*alt.lines, f"    {{ auto* volatile kevin_p = &{target}; (void)kevin_p; }}", *(["    }"] * alt.scopes)])
            sinks.append(_wrap(items[site.item].ns, f"void kevin_instances_{len(sinks)}() {{\n{body}\n}}"))

    # Light torch things device code names (or instantiations use).
    if "c10::Half" in concrete_types:
        needs.add("half")
    if "c10::BFloat16" in concrete_types:
        needs.add("bf16")
    headers = list(_DEVICE_HEADERS)
    headers += [h for key, h in (("macros", "c10/macros/Macros.h"), ("half", "c10/util/Half.h"), ("bf16", "c10/util/BFloat16.h")) if key in needs]
    prelude = "".join(f"#include <{h}>\n" for h in headers) + _shims(needs)

    # The device part, in the file's order, then the generated code.
    device: list[str] = [prelude]
    host: list[str] = ["#include <cuda_runtime.h>", "#include <cuda_fp16.h>", "#include <cuda_bf16.h>"]
    if used_variables:
        host.append(_SYMBOL_OVERLOADS)
    declared: set[str] = set()
    for index, item in enumerate(items):
        kind = kinds[index]
        located = _located(cuda, item)
        if kind == "pre":
            host.append(item.text)
            device.append(item.text)
        elif kind == "pre-host":
            host.append(item.text)
        elif kind == "pre-device":
            device.append(item.text)
        elif kind == "type":
            device.append(_wrap(item.ns, located))
            host.append(_wrap(item.ns, _located(cuda, item, _host_copy_of_type(item))))
        elif kind == "device-type":
            device.append(_wrap(item.ns, located))
        elif kind in ("plain", "hostdevice"):
            device.append(_wrap(item.ns, located))
            text = _located(cuda, item, state.host_copy[index])
            host.append(_wrap(item.ns, text if _is_function_declaration(item.blank) else f"namespace {{\n{text}\n}}  // namespace"))
        elif kind == "launching":
            text, head = _launching_function(item)
            device.append(_wrap(item.ns, _located(cuda, item, text)))
            host.append(_wrap(item.ns, _located(cuda, item, head + ";")))
        elif kind == "host":
            host.append(_wrap(item.ns, _located(cuda, item, state.host_copy[index])))
        elif kind in ("kernel", "device"):
            device.append(_wrap(item.ns, located))
            for kernel in _kernels_first_declared_at(state, index):
                for what, table in (("launch", launched), ("kernel", accessed)):
                    key = f"{what}:{'::'.join(kernel.ns)}::{kernel.name}:{','.join(kernel.params)}"
                    if kernel.name in table and key not in declared:
                        declared.add(key)
                        host.append(_wrap(kernel.ns, _GENERATED_HOST + _generated(kernel, what).split(" {\n", 1)[0] + ";"))
            if index in used_variables:
                name, typedef = used_variables[index]
                device.append(_wrap(item.ns, f"{_GENERATED_DEVICE}void* kevin_symbol_{name}() {{ return (void*)&{name}; }}"))
                host.append(_wrap(item.ns, f"{_GENERATED_HOST}void* kevin_symbol_{name}();\nnamespace {{\n{typedef}\n"
                                           f"kevin_type_{name}& {name} = *static_cast<kevin_type_{name}*>(kevin_symbol_{name}());\n}}"))
        else:  # pragma: no cover - every kind is handled above
            raise AssertionError(kind)

    generated = [_GENERATED_DEVICE.rstrip("\n")]
    seen: set[str] = set()
    for what, table in (("launch", launched), ("kernel", accessed)):
        for name in table:
            for kernel in state.kernels[name]:
                text = _wrap(kernel.ns, _generated(kernel, what))
                if text not in seen:
                    seen.add(text)
                    generated.append(text)
    device_text = "\n".join([*device, *generated, *explicit, *sinks]) + "\n"
    host_text = "\n".join(host) + "\n"
    return Split(device_text, host_text, tuple(f"kevin_launch_{n}" for n in launched), bool(explicit or sinks))


# Where generated code stands, so compiler errors in it are never read as the candidate's.
_GENERATED_DEVICE = '#line 1 "kevin_launchers.cu"\n'
_GENERATED_HOST = '#line 1 "kevin_host_declarations.cpp"\n'


# cuda_runtime.h gives these overloads (a device variable named directly) to nvcc only; the host
# part's device variables are references to their host shadows, which the C functions take.
_SYMBOL_OVERLOADS = _GENERATED_HOST + """template <class T> static inline cudaError_t cudaMemcpyToSymbol(const T& symbol, const void* src,
    size_t count = sizeof(T), size_t offset = 0, cudaMemcpyKind kind = cudaMemcpyHostToDevice) {
    return ::cudaMemcpyToSymbol((const void*)&symbol, src, count, offset, kind); }
template <class T> static inline cudaError_t cudaMemcpyToSymbolAsync(const T& symbol, const void* src, size_t count,
    size_t offset = 0, cudaMemcpyKind kind = cudaMemcpyHostToDevice, cudaStream_t stream = 0) {
    return ::cudaMemcpyToSymbolAsync((const void*)&symbol, src, count, offset, kind, stream); }
template <class T> static inline cudaError_t cudaMemcpyFromSymbol(void* dst, const T& symbol,
    size_t count = sizeof(T), size_t offset = 0, cudaMemcpyKind kind = cudaMemcpyDeviceToHost) {
    return ::cudaMemcpyFromSymbol(dst, (const void*)&symbol, count, offset, kind); }
template <class T> static inline cudaError_t cudaMemcpyFromSymbolAsync(void* dst, const T& symbol, size_t count,
    size_t offset = 0, cudaMemcpyKind kind = cudaMemcpyDeviceToHost, cudaStream_t stream = 0) {
    return ::cudaMemcpyFromSymbolAsync(dst, (const void*)&symbol, count, offset, kind, stream); }
template <class T> static inline cudaError_t cudaGetSymbolAddress(void** ptr, const T& symbol) {
    return ::cudaGetSymbolAddress(ptr, (const void*)&symbol); }
template <class T> static inline cudaError_t cudaGetSymbolSize(size_t* size, const T& symbol) {
    return ::cudaGetSymbolSize(size, (const void*)&symbol); }"""


# ---------------------------------------------------------------------------------------------
# Reading the file


def _items(code: str, blank: str, lo: int = 0, hi: int | None = None, ns: tuple[str, ...] = ()) -> list[_Item]:
    """Top-level items (preprocessor lines, declarations, definitions) of code[lo:hi], the contents
    of namespace blocks read as items of their own."""
    hi = len(blank) if hi is None else hi
    items: list[_Item] = []
    start, depth, i = lo, 0, lo
    while i < hi:
        c = blank[i]
        if depth == 0 and c == "#" and blank[start:i].strip() == "":
            end = i
            while True:  # a preprocessor line, with its continuations
                end = blank.find("\n", end, hi)
                if end < 0:
                    end = hi
                    break
                if blank[end - 1] != "\\":
                    break
                end += 1
            items.append(_Item(code[i:end], blank[i:end], i, ns))
            start = i = end
            continue
        if c == "{" and depth == 0:
            head = blank[start:i]
            m = re.fullmatch(r"\s*(inline\s+)?namespace\s*((?:\w+\s*(?:::\s*)?)*)\s*", head)
            if m:
                if m.group(1):
                    raise SplitError("an inline namespace")
                close = _balanced(blank, i, "{", "}") - 1
                inner = ns + tuple(p.strip() for p in m.group(2).split("::") if p.strip())
                items += _items(code, blank, i + 1, close, inner)
                start = i = close + 1
                continue
            if re.fullmatch(r'\s*extern\s*"\s*"\s*', head):
                raise SplitError('an extern "C" { ... } block')
        if c in "{(":
            depth += 1
        elif c in "})":
            depth -= 1
            if depth < 0:
                raise SplitError("unbalanced braces")
            if depth == 0 and c == "}":
                j = i + 1
                rest = blank[j:min(hi, j + 64)].lstrip()
                if rest.startswith(";"):
                    j = blank.index(";", j) + 1
                items.append(_Item(code[start:j], blank[start:j], start, ns))
                start, i = j, j
                continue
        elif c == ";" and depth == 0:
            items.append(_Item(code[start:i + 1], blank[start:i + 1], start, ns))
            start = i + 1
        i += 1
    if blank[start:hi].strip():
        raise SplitError("text after the last top-level item")
    trimmed = []
    for item in items:
        if item.blank.strip() and item.blank.strip() != ";":
            lead = len(item.blank) - len(item.blank.lstrip())
            trimmed.append(_Item(item.text[lead:], item.blank[lead:], item.at + lead, item.ns))
    return trimmed


def _params(text: str) -> list[str]:
    parts, depth, current = [], 0, ""
    for ch in text:
        if ch in "(<[{":
            depth += 1
        elif ch in ")>]}":
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
    raise SplitError(f"unbalanced {opening}{closing}")


def _template_head(blank: str) -> tuple[str, int] | None:
    """(the template parameter list, offset past the closing `>`) of an item that opens with
    `template <...>`, else None."""
    m = re.match(r"\s*template\s*<", blank)
    if m is None:
        return None
    depth, i = 1, m.end()
    while i < len(blank) and depth:
        if blank[i] == "<":
            depth += 1
        elif blank[i] == ">":
            depth -= 1
        elif blank[i] == "(":
            i = _balanced(blank, i) - 1
        i += 1
    return blank[m.end():i - 1], i


def _tparams(head: str, owner: str) -> list[_TParam]:
    result = []
    for p in _params(head):
        default = None
        eq = _top_level(p, "=")
        if eq >= 0:
            p, default = p[:eq].strip(), p[eq + 1:].strip()
        if "..." in p:
            raise SplitError(f"{owner} has a template parameter pack")
        if re.match(r"template\b", p):
            raise SplitError(f"{owner} has a template template parameter")
        m = re.fullmatch(r"(typename|class)\s+(\w+)", p)
        if m:
            result.append(_TParam("type", m.group(2), "", default))
            continue
        m = re.fullmatch(r"(.*?[\w*&>])\s*\b(\w+)", p, re.S)
        if m is None:
            raise SplitError(f"cannot read template parameter {p!r} of {owner}")
        result.append(_TParam("value", m.group(2), m.group(1).strip(), default))
    return result


def _top_level(text: str, char: str) -> int:
    depth = 0
    for i, ch in enumerate(text):
        if ch in "(<[{":
            depth += 1
        elif ch in ")>]}":
            depth -= 1
        elif ch == char and depth == 0:
            return i
    return -1


def _expand_launch_macros(cuda: str) -> str:
    """`cuda` with every use of a function-like macro that hides a kernel launch expanded in place
    (the expansion on the use's first line, its other lines kept empty) and the macro's definition
    left out (its lines kept empty)."""
    blank = strip_cpp(cuda)
    macros = {}
    for m in re.finditer(r"^[ \t]*#[ \t]*define[ \t]+(\w+)(\([^)]*\))?((?:[^\n]*\\\n)*[^\n]*)", blank, re.M):
        if "<<<" not in m.group(3):
            continue
        if m.group(2) is None:
            raise SplitError(f"macro {m.group(1)} hides a kernel launch without parameters")
        params = [p.strip() for p in m.group(2)[1:-1].split(",") if p.strip()]
        body = re.sub(r"\\\n", " ", cuda[m.start(3):m.end(3)]).strip()
        macros[m.group(1)] = (params, body, m.start(), m.end())
    if not macros:
        return cuda
    edits = []
    for name, (params, body, start, end) in macros.items():
        for m in re.finditer(rf"\b{name}\s*\(", blank):
            if start <= m.start() < end:
                continue
            line_start = blank.rfind("\n", 0, m.start()) + 1
            if blank[line_start:m.start()].lstrip().startswith("#"):
                raise SplitError(f"macro {name}, which hides a kernel launch, is used by another macro")
            close = _balanced(blank, m.end() - 1)
            args = _macro_args(cuda, blank, m.end(), close - 1)
            expansion = _substitute(body, params, args, name)
            edits.append((m.start(), close, expansion + "\n" * cuda.count("\n", m.start(), close)))
        edits.append((start, end, "\n" * cuda.count("\n", start, end)))  # every use expanded: the definition goes
    for start, end, text in sorted(edits, reverse=True):
        cuda = cuda[:start] + text + cuda[end:]
    return cuda


def _macro_args(code: str, blank: str, lo: int, hi: int) -> list[str]:
    args, depth, last = [], 0, lo
    for i in range(lo, hi):
        if blank[i] == "(":
            depth += 1
        elif blank[i] == ")":
            depth -= 1
        elif blank[i] == "," and depth == 0:
            args.append(code[last:i].strip())
            last = i + 1
    if code[last:hi].strip() or args:
        args.append(code[last:hi].strip())
    return args


def _substitute(body: str, params: list[str], args: list[str], name: str) -> str:
    mapping = {}
    for i, p in enumerate(params):
        if p == "...":
            mapping["__VA_ARGS__"] = ", ".join(args[i:])
        elif p.endswith("..."):
            mapping[p[:-3].strip()] = ", ".join(args[i:])
        elif i < len(args):
            mapping[p] = args[i]
        else:
            raise SplitError(f"macro {name} is used with too few arguments")

    def token(m: re.Match[str]) -> str:
        if m.group(1) is not None:  # #param: the argument as a string literal
            return '"' + mapping.get(m.group(1), m.group(1)).replace("\\", "\\\\").replace('"', '\\"') + '"'
        return mapping.get(m.group(2), m.group(2))

    out = re.sub(r"(?<!#)#(?!#)\s*(\w+)|\b(\w+)\b", token, body)
    return re.sub(r"\s*##\s*", "", out)


# ---------------------------------------------------------------------------------------------
# What each item is


def _classify(item: _Item, index: int, state: _State, needs: set[str]) -> str:
    b = item.blank
    if b.startswith("#"):
        if _TORCH_INCLUDE.search(item.text):
            return "pre-host"
        if _DEVICE_INCLUDE.search(item.text):
            return "pre-device"
        return "pre"
    kernel = _KERNEL.search(b)
    template = _template_head(b)
    rest = b[template[1]:] if template else b
    head = _ATTRIBUTES.sub(" ", rest.split("{", 1)[0])
    is_type = bool(re.match(r"\s*(struct|class|union|enum|typedef|using)\b", rest)) and (
        "(" not in head or re.match(r"\s*(typedef|using)\b", rest) is not None)
    if re.match(r"\s*namespace\s+\w+\s*=", b):
        is_type = True
    if kernel is None and is_type:
        if _TORCH.search(b):
            light: set[str] = set()
            try:
                _check_device_torch(b, light, "a type")
            except SplitError:
                if _DEVICE.search(b):
                    raise
                return "host"
            needs.update(light)
        if _DEVICE_ONLY_NAMES.search(b):
            return "device-type"
        return "type"
    if kernel:
        _check_device_torch(b, needs, f"kernel {kernel.group(1)}")
        _record_kernels(item, index, state)
        return "kernel"
    if _DEVICE.search(b):
        what = "device code"
        _check_device_torch(b, needs, what)
        decl_head = _declaration_head(rest)
        if "(" not in _ATTRIBUTES.sub(" ", decl_head):  # a variable
            if not re.search(r"\b__shared__\b", decl_head):
                _record_variable(item, index, state, decl_head)
            return "device"
        if re.search(r"\b__host__\b", decl_head):
            return "hostdevice"
        return "device"
    if _TORCH.search(b):
        return "host"
    if _DEVICE_ONLY_NAMES.search(b):
        return "device"
    if "<<<" in b and "{" in b and template is None:
        return "launching"
    return "plain"


def _check_device_torch(blank: str, needs: set[str], what: str) -> None:
    for m in _TORCH_TOKEN.finditer(blank):
        token = re.sub(r"\s+", "", m.group(0))
        if token in _DEVICE_MACROS:
            needs.add("macros")
            continue
        key = next((v for k, v in _DEVICE_TORCH.items() if token == k or token.startswith(k + "::")), None)
        if key is None:
            raise SplitError(f"{what} names {token} (torch's headers, which the device part does not include)")
        needs.add(key)


def _declaration_head(blank: str) -> str:
    """A declaration's text up to its initializer, body or end."""
    depth = 0
    for i, ch in enumerate(blank):
        if ch in "([":
            depth += 1
        elif ch in ")]":
            depth -= 1
        elif depth == 0 and ch in "={;":
            return blank[:i]
    return blank


def _record_kernels(item: _Item, index: int, state: _State) -> None:
    b = item.blank
    for kernel in _KERNEL.finditer(b):
        name = kernel.group(1)
        template = _template_head(b)
        head, tparams = None, []
        if template is not None and template[1] <= kernel.start():
            head = item.text[b.index("<", b.index("template")) + 1:template[1] - 1].strip()
            tparams = _tparams(template[0], f"kernel {name}")
        close = _balanced(b, kernel.end() - 1)
        params = _params(item.text[kernel.end():close - 1])
        if params == ["void"]:
            params = []
        found = _Kernel(name, item.ns, params, head, tparams, index)
        known = state.kernels.setdefault(name, [])
        if any(k.ns != item.ns for k in known):
            raise SplitError(f"two kernels named {name} in different namespaces")
        if not any(_signature(k) == _signature(found) for k in known):
            if known and (head is not None or any(k.template is not None for k in known)):
                raise SplitError(f"kernel template {name} is overloaded")
            known.append(found)


def _signature(kernel: _Kernel) -> str:
    return re.sub(r"\s+", " ", ",".join(_typed(kernel.name, kernel.params, names=False)) + "|" + (kernel.template or ""))


def _record_variable(item: _Item, index: int, state: _State, decl_head: str) -> None:
    managed = bool(re.search(r"\b__managed__\b", decl_head))
    text = re.sub(r"\b(__constant__|__device__|__managed__|static|extern|inline)\b", " ", decl_head)
    text = _ATTRIBUTES.sub(lambda m: m.group(0) if m.group(0).startswith(("__align__", "alignas")) else " ", text)
    if _top_level(text, ",") >= 0:
        for name in re.findall(r"(\w+)\s*(?:\[[^\]]*\]\s*)*(?:,|$)", text.strip()):
            state.variables[name] = (index, "", managed)  # several in one declaration: no host reference
        return
    m = re.fullmatch(r"\s*(.*?)\b(\w+)\s*((?:\[[^\]]*\]\s*)*)", text, re.S)
    if m is None or not m.group(1).strip():
        return
    name = m.group(2)
    state.variables[name] = (index, f"typedef {m.group(1).strip()} kevin_type_{name}{m.group(3).strip()};", managed)


def _variables_used_by_host(state: _State, kinds: list[str]) -> dict[int, tuple[str, str]]:
    """Device variables host code names (cudaMemcpyToSymbol and the like): item -> (name, typedef)."""
    used: dict[int, tuple[str, str]] = {}
    host_blank = "\n".join(strip_cpp(text) for i, text in state.host_copy.items() if kinds[i] in ("host", "plain"))
    for name, (index, typedef, managed) in state.variables.items():
        if not re.search(rf"(?<![\w.>]){re.escape(name)}\b", host_blank):
            continue
        if managed:
            raise SplitError(f"host code uses __managed__ variable {name}")
        if not typedef:
            raise SplitError(f"host code uses device variable {name}, declared with others in one declaration")
        used[index] = (name, typedef)
    return used


def _kernels_first_declared_at(state: _State, index: int) -> list[_Kernel]:
    return [k for ks in state.kernels.values() for k in ks if k.first == index]


def _is_function_declaration(blank: str) -> bool:
    """`int f(int a, float* b);` (a declaration, no body) rather than `dim3 g(256);`."""
    if "{" in blank or not blank.rstrip().endswith(";"):
        return False
    m = re.fullmatch(r"\s*(?:template\s*<[^;]*?>\s*)?[\w:<>,*&\s]+?\b\w+\s*\((.*)\)\s*(?:const\s*)?(?:noexcept\s*)?;\s*", blank, re.S)
    if m is None:
        return False
    params = _params(m.group(1))
    return not params or params == ["void"] or any(re.search(r"[*&]|\w\s+\w", p) for p in params)


# ---------------------------------------------------------------------------------------------
# Host copies


def _rewrite_host(item: _Item, index: int, state: _State, sites: list[_Site],
                  launched: dict[str, _Kernel], accessed: dict[str, _Kernel]) -> str:
    """The item's host text: every launch through its launcher, every other use of a kernel's
    name through its address function."""
    text, b = item.text, item.blank
    edits: list[tuple[int, int, str]] = []
    for q in [m.start() for m in re.finditer(r"<<<", b)]:
        name_start, name, targs, qual = _launched_name(b, q)
        if name not in state.kernels:
            raise SplitError(f"launch of {name}, which is not a kernel of this file")
        kernel = _pick(state.kernels[name], name)
        config_end = b.find(">>>", q + 3)
        if config_end < 0:
            raise SplitError(f"unterminated launch configuration of {name}")
        config = _params(text[q + 3:config_end])
        if not 2 <= len(config) <= 4:
            raise SplitError(f"launch of {name} has {len(config)} configuration values")
        config += ["0", "0"][: 4 - len(config)]
        open_paren = config_end + 3
        while open_paren < len(b) and b[open_paren].isspace():
            open_paren += 1
        if open_paren >= len(b) or b[open_paren] != "(":
            raise SplitError(f"launch of {name} has no argument list")
        close = _balanced(b, open_paren)
        args = text[open_paren + 1:close - 1]
        if targs is None and kernel.template is not None:
            targs = _deduced(kernel, args)
        targs = _template_arguments(kernel, targs, name)
        launched.setdefault(name, kernel)
        call = f"{qual}kevin_launch_{name}" + (f"<{targs}>" if targs is not None else "")
        if targs is not None:
            sites.append(_Site(kernel, targs, qual, "launch", index, name_start))
        gap = "\n" * text.count("\n", name_start, open_paren)
        edits.append((name_start, close, f"{call}({', '.join(config)}" + (f",{gap} {args})" if args.strip() else f"){gap}")))

    # other uses of a kernel's name: its address (cudaFuncSetAttribute(k, ...), (void*)k, &k)
    taken = [(s, e) for s, e, _ in edits]
    for name, kernels in state.kernels.items():
        for m in re.finditer(rf"((?:[(,&]|\(\s*(?:const\s+)?void\s*\*\s*\))\s*)((?:\w+::)*){re.escape(name)}\b", b):
            start = m.start(2)
            if any(s <= start < e for s, e in taken):
                continue
            kernel = _pick(kernels, name)
            end = m.end()
            targs = None
            after = b[end:].lstrip()
            if after.startswith("<") and not after.startswith("<<"):
                lt = b.index("<", end)
                gt = _balanced(b, lt, "<", ">")
                targs, end = text[lt + 1:gt - 1].strip(), gt
            if not re.match(r"\s*[,)]", b[end:]):
                continue
            targs = _template_arguments(kernel, targs, name)
            accessed.setdefault(name, kernel)
            if targs is not None:
                sites.append(_Site(kernel, targs, m.group(2), "kernel", index, start))
            edits.append((start, end, f"{m.group(2)}kevin_kernel_{name}" + (f"<{targs}>" if targs is not None else "") + "()"))
            taken.append((start, end))
    out, last = [], 0
    for start, end, replacement in sorted(edits):
        out.append(text[last:start] + replacement)
        last = end
    out.append(text[last:])
    return "".join(out)


def _launched_name(b: str, q: int) -> tuple[int, str, str | None, str]:
    """For the `<<<` at q: (start of the launched name with its qualifiers, the kernel's name, its
    template arguments as written or None, the qualifiers written before it)."""
    j = q - 1
    while j >= 0 and b[j].isspace():
        j -= 1
    targs = None
    if j >= 0 and b[j] == ">":
        depth, k = 0, j
        while k >= 0:
            if b[k] in ">)":
                depth += 1
            elif b[k] in "<(":
                depth -= 1
                if depth == 0:
                    break
            k -= 1
        if k < 0:
            raise SplitError("cannot read a launch's template arguments")
        targs = b[k + 1:j].strip()
        j = k - 1
        while j >= 0 and b[j].isspace():
            j -= 1
    end = j + 1
    while j >= 0 and (b[j].isalnum() or b[j] == "_"):
        j -= 1
    name = b[j + 1:end]
    if not name or name[0].isdigit():
        raise SplitError("a launch of something other than a kernel's name")
    start = j + 1
    m = re.search(r"(?:(?:\b\w+)?\s*::\s*)+$", b[:start])
    if m:
        start = m.start()
    return start, name, targs, re.sub(r"\s+", "", b[start:j + 1])


def _pick(kernels: list[_Kernel], name: str) -> _Kernel:
    return kernels[0]


_POINTER_OF = (
    re.compile(r"\b(?:mutable_|const_)?data(?:_ptr)?\s*<\s*([\w:]+)\s*>\s*\(\s*\)\s*$"),  # x.data_ptr<float>()
    re.compile(r"^\(\s*(?:const\s+)?([\w:]+)\s*\*\s*\)"),  # (float*)p
    re.compile(r"^(?:reinterpret_cast|static_cast)\s*<\s*(?:const\s+)?([\w:]+)\s*\*\s*>"),
)


def _deduced(kernel: _Kernel, args: str) -> str | None:
    """The type arguments a launch without template arguments deduces, where each argument for a
    `T*` parameter names its pointee (x.data_ptr<scalar_t>(), (float*)p, reinterpret_cast<half*>(p));
    None when they cannot be read."""
    given = _params(args)
    if len(given) != len(kernel.params):
        return None
    found: dict[str, str] = {}
    for param, arg in zip(_typed(kernel.name, kernel.params, names=False), given):
        for tparam in kernel.tparams:
            if not re.search(rf"\b{re.escape(tparam.name)}\b", param):
                continue
            if tparam.kind != "type" or not re.fullmatch(rf"(?:const\s+)?{re.escape(tparam.name)}\s*(?:const\s*)?\*\s*(?:__restrict__\s*)?(?:const\s*)?",
                                                          param.strip()):
                continue  # read from the pointer parameters only
            m = next((m for p in _POINTER_OF if (m := p.search(strip_cpp(arg).strip()))), None)
            if m is None or found.setdefault(tparam.name, m.group(1)) != m.group(1):
                return None
    values = []
    for tparam in kernel.tparams:
        if tparam.name in found:
            values.append(found[tparam.name])
        elif tparam.default is None:
            return None
        else:
            break
    return ", ".join(values)


def _template_arguments(kernel: _Kernel, targs: str | None, name: str) -> str | None:
    if kernel.template is None:
        if targs is not None:
            raise SplitError(f"kernel {name} is not a template but is launched with template arguments")
        return None
    given = _params(targs) if targs else []
    if len(given) > len(kernel.tparams):
        raise SplitError(f"kernel {name} is launched with more template arguments than it has")
    if any(p.default is None for p in kernel.tparams[len(given):]):
        raise SplitError(f"the launch of kernel template {name} leaves template arguments to be deduced from its arguments")
    return targs or ""


# ---------------------------------------------------------------------------------------------
# Which template arguments: read from the source


@dataclass
class _Alternative:
    lines: list[str]  # declarations (and opened scopes) that give the names their meaning
    scopes: int = 0  # scopes opened in `lines`
    bound: dict[str, str] = field(default_factory=dict)  # names bound to a concrete type
    simple: bool = True  # the lines only bind names to types (an explicit instantiation can stand in)


def _resolve(state: _State, kinds: list[str], index: int, pos: int, args: str, depth: int, owner: str) -> list[_Alternative]:
    """The ways the names in `args` (template arguments written at `pos` in host item `index`)
    can be made to mean what they mean there, as declarations for a function in the device part."""
    if depth > 4:
        raise SplitError("template arguments passed through more than four host function templates")
    item = state.items[index]
    b = item.blank
    declarations: dict[int, str] = {}
    dispatched: list[str] | None = None
    dispatch_name = ""
    template_names: set[str] = set()
    template = _template_head(b)
    host_tparams = {p.name: p for p in _tparams(template[0], "a host function")} if template else {}
    work = [(name, pos) for name in _names(args)]
    seen: set[str] = set()
    while work:
        name, at = work.pop()
        if name in seen:
            continue
        seen.add(name)
        found = _local_declaration(b, name, at)
        if found is not None:
            start, end, init = found
            declarations[start] = item.text[start:end].strip()
            work += [(n, start) for n in _names(init)]
            continue
        span = _dispatch_at(b, at)
        if name == "scalar_t" and span is not None:
            dispatched, dispatch_name = span, name
            continue
        if name in host_tparams:
            template_names.add(name)
        elif not _visible(state, kinds, name):
            raise SplitError(f"template argument {name} of {owner} is neither a constant nor a dispatched type the split can read")
    local = ["    " + declarations[k] for k in sorted(declarations)]
    dispatch_alts = [[]] if dispatched is None else [[f"    using {dispatch_name} = {t};"] for t in dispatched]
    bound_alts = [{}] if dispatched is None else [{dispatch_name: t} for t in dispatched]
    if not template_names:
        return [_Alternative([*d, *local], 0, dict(bd), not local) for d, bd in zip(dispatch_alts, bound_alts)]
    # the host function template's own parameters: from its calls
    fname = _function_name(b, template[1])
    callers = _calls(state, kinds, fname, index)
    if not callers:
        raise SplitError(f"host function template {fname} is never called with explicit template arguments")
    order = list(host_tparams)
    result = []
    for caller, at, given in callers:
        values = []
        for pname in order:
            i = order.index(pname)
            value = given[i] if i < len(given) else host_tparams[pname].default
            if value is None:
                raise SplitError(f"host function template {fname} is called with template arguments deduced from its arguments")
            values.append(value)
        needed = [values[order.index(n)] for n in order if n in template_names]
        for outer in _resolve(state, kinds, caller, at, ", ".join(needed), depth + 1, f"the call of {fname}"):
            lines = list(outer.lines)
            for pname in order:
                if pname not in template_names:
                    continue
                value = values[order.index(pname)]
                tmp = f"kevin_bind_{depth}_{pname}"
                p = host_tparams[pname]
                lines.append(f"    using {tmp} = {value};" if p.kind == "type" else f"    constexpr auto {tmp} = ({value});")
            lines.append("    {")
            for pname in order:
                if pname in template_names:
                    p = host_tparams[pname]
                    tmp = f"kevin_bind_{depth}_{pname}"
                    lines.append(f"    using {pname} = {tmp};" if p.kind == "type" else f"    constexpr {p.type} {pname} = {tmp};")
            bound = {}
            for pname in order:
                if pname in template_names and host_tparams[pname].kind == "type":
                    v = values[order.index(pname)].strip()
                    bound[pname] = outer.bound.get(v, _CONCRETE.get(v, ""))
            simple = outer.simple and not local and all(host_tparams[n].kind == "type" and bound.get(n) for n in template_names)
            for d, bd in zip(dispatch_alts, bound_alts):
                result.append(_Alternative([*lines, *d, *local], outer.scopes + 1, {**bound, **bd}, simple))
    return result


# Names CUDA's and the standard headers give both parts.
_HEADER_NAMES = re.compile(r"(?:__)?(?:half2?|nv_bfloat162?|(?:u?char|u?short|u?int|u?long|longlong|float|double)[1-4]|"
                           r"u?int(?:8|16|32|64)_t|size_t|ptrdiff_t|dim3|cudaStream_t|warpSize)")


def _visible(state: _State, kinds: list[str], name: str) -> bool:
    """Whether `name` is declared where the device part sees it (a macro, a constant, a type, a
    name from CUDA's headers)."""
    if _HEADER_NAMES.fullmatch(name):
        return True
    pattern = re.compile(rf"\b{re.escape(name)}\b")
    return any(kinds[i] in ("pre", "pre-device", "type", "device-type", "plain", "hostdevice", "device", "launching")
               and pattern.search(item.blank) for i, item in enumerate(state.items))


def _names(expression: str) -> list[str]:
    blank = strip_cpp(expression)
    names = []
    for m in re.finditer(r"(?<![\w.:>])(?<!->)\b([A-Za-z_]\w*)\b(?!\s*::)", blank):
        if m.group(1) not in _KEYWORDS:
            names.append(m.group(1))
    return names


def _local_declaration(blank: str, name: str, pos: int) -> tuple[int, int, str] | None:
    """The last declaration of `name` before `pos` still in scope there: (start, end, initializer)."""
    n = re.escape(name)
    patterns = (
        rf"(?:\bstatic\s+)?\b(?:constexpr|const)\b[^;{{}}]*?\b{n}\s*((?:=(?!=)|\{{)[^;]*);",
        rf"\busing\s+{n}\s*=\s*([^;]*);",
        rf"\btypedef\s+([^;]*?)\b{n}\s*;",
    )
    best = None
    for pattern in patterns:
        for m in re.finditer(pattern, blank[:pos]):
            if _in_scope(blank, m.end(), pos) and (best is None or m.start() > best[0]):
                best = (m.start(), m.end(), next((g for g in m.groups() if g is not None), ""))
    return best


def _in_scope(blank: str, start: int, pos: int) -> bool:
    depth = 0
    for ch in blank[start:pos]:
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth < 0:
                return False
    return True


def _dispatch_at(blank: str, pos: int) -> list[str] | None:
    """The types `scalar_t` takes at `pos`, when it lies inside an AT_DISPATCH_* macro's lambda."""
    inner = None
    for m in re.finditer(r"\b(AT_DISPATCH_\w+)\s*\(", blank):
        close = _balanced(blank, m.end() - 1)
        if m.end() <= pos < close:
            inner = (m.group(1), blank[m.end():close - 1])
    if inner is None:
        return None
    return _dispatch_types(*inner)


# The types a dispatch macro hands its lambda as `scalar_t`.
_DISPATCH_TYPES = {
    "AT_DISPATCH_FLOATING_TYPES": ("float", "double"),
    "AT_DISPATCH_FLOATING_TYPES_AND_HALF": ("float", "double", "c10::Half"),
    "AT_DISPATCH_REDUCED_FLOATING_TYPES": ("c10::Half", "c10::BFloat16"),
}
_SCALAR_NAMES = {"Half": "c10::Half", "BFloat16": "c10::BFloat16", "Float": "float", "Double": "double"}
_CONCRETE = {"float": "float", "double": "double", "at::Half": "c10::Half", "c10::Half": "c10::Half",
             "at::BFloat16": "c10::BFloat16", "c10::BFloat16": "c10::BFloat16", "half": "__half", "__half": "__half",
             "__nv_bfloat16": "__nv_bfloat16", "nv_bfloat16": "__nv_bfloat16", "int": "int", "int64_t": "int64_t"}


def _dispatch_types(macro: str, args: str) -> list[str]:
    if macro in _DISPATCH_TYPES:
        return list(_DISPATCH_TYPES[macro])
    m = re.fullmatch(r"AT_DISPATCH_FLOATING_TYPES_AND(\d?)", macro)
    if m is None:
        raise SplitError(f"{macro} dispatches types the fast build does not instantiate")
    count = int(m.group(1) or 1)
    found = ["float", "double"]
    for extra in _params(args)[:count]:
        name = re.sub(r"^(?:(?:at|c10|torch)\s*::\s*)?(?:ScalarType\s*::\s*|k)", "", extra.strip())
        if name not in _SCALAR_NAMES:
            raise SplitError(f"{macro} dispatches {extra.strip()}, which the fast build does not instantiate")
        found.append(_SCALAR_NAMES[name])
    return list(dict.fromkeys(found))


def _function_name(blank: str, after: int) -> str:
    paren = blank.find("(", after)
    m = re.search(r"(\w+)\s*$", blank[after:paren]) if paren >= 0 else None
    if m is None:
        raise SplitError("cannot read a host function template's name")
    return m.group(1)


def _calls(state: _State, kinds: list[str], fname: str, own: int) -> list[tuple[int, int, list[str]]]:
    """Calls of host function template `fname` anywhere in the file's code: (item, offset, template
    arguments), the arguments written (`fname<args>(...)`) or deduced from its pointer arguments."""
    item = state.items[own]
    template = _template_head(item.blank)
    assert template is not None
    paren = item.blank.find("(", template[1])
    signature = _Kernel(fname, item.ns, [p for p in _params(item.text[paren + 1:_balanced(item.blank, paren) - 1]) if p != "void"],
                        template[0], _tparams(template[0], f"host function template {fname}"), own)
    calls = []
    for index, other in enumerate(state.items):
        if kinds[index] not in ("host", "plain", "launching", "hostdevice"):
            continue
        b = other.blank
        for m in re.finditer(rf"(?<![\w.])(?<!->){re.escape(fname)}\s*<", b):
            lt = m.end() - 1
            try:
                gt = _balanced(b, lt, "<", ">")
            except SplitError:
                continue
            if not re.match(r"\s*\(", b[gt:]):
                continue
            calls.append((index, m.start(), _params(other.text[lt + 1:gt - 1])))
        if index == own or _template_head(b) and b.find("(", _template_head(b)[1]) == b.find(fname, _template_head(b)[1]) + len(fname):
            continue  # the definition itself, or another declaration of it
        for m in re.finditer(rf"(?<![\w.])(?<!->){re.escape(fname)}\s*\(", b):
            close = _balanced(b, m.end() - 1)
            deduced = _deduced(signature, other.text[m.end():close - 1])
            if deduced is None:
                raise SplitError(f"host function template {fname} is called with template arguments deduced from arguments the split cannot read")
            calls.append((index, m.start(), _params(deduced)))
    return calls


# ---------------------------------------------------------------------------------------------
# Generated code


def _typed(name: str, params: list[str], names: bool = True) -> list[str]:
    typed = []
    for i, param in enumerate(params):
        p, default = param, None
        eq = _top_level(param, "=")
        if eq >= 0:
            p, default = param[:eq].strip(), param[eq + 1:].strip()
        array = re.fullmatch(r"(.*?)\s*\[[^\]]*\]\s*", p, re.S)
        pointer = ""
        if array:
            p, pointer = array.group(1), "*"
        m = re.fullmatch(r"(.*?[\s*&>])(\w+)\s*", p, re.S)
        if m is None or not m.group(1).strip() or m.group(2) in _KEYWORDS | {"__restrict__", "const"}:
            if array:
                raise SplitError(f"cannot read parameter {param!r} of kernel {name}")
            type_text = p.strip()  # an unnamed parameter
        else:
            type_text = m.group(1).strip()
        entry = f"{type_text}{pointer}" + (f" kevin_arg{i}" if names else "")
        if default is not None and names:
            entry += f" = {default}"
        typed.append(entry)
    return typed


def _generated(kernel: _Kernel, what: str) -> str:
    """The launcher (`what` "launch") or address function ("kernel") of a kernel."""
    template = f"template <{kernel.template}>\n" if kernel.template is not None else ""
    name = kernel.name + (f"<{', '.join(p.name for p in kernel.tparams)}>" if kernel.template is not None else "")
    if what == "kernel":
        return f"{template}const void* kevin_kernel_{kernel.name}() {{\n    return (const void*){name};\n}}\n"
    names = [f"kevin_arg{i}" for i in range(len(kernel.params))]
    head = ", ".join(["dim3 kevin_grid", "dim3 kevin_block", "size_t kevin_smem", "cudaStream_t kevin_stream", *_typed(kernel.name, kernel.params)])
    return (
        f"{template}void kevin_launch_{kernel.name}({head}) {{\n"
        f"    {name}<<<kevin_grid, kevin_block, kevin_smem, kevin_stream>>>({', '.join(names)});\n"
        "}\n"
    )


def _concrete_type(site: _Site, alt: _Alternative) -> str | None:
    """The one concrete type a single-type-parameter kernel is launched with here, when that is all
    the instantiation needs (then it is instantiated explicitly), else None."""
    kernel = site.kernel
    if len(kernel.tparams) != 1 or kernel.tparams[0].kind != "type" or site.what != "launch":
        return None
    arg = re.sub(r"\s+", "", site.args)
    if arg in _CONCRETE and not alt.lines:
        return _CONCRETE[arg]
    if alt.simple and alt.bound.get(arg):
        return alt.bound[arg]
    return None


def _instantiation(kernel: _Kernel, type_name: str, what: str) -> str:
    """`template void kevin_launch_k<float>(...);`: the launcher for one type, compiled here so the
    host code's call links."""
    tparam = kernel.tparams[0].name
    typed = [re.sub(rf"\b{re.escape(tparam)}\b", type_name, p) for p in _typed(kernel.name, kernel.params, names=False)]
    head = ", ".join(["dim3", "dim3", "size_t", "cudaStream_t", *typed])
    return f"template void kevin_launch_{kernel.name}<{type_name}>({head});"


def _wrap(ns: tuple[str, ...], text: str) -> str:
    if not ns:
        return text
    return "".join(f"namespace {n} {{ " for n in ns) + "\n" + text + "\n" + "}" * len(ns) + "  // namespace " + "::".join(ns)


def _located(cuda: str, item: _Item, text: str | None = None) -> str:
    return f'#line {cuda.count(chr(10), 0, item.at) + 1} "{SOURCE_NAME}"\n{item.text if text is None else text}'


def _launching_function(item: _Item) -> tuple[str, str]:
    """A torch-free function that launches kernels, for the device part (with external linkage, so
    host code can call it), and its declaration for the host part."""
    b = item.blank
    m = re.match(r"\s*((?:(?:static|inline|__host__|__forceinline__)\s+)*)", b)
    cut = m.end() if m else 0
    text = item.text[cut:]
    head = text[: b.index("{") - cut].rstrip()
    return text, head


def _host_copy_of_type(item: _Item) -> str:
    """A type's definition for the host part: the bodies of member functions only device code may
    call left out (g++ cannot compile them; the host part never calls them)."""
    text, b = item.text, item.blank
    out, last = [], 0
    for m in re.finditer(r"\b__device__\b", b):
        if m.start() < last:
            continue
        s = max(b.rfind(c, 0, m.start()) for c in ";{}:") + 1
        j, depth = m.end(), 0
        while j < len(b):
            ch = b[j]
            if ch == "(":
                depth += 1
            elif ch == ")":
                depth -= 1
            elif depth == 0 and ch in "{;":
                break
            j += 1
        if j >= len(b) or b[j] == ";":
            continue
        head = b[s:j]
        if "__host__" in head or "(" not in head:
            continue
        close = _balanced(b, j, "{", "}")
        cut = j
        paren = b.rfind(")", s, j)
        colon = b.find(":", paren, j) if paren >= 0 else -1
        if colon >= 0 and b[colon:colon + 2] != "::":
            cut = colon  # a constructor's member initializers go with its body
        out.append(text[last:cut] + ";" + "\n" * text.count("\n", cut, close))
        last = close
    out.append(text[last:])
    return "".join(out)


def _shims(needs: set[str]) -> str:
    """at::opmath_type and at::acc_type as torch defines them, for device code that names them."""
    lines = []
    if "opmath" in needs:
        lines += ["namespace at {", "template <typename T> struct OpMathType { using type = T; };"]
        if "half" in needs:
            lines.append("template <> struct OpMathType<c10::Half> { using type = float; };")
        if "bf16" in needs:
            lines.append("template <> struct OpMathType<c10::BFloat16> { using type = float; };")
        lines += ["template <typename T> using opmath_type = typename OpMathType<T>::type;", "}  // namespace at"]
    if "acc" in needs:
        lines += ["namespace at {", "template <typename T, bool is_cuda> struct AccumulateType { using type = T; };",
                  "template <> struct AccumulateType<float, false> { using type = double; };"]
        for t in ("int8_t", "uint8_t", "int16_t", "int32_t", "char"):
            lines.append(f"template <bool c> struct AccumulateType<{t}, c> {{ using type = int64_t; }};")
        if "half" in needs:
            lines.append("template <bool c> struct AccumulateType<c10::Half, c> { using type = float; };")
        if "bf16" in needs:
            lines.append("template <bool c> struct AccumulateType<c10::BFloat16, c> { using type = float; };")
        lines += ["template <typename T, bool is_cuda> using acc_type = typename AccumulateType<T, is_cuda>::type;", "}  // namespace at"]
    return "\n".join(lines) + ("\n" if lines else "")
