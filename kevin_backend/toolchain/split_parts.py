"""The split's two texts written out: the device part (for nvcc, no torch headers) and the host part
(for g++ with torch's headers), each item where it can compile, in the file's order.

Every item copied into a part stands after a `#line` directive giving its line in the candidate's
CUDA source (`SOURCE_NAME`), so compiler errors point at the candidate's own lines; generated code
stands under names of its own (`launchers.GENERATED_DEVICE`, `GENERATED_HOST`).
"""

from __future__ import annotations

import re

from kevin_backend.toolchain.cpp_text import in_namespaces, matching_end, split_top_level
from kevin_backend.toolchain.cuda_items import Item
from kevin_backend.toolchain.host_rewrite import HostUses
from kevin_backend.toolchain.item_kinds import SplitState, kernels_first_declared_at
from kevin_backend.toolchain.launchers import GENERATED_DEVICE, GENERATED_HOST, Instances, generated_function, generated_functions

__all__ = ["SOURCE_NAME", "write_parts"]

# The file name `#line` directives give the candidate's own lines in the device part, so compiler
# errors there point at the candidate's CUDA source (see build_errors.SourceFile).
SOURCE_NAME = "cuda_sources.cu"

# What torch's headers would have given a kernel file (the split's device part has none of them).
_DEVICE_HEADERS = (
    "cstddef", "cstdint", "cfloat", "climits", "cmath", "cstdio", "cassert", "limits", "algorithm", "type_traits",
    "utility", "cuda_runtime.h", "cuda_fp16.h", "cuda_bf16.h",
)


# cuda_runtime.h gives these overloads (a device variable named directly) to nvcc only; the host
# part's device variables are references to their host shadows, which the C functions take.
_SYMBOL_OVERLOADS = GENERATED_HOST + """template <class T> static inline cudaError_t cudaMemcpyToSymbol(const T& symbol, const void* src,
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


def write_parts(cuda: str, state: SplitState, kinds: list[str], needs: set[str], used_variables: dict[int, tuple[str, str]],
                uses: HostUses, instances: Instances) -> tuple[str, str]:
    """(the device part, the host part): the items in the file's order, then, in the device part,
    the generated launchers and instantiations."""
    device: list[str] = [_prelude(needs)]
    host: list[str] = ["#include <cuda_runtime.h>", "#include <cuda_fp16.h>", "#include <cuda_bf16.h>"]
    if used_variables:
        host.append(_SYMBOL_OVERLOADS)
    _place_items(cuda, state, kinds, used_variables, uses, device, host)
    device_text = "\n".join([*device, *generated_functions(state, uses), *instances.explicit, *instances.sinks]) + "\n"
    host_text = "\n".join(host) + "\n"
    return device_text, host_text


def _prelude(needs: set[str]) -> str:
    """The device part's includes: what torch's headers would have given a kernel file, the light
    c10 headers device code needs, and at::opmath_type / at::acc_type where it names them."""
    headers = list(_DEVICE_HEADERS)
    headers += [h for key, h in (("macros", "c10/macros/Macros.h"), ("half", "c10/util/Half.h"), ("bf16", "c10/util/BFloat16.h")) if key in needs]
    return "".join(f"#include <{h}>\n" for h in headers) + _shims(needs)


def _place_items(cuda: str, state: SplitState, kinds: list[str], used_variables: dict[int, tuple[str, str]],
                 uses: HostUses, device: list[str], host: list[str]) -> None:
    """Each item appended to the parts it goes to (module docstring of item_kinds), with, after a
    kernel's first declaration, its launcher's declaration for the host part, and after a device
    variable host code names, its accessor."""
    declared: set[str] = set()
    for index, item in enumerate(state.items):
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
            device.append(in_namespaces(item.ns, located))
            host.append(in_namespaces(item.ns, _located(cuda, item, _host_copy_of_type(item))))
        elif kind == "device-type":
            device.append(in_namespaces(item.ns, located))
        elif kind in ("plain", "hostdevice"):
            device.append(in_namespaces(item.ns, located))
            text = _located(cuda, item, state.host_copy[index])
            host.append(in_namespaces(item.ns, text if _is_function_declaration(item.blank) else f"namespace {{\n{text}\n}}  // namespace"))
        elif kind == "launching":
            text, head = _launching_function(item)
            device.append(in_namespaces(item.ns, _located(cuda, item, text)))
            host.append(in_namespaces(item.ns, _located(cuda, item, head + ";")))
        elif kind == "host":
            host.append(in_namespaces(item.ns, _located(cuda, item, state.host_copy[index])))
        elif kind in ("kernel", "device"):
            device.append(in_namespaces(item.ns, located))
            for kernel in kernels_first_declared_at(state, index):
                for what, table in (("launch", uses.launched), ("kernel", uses.accessed)):
                    key = f"{what}:{'::'.join(kernel.ns)}::{kernel.name}:{','.join(kernel.params)}"
                    if kernel.name in table and key not in declared:
                        declared.add(key)
                        host.append(in_namespaces(kernel.ns, GENERATED_HOST + generated_function(kernel, what).split(" {\n", 1)[0] + ";"))
            if index in used_variables:
                name, typedef = used_variables[index]
                device.append(in_namespaces(item.ns, f"{GENERATED_DEVICE}void* kevin_symbol_{name}() {{ return (void*)&{name}; }}"))
                host.append(in_namespaces(item.ns, f"{GENERATED_HOST}void* kevin_symbol_{name}();\nnamespace {{\n{typedef}\n"
                                                   f"kevin_type_{name}& {name} = *static_cast<kevin_type_{name}*>(kevin_symbol_{name}());\n}}"))
        else:  # pragma: no cover - every kind is handled above
            raise AssertionError(kind)


def _located(cuda: str, item: Item, text: str | None = None) -> str:
    return f'#line {cuda.count(chr(10), 0, item.at) + 1} "{SOURCE_NAME}"\n{item.text if text is None else text}'


def _launching_function(item: Item) -> tuple[str, str]:
    """A torch-free function that launches kernels, for the device part (with external linkage, so
    host code can call it), and its declaration for the host part."""
    b = item.blank
    m = re.match(r"\s*((?:(?:static|inline|__host__|__forceinline__)\s+)*)", b)
    cut = m.end() if m else 0
    text = item.text[cut:]
    head = text[: b.index("{") - cut].rstrip()
    return text, head


def _host_copy_of_type(item: Item) -> str:
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
        close = matching_end(b, j, "{", "}")
        cut = j
        paren = b.rfind(")", s, j)
        colon = b.find(":", paren, j) if paren >= 0 else -1
        if colon >= 0 and b[colon:colon + 2] != "::":
            cut = colon  # a constructor's member initializers go with its body
        out.append(text[last:cut] + ";" + "\n" * text.count("\n", cut, close))
        last = close
    out.append(text[last:])
    return "".join(out)


def _is_function_declaration(blank: str) -> bool:
    """`int f(int a, float* b);` (a declaration, no body) rather than `dim3 g(256);`."""
    if "{" in blank or not blank.rstrip().endswith(";"):
        return False
    m = re.fullmatch(r"\s*(?:template\s*<[^;]*?>\s*)?[\w:<>,*&\s]+?\b\w+\s*\((.*)\)\s*(?:const\s*)?(?:noexcept\s*)?;\s*", blank, re.S)
    if m is None:
        return False
    params = split_top_level(m.group(1))
    return not params or params == ["void"] or any(re.search(r"[*&]|\w\s+\w", p) for p in params)


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
