"""The static rules on a candidate's C++/CUDA: read on what the preprocessor produces
(cpp_preprocess.py), so a name split by `##`, made by a macro or hidden in a `#define` is seen
whole. Each rule is a function with its rationale in its docstring; a violation names the place
as `cpp:LINE` / `cuda:LINE`, the line of the candidate's own source.

Host code is where a candidate reaches the process that loads it: the Python interpreter (the C
API, pybind11), files, processes, threads, signals, the environment, dynamic loading, the GPU's
settings. Host code may use allowlisted headers and namespaces only, and the names that reach
the rest are refused; device code (the bodies of `__global__` and `__device__` functions) cannot
reach the host at all.
"""

from __future__ import annotations

import re
from typing import Iterator, Sequence

import torch

from kevin_backend.toolchain.candidate import Candidate, InlineExtension
from kevin_backend.toolchain.cpp_preprocess import CppSource, Token, preprocess
from kevin_backend.toolchain.posix_names import POSIX_NAMES
from kevin_backend.toolchain.rule_violation import RuleViolation
from kevin_backend.toolchain.static_forward import ALLOWED_TENSOR_METHODS

__all__ = ["ALLOWED_CPP_TORCH", "ALLOWED_NAMESPACES", "COMPUTE_METHODS", "CPP_RULES",
           "preprocessed"]

# Tensor methods C++ host code may not call: every method torch.Tensor has, but the allowed ones
# (dtype conversions in host code are caught when they run: the judge audits dispatched ops).
COMPUTE_METHODS = frozenset(
    name for name in dir(torch.Tensor)
    if not name.startswith("_") and callable(getattr(torch.Tensor, name, None))
) - ALLOWED_TENSOR_METHODS - {"to", "float", "half", "double", "type", "cpu", "resize", "resize_", "record_stream",
                              "is_pinned", "is_set_to", "is_signed", "is_inference", "is_neg", "is_conj", "dim_order"}

# C++ host code: torch/ATen calls that only allocate, describe or guard.
ALLOWED_CPP_TORCH = frozenset(
    {
        "Tensor", "TensorOptions", "empty", "empty_like", "empty_strided", "zeros", "zeros_like", "ones",
        "ones_like", "full", "full_like", "from_blob", "Device", "DeviceType", "ScalarType", "IntArrayRef",
        "Scalar", "Half", "BFloat16", "kFloat", "kFloat32", "kFloat16", "kHalf", "kBFloat16", "kDouble",
        "kFloat64", "kInt", "kInt32", "kLong", "kInt64", "kBool", "kByte", "kInt8", "kCUDA", "kCPU",
        "dtype", "device", "layout", "kStrided", "MemoryFormat", "Layout", "cuda", "OptionalCUDAGuard",
        "CUDAGuard", "getCurrentCUDAStream", "CUDAStream", "detail", "native", "Generator", "optional",
        "nullopt", "TensorAccessor", "PackedTensorAccessor32", "PackedTensorAccessor64", "RestrictPtrTraits",
        "DefaultPtrTraits", "elementSize", "toString", "string_view", "ArrayRef", "SymInt", "c10",
        "getCurrentDeviceProperties", "DeviceGuard", "OptionalDeviceGuard", "acc_type", "opmath_type",
        "CppTypeToScalarType",
    }
)

