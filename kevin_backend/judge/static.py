"""Static rules: what a candidate may not do, checked before anything is built or run.

Each rule is a function with its rationale in its docstring; each failure is a `RuleViolation`
naming the rule and the place (`python:LINE`, `cuda:LINE`, `cpp:LINE`). The rules read the
candidate's Python (as an AST) and its C++/CUDA sources (comments and string literals removed).
They are the first line against reward hacking; the runtime checks (a dispatch audit of the
forward, fresh inputs, poisoned outputs, input checks) are the second.
"""

from __future__ import annotations

import ast
import re

import torch
from typing import Callable, Iterator

from kevin_backend.toolchain.candidate import Candidate, InlineExtension
from kevin_backend.judge.result import RuleViolation
from kevin_backend.toolchain.cpp_text import KERNEL_ATTRIBUTES, strip_cpp

__all__ = ["RULES", "check", "strip_cpp"]

# Modules a candidate may import. Files, network, processes, threads, timers and code loading all
# arrive through imports; a KernelBench candidate needs none of them.
ALLOWED_IMPORTS = frozenset(
    {"torch", "torch.nn", "torch.nn.functional", "torch.utils.cpp_extension", "math", "typing", "__future__"}
)

# Calls on `torch.` allowed in forward: allocation, shape and metadata, nothing that computes.
ALLOWED_TORCH_CALLS = frozenset(
    {
        "empty", "empty_like", "empty_strided", "zeros", "zeros_like", "ones", "ones_like", "full",
        "full_like", "tensor", "as_strided", "device", "Size", "is_tensor", "numel", "finfo", "iinfo",
        "is_floating_point", "is_complex", "get_default_dtype", "no_grad", "inference_mode",
    }
)

# Tensor methods the forward may call: metadata, views, layout, pointers, allocation and fills.
# Anything else a forward calls on a tensor is PyTorch computing for the candidate.
ALLOWED_TENSOR_METHODS = frozenset(
    {
        "size", "dim", "ndimension", "numel", "nelement", "stride", "storage_offset", "element_size", "data_ptr",
        "const_data_ptr", "is_contiguous", "is_floating_point", "is_complex", "is_same_size", "get_device",
        "contiguous", "clone", "view", "view_as", "reshape", "reshape_as", "as_strided", "permute", "transpose", "t",
        "unsqueeze", "squeeze", "flatten", "unflatten", "expand", "expand_as", "broadcast_to", "narrow", "select",
        "unbind", "split", "chunk", "movedim", "moveaxis", "diagonal", "new_empty", "new_empty_strided", "new_zeros",
        "new_ones", "new_full", "zero_", "fill_", "cuda", "detach", "requires_grad_", "item", "tolist", "__len__",
    }
)
# Methods of Python's own containers and strings (never tensor methods).
_PYTHON_METHODS = frozenset(
    {"append", "extend", "insert", "pop", "items", "keys", "values", "get", "update", "setdefault", "format", "join",
     "startswith", "endswith", "copy", "index", "count", "lower", "upper", "strip", "replace"}
)
_PYTHON_BUILTINS = frozenset(
    {"int", "float", "bool", "len", "range", "min", "max", "tuple", "list", "dict", "set", "isinstance", "print",
     "enumerate", "zip", "str", "hasattr", "getattr", "type", "super", "divmod", "sorted", "reversed", "any", "all",
     "iter", "next", "map", "load_inline"}
)
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
    }
)

