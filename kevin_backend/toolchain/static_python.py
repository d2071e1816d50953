"""The static rules on a candidate's Python: what a kernel program may not do, checked on its AST
before anything is built, loaded or run. Each rule is a function with its rationale in its
docstring; each failure is a `RuleViolation` naming the rule and the place (`python:LINE`).

The program is hostile: whatever it can reach through an allowed module (`torch.os`,
`torch.utils.cpp_extension.subprocess`, `torch.sys.modules`), an alias (`c = torch.cuda`) or the
object model (`x.__class__.__subclasses__()`) it can use. So the rules refuse names, not
spellings: an attribute called `os`, `_getframe` or `__globals__` is refused wherever it appears,
attributes are assigned only on `self`, and the top level of a program only defines things.
"""

from __future__ import annotations

import ast
import re
from typing import Iterator

from kevin_backend.toolchain.candidate import Candidate, InlineExtension
from kevin_backend.toolchain.cpp_text import KERNEL_ATTRIBUTES, strip_cpp
from kevin_backend.toolchain.rule_violation import RuleViolation

__all__ = ["ALLOWED_IMPORTS", "ALLOWED_TENSOR_METHODS", "ALLOWED_TORCH_CALLS", "PYTHON_RULES", "TASK_RULES"]

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
    """No try/except in Python (the C++ half of the rule is in static_cpp.py).

    Why: the classic hack wraps the kernel in try and falls back to PyTorch in except, scoring
    as correct while the kernel never works."""
    for node in ast.walk(c.tree):
        if isinstance(node, ast.Try) or type(node).__name__ == "TryStar":
            yield RuleViolation("no-try-except", f"python:{node.lineno}", "try/except is not allowed")


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


# Attribute names that lead out of the program's reach, whatever object they are read from: the
# interpreter (sys, builtins, importlib), the machine (os, subprocess), torch's internals and
# hooks (_C, ops, library, _dynamo, _inductor, overrides, hub, load), frames and code objects,
# and the object model's back doors (__class__, __subclasses__, __globals__, __dict__).
FORBIDDEN_ATTRIBUTES = frozenset("""
sys os subprocess builtins importlib _C _getframe f_back f_globals f_locals f_builtins f_code f_trace gi_frame gi_code
cr_frame ag_frame tb_frame tb_next __globals__ __builtins__ __dict__ __class__ __subclasses__ __bases__ __base__
__mro__ mro __code__ __closure__ __defaults__ __kwdefaults__ __func__ __self__ __wrapped__ __getattribute__ __getattr__
__setattr__ __delattr__ __import__ __loader__ __spec__ __reduce__ __reduce_ex__ __init_subclass__ __traceback__
modules ops library _dynamo _inductor overrides hub load load_library from_file save multiprocessing package
classes CUDAPluggableAllocator change_current_allocator manual_seed manual_seed_all seed seed_all set_rng_state
set_rng_state_all default_generator use_deterministic_algorithms register_module_forward_hook
register_module_forward_pre_hook register_module_full_backward_hook register_module_backward_hook
""".split())
# Names that run code from data, reach the interpreter's namespaces, files or the debugger.
FORBIDDEN_NAMES = frozenset("""
eval exec compile globals locals vars open __import__ breakpoint __builtins__ __build_class__ input
memoryview __loader__ __spec__
""".split())
# Special methods that run code at moments the program does not call (class creation, garbage
# collection, attribute lookups, torch's function and dispatch overrides).
FORBIDDEN_METHODS = frozenset("""
__del__ __init_subclass__ __set_name__ __class_getitem__ __prepare__ __getattr__ __getattribute__ __setattr__
__delattr__ __reduce__ __reduce_ex__ __new__ __instancecheck__ __subclasscheck__ __torch_function__
__torch_dispatch__ __enter__ __exit__ __eq__ __hash__ __index__ __bool__ __float__ __int__
""".split())
# CUDA streams and events, whatever they are reached through
STREAM_ATTRIBUTES = frozenset("""
Stream ExternalStream set_stream StreamContext Event stream streams current_stream default_stream cuda_stream graph
CUDAGraph graphs make_graphed_callables
""".split())
# Keywords of load_inline a program may give, and the compiler flags it may pass.
_LOAD_INLINE_KEYWORDS = frozenset({"name", "cpp_sources", "cuda_sources", "functions", "verbose", "extra_cflags",
                                   "extra_cuda_cflags", "extra_ldflags", "with_cuda", "with_pytorch_error_handling"})