# The first name of a qualified name in host code (`X::...`): namespaces a kernel program uses.
# A program's own namespaces, classes, enums, aliases and template parameters are allowed too.
ALLOWED_NAMESPACES = frozenset({
    "std", "at", "c10", "torch", "cuda", "cub", "thrust", "cooperative_groups", "nvcuda", "cutlass", "cute",
})
# Namespaces whose names are not checked one by one when a `using namespace` or an alias opens
# them (torch's and ATen's are checked by name: ALLOWED_CPP_TORCH).
_CLOSED_NAMESPACES = frozenset({"at", "c10", "torch", "pybind11", "py"})
_PYTHON_NAMESPACES = frozenset({"pybind11", "py"})  # rule_no_python_api's
# std:: is for containers, math, algorithms, strings and type traits; nothing of files,
# threads, time, processes or the environment.
STD_NAMES = frozenset("""
vector array string string_view basic_string to_string stoi stol stoll stof stod wstring pair make_pair tuple
make_tuple get tie ignore optional nullopt make_optional variant visit initializer_list map unordered_map set
unordered_set multimap multiset deque list queue priority_queue stack bitset complex
min max minmax clamp abs fabs fabsf sqrt sqrtf rsqrt cbrt exp expf exp2 expm1 log logf log2 log10 log1p pow powf
sin cos tan asin acos atan atan2 sinh cosh tanh asinh acosh atanh erf erfc erff tgamma lgamma floor ceil round
lround llround trunc fmod remainder fma fmaf fmax fmin hypot copysign signbit isnan isinf isfinite nan
numeric_limits min_element max_element minmax_element sort stable_sort partial_sort nth_element reverse rotate
fill fill_n copy copy_n move swap iota accumulate reduce inner_product partial_sum transform for_each find
find_if count count_if all_of any_of none_of equal lower_bound upper_bound binary_search unique distance
begin end size data next prev advance back_inserter gcd lcm
size_t ptrdiff_t nullptr_t int8_t int16_t int32_t int64_t uint8_t uint16_t uint32_t uint64_t intptr_t uintptr_t
is_same is_same_v enable_if enable_if_t conditional conditional_t is_floating_point is_floating_point_v
is_integral is_integral_v is_signed is_unsigned remove_cv remove_cv_t remove_reference remove_reference_t
remove_pointer decay decay_t integral_constant true_type false_type declval forward make_unsigned
make_signed underlying_type common_type is_arithmetic is_pointer is_const add_const void_t index_sequence
make_index_sequence integer_sequence is_base_of is_convertible is_trivially_copyable aligned_storage
unique_ptr shared_ptr make_unique make_shared function hash less greater plus multiplies
runtime_error invalid_argument out_of_range logic_error exception
cout cerr endl ostream ostringstream stringstream istringstream setw setprecision fixed scientific
""".split())

_PY_NAME = re.compile(r"^_*(?:Py[A-Z_a-z]|THP[A-Z]|PYBIND11_|pybind11$)")
# Names that reach files, processes, threads, signals, the environment, dynamic loading or the
# GPU's settings (and the CUDA driver's handles on them)
_SYSTEM_NAMES = frozenset("""
system popen pclose fork vfork clone execve fexecve posix_spawn posix_spawnp fopen fopen64 freopen fdopen tmpfile
tmpnam mkstemp mkostemp open open64 openat creat ifstream ofstream fstream filebuf basic_ifstream basic_ofstream
basic_fstream basic_filebuf filesystem unlink unlinkat rmdir mkdir rename renameat truncate ftruncate chmod chown
symlink link socket socketpair connect listen accept send recv sendto recvfrom getaddrinfo dlopen dlmopen dlsym
dlvsym dlclose getenv secure_getenv setenv putenv unsetenv clearenv environ __environ mmap munmap mprotect syscall
ptrace kill raise signal sigaction sigprocmask prctl setuid seteuid chdir chroot atexit at_quick_exit
process_vm_writev process_vm_readv memfd_create shm_open ioctl getpid getppid
cudaDeviceReset cudaSetDevice cudaSetDeviceFlags cudaSetValidDevices cudaDeviceSetLimit cudaDeviceSetCacheConfig
cudaDeviceSetSharedMemConfig cudaProfilerStart cudaProfilerStop cudaThreadExit cudaThreadSetLimit
cudaDeviceSetMemPool cudaMemPoolSetAttribute cudaMemPoolTrimTo cudaDeviceEnablePeerAccess cudaDeviceGraphMemTrim
cudaGetDriverEntryPoint cuGetProcAddress cuInit cudaDeviceSetGraphMemAttribute CUDACachingAllocator
""".split())
_SYSTEM_PATTERN = re.compile(r"^(?:exec[lv]p?e?|nvml\w+|nvrtc\w+|cuCtx\w+|cuDevicePrimaryCtx\w+|cudaIpc\w+|cuIpc\w+|"
                             r"cuModuleLoad\w*|cuLibraryLoad\w*|cudaLibraryLoad\w*|pthread_\w+|dl_iterate_phdr)$")