_CPP_STREAMS = re.compile(
    r"\b(cudaStreamCreate\w*|getStreamFromPool|getStreamFromExternal|cudaStreamDestroy|std::thread|"
    r"std::async|std::jthread|pthread_\w+|fork|vfork|cudaLaunchHostFunc|cudaStreamAddCallback)\b"
)
_CPP_SYSTEM = re.compile(
    r"\b(fopen|freopen|open|openat|creat|ifstream|ofstream|fstream|filebuf|system|popen|execl\w*|execv\w*|"
    r"socket|connect|bind|listen|accept|send|recv|dlopen|dlsym|getenv|setenv|putenv|unlink|remove|rename|"
    r"mmap|syscall|ptrace|kill|nvml\w*|cudaDeviceReset|cudaSetDevice|cudaSetDeviceFlags|"
    r"cudaDeviceSetLimit|cudaProfilerStart|cudaProfilerStop)\s*\("
)
_CPP_TIMING = re.compile(r"\b(cudaEventElapsedTime|cudaEventCreate\w*|clock_gettime|gettimeofday|chrono)\b")
_CPP_TRY = re.compile(r"\b(try\s*\{|catch\s*\()")
_CPP_TORCH_CALL = re.compile(r"\b(?:torch|at|c10)::((?:\w+::)*)(\w+)")
_CPP_METHOD = re.compile(r"(?:\.|->)\s*(\w+)\s*\(")
_GLOBAL = re.compile(r"__global__\s+" + KERNEL_ATTRIBUTES + r"void\s+" + KERNEL_ATTRIBUTES + r"(\w+)")
_LAUNCH = re.compile(r"\b(\w+)\s*(?:<[^<>;]*>)?\s*<<<")



def _line(text: str, offset: int) -> int:
    return text.count("\n", 0, offset) + 1


def _sources(ext: InlineExtension) -> Iterator[tuple[str, str]]:
    if ext.cuda_sources:
        yield "cuda", strip_cpp(ext.cuda_sources)
    if ext.cpp_sources:
        yield "cpp", strip_cpp(ext.cpp_sources)


# -- Python rules --------------------------------------------------------------------------


