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
from typing import Callable, Iterator

from kevin_backend.judge.candidate import Candidate, InlineExtension
from kevin_backend.judge.result import RuleViolation

__all__ = ["RULES", "check", "strip_cpp"]

# Modules a candidate may import. Files, network, processes, threads, timers and code loading all
# arrive through imports; a KernelBench candidate needs none of them.
ALLOWED_IMPORTS = frozenset(
    {"torch", "torch.nn", "torch.nn.functional", "torch.utils.cpp_extension", "math", "typing", "__future__"}
)

# Calls on `torch.` / `F.` allowed in forward: allocation, shape and view, nothing that computes.
ALLOWED_TORCH_CALLS = frozenset(
    {
        "empty", "empty_like", "empty_strided", "zeros", "zeros_like", "ones", "ones_like", "full",
        "full_like", "tensor", "as_strided", "device", "Size", "is_tensor", "numel",
    }
)

# Tensor methods allowed in forward: metadata, views, layout, pointers.
ALLOWED_TENSOR_METHODS = frozenset(
    {
        "size", "dim", "numel", "stride", "storage_offset", "element_size", "data_ptr", "is_contiguous",
        "contiguous", "view", "view_as", "reshape", "reshape_as", "permute", "transpose", "t", "unsqueeze",
        "squeeze", "flatten", "unflatten", "expand", "expand_as", "narrow", "select", "unbind", "split",
        "chunk", "get_device", "new_empty", "new_zeros", "new_ones", "new_full", "cuda", "is_cuda",
        "requires_grad_", "detach", "item", "tolist", "dtype", "device", "__len__",
    }
)

# Tensor methods that compute (a sample of the common ones; anything on torch.* is caught above).
COMPUTE_METHODS = frozenset(
    {
        "add", "sub", "mul", "div", "matmul", "mm", "bmm", "addmm", "sum", "mean", "max", "min", "amax", "amin",
        "softmax", "log_softmax", "relu", "gelu", "sigmoid", "tanh", "exp", "log", "sqrt", "rsqrt", "pow",
        "abs", "neg", "clamp", "clip", "where", "masked_fill", "var", "std", "norm", "cumsum", "prod",
        "argmax", "argmin", "sort", "topk", "conv2d", "copy_", "fill_", "add_", "mul_", "div_", "sub_",
        "clamp_", "relu_", "zero_", "float", "half", "bfloat16", "double", "to", "type_as", "lerp",
        "addcmul", "addcdiv", "baddbmm", "einsum", "logsumexp", "erf", "sin", "cos", "square", "reciprocal",
        "index_select", "gather", "scatter", "scatter_add", "masked_select", "repeat", "tile", "flip", "roll",
        "tril", "triu", "outer", "dot", "mv", "linear", "layer_norm", "batch_norm", "dropout", "clone",
    }
)

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
_GLOBAL = re.compile(r"__global__\s+(?:__launch_bounds__\s*\([^)]*\)\s*)?void\s+(?:__launch_bounds__\s*\([^)]*\)\s*)?(\w+)")
_LAUNCH = re.compile(r"\b(\w+)\s*(?:<[^<>;]*>)?\s*<<<")


def strip_cpp(code: str) -> str:
    """C++ with comments and string/char literal contents blanked: same length, same offsets,
    so positions found in it hold in the original."""
    out = list(code)
    n = len(code)

    def clear(a: int, b: int) -> None:
        for k in range(a, min(b, n)):
            if out[k] != "\n":
                out[k] = " "

    i = 0
    while i < n:
        if code.startswith("//", i):
            j = code.find("\n", i)
            j = n if j < 0 else j
            clear(i, j)
            i = j
        elif code.startswith("/*", i):
            j = code.find("*/", i + 2)
            j = n if j < 0 else j + 2
            clear(i, j)
            i = j
        elif code[i] in "\"'":
            quote, j = code[i], i + 1
            while j < n and code[j] != quote and code[j] != "\n":
                j += 2 if code[j] == "\\" else 1
            clear(i + 1, j)
            i = j + 1
        else:
            i += 1
    return "".join(out)


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


def _forward_calls(c: Candidate) -> Iterator[ast.Call]:
    forward = c.method("forward")
    if forward is None:
        return
    for node in ast.walk(forward):
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


def rule_no_torch_compute(c: Candidate) -> Iterator[RuleViolation]:
    """No PyTorch compute in the forward path: no torch.*/F.* compute functions, no torch.ops, no
    torch.nn modules, no computing tensor methods; in C++ host code, no torch::/at:: compute calls
    and no computing tensor methods. Allocation, shape and view operations are allowed.

    Why: a kernel program that hands the work to PyTorch measures PyTorch, not the kernel. (The
    judge also audits the ops the forward really dispatches at run time.)"""
    modules = _torch_modules_in_init(c)
    for call in _forward_calls(c):
        name = _dotted(call.func)
        parts = name.split(".")
        where = f"python:{call.lineno}"
        if parts[0] in ("torch", "F") and len(parts) >= 2:
            if parts[1] == "ops" or (parts[0] == "torch" and parts[1] in ("nn", "special", "linalg", "fft")):
                yield RuleViolation("no-pytorch-compute", where, f"calls {name}")
            elif parts[-1] not in ALLOWED_TORCH_CALLS and not (len(parts) == 3 and parts[1] == "cuda"):
                yield RuleViolation("no-pytorch-compute", where, f"calls {name}")
        elif parts[0] == "self" and len(parts) == 2 and parts[1] in modules:
            yield RuleViolation("no-pytorch-compute", where, f"calls the torch.nn module self.{parts[1]}")
        elif isinstance(call.func, ast.Attribute) and call.func.attr in COMPUTE_METHODS:
            yield RuleViolation("no-pytorch-compute", where, f"calls the tensor method .{call.func.attr}()")
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
                if m.group(1) in COMPUTE_METHODS and m.group(1) not in ("to", "float", "half", "double"):
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
    # another name, so any attribute call of a declared extension function counts.
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