# Calls on the process's file descriptors (the judge's own pipes among them)
_FD_CALLS = frozenset("read write pread pwrite readv writev close dup dup2 dup3 lseek fcntl select poll".split())
_STREAM_NAMES = frozenset("""
thread jthread async this_thread getStreamFromPool getStreamFromExternal setCurrentCUDAStream CUDAStreamGuard
OptionalCUDAStreamGuard CUDAMultiStreamGuard cudaStreamDestroy cudaLaunchHostFunc cudaStreamAddCallback
cudaStreamBeginCapture cudaStreamEndCapture CUDAGraph
""".split())
_STREAM_PATTERN = re.compile(r"^(?:cudaStreamCreate\w*|cuStreamCreate\w*|cudaGraph\w+|cuGraph\w+)$")
_TIMER_NAMES = frozenset("""
cudaEventElapsedTime clock_gettime gettimeofday chrono steady_clock high_resolution_clock system_clock __rdtsc rdtsc
CUDAEvent
""".split())
_TIMER_PATTERN = re.compile(r"^(?:cudaEventCreate\w*|cuEventCreate\w*)$")
# attributes that run code at load time or bind a name to another symbol
_SYMBOL_ATTRIBUTES = frozenset("constructor destructor alias weakref ifunc symver init_priority section".split())
# torch's and c10's macros that register operators, kernels or flags when the library loads
_REGISTRATION = re.compile(r"^(?:TORCH_LIBRARY\w*|C10_REGISTER\w*|REGISTER_\w+|C10_DEFINE_\w+|C10_DECLARE_\w+|"
                           r"TORCH_DECLARE_\w+|STATIC_INITIALIZER\w*|RegisterOperators|Library|Dispatcher)$")


def preprocessed(ext: InlineExtension) -> Iterator[CppSource]:
    """The extension's sources after the preprocessor (cached: every rule reads the same)."""
    if ext.cuda_sources:
        yield preprocess("cuda", ext.cuda_sources, ext.name, tuple(f.strip() for f in ext.extra_cuda_cflags))
    if ext.cpp_sources:
        yield preprocess("cpp", ext.cpp_sources, ext.name, tuple(f.strip() for f in ext.extra_cflags))


def _sources(c: Candidate) -> Iterator[CppSource]:
    for ext in c.extensions:
        yield from preprocessed(ext)


def _at(src: CppSource, t: Token) -> str:
    return f"{src.kind}:{t.line}"


def rule_cpp_readable(c: Candidate) -> Iterator[RuleViolation]:
    """Every C++/CUDA source goes through the preprocessor; a source that cannot (no
    preprocessor on the machine, a preprocessor error, a macro that expands without end) fails,
    and so does a condition (`#if`, `#ifdef`) on a macro of a header the rules do not read.

    Why: the other C++ rules read what the preprocessor produces; a source they cannot read, or
    a branch the build may take and the preprocessor here did not, is refused rather than let
    through unread (fail closed)."""
    for src in _sources(c):
        if src.error is not None:
            yield RuleViolation("cpp-preprocessed", src.kind, src.error)
        for line, problem in src.conditions:
            yield RuleViolation("cpp-preprocessed", f"{src.kind}:{line}", problem)


def rule_allowed_headers(c: Candidate) -> Iterator[RuleViolation]:
    """Only allowlisted headers: torch's extension API, ATen, c10, the CUDA runtime and its
    device libraries (cub, thrust, cooperative groups, cuda_fp16...), C/C++ math, containers,
    algorithms and strings. An `#include` whose header a macro names is refused.

    Why: processes, files, threads, signals, time, dynamic loading and the Python C API arrive
    through headers (unistd.h, dlfcn.h, thread, fstream, Python.h, pybind11/...)."""
    for src in _sources(c):
        for line, header in src.headers:
            yield RuleViolation("allowed-headers", f"{src.kind}:{line}", f"includes {header}, which is not an allowed header")


def _host(src: CppSource) -> list[Token]:
    return [t for t in src.tokens if not t.device]