_FLAG = re.compile(
    r"^(?:|-O[0-3s]?|--?use_fast_math|-ffast-math|-lineinfo|-g|-w|-Wall|-Wextra|-Wno-[\w-]+|-std=c\+\+(?:14|17|20)|"
    r"--std=c\+\+(?:14|17|20)|--expt-relaxed-constexpr|--expt-extended-lambda|--extended-lambda|-Xptxas|"
    r"(?:-Xptxas[= ]?)?-?(?:O[0-3]|v|warn-spills|dlcm=c[ag])|--ptxas-options=-?v|--?maxrregcount[= ]?\d+|"
    r"-[DU]__CUDA_NO_\w+|-DNDEBUG|-DUSE_FAST_MATH|-ftz=(?:true|false)|-prec-(?:div|sqrt)=(?:true|false)|"
    r"-fmad=(?:true|false)|--restrict|-res-usage|--resource-usage|-funroll-loops|-march=native|"
    r"-arch=sm_\d+a?|-gencode=arch=compute_\d+a?,code=sm_\d+a?)$"
)
_LDFLAG = re.compile(r"^(?:|-lcuda|-lcudart|-lcublas|-lcublasLt)$")
# Python builtins a top-level statement may call with inert arguments
_INERT_CALLS = frozenset({"int", "float", "str", "tuple", "len", "min", "max", "range", "bool", "list", "dict", "dedent"})
_STRING_METHODS = frozenset({"format", "replace", "join", "strip", "lstrip", "rstrip", "lower", "upper"})


