"""A candidate's C++/CUDA source as the compiler will see it: allowlisted headers taken out, the
rest run through the real preprocessor, the result as tokens marked host or device.

The static rules read these tokens, not the text: a name split by `##`, built by a macro or
hidden behind `#define` is whole again after the preprocessor, and comments are gone. Headers are
an allowlist (torch, ATen, c10, the CUDA runtime and its device libraries, the standard math,
container and algorithm headers); any other header is a violation, and so is an `#include` whose
header a macro names. The headers themselves are never read: their macros (`TORCH_CHECK`,
`AT_DISPATCH_*`) stay as names. Without a preprocessor on the machine, every C++ source fails the
check with the reason (fail closed).

Host code is whatever is not the body of a `__global__` or `__device__` function: the rules that
keep the process, the files and the Python interpreter out of reach apply there.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
from dataclasses import dataclass
from typing import Iterator

from kevin_backend.toolchain.cpp_text import strip_cpp

__all__ = ["ALLOWED_HEADERS", "CppSource", "Token", "header_allowed", "header_macros", "preprocess"]

# Headers a kernel program may include: exact names, and folders (ending in "/") whose headers
# all are allowed. Files, processes, threads, signals, time, dynamic loading and the Python C API
# arrive through headers, and a kernel needs none of them.
ALLOWED_HEADERS = frozenset({
    # torch's C++ API for extensions (not torch/python.h, torch/library.h, torch/csrc/...)
    "torch/extension.h", "torch/types.h", "torch/torch.h", "torch/all.h",
    "ATen/", "c10/cuda/", "c10/util/", "c10/core/", "c10/macros/",
    # CUDA: the runtime, its types and device libraries
    "cuda_runtime.h", "cuda_runtime_api.h", "cuda.h", "cuda_fp16.h", "cuda_fp16.hpp", "cuda_bf16.h",
    "cuda_bf16.hpp", "cuda_fp8.h", "cuda_fp8.hpp", "device_launch_parameters.h", "device_functions.h",
    "vector_types.h", "vector_functions.h", "math_constants.h", "cuda_pipeline.h", "cuda_pipeline_primitives.h",
    "cuda_awbarrier.h", "cuda_awbarrier_primitives.h", "cooperative_groups.h", "cooperative_groups/", "mma.h",
    "sm_60_atomic_functions.h", "sm_61_intrinsics.h", "crt/math_functions.h", "curand_kernel.h", "cublas_v2.h",
    "cublasLt.h", "cuda/", "cub/", "thrust/", "cutlass/", "cute/",
    # C and C++ standard: math, numbers, containers, algorithms, strings, type traits, formatting
    "cmath", "math.h", "cfloat", "float.h", "climits", "limits.h", "cstdint", "stdint.h", "cstddef", "stddef.h",
    "cstdio", "stdio.h", "cstdlib", "stdlib.h", "cassert", "assert.h", "cstring", "string.h", "cinttypes",
    "inttypes.h", "stdbool.h", "vector", "array", "string", "string_view", "algorithm", "numeric", "limits",
    "type_traits", "utility", "tuple", "functional", "memory", "initializer_list", "optional", "map",
    "unordered_map", "set", "unordered_set", "iterator", "stdexcept", "exception", "new", "complex", "bitset",
    "deque", "list", "queue", "stack", "iostream", "ostream", "istream", "sstream", "iomanip", "ios", "cstdarg",
    "cctype", "variant", "cmath.h",
})

_COMPILERS = ("g++", "cpp", "clang++")
_TIMEOUT_S = 20
_MAX_OUTPUT = 4 * 2**20  # bytes: a macro bomb fails the check instead of filling memory (sources: KBs)


@dataclass(frozen=True)
class Token:
    text: str
    line: int  # line in the candidate's own source (cpp_sources or cuda_sources)
    kind: str  # "name", "number", "string", "punct"
    device: bool = False  # inside the body of a __global__ or __device__ function


@dataclass(frozen=True)
class CppSource:
    """One extension source after the preprocessor: its tokens, or why it could not be read.

    `directives` are (line, problem) for the `#include`s and definitions the rules refuse;
    `error` is set when the preprocessor did not run or failed (the rules then fail closed)."""

    kind: str  # "cpp" or "cuda"
    tokens: tuple[Token, ...] = ()
    headers: tuple[tuple[int, str], ...] = ()  # (line, header) refused
    redefined: tuple[tuple[int, str], ...] = ()  # (line, CUDA keyword) given a #define / #undef
    conditions: tuple[tuple[int, str], ...] = ()  # (line, problem) of #if/#ifdef the rules cannot follow
    error: str | None = None


def header_allowed(header: str) -> bool:
    return header in ALLOWED_HEADERS or any(header.startswith(p) for p in ALLOWED_HEADERS if p.endswith("/"))


_DIRECTIVE = re.compile(r"^[ \t]*(?:#|%:)[ \t]*(\w+)(.*)$")
_HEADER = re.compile(r"^\s*(<([^<>]+)>|\"([^\"]+)\")\s*$")
# CUDA's execution-space keywords decide what is host code: a program may not redefine them
_CUDA_KEYWORDS = frozenset({"__global__", "__device__", "__host__", "__forceinline__", "__noinline__"})


def _logical_lines(code: str) -> list[tuple[int, int]]:
    """(first, last) physical line indices of each logical line (backslash-newlines spliced)."""
    lines = code.split("\n")
    out, i = [], 0
    while i < len(lines):
        j = i
        while lines[j].endswith("\\") and j + 1 < len(lines):
            j += 1
        out.append((i, j))
        i = j + 1
    return out


def _directives(code: str) -> tuple[str, list[tuple[int, str]], list[tuple[int, str]], list[tuple[int, str]]]:
    """The source with every #include line blanked (same line count), the refused headers, the
    CUDA keywords the source redefines, and the conditions (line, text) of its #if-like
    directives."""
    lines = code.split("\n")
    blank = strip_cpp(code).split("\n")
    refused: list[tuple[int, str]] = []
    redefined: list[tuple[int, str]] = []
    conditions: list[tuple[int, str]] = []
    for first, last in _logical_lines(code):
        logical_blank = " ".join(b.rstrip("\\") for b in blank[first:last + 1])
        m = _DIRECTIVE.match(logical_blank)
        if m is None:
            continue
        name = m.group(1)
        if name in ("include", "include_next", "import", "embed"):
            original = " ".join(s.rstrip("\\") for s in lines[first:last + 1])
            om = re.match(r"^[ \t]*(?:#|%:)[ \t]*\w+(.*)$", original)
            rest = re.sub(r"//.*$|/\*.*?\*/", " ", om.group(1) if om else "")
            h = _HEADER.match(rest)
            if h is None:
                refused.append((first + 1, f"#{name} {rest.strip()} (a header must be named, <...> or \"...\")"))
            elif name != "include" or not header_allowed(h.group(2) or h.group(3)):
                refused.append((first + 1, h.group(2) or h.group(3)))
            for k in range(first, last + 1):
                lines[k] = ""
        elif name in ("define", "undef"):
            word = m.group(2).split("(")[0].split()
            if word and word[0] in _CUDA_KEYWORDS:
                redefined.append((first + 1, word[0]))
        elif name in ("if", "ifdef", "ifndef", "elif", "elifdef", "elifndef"):
            conditions.append((first + 1, m.group(2)))
        elif name == "line":
            refused.append((first + 1, "#line (the rules name the candidate's own lines)"))
    return "\n".join(lines), refused, redefined, conditions


def _compiler() -> str | None:
    return next((c for c in map(shutil.which, _COMPILERS) if c), None)


# Macros the build defines as the preprocessor here does: the CUDA compiler's (for cuda_sources:
# nvcc's own and torch's COMMON_NVCC_FLAGS) and load_inline's.
_CUDA_DEFINES = ("-D__CUDACC__", "-D__NVCC__", "-D__CUDA_NO_HALF_OPERATORS__", "-D__CUDA_NO_HALF_CONVERSIONS__",
                 "-D__CUDA_NO_BFLOAT16_CONVERSIONS__", "-D__CUDA_NO_HALF2_OPERATORS__")
# Names a condition may test whose value is the same here and in the build: the platform's, and
# those no build here defines (`__CUDA_ARCH__` guards device code, which host code never runs).
_STABLE_MACROS = frozenset({
    "__CUDA_ARCH__", "__CUDACC__", "__NVCC__", "__CUDACC_RTC__", "__HIPCC__", "USE_ROCM", "__HIP_PLATFORM_AMD__",
    "__HIP_PLATFORM_HCC__", "__HIP_DEVICE_COMPILE__", "_WIN32", "_WIN64", "_MSC_VER", "__APPLE__", "__clang__",
    "__GNUC__", "__linux__", "__x86_64__", "__aarch64__", "TORCH_EXTENSION_NAME", "TORCH_API_INCLUDE_EXTENSION_H",
})


@functools.lru_cache(maxsize=4096)
def preprocess(kind: str, code: str, extension: str = "extension", flags: tuple[str, ...] = ()) -> CppSource:
    """`code` (an extension's cpp_sources or cuda_sources) through the preprocessor, as the build
    sees it: cuda_sources as nvcc's host pass (`__CUDACC__` defined, `__CUDA_ARCH__` not),
    cpp_sources as the host compiler; `flags` are the program's own `-D`/`-U` compiler flags.

    A condition (`#if`, `#ifdef`...) may test only the program's own macros and names whose value
    here is the build's: a macro of a header the rules do not read (`TORCH_VERSION_MAJOR`,
    `CUDART_VERSION`, `INFINITY`) would send the preprocessor here down another branch than the
    compiler's, hiding what the build compiles."""
    text, refused, redefined, conditions = _directives(code)
    defines = [*(_CUDA_DEFINES if kind == "cuda" else ()), f"-DTORCH_EXTENSION_NAME={_ident(extension)}",
               "-DTORCH_API_INCLUDE_EXTENSION_H", *(f for f in flags if f.startswith(("-D", "-U")))]
    unknown = tuple(_unfollowable(conditions, {d[2:].split("=")[0] for d in defines}))

    def failed(problem: str) -> CppSource:
        return CppSource(kind, (), tuple(refused), tuple(redefined), unknown, problem)

    compiler = _compiler()
    if compiler is None:
        return failed("no C++ preprocessor (g++, cpp or clang++) on this machine: the C++ rules cannot be checked")
    argv = [compiler, "-E", "-x", "c++", "-std=c++17", "-nostdinc", *defines, "-"]
    if compiler.endswith("cpp"):
        argv.remove("-E")
    out, err, problem = _run(argv, text.encode())
    if problem is not None:
        return failed(problem)
    if err is not None:
        first = next((line for line in err.splitlines() if "error" in line), err.strip()[:200])
        return failed("the preprocessor failed: " + re.sub(r"^<stdin>:(\d+):(\d+:)?", rf"{kind}:\1:", first.strip()))
    return CppSource(kind, _mark_device(_tokens(out)), tuple(refused), tuple(redefined), unknown)