def _binding_span(tokens: Sequence[Token]) -> tuple[int, int] | None | str:
    """The tokens of `PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("name", &fn, ...); ... }`
    as (start, end); None when there is no such block; a message when the block does more."""
    texts = [t.text for t in tokens]
    if "PYBIND11_MODULE" not in texts:
        return None
    i = texts.index("PYBIND11_MODULE")
    head = texts[i:i + 7]
    if len(head) < 7 or head[1] != "(" or head[3] != "," or head[5] != ")" or head[6] != "{":
        return "PYBIND11_MODULE must read PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def(...); }"
    module = head[4]
    k = i + 7
    allowed = {"py", "pybind11", "::", "arg", "(", ")", "=", ",", "-", "true", "false", "&", module, "def", ".", ";"}
    while k < len(tokens) and texts[k] != "}":
        if texts[k:k + 4] != [module, ".", "def", "("] or tokens[k + 4].kind != "string":
            return f"the PYBIND11_MODULE block may only bind functions, {module}.def(\"name\", &function, ...)"
        k += 4
        depth = 0
        while k < len(tokens):
            t = tokens[k]
            depth += {"(": 1, ")": -1}.get(t.text, 0)
            if t.kind == "name" and t.text not in allowed and not (tokens[k - 1].text in ("&", ",", "::") and depth == 1):
                return f"the PYBIND11_MODULE block may only bind functions ({t.text!r} at line {t.line})"
            if t.kind == "punct" and t.text not in allowed:
                return f"the PYBIND11_MODULE block may only bind functions ({t.text!r} at line {t.line})"
            k += 1
            if depth == 0:
                break
        if k >= len(tokens) or texts[k] != ";":
            return "the PYBIND11_MODULE block may only bind functions"
        k += 1
    return (i, k + 1)


def _defined_functions(c: Candidate) -> set[str]:
    names: set[str] = set()
    for src in _sources(c):
        names |= _program_names(src.tokens)
    return names


def rule_no_python_api(c: Candidate) -> Iterator[RuleViolation]:
    """No Python C API (`Py*`, `_Py*`, torch's `THP*`) and no pybind11 (`pybind11::`, `py::`,
    `PYBIND11_*`) beyond the binding `load_inline` writes or the usual
    `PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("name", &fn, ...); }`; the functions
    `load_inline(functions=[...])` binds are the program's own (not `system` or `PyRun_*`).

    Why: an extension runs inside the judge's Python process; through the interpreter it can
    import anything, rewrite the judge's functions or the kept reference, whatever the Python
    rules forbid. A kernel needs the interpreter for nothing but the binding of its functions."""
    for src in _sources(c):
        tokens = list(src.tokens)
        span = _binding_span(tokens)
        if isinstance(span, str):
            yield RuleViolation("no-python-api", src.kind, span)
            span = None
        for k, t in enumerate(tokens):
            if span is not None and span[0] <= k < span[1]:
                continue
            if t.kind != "name":
                continue
            nxt = tokens[k + 1].text if k + 1 < len(tokens) else ""
            if _PY_NAME.match(t.text) or (t.text == "py" and nxt == "::"):
                yield RuleViolation("no-python-api", _at(src, t), f"uses {t.text}: the Python C API and pybind11 are "
                                    "out of a kernel's reach")
    defined = _defined_functions(c)
    for ext in c.extensions:
        for name in ext.functions:
            if name not in defined and not any(src.error for src in preprocessed(ext)):
                yield RuleViolation("no-python-api", f"python:{ext.line}",
                                    f"functions= binds {name}, which the program's C++ does not define")


def _called(tokens: Sequence[Token], k: int) -> bool:
    return k + 1 < len(tokens) and tokens[k + 1].text == "(" and (k == 0 or tokens[k - 1].text not in (".", "->"))


_NOT_TYPES = frozenset("return case goto throw sizeof alignof new delete co_return co_yield else do operator".split())


def _program_names(tokens: Sequence[Token]) -> set[str]:
    """Variables the program declares (`float time = 0`, a parameter `int link`) and functions it
    defines (`void sleep_cycles(...) { ... }`): such a name is the program's own, not libc's."""
    names: set[str] = set()
    for k in range(1, len(tokens) - 1):
        t, prev, nxt = tokens[k], tokens[k - 1], tokens[k + 1]
        if t.kind != "name":
            continue
        if nxt.text in ("=", ";", ",", "[", "{", ")") and (
            (prev.kind == "name" and prev.text not in _NOT_TYPES) or prev.text in ("*", "&", "&&", ">")
        ):
            names.add(t.text)
        elif nxt.text == "(" and ((prev.kind == "name" and prev.text not in _NOT_TYPES) or prev.text in ("*", "&", ">")):
            depth, j = 0, k + 1
            while j < len(tokens):
                depth += {"(": 1, ")": -1}.get(tokens[j].text, 0)
                if depth == 0:
                    break
                j += 1
            j += 1
            while j < len(tokens) and tokens[j].kind == "name" and tokens[j].text in ("const", "noexcept", "override", "final"):
                j += 1
            if j < len(tokens) and tokens[j].text in ("{", ":"):
                names.add(t.text)
    return names