def rule_imports(c: Candidate) -> Iterator[RuleViolation]:
    """Only torch, torch.nn, torch.utils.cpp_extension, math and typing may be imported.

    Why: file and network access, processes, threads, timers and code loading all arrive through
    imports; a kernel needs none of them, and an allowlist cannot be sidestepped by a new name."""
    for node in ast.walk(c.tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = [node.module or ""]
        for name in names:
            if name not in ALLOWED_IMPORTS:
                yield RuleViolation("allowed-imports", f"python:{node.lineno}", f"imports {name!r}; allowed: {sorted(ALLOWED_IMPORTS)}")


def rule_no_try(c: Candidate) -> Iterator[RuleViolation]:
    """No try/except in Python or C++.

    Why: the classic hack wraps the kernel in try and falls back to PyTorch in except, scoring
    as correct while the kernel never works."""
    for node in ast.walk(c.tree):
        if isinstance(node, ast.Try) or type(node).__name__ == "TryStar":
            yield RuleViolation("no-try-except", f"python:{node.lineno}", "try/except is not allowed")
    for ext in c.extensions:
        for kind, code in _sources(ext):
            for m in _CPP_TRY.finditer(code):
                yield RuleViolation("no-try-except", f"{kind}:{_line(code, m.start())}", "C++ try/catch is not allowed")


def rule_no_reference(c: Candidate) -> Iterator[RuleViolation]:
    """No use of the reference `Model`, by name, by subclassing or by import.

    Why: calling or inheriting the reference returns correct outputs without a kernel."""
    for node in ast.walk(c.tree):
        if isinstance(node, ast.Name) and node.id == "Model":
            yield RuleViolation("no-reference-model", f"python:{node.lineno}", "uses the reference class Model")
        if isinstance(node, ast.Attribute) and node.attr == "Model":
            yield RuleViolation("no-reference-model", f"python:{node.lineno}", "uses an attribute named Model")


def rule_no_pass_bodies(c: Candidate) -> Iterator[RuleViolation]:
    """No function or class whose body does nothing (only `pass`, `...` or a docstring).

    Why: an empty forward that inherits behaviour, or a stub that returns None, is not a kernel."""
    for node in ast.walk(c.tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            body = [s for s in node.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
            if all(isinstance(s, ast.Pass) for s in body):
                yield RuleViolation("no-empty-bodies", f"python:{node.lineno}", f"{node.name} has an empty body")


_MODULE_ROOTS = {"torch", "nn", "F", "math", "time", "os", "sys", "builtins", "triton"}


def _root(node: ast.expr) -> str | None:
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def _dotted(node: ast.expr) -> str:
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
    return ".".join(reversed(parts))


def rule_no_patching(c: Candidate) -> Iterator[RuleViolation]:
    """No assignment to attributes of modules (torch.cuda.synchronize = ..., torch.cuda.Event = ...),
    no setattr/delattr, no globals()/vars()/__builtins__, no eval/exec/compile/__import__.

    Why: patching the timer or synchronize makes any kernel look fast; dynamic code hides calls
    from every other rule."""
    for node in ast.walk(c.tree):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        for t in targets:
            if isinstance(t, ast.Attribute) and _root(t) in _MODULE_ROOTS:
                yield RuleViolation("no-patching", f"python:{node.lineno}", f"assigns to {_dotted(t)}")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in (
            "setattr", "delattr", "globals", "vars", "eval", "exec", "compile", "__import__", "open", "getattr", "locals",
        ):
            if node.func.id == "getattr" and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant):
                continue  # getattr(obj, "constant") hides nothing
            yield RuleViolation("no-patching", f"python:{node.lineno}", f"calls {node.func.id}()")
        if isinstance(node, ast.Name) and node.id in ("__builtins__", "__dict__"):
            yield RuleViolation("no-patching", f"python:{node.lineno}", f"touches {node.id}")


def rule_no_streams(c: Candidate) -> Iterator[RuleViolation]:
    """No CUDA streams, threads or processes, in Python or C++.

    Why: work on a side stream or another thread escapes the timer; the judge times with
    device-wide synchronization, and this rule keeps the candidate honest before that."""
    for node in ast.walk(c.tree):
        if isinstance(node, ast.Attribute) and node.attr in ("Stream", "stream", "ExternalStream", "Event", "set_stream", "graph", "CUDAGraph"):
            if _root(node) == "torch":
                yield RuleViolation("no-streams-threads", f"python:{node.lineno}", f"uses {_dotted(node)}")
    for ext in c.extensions:
        for kind, code in _sources(ext):
            for m in _CPP_STREAMS.finditer(code):
                yield RuleViolation("no-streams-threads", f"{kind}:{_line(code, m.start())}", f"uses {m.group(1)}")


def rule_no_system(c: Candidate) -> Iterator[RuleViolation]:
    """No file, network, process or device-management calls in C++ (Python's arrive by import).

    Why: a candidate must not read stored answers, talk to the outside, or change the GPU's
    state (resets, clocks through NVML, device switches) for the judge or anyone after it."""
    for ext in c.extensions:
        for kind, code in _sources(ext):
            for m in _CPP_SYSTEM.finditer(code):
                yield RuleViolation("no-system-access", f"{kind}:{_line(code, m.start())}", f"calls {m.group(1)}()")
            for m in _CPP_TIMING.finditer(code):
                yield RuleViolation("no-timers", f"{kind}:{_line(code, m.start())}", f"uses {m.group(1)}")


def _forward_functions(c: Candidate) -> list[ast.FunctionDef]:
    """forward, and what it reaches: ModelNew methods called as `self.name(...)` and module-level
    functions called by name, followed through each other."""
    cls = c.model_class()
    methods = {n.name: n for n in (cls.body if cls else []) if isinstance(n, ast.FunctionDef)}
    functions = {n.name: n for n in c.tree.body if isinstance(n, ast.FunctionDef)}
    start = methods.get("forward")
    if start is None:
        return []
    seen: dict[int, ast.FunctionDef] = {}
    todo = [start]
    while todo:
        fn = todo.pop()
        if id(fn) in seen:
            continue
        seen[id(fn)] = fn
        for node in ast.walk(fn):
            if not isinstance(node, ast.Call):
                continue
            f = node.func
            if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id == "self" and f.attr in methods:
                todo.append(methods[f.attr])
            elif isinstance(f, ast.Name) and f.id in functions:
                todo.append(functions[f.id])
    return list(seen.values())


def _forward_calls(c: Candidate) -> Iterator[ast.Call]:
    for fn in _forward_functions(c):
        for node in ast.walk(fn):
            if isinstance(node, ast.Call):
                yield node


def _torch_modules_in_init(c: Candidate) -> set[str]:
    """Attributes set in __init__ to torch.nn modules (self.linear = nn.Linear(...))."""
    names: set[str] = set()
    init = c.method("__init__")
    if init is None:
        return names
    for node in ast.walk(init):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
            callee = _dotted(node.value.func)
            if callee.split(".")[0] in ("nn", "torch") and not callee.endswith(("Parameter", "ParameterList", "ParameterDict")):
                for t in node.targets:
                    if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self":
                        names.add(t.attr)
    return names


def _torch_imports(c: Candidate) -> dict[str, str]:
    """Names bound by `from torch... import name [as alias]`: alias -> the torch call it is."""
    names: dict[str, str] = {}
    for node in ast.walk(c.tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "torch":
            for a in node.names:
                if node.module != "torch.utils.cpp_extension":
                    names[a.asname or a.name] = f"{node.module}.{a.name}"
    return names


def _moves_device_only(call: ast.Call) -> bool:
    """`t.to(device)`, `t.to(x.device)`, `t.to("cuda")`, `t.to(device=...)`: a move, no dtype."""
    if any(k.arg in ("dtype", "memory_format") for k in call.keywords):
        return False
    for a in call.args:
        dotted = _dotted(a) if isinstance(a, (ast.Attribute, ast.Name)) else ""
        if isinstance(a, ast.Constant) and isinstance(a.value, str) and a.value.split(":")[0] in ("cuda", "cpu"):
            continue
        if dotted.endswith("device") or (isinstance(a, ast.Call) and _dotted(a.func) in ("torch.device",)):
            continue
        return False
    return True


def rule_no_torch_compute(c: Candidate) -> Iterator[RuleViolation]:
    """The forward path (forward, the ModelNew methods and module functions it calls) may call
    only the extension's functions, allocation (`torch.empty`, `x.new_zeros`...), and view and
    metadata methods (an allowlist: `size`, `stride`, `data_ptr`, `contiguous`, `view`, ...);
    any other tensor method, any torch.*/F.* compute function, torch.ops and torch.nn modules are
    PyTorch compute. In C++ host code, no torch::/at:: compute calls and no tensor method that
    computes.

    Why: a kernel program that hands part of the work to PyTorch measures PyTorch, not the
    kernel; a list of forbidden calls always misses one (`clamp_min`, `expm1`, `sign`...). The
    judge also audits the ops the forward really dispatches at run time."""
    modules = _torch_modules_in_init(c)
    functions = {f for e in c.extensions for f in e.functions}
    imported = _torch_imports(c)
    cls = c.model_class()
    methods = {n.name for n in (cls.body if cls else []) if isinstance(n, ast.FunctionDef)}
    for call in _forward_calls(c):
        name = _dotted(call.func)
        parts = name.split(".")
        where = f"python:{call.lineno}"
        if isinstance(call.func, ast.Name):
            target = imported.get(call.func.id)
            if target is not None and target.split(".")[-1] not in ALLOWED_TORCH_CALLS:
                yield RuleViolation("no-pytorch-compute", where, f"calls {call.func.id} ({target})")
            continue  # builtins, module functions (followed), names bound to extension functions
        if not isinstance(call.func, ast.Attribute):
            continue
        method = call.func.attr
        if method in functions:
            continue  # an extension function, under whatever name the extension is kept
        if parts[0] in ("torch", "F", "nn") and len(parts) >= 2:
            if parts[1] == "ops" or parts[0] in ("F", "nn") or parts[1] in ("nn", "special", "linalg", "fft"):
                yield RuleViolation("no-pytorch-compute", where, f"calls {name}")
            elif parts[-1] not in ALLOWED_TORCH_CALLS and not (len(parts) == 3 and parts[1] == "cuda"):
                yield RuleViolation("no-pytorch-compute", where, f"calls {name}")
            continue
        if parts[0] == "math":
            continue  # Python arithmetic on numbers
        if parts[0] == "self" and len(parts) == 2:
            if parts[1] in modules:
                yield RuleViolation("no-pytorch-compute", where, f"calls the torch.nn module self.{parts[1]}")
            elif parts[1] in methods:
                continue
            continue
        if method in ALLOWED_TENSOR_METHODS or method in _PYTHON_METHODS:
            continue
        if method == "to" and _moves_device_only(call):
            continue
        if method == "type" and not call.args and not call.keywords:
            continue
        yield RuleViolation("no-pytorch-compute", where,
                            f"calls .{method}(): the forward may call only the extension's functions, allocation, "
                            "and view or metadata methods (PyTorch compute otherwise)")
    for ext in c.extensions:
        for kind, code in _sources(ext):
            for m in _CPP_TORCH_CALL.finditer(code):
                name = m.group(2)
                if name in ALLOWED_CPP_TORCH or name.startswith(("k", "AT_", "TORCH_")):
                    continue
                if m.group(1).startswith(("cuda::", "detail::")):
                    continue
                yield RuleViolation("no-pytorch-compute", f"{kind}:{_line(code, m.start())}", f"calls {m.group(0)}")
            for m in _CPP_METHOD.finditer(code):
                if m.group(1) in COMPUTE_METHODS:
                    yield RuleViolation("no-pytorch-compute", f"{kind}:{_line(code, m.start())}", f"calls the tensor method .{m.group(1)}()")


def rule_launches_kernel(c: Candidate) -> Iterator[RuleViolation]:
    """At least one `__global__` kernel, launched by host code, in an extension whose function the
    forward calls.

    Why: without a kernel the forward path can only be PyTorch or a copy of an input."""
    kernels: set[str] = set()
    launched: set[str] = set()
    for ext in c.extensions:
        for _, code in _sources(ext):
            kernels.update(_GLOBAL.findall(code))
            launched.update(_LAUNCH.findall(code))
            launched.update(re.findall(r"cudaLaunch(?:Cooperative)?Kernel\w*\s*\(\s*\(?\s*(?:void\s*\*\s*\)?\s*)?&?\s*(\w+)", code))
    if not kernels:
        yield RuleViolation("launches-a-kernel", "", "defines no __global__ kernel")
        return
    if not kernels & launched:
        yield RuleViolation("launches-a-kernel", "", f"never launches its kernels ({', '.join(sorted(kernels))})")
    functions = {f for e in c.extensions for f in e.functions}
    if c.method("forward") is None:
        yield RuleViolation("launches-a-kernel", "", "ModelNew has no forward")
        return
    # `ext.fn(...)`, `self.ext.fn(...)`, `self.op.fn(...)`: the extension is often kept under
    # another name, so any attribute call of a declared extension function counts (in forward or
    # in the methods and module functions it calls).
    calls = [_dotted(call.func).split(".") for call in _forward_calls(c)]
    if not any(len(p) >= 2 and p[-1] in functions for p in calls):
        yield RuleViolation(
            "launches-a-kernel", "", f"forward never calls an extension function ({', '.join(sorted(functions)) or 'none declared'})"
        )


def rule_has_model_new(c: Candidate) -> Iterator[RuleViolation]:
    """The program defines `class ModelNew`.

    Why: it is what the judge instantiates and runs in place of the reference."""
    if c.model_class() is None:
        yield RuleViolation("defines-modelnew", "", "no class ModelNew")


RULES: tuple[Callable[[Candidate], Iterator[RuleViolation]], ...] = (
    rule_has_model_new,
    rule_imports,
    rule_no_try,
    rule_no_reference,
    rule_no_pass_bodies,
    rule_no_patching,
    rule_no_streams,
    rule_no_system,
    rule_no_torch_compute,
    rule_launches_kernel,
)


def check(candidate: Candidate) -> tuple[RuleViolation, ...]:
    """Every rule the candidate breaks, in rule order (empty when it breaks none)."""
    return tuple(v for rule in RULES for v in rule(candidate))
