"""The static rules on the forward path of a candidate's Python: the work is the kernel's. The
forward (and the ModelNew methods and module functions it calls) may call the extension's
functions, allocation, views and metadata, nothing that computes with PyTorch or copies to the
host; the program defines ModelNew, launches a kernel, and leaves the reference alone. Each rule is
a function with its rationale in its docstring (the rules that keep a program out of the process
that loads it are in static_python.py)."""

from __future__ import annotations

import ast
import re
from typing import Iterator

from kevin_backend.toolchain.candidate import Candidate, InlineExtension
from kevin_backend.toolchain.cpp_text import KERNEL_ATTRIBUTES, strip_cpp
from kevin_backend.toolchain.rule_violation import RuleViolation

__all__ = ["ALLOWED_TENSOR_METHODS", "ALLOWED_TORCH_CALLS", "dotted_name", "root_name", "rule_has_model_new",
           "rule_launches_kernel", "rule_no_host_sync", "rule_no_pass_bodies", "rule_no_reference", "rule_no_torch_compute"]

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
_GLOBAL = re.compile(r"__global__\s+" + KERNEL_ATTRIBUTES + r"void\s+" + KERNEL_ATTRIBUTES + r"(\w+)")
_LAUNCH = re.compile(r"\b(\w+)\s*(?:<[^<>;]*>)?\s*<<<")
_CUTLASS_OPERATOR = re.compile(r"\bcutlass::(?:gemm|conv)::device::(\w+)")  # a device-level operator: its kernel is CUTLASS's
# such an operator run: `.run(`, or called with its arguments (`op(args, workspace, stream)`; not its queries)
_CUTLASS_RUN = re.compile(r"\.\s*run\s*\(|\b(?!can_implement\b|initialize\b|get_workspace_size\b)\w+\s*\(\s*args\s*[,)]")

def _line(text: str, offset: int) -> int:
    return text.count("\n", 0, offset) + 1


def _sources(ext: InlineExtension) -> Iterator[tuple[str, str]]:
    if ext.cuda_sources:
        yield "cuda", strip_cpp(ext.cuda_sources)
    if ext.cpp_sources:
        yield "cpp", strip_cpp(ext.cpp_sources)


def root_name(node: ast.expr) -> str | None:
    """The name an attribute or subscript chain starts from (`torch` of `torch.cuda.Event`)."""
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def dotted_name(node: ast.expr) -> str:
    """An attribute chain as text (`torch.cuda.Event`)."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
    return ".".join(reversed(parts))


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
            callee = dotted_name(node.value.func)
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
        dotted = dotted_name(a) if isinstance(a, (ast.Attribute, ast.Name)) else ""
        if isinstance(a, ast.Constant) and isinstance(a.value, str) and a.value.split(":")[0] in ("cuda", "cpu"):
            continue
        if dotted.endswith("device") or (isinstance(a, ast.Call) and dotted_name(a.func) in ("torch.device",)):
            continue
        return False
    return True


def rule_no_host_sync(c: Candidate) -> Iterator[RuleViolation]:
    """The forward path calls no `.item()`, `.tolist()`, `.cpu()`, `.numpy()` or `.to("cpu")`.

    Why: a copy to the host synchronizes with the GPU and breaks CUDA-graph capture of the model
    the kernel is kept for (the C++ half of the rule is in static_cpp.py)."""
    for call in _forward_calls(c):
        if not isinstance(call.func, ast.Attribute):
            continue
        method = call.func.attr
        to_cpu = method == "to" and any(
            (isinstance(a, ast.Constant) and a.value == "cpu") or (isinstance(a, ast.Call) and a.args and
                                                                  isinstance(a.args[0], ast.Constant) and a.args[0].value == "cpu")
            for a in [*call.args, *(k.value for k in call.keywords)])
        if method in ("item", "tolist", "cpu", "numpy") or to_cpu:
            yield RuleViolation("no-host-sync", f"python:{call.lineno}", f"calls .{method}(), a copy to the host in forward")
def rule_no_torch_compute(c: Candidate) -> Iterator[RuleViolation]:
    """The forward path (forward, the ModelNew methods and module functions it calls) may call
    only the extension's functions, allocation (`torch.empty`, `x.new_zeros`...), and view and
    metadata methods (an allowlist: `size`, `stride`, `data_ptr`, `contiguous`, `view`, ...);
    any other tensor method, any torch.*/F.* compute function, torch.ops and torch.nn modules are
    PyTorch compute (the C++ half of the rule is in static_cpp.py).

    Why: a kernel program that hands part of the work to PyTorch measures PyTorch, not the
    kernel; a list of forbidden calls always misses one (`clamp_min`, `expm1`, `sign`...). The
    judge also audits the ops the forward really dispatches at run time."""
    modules = _torch_modules_in_init(c)
    functions = {f for e in c.extensions for f in e.functions}
    imported = _torch_imports(c)
    cls = c.model_class()
    methods = {n.name for n in (cls.body if cls else []) if isinstance(n, ast.FunctionDef)}
    for call in _forward_calls(c):
        name = dotted_name(call.func)
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


def rule_launches_kernel(c: Candidate) -> Iterator[RuleViolation]:
    """At least one `__global__` kernel, launched by host code, in an extension whose function the
    forward calls. A CUTLASS device-level operator (`cutlass::gemm::device::GemmUniversalAdapter`,
    `cutlass::conv::device::...`) that the host code runs (`.run(`, or called with its arguments)
    is a kernel defined and launched: its `__global__` lives in CUTLASS's headers.

    Why: without a kernel the forward path can only be PyTorch or a copy of an input."""
    kernels: set[str] = set()
    launched: set[str] = set()
    for ext in c.extensions:
        for _, code in _sources(ext):
            kernels.update(_GLOBAL.findall(code))
            launched.update(_LAUNCH.findall(code))
            launched.update(re.findall(r"cudaLaunch(?:Cooperative)?Kernel\w*\s*\(\s*\(?\s*(?:void\s*\*\s*\)?\s*)?&?\s*(\w+)", code))
            operators = {f"cutlass {name}" for name in _CUTLASS_OPERATOR.findall(code)}
            kernels.update(operators)
            if _CUTLASS_RUN.search(code):
                launched.update(operators)
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
    calls = [dotted_name(call.func).split(".") for call in _forward_calls(c)]
    if not any(len(p) >= 2 and p[-1] in functions for p in calls):
        yield RuleViolation(
            "launches-a-kernel", "", f"forward never calls an extension function ({', '.join(sorted(functions)) or 'none declared'})"
        )


def rule_has_model_new(c: Candidate) -> Iterator[RuleViolation]:
    """The program defines `class ModelNew`.

    Why: it is what the judge instantiates and runs in place of the reference."""
    if c.model_class() is None:
        yield RuleViolation("defines-modelnew", "", "no class ModelNew")


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