def rule_no_system(c: Candidate) -> Iterator[RuleViolation]:
    """No file, process, signal, environment, dynamic-loading or device-management names in host
    code (`system`, `popen`, `fork`, `exec*`, `fopen`, `open`, `ofstream`, `kill`, `raise`,
    `signal`, `ptrace`, `mmap`, `syscall`, `dlopen`, `dlsym`, `getenv`, `setenv`,
    `cudaDeviceReset`, `cudaSetDevice`, `cudaDeviceSetLimit`, `nvml*`, `cuCtx*`, `cudaIpc*`...),
    no calls on file descriptors (`read`, `write`, `close`, `dup2`...), and none of the C library's
    functions of unistd.h, pthread.h, time.h, stdio.h's files, stdlib.h's environment
    (posix_names.py) unless the program declares that name itself.

    Why: a candidate must not read stored answers, write the judge's pipes or files, start
    processes, load code, or change the GPU's state for the judge or anyone after it."""
    for src in _sources(c):
        host = _host(src)
        own = _program_names(src.tokens)
        for k, t in enumerate(host):
            if t.kind != "name" or (k and host[k - 1].text in (".", "->")):
                continue
            if t.text in _SYSTEM_NAMES or _SYSTEM_PATTERN.match(t.text) or (t.text in _FD_CALLS and _called(host, k)):
                yield RuleViolation("no-system-access", _at(src, t), f"uses {t.text}")
            elif t.text in POSIX_NAMES and t.text not in own and not (
                    k > 1 and host[k - 1].text == "::" and host[k - 2].kind == "name" and host[k - 2].text != "std"):
                yield RuleViolation("no-system-access", _at(src, t), f"uses {t.text} (the C library's process, file, "
                                    "thread or time functions are out of a kernel's reach)")


def rule_no_streams(c: Candidate) -> Iterator[RuleViolation]:
    """No CUDA streams of the program's own, no stream switches, threads or host callbacks in
    host code (`cudaStreamCreate*`, `getStreamFromPool`, `CUDAStreamGuard`, `std::thread`,
    `pthread_*`, `cudaLaunchHostFunc`, graph capture).

    Why: work on a side stream or another thread escapes the timer. (A library's own namespace of
    that name, as in `cutlass::epilogue::thread::ReLu`, a CUDA thread's functors, is not one.)"""
    for src in _sources(c):
        host = _host(src)
        for k, t in enumerate(host):
            if t.kind == "name" and (t.text in _STREAM_NAMES or _STREAM_PATTERN.match(t.text)):
                if t.text == "thread" and (_library_namespace(host, k) or (k and host[k - 1].text in (".", "->"))):
                    continue  # (or a member of that name: CUTLASS's epilogue arguments have one)
                yield RuleViolation("no-streams-threads", _at(src, t), f"uses {t.text}")


def _library_namespace(tokens: Sequence[Token], k: int) -> bool:
    """Whether `tokens[k]` is a namespace inside another than std's: `name :: X :: name`, name not std."""
    return (2 <= k < len(tokens) - 1 and tokens[k - 1].text == "::" and tokens[k + 1].text == "::"
            and tokens[k - 2].kind == "name" and tokens[k - 2].text != "std")


def rule_no_timers(c: Candidate) -> Iterator[RuleViolation]:
    """No timers in host code (CUDA events, `chrono`, `clock_gettime`).

    Why: a kernel that measures time can tell when it is timed and behave differently."""
    for src in _sources(c):
        for t in _host(src):
            if t.kind == "name" and (t.text in _TIMER_NAMES or _TIMER_PATTERN.match(t.text)):
                yield RuleViolation("no-timers", _at(src, t), f"uses {t.text}")