# Prefixes of the macros of torch, CUDA, CUTLASS and CuTe, pybind11, Python, the C++ library and
# the compiler, whether or not their headers are on this machine (CUTLASS's are set by the
# architecture its headers see: `#if defined(CUTLASS_ARCH_MMA_SM90_SUPPORTED)` differs in the build)
_LIBRARY_MACRO = re.compile(r"^(?:CUDA|CUDART|CUB_|THRUST_|CUTLASS_|CUTE_|TORCH_|AT_|C10_|CAFFE2_|PYBIND11|Py|__CUDA|__CUDACC|"
                            r"_GLIBCXX|__GLIBC|__cpp_|__cplusplus|__STDC|__NV|NV_|__HIP)")


def _unfollowable(conditions: list[tuple[int, str]], flags: set[str]) -> Iterator[tuple[int, str]]:
    """(line, problem) for each condition that tests a name whose value here may not be the
    build's: a macro of a header the rules do not read or of the compiler, unless it is a stable
    one or the program's own flags define it. (A name no header defines is undefined in both, or
    defined by the program in both.)"""
    for line, condition in conditions:
        text = re.sub(r"//.*$|/\*.*?\*/", " ", condition)
        if "__has_include" in text:
            yield line, "#if __has_include(...) tests a header the rules do not read"
            continue
        for name in re.findall(r"[A-Za-z_]\w*", re.sub(r"'(?:\\.|[^'])*'", " ", text)):
            if name == "defined" or name in _STABLE_MACROS or name in flags:
                continue
            if _LIBRARY_MACRO.match(name) or name in header_macros():  # the headers are read only when needed
                yield line, f"a condition on {name}, a macro of a header or of the compiler the rules do not read"
                break