def _imported_names(tree: ast.Module) -> set[str]:
    """Names bound by the program's imports (modules and what was imported from them)."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            names.update(a.asname or a.name for a in node.names)
    return names


def _reach(tree: ast.Module, allowed: frozenset[str] = frozenset()) -> Iterator[RuleViolation]:
    imported = _imported_names(tree)
    for node in ast.walk(tree):
        where = f"python:{getattr(node, 'lineno', 0)}"
        if isinstance(node, ast.Attribute):
            if node.attr in FORBIDDEN_ATTRIBUTES - allowed:
                yield RuleViolation("no-runtime-reach", where, f"reads the attribute {node.attr!r} ({_dotted(node)})")
            elif node.attr.startswith("_") and not node.attr.startswith("__") and _root(node) in imported:
                yield RuleViolation("no-runtime-reach", where, f"reads the private attribute {_dotted(node)}")
        elif isinstance(node, ast.ImportFrom):
            for a in node.names:
                if a.name in FORBIDDEN_ATTRIBUTES - allowed or (a.name.startswith("_") and node.module != "__future__"):
                    yield RuleViolation("no-runtime-reach", where, f"imports {a.name!r} from {node.module}")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in ("__dict__", "__class__"):
            yield RuleViolation("no-runtime-reach", where, f"names {node.value!r}")


def rule_no_runtime_reach(c: Candidate) -> Iterator[RuleViolation]:
    """No attribute named `sys`, `os`, `subprocess`, `builtins`, `importlib`, `_C`, `_getframe`,
    `f_back`, `f_globals`, `gi_frame`, `tb_frame`, `__globals__`, `__builtins__`, `__dict__`,
    `__class__`, `__subclasses__`, `__bases__`, `__mro__`, `__code__`, `__getattribute__`,
    `__import__`, `__loader__`, `__spec__`, `modules`, `ops`, `library`, `_dynamo`, `_inductor`
    (and torch's hooks, seeds and loaders: `overrides`, `hub`, `load`, `manual_seed`...), read from
    anything, nor a private attribute of an imported module; nothing of the kind imported by name.

    Why: allowed modules lead everywhere (`torch.os.system`, `torch.sys._getframe`,
    `torch.utils.cpp_extension.subprocess.run`, `x.__class__.__subclasses__()`), and an alias
    (`c = torch.utils.cpp_extension`) hides the root; the attribute's own name does not."""
    yield from _reach(c.tree)


def rule_task_no_runtime_reach(c: Candidate) -> Iterator[RuleViolation]:
    """`rule_no_runtime_reach` for a task program, which calls its ops as `torch.ops.aten.*`."""
    yield from _reach(c.tree, frozenset({"ops"}))


def rule_no_dynamic_code(c: Candidate) -> Iterator[RuleViolation]:
    """No `eval`, `exec`, `compile`, `globals`, `locals`, `vars`, `open`, `__import__`,
    `breakpoint` (named at all, not only called), and `getattr` only with a literal public name.

    Why: code built from strings, and attributes named by strings, hide every call from the other
    rules; the namespaces and files they reach are the judge's."""
    for node in ast.walk(c.tree):
        if isinstance(node, ast.Name) and node.id in FORBIDDEN_NAMES:
            yield RuleViolation("no-dynamic-code", f"python:{node.lineno}", f"uses {node.id}")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr":
            name = node.args[1] if len(node.args) >= 2 else None
            if not (isinstance(name, ast.Constant) and isinstance(name.value, str)) or name.value.startswith("_"):
                yield RuleViolation("no-dynamic-code", f"python:{node.lineno}",
                                    "calls getattr() with a name that is not a literal public attribute")


def _methods(tree: ast.Module) -> dict[int, ast.FunctionDef]:
    """Every node inside a method whose first parameter is `self`, mapped to that method."""
    inside: dict[int, ast.FunctionDef] = {}
    for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
        for fn in cls.body:
            if isinstance(fn, ast.FunctionDef) and fn.args.args and fn.args.args[0].arg == "self":
                for node in ast.walk(fn):
                    inside[id(node)] = fn
    return inside


def rule_no_patching(c: Candidate) -> Iterator[RuleViolation]:
    """No assignment or deletion of an attribute of anything but `self` (`self.name = ...` in a
    method), no `setattr` or `delattr` (named at all), no item assignment into an imported module, `self` never rebound, and no method
    called through its class (`Cls.method(torch.cuda)`, `type(self).method(...)`).

    Why: patching the comparison, the timer, `torch.cuda.synchronize` or an op makes any kernel
    look right or fast, and outlives the candidate in the process. An alias (`F2 =
    torch.nn.functional; F2.relu = ...`, `c = torch.cuda; c.synchronize = ...`) hides the root,
    so only `self` may have attributes set."""
    methods = _methods(c.tree)
    imported = _imported_names(c.tree)
    classes = {n.name: {f.name for f in n.body if isinstance(f, ast.FunctionDef)} for n in ast.walk(c.tree)
               if isinstance(n, ast.ClassDef)}
    for node in ast.walk(c.tree):
        where = f"python:{getattr(node, 'lineno', 0)}"
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, (ast.Store, ast.Del)):
            on_self = isinstance(node.value, ast.Name) and node.value.id == "self" and id(node) in methods
            if not on_self:
                yield RuleViolation("no-patching", where, f"assigns to {_dotted(node)}")
        elif isinstance(node, ast.Subscript) and isinstance(node.ctx, (ast.Store, ast.Del)) and _root(node) in imported:
            yield RuleViolation("no-patching", where, f"assigns into {_dotted(node.value)}")
        elif isinstance(node, ast.Name) and node.id in ("setattr", "delattr"):
            yield RuleViolation("no-patching", where, f"uses {node.id}")
        elif isinstance(node, ast.Name) and node.id == "self" and isinstance(node.ctx, (ast.Store, ast.Del)):
            yield RuleViolation("no-patching", where, "rebinds self")
        elif isinstance(node, ast.arg) and node.arg == "self" and not any(
            fn.args.args and fn.args.args[0] is node for fn in set(methods.values())
        ):
            yield RuleViolation("no-patching", where, "names a parameter self outside a method's first place")
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.attr in classes.get(node.value.id, ()):
            yield RuleViolation("no-patching", where, f"calls the method {_dotted(node)} through its class")
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Call) and _dotted(node.value.func) == "type":
            yield RuleViolation("no-patching", where, f"reads .{node.attr} of type(...)")