def rule_no_host_asm(c: Candidate) -> Iterator[RuleViolation]:
    """No inline assembly in host code (`asm`, `__asm__`); device code may use PTX.

    Why: host assembly makes system calls no name shows."""
    for src in _sources(c):
        for t in _host(src):
            if t.text in ("asm", "__asm__", "__asm"):
                yield RuleViolation("no-host-asm", _at(src, t), f"uses {t.text} in host code")


def rule_no_symbol_tricks(c: Candidate) -> Iterator[RuleViolation]:
    """No attributes that run code at load time or rename symbols (`constructor`, `destructor`,
    `alias`, `weakref`, `ifunc`, `section`...), no registration with torch (`TORCH_LIBRARY*`,
    `C10_REGISTER*`, `REGISTER_*`), and no `#define`/`#undef` of CUDA's execution-space keywords
    (`__global__`, `__device__`, `__host__`).

    Why: a constructor runs when the extension is loaded, before any rule of the judge's; a
    registered kernel replaces one of torch's operators for the whole process (the reference's
    included); an alias calls a forbidden function by another name; a redefined `__device__`
    would make host code look like device code to these rules."""
    for src in _sources(c):
        for line, word in src.redefined:
            yield RuleViolation("no-symbol-tricks", f"{src.kind}:{line}", f"redefines {word}")
        for t in src.tokens:
            if t.kind == "name" and _REGISTRATION.match(t.text):
                yield RuleViolation("no-symbol-tricks", _at(src, t), f"uses {t.text}, which registers code with torch at load")
        tokens = src.tokens
        depth = 0
        for k, t in enumerate(tokens):
            if t.text == "__attribute__" or (t.text == "[" and k + 1 < len(tokens) and tokens[k + 1].text == "["):
                depth = 1 if depth == 0 else depth
            elif depth and t.text in ("(", "["):
                depth += 1
            elif depth and t.text in (")", "]"):
                depth -= 1
            elif t.kind == "name" and t.text in _SYMBOL_ATTRIBUTES and (depth or t.text in ("constructor", "destructor")):
                yield RuleViolation("no-symbol-tricks", _at(src, t), f"uses the attribute {t.text}")


def _own_names(tokens: Sequence[Token]) -> set[str]:
    """Names the program declares: namespaces, classes, structs, unions, enums, template
    parameters, type aliases."""
    names: set[str] = set()
    for k, t in enumerate(tokens[:-1]):
        nxt = tokens[k + 1]
        if t.text in ("namespace", "class", "struct", "union", "enum", "typename") and nxt.kind == "name":
            names.add(tokens[k + 2].text if nxt.text in ("class", "struct") and k + 2 < len(tokens) else nxt.text)
        elif t.text == "using" and nxt.kind == "name" and k + 2 < len(tokens) and tokens[k + 2].text == "=":
            names.add(nxt.text)
        elif t.text == "typedef":
            end = next((j for j in range(k, len(tokens)) if tokens[j].text == ";"), len(tokens))
            if end - 1 > k and tokens[end - 1].kind == "name":
                names.add(tokens[end - 1].text)
    return names


def rule_allowed_namespaces(c: Candidate) -> Iterator[RuleViolation]:
    """Qualified names in host code start with an allowed namespace (`std`, `at`, `c10`, `torch`,
    `cuda`, `cub`, `thrust`, `cooperative_groups`, `nvcuda`, `cutlass`, `cute`) or one of the
    program's own; `std::` names are containers, math, algorithms, strings and type traits;
    `using namespace` and namespace aliases do not open torch, ATen, c10 or pybind11.

    Why: an allowlist of where names come from leaves no corner of a header unchecked (std's
    threads, files and clocks; torch's dispatcher and Python bindings behind `using namespace`)."""
    for src in _sources(c):
        host = _host(src)
        own = _own_names(src.tokens)
        for k, t in enumerate(host):
            if t.kind != "name":
                continue
            prev = host[k - 1].text if k else ""
            nxt = host[k + 1].text if k + 1 < len(host) else ""
            if nxt == "::" and prev != "::" and t.text not in ALLOWED_NAMESPACES | own | _PYTHON_NAMESPACES:
                yield RuleViolation("allowed-namespaces", _at(src, t), f"uses the namespace {t.text}")
            if t.text == "std" and nxt == "::" and k + 2 < len(host) and host[k + 2].kind == "name":
                member = host[k + 2].text
                if member not in STD_NAMES:
                    yield RuleViolation("allowed-namespaces", _at(src, t), f"uses std::{member}")
            if t.text == "namespace" and prev == "using" and nxt in _CLOSED_NAMESPACES:
                yield RuleViolation("allowed-namespaces", _at(src, t), f"opens the namespace {nxt} (using namespace)")
            if t.text == "namespace" and k + 3 < len(host) and host[k + 2].text == "=":
                target = host[k + 4].text if host[k + 3].text == "::" and k + 4 < len(host) else host[k + 3].text
                if target in _CLOSED_NAMESPACES or target not in ALLOWED_NAMESPACES | own:
                    yield RuleViolation("allowed-namespaces", _at(src, t), f"aliases the namespace {target}")