def _run(argv: list[str], text: bytes, timeout: float | None = None) -> tuple[str, str | None, str | None]:
    """(output, the errors when it failed, a problem that stopped it): the preprocessor under a
    time limit, its output read up to the size limit (a macro bomb is stopped, not stored)."""
    with tempfile.TemporaryFile() as errors:
        try:
            # its own process group: the compiler driver's child (cc1plus) is stopped with it
            proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=errors,
                                    start_new_session=True)
        except OSError as exc:
            return "", None, f"the preprocessor could not run: {exc}"

        def stop() -> None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

        timer = threading.Timer(timeout or _TIMEOUT_S, stop)
        timer.start()
        try:
            assert proc.stdin is not None and proc.stdout is not None
            try:
                proc.stdin.write(text)
                proc.stdin.close()
            except BrokenPipeError:
                pass
            out = proc.stdout.read(_MAX_OUTPUT + 1)
            if len(out) > _MAX_OUTPUT:
                stop()
                proc.wait()
                return "", None, "the preprocessed source is over 4 MB"
            proc.wait()
        finally:
            timer.cancel()
            if proc.stdout is not None:
                proc.stdout.close()
        if proc.returncode < 0:
            return "", None, f"the preprocessor took over {timeout or _TIMEOUT_S} s"
        if proc.returncode != 0:
            errors.seek(0)
            return out.decode(errors="replace"), errors.read().decode(errors="replace"), None
    return out.decode(errors="replace"), None, None