def rule_no_streams(c: Candidate) -> Iterator[RuleViolation]:
    """No CUDA streams, events or graphs in Python, through any alias (`_c = torch.cuda;
    _c.Stream()`, `from torch.cuda import Stream`, a current stream's handle passed on).

    Why: work on a side stream escapes the timer, and events are a timer of the program's own
    (the C++ half of the rule is in static_cpp.py)."""
    for node in ast.walk(c.tree):
        if isinstance(node, ast.Attribute) and node.attr in STREAM_ATTRIBUTES:
            yield RuleViolation("no-streams-threads", f"python:{node.lineno}", f"uses {_dotted(node)}")
        elif isinstance(node, ast.ImportFrom):
            for a in node.names:
                if a.name in STREAM_ATTRIBUTES:
                    yield RuleViolation("no-streams-threads", f"python:{node.lineno}", f"imports {a.name} from {node.module}")


def _inert(node: ast.expr | None) -> bool:
    """An expression that runs nothing when evaluated: constants, names, attributes of names,
    containers, arithmetic and subscripts of these, f-strings of these, lambdas (not called)."""
    if node is None:
        return True
    if isinstance(node, (ast.Constant, ast.Name, ast.Lambda)):
        return True
    if isinstance(node, ast.Attribute):
        return _inert(node.value)
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return all(_inert(e) for e in node.elts)
    if isinstance(node, ast.Dict):
        return all(_inert(k) and _inert(v) for k, v in zip(node.keys, node.values))
    if isinstance(node, ast.BinOp):
        return _inert(node.left) and _inert(node.right)
    if isinstance(node, ast.UnaryOp):
        return _inert(node.operand)
    if isinstance(node, ast.Subscript):
        return _inert(node.value) and _inert(node.slice)
    if isinstance(node, (ast.JoinedStr, ast.FormattedValue)):
        return all(_inert(v) for v in ast.iter_child_nodes(node) if isinstance(v, ast.expr))
    if isinstance(node, ast.Starred):
        return _inert(node.value)
    if isinstance(node, ast.Call):
        f = node.func
        pure = (isinstance(f, ast.Name) and f.id in _INERT_CALLS) or (
            isinstance(f, ast.Attribute) and f.attr in _STRING_METHODS and isinstance(f.value, (ast.Constant, ast.Name)))
        return pure and all(_inert(a) for a in node.args) and all(_inert(k.value) for k in node.keywords)
    return False


def _is_load_inline(node: ast.expr | None) -> bool:
    return isinstance(node, ast.Call) and _dotted(node.func).split(".")[-1] == "load_inline" and all(
        _inert(a) for a in node.args) and all(_inert(k.value) for k in node.keywords)


def _definition_problems(node: ast.FunctionDef | ast.ClassDef) -> Iterator[str]:
    """What runs when a `def` or `class` statement runs: decorators, defaults, annotations,
    base classes, class keywords, the class body."""
    for d in node.decorator_list:
        if not _inert(d) and not (isinstance(d, ast.Call) and _inert(d.func) and not d.args and not d.keywords):
            yield f"decorator of {node.name} runs code"
    if isinstance(node, ast.FunctionDef):
        args = node.args
        for default in [*args.defaults, *args.kw_defaults]:
            if not _inert(default):
                yield f"a default of {node.name} runs code"
        if node.name in FORBIDDEN_METHODS:
            yield f"defines {node.name}, which runs at moments the program does not call"
        return
    if node.keywords:
        yield f"class {node.name} takes keywords (a metaclass runs code)"
    for base in node.bases:
        if not _inert(base):
            yield f"a base of {node.name} runs code"
    for stmt in node.body:
        if isinstance(stmt, (ast.FunctionDef, ast.ClassDef)):
            yield from _definition_problems(stmt)
        elif not _inert_statement(stmt):
            yield f"class {node.name}'s body runs code (line {stmt.lineno})"