def rule_no_try(c: Candidate) -> Iterator[RuleViolation]:
    """No C++ try/catch (the Python half of the rule is in static_python.py).

    Why: the classic hack wraps the kernel in try and falls back to PyTorch in catch."""
    for src in _sources(c):
        toks = src.tokens
        for k, t in enumerate(toks[:-1]):
            if (t.text == "try" and toks[k + 1].text == "{") or (t.text == "catch" and toks[k + 1].text == "("):
                yield RuleViolation("no-try-except", _at(src, t), "C++ try/catch is not allowed")


def rule_no_torch_compute(c: Candidate) -> Iterator[RuleViolation]:
    """In C++ host code, no torch::/at::/c10:: call outside allocation, description and guards
    (ALLOWED_CPP_TORCH), and no tensor method that computes (the Python half is in
    static_python.py).

    Why: a kernel program that hands part of the work to PyTorch measures PyTorch."""
    for src in _sources(c):
        host = _host(src)
        for k, t in enumerate(host):
            if t.text in ("torch", "at", "c10") and k + 2 < len(host) and host[k + 1].text == "::" and (k == 0 or host[k - 1].text != "::"):
                parts = [t.text]
                j = k + 1
                while j + 1 < len(host) and host[j].text == "::" and host[j + 1].kind == "name":
                    parts.append(host[j + 1].text)
                    j += 2
                name, middle = parts[-1], parts[1:-1]
                if len(parts) < 2 or name in ALLOWED_CPP_TORCH or name.startswith(("k", "AT_", "TORCH_")):
                    continue
                if middle and middle[0] in ("cuda", "detail"):
                    continue
                yield RuleViolation("no-pytorch-compute", _at(src, t), f"calls {'::'.join(parts)}")
            elif t.text in (".", "->") and k + 2 < len(host) and host[k + 2].text == "(" and host[k + 1].text in COMPUTE_METHODS:
                yield RuleViolation("no-pytorch-compute", _at(src, t), f"calls the tensor method .{host[k + 1].text}()")


def rule_no_host_sync(c: Candidate) -> Iterator[RuleViolation]:
    """No `.item()`, `.cpu()` or `.to(kCPU)` in C++ host code (the Python half is in
    static_python.py).

    Why: a copy to the host synchronizes with the GPU and breaks CUDA-graph capture of the
    compiled model the kernel is kept for."""
    for src in _sources(c):
        host = _host(src)
        for k, t in enumerate(host[:-2]):
            if t.text in (".", "->") and host[k + 1].text in ("item", "cpu") and host[k + 2].text in ("(", "<"):
                yield RuleViolation("no-host-sync", _at(src, t), f"calls .{host[k + 1].text}(), a copy to the host")
            elif t.text in (".", "->") and host[k + 1].text == "to" and host[k + 2].text == "(":
                args = [x.text for x in host[k + 3:k + 12]]
                if "kCPU" in args[: args.index(")") if ")" in args else len(args)]:
                    yield RuleViolation("no-host-sync", _at(src, t), "calls .to(kCPU), a copy to the host")


CPP_RULES = (
    rule_cpp_readable,
    rule_allowed_headers,
    rule_no_python_api,
    rule_no_system,
    rule_no_streams,
    rule_no_timers,
    rule_no_host_asm,
    rule_no_symbol_tricks,
    rule_allowed_namespaces,
    rule_no_try,
    rule_no_torch_compute,
    rule_no_host_sync,
)