@functools.lru_cache(maxsize=1)
def header_macros() -> frozenset[str]:
    """Every macro the allowed headers on this machine define (torch's extension header, the CUDA
    runtime's and the C/C++ headers of ALLOWED_HEADERS that are here): read once a process."""
    compiler = _compiler()
    if compiler is None:
        return frozenset()
    import sysconfig

    includes = [f"-I{sysconfig.get_paths()['include']}"]
    try:
        from torch.utils.cpp_extension import CUDA_HOME, include_paths

        includes += [f"-I{p}" for p in include_paths()] + ([f"-I{CUDA_HOME}/include"] if CUDA_HOME else [])
    except Exception:  # noqa: BLE001 - without torch's headers, the C/C++ ones still count
        pass
    headers = ["torch/extension.h", *sorted(h for h in ALLOWED_HEADERS if not h.endswith("/"))]
    names: set[str] = set()
    for chunk in (headers[:1], headers[1:]):  # torch's alone: a header it cannot find leaves the rest
        text = "".join(f"#if __has_include(<{h}>)\n#include <{h}>\n#endif\n" for h in chunk)
        out, _, _ = _run([compiler, "-dM", "-E", "-x", "c++", "-std=c++17", *includes, "-"], text.encode(), timeout=120)
        names.update(re.findall(r"^#define (\w+)", out, re.MULTILINE))
    return frozenset(names)


def _ident(name: str) -> str:
    return re.sub(r"\W", "_", name) or "extension"