def _inert_statement(stmt: ast.stmt) -> bool:
    if isinstance(stmt, (ast.Import, ast.ImportFrom, ast.Pass)):
        return True
    if isinstance(stmt, ast.Expr):
        return isinstance(stmt.value, ast.Constant)
    if isinstance(stmt, ast.Assign):
        return all(isinstance(t, (ast.Name, ast.Tuple)) for t in stmt.targets) and (
            _inert(stmt.value) or _is_load_inline(stmt.value))
    if isinstance(stmt, ast.AnnAssign):
        return isinstance(stmt.target, ast.Name) and (_inert(stmt.value) or _is_load_inline(stmt.value))
    return False


def rule_inert_top_level(c: Candidate) -> Iterator[RuleViolation]:
    """The top level only defines: imports, functions, classes, names bound to constants,
    strings, tuples or to a `load_inline(...)` call; class bodies likewise; decorators, defaults
    and base classes run nothing; no special method that runs unbidden (`__del__`,
    `__init_subclass__`, `__torch_function__`...).

    Why: whatever runs when the program is loaded runs before any check of the judge's, in the
    process that loads it (the judge's worker, the compiled model's process for a cached kernel);
    a kernel program needs nothing to run then but the build of its extension."""
    for stmt in c.tree.body:
        if isinstance(stmt, (ast.FunctionDef, ast.ClassDef)):
            for problem in _definition_problems(stmt):
                yield RuleViolation("inert-top-level", f"python:{stmt.lineno}", problem)
        elif not _inert_statement(stmt):
            yield RuleViolation("inert-top-level", f"python:{stmt.lineno}",
                                f"the top level runs code ({type(stmt).__name__}); only imports, definitions, "
                                "constants and load_inline(...) may be there")


def rule_allowed_build_flags(c: Candidate) -> Iterator[RuleViolation]:
    """`load_inline` takes only its usual keywords (no build folder, include paths, or other
    loaders), and compiler flags from an allowlist (optimisation, fast math, language standard,
    ptxas options, `__CUDA_NO_*` macros).

    Why: a flag can force-include a header (`-include unistd.h`), define a macro the C++ rules
    never saw (`-Dk=system`), or point the build at other files."""
    for node in ast.walk(c.tree):
        if not (isinstance(node, ast.Call) and _dotted(node.func).split(".")[-1] == "load_inline"):
            continue
        for k in node.keywords:
            if k.arg not in _LOAD_INLINE_KEYWORDS:
                yield RuleViolation("allowed-build-flags", f"python:{node.lineno}", f"load_inline takes {k.arg}=")
    for ext in c.extensions:
        for flag in (*ext.extra_cflags, *ext.extra_cuda_cflags):
            if not _FLAG.match(flag.strip()):
                yield RuleViolation("allowed-build-flags", f"python:{ext.line}", f"compiler flag {flag!r} is not allowed")
        for flag in ext.extra_ldflags:
            if not _LDFLAG.match(flag.strip()):
                yield RuleViolation("allowed-build-flags", f"python:{ext.line}", f"linker flag {flag!r} is not allowed")


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


# The rules on a candidate's Python, in the order their violations are reported.
PYTHON_RULES = (
    rule_has_model_new,
    rule_imports,
    rule_inert_top_level,
    rule_no_runtime_reach,
    rule_no_dynamic_code,
    rule_no_try,
    rule_no_reference,
    rule_no_pass_bodies,
    rule_no_patching,
    rule_no_streams,
    rule_allowed_build_flags,
    rule_no_torch_compute,
    rule_no_host_sync,
    rule_launches_kernel,
)

# The rules a task program (a cached entry's reference) passes before it is loaded: it computes
# with torch, so only the rules that keep it from reaching the process apply.
TASK_RULES = (
    rule_imports,
    rule_inert_top_level,
    rule_task_no_runtime_reach,
    rule_no_dynamic_code,
    rule_no_patching,
    rule_no_streams,
)