_TOKEN = re.compile(
    r"""(?P<marker>^\#[ \t]*\d+[^\n]*)|(?P<directive>^[ \t]*\#[^\n]*)|(?P<nl>\n)|(?P<ws>[ \t\r\f\v]+)"""
    r"""|(?P<raw>(?:u8|u|U|L)?R"(?P<delim>[^ ()\\\t\n]{0,16})\((?:.|\n)*?\)(?P=delim)")"""
    r"""|(?P<string>(?:u8|u|U|L)?"(?:\\.|[^"\\\n])*")|(?P<char>(?:u8|u|U|L)?'(?:\\.|[^'\\\n])*')"""
    r"""|(?P<name>[A-Za-z_$][\w$]*)|(?P<number>\.?\d(?:[eEpP][+-]|[\w.'])*)"""
    r"""|(?P<punct>::|->|<<|>>|&&|\|\||\.\.\.|[^\s])""",
    re.MULTILINE,
)


def _tokens(output: str) -> list[Token]:
    out: list[Token] = []
    line = 1
    for m in _TOKEN.finditer(output):
        group = m.lastgroup if m.lastgroup != "delim" else "raw"
        value = m.group(0)
        if group == "marker":
            line = int(re.match(r"#[ \t]*(\d+)", value).group(1)) - 1  # type: ignore[union-attr]
        elif group == "nl":
            line += 1
        elif group in ("raw", "string", "char"):
            out.append(Token(value, line, "string"))
            line += value.count("\n")
        elif group in ("name", "number", "punct"):
            out.append(Token(value, line, group))
    return out


def _matching(tokens: list[Token], i: int, end: int) -> int:
    depth = 0
    for k in range(i, end):
        t = tokens[k].text
        if t == "{":
            depth += 1
        elif t == "}":
            depth -= 1
            if depth == 0:
                return k
    return end - 1


def _without_templates(head: list[Token]) -> list[str]:
    """A declaration's head without its `template <...>` parameter lists."""
    out: list[str] = []
    depth = 0
    skipping = False
    for i, t in enumerate(head):
        if t.text == "template" and i + 1 < len(head) and head[i + 1].text == "<":
            skipping = True
            continue
        if skipping:
            depth += {"<": 1, ">": -1, ">>": -2}.get(t.text, 0)
            if depth <= 0 and t.text in (">", ">>"):
                skipping, depth = False, 0
            continue
        out.append(t.text)
    return out


def _scope_kind(head: list[Token]) -> str:
    """What a `{` opens after this head: "scope" (namespace, extern block, class), "function"
    (a function's body), or "data" (an initializer, an enum)."""
    words = _without_templates(head)
    if "namespace" in words or (words[:1] == ["extern"] and "(" not in words):
        return "scope"
    paren = words.index("(") if "(" in words else len(words)
    equals = words.index("=") if "=" in words else len(words)
    if paren < equals and paren < len(words):
        return "function"
    if equals < len(words) or "enum" in words:
        return "data"
    if {"class", "struct", "union"} & set(words):
        return "scope"
    return "data"


def _is_device(head: list[Token]) -> bool:
    words = {t.text for t in head}
    return bool({"__global__", "__device__"} & words) and "__host__" not in words and "host" not in words


def _mark_device(tokens: list[Token]) -> tuple[Token, ...]:
    device = [False] * len(tokens)

    def scan(i: int, end: int) -> None:
        start = i
        while i < end:
            t = tokens[i].text
            if t in (";", "}"):
                start = i + 1
            elif t in ("public", "private", "protected") and i + 1 < end and tokens[i + 1].text == ":":
                start = i + 2
            elif t == "{":
                close = _matching(tokens, i, end)
                head = tokens[start:i]
                kind = _scope_kind(head)
                if kind == "scope":
                    scan(i + 1, close)
                elif kind == "function" and _is_device(head):
                    for k in range(i, close + 1):
                        device[k] = True
                i = close
                start = close + 1
            i += 1

    scan(0, len(tokens))
    return tuple(Token(t.text, t.line, t.kind, d) for t, d in zip(tokens, device))
