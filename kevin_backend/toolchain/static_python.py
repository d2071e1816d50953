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

from kevin_backend.toolchain.candidate import Candidate
from kevin_backend.toolchain.rule_violation import RuleViolation
from kevin_backend.toolchain.static_forward import (
    dotted_name, root_name, rule_has_model_new, rule_launches_kernel, rule_no_host_sync, rule_no_pass_bodies,
    rule_no_reference, rule_no_torch_compute,
)

__all__ = ["ALLOWED_IMPORTS", "FORBIDDEN_ATTRIBUTES", "FORBIDDEN_NAMES", "PYTHON_RULES", "TASK_RULES"]

# Modules a candidate may import. Files, network, processes, threads, timers and code loading all
# arrive through imports; a KernelBench candidate needs none of them.
ALLOWED_IMPORTS = frozenset(
    {"torch", "torch.nn", "torch.nn.functional", "torch.utils.cpp_extension", "math", "typing", "__future__"}
)

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
compile distributed DataLoader profiler benchmark reset_peak_memory_stats reset_accumulated_memory_stats
""".split())
# torch's process-wide switches (`torch.set_default_dtype`, `torch.cuda.set_device`,
# `torch.set_flush_denormal`...): a program changes nothing for the judge or the next program
_SETTER = re.compile(r"^set_\w+$")
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
# Decorators a definition may call (with no arguments) when it runs
_DECORATOR_CALLS = frozenset({"no_grad", "inference_mode", "enable_grad"})


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
                yield RuleViolation("no-runtime-reach", where, f"reads the attribute {node.attr!r} ({dotted_name(node)})")
            elif _SETTER.match(node.attr) and root_name(node) in imported:
                yield RuleViolation("no-runtime-reach", where, f"changes process-wide state ({dotted_name(node)})")
            elif node.attr.startswith("_") and not node.attr.startswith("__") and root_name(node) in imported:
                yield RuleViolation("no-runtime-reach", where, f"reads the private attribute {dotted_name(node)}")
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
    (and torch's hooks, seeds, loaders, compilers and switches: `overrides`, `hub`, `load`,
    `manual_seed`, `compile`, `set_*`...), read from anything, nor a private attribute of an
    imported module; nothing of the kind imported by name.

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
                yield RuleViolation("no-patching", where, f"assigns to {dotted_name(node)}")
        elif isinstance(node, ast.Subscript) and isinstance(node.ctx, (ast.Store, ast.Del)) and root_name(node) in imported:
            yield RuleViolation("no-patching", where, f"assigns into {dotted_name(node.value)}")
        elif isinstance(node, ast.Name) and node.id in ("setattr", "delattr"):
            yield RuleViolation("no-patching", where, f"uses {node.id}")
        elif isinstance(node, ast.Name) and node.id == "self" and isinstance(node.ctx, (ast.Store, ast.Del)):
            yield RuleViolation("no-patching", where, "rebinds self")
        elif isinstance(node, ast.arg) and node.arg == "self" and not any(
            fn.args.args and fn.args.args[0] is node for fn in set(methods.values())
        ):
            yield RuleViolation("no-patching", where, "names a parameter self outside a method's first place")
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.attr in classes.get(node.value.id, ()):
            yield RuleViolation("no-patching", where, f"calls the method {dotted_name(node)} through its class")
        elif (isinstance(node, ast.Call) and dotted_name(node.func) == "getattr" and len(node.args) >= 2
              and isinstance(node.args[0], ast.Name) and isinstance(node.args[1], ast.Constant)
              and node.args[1].value in classes.get(node.args[0].id, ())):
            yield RuleViolation("no-patching", where, f"takes the method {node.args[1].value} through its class")
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Call) and dotted_name(node.value.func) == "type":
            yield RuleViolation("no-patching", where, f"reads .{node.attr} of type(...)")


def rule_no_streams(c: Candidate) -> Iterator[RuleViolation]:
    """No CUDA streams, events or graphs in Python, through any alias (`_c = torch.cuda;
    _c.Stream()`, `from torch.cuda import Stream`, a current stream's handle passed on).

    Why: work on a side stream escapes the timer, and events are a timer of the program's own
    (the C++ half of the rule is in static_cpp.py)."""
    for node in ast.walk(c.tree):
        if isinstance(node, ast.Attribute) and node.attr in STREAM_ATTRIBUTES:
            yield RuleViolation("no-streams-threads", f"python:{node.lineno}", f"uses {dotted_name(node)}")
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
    return isinstance(node, ast.Call) and dotted_name(node.func).split(".")[-1] == "load_inline" and all(
        _inert(a) for a in node.args) and all(_inert(k.value) for k in node.keywords)


def _definition_problems(node: ast.FunctionDef | ast.ClassDef) -> Iterator[str]:
    """What runs when a `def` or `class` statement runs: decorators, defaults, annotations,
    base classes, class keywords, the class body."""
    for d in node.decorator_list:
        called = isinstance(d, ast.Call) and dotted_name(d.func).split(".")[-1] in _DECORATOR_CALLS
        if not _inert(d) and not (called and not d.args and not d.keywords):  # type: ignore[union-attr]
            yield f"decorator of {node.name} runs code"
    if isinstance(node, ast.FunctionDef):
        args = node.args
        for default in [*args.defaults, *args.kw_defaults]:
            if not _inert(default):
                yield f"a default of {node.name} runs code"
        every = [*args.posonlyargs, *args.args, *args.kwonlyargs, *(a for a in (args.vararg, args.kwarg) if a)]
        if not all(_inert(a.annotation) for a in every) or not _inert(node.returns):
            yield f"an annotation of {node.name} runs code"
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


def _main_guard(stmt: ast.stmt) -> bool:
    """`if __name__ == "__main__":`, which never runs when the program is loaded as a module."""
    return (isinstance(stmt, ast.If) and isinstance(stmt.test, ast.Compare) and isinstance(stmt.test.left, ast.Name)
            and stmt.test.left.id == "__name__" and len(stmt.test.ops) == 1 and isinstance(stmt.test.ops[0], ast.Eq)
            and isinstance(stmt.test.comparators[0], ast.Constant) and stmt.test.comparators[0].value == "__main__"
            and not stmt.orelse)


def _inert_statement(stmt: ast.stmt) -> bool:
    if isinstance(stmt, (ast.Import, ast.ImportFrom, ast.Pass)):
        return True
    if isinstance(stmt, ast.Expr):
        return isinstance(stmt.value, ast.Constant)
    if isinstance(stmt, ast.Assign):
        return all(isinstance(t, (ast.Name, ast.Tuple)) for t in stmt.targets) and (
            _inert(stmt.value) or _is_load_inline(stmt.value))
    if isinstance(stmt, ast.AnnAssign):
        return isinstance(stmt.target, ast.Name) and _inert(stmt.annotation) and (
            _inert(stmt.value) or _is_load_inline(stmt.value))
    return False


def rule_inert_top_level(c: Candidate) -> Iterator[RuleViolation]:
    """The top level only defines: imports, functions, classes, names bound to constants,
    strings, tuples or to a `load_inline(...)` call (and an `if __name__ == "__main__":` block,
    which a loaded module never runs); class bodies likewise; decorators, defaults
    and base classes run nothing; no special method that runs unbidden (`__del__`,
    `__init_subclass__`, `__torch_function__`...).

    Why: whatever runs when the program is loaded runs before any check of the judge's, in the
    process that loads it (the judge's worker, the compiled model's process for a cached kernel);
    a kernel program needs nothing to run then but the build of its extension."""
    for stmt in c.tree.body:
        if _main_guard(stmt):
            continue
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
    never saw (`-Dk=system`), or point the build at other files; the extension's name becomes a
    module name and a macro (an identifier, nothing else)."""
    for node in ast.walk(c.tree):
        if not (isinstance(node, ast.Call) and dotted_name(node.func).split(".")[-1] == "load_inline"):
            continue
        for k in node.keywords:
            if k.arg not in _LOAD_INLINE_KEYWORDS:
                yield RuleViolation("allowed-build-flags", f"python:{node.lineno}", f"load_inline takes {k.arg}=")
    for ext in c.extensions:
        if not re.match(r"^[A-Za-z_]\w{0,99}$", ext.name):
            yield RuleViolation("allowed-build-flags", f"python:{ext.line}", f"extension name {ext.name!r} is not an identifier")
        for flag in (*ext.extra_cflags, *ext.extra_cuda_cflags):
            if not _FLAG.match(flag.strip()):
                yield RuleViolation("allowed-build-flags", f"python:{ext.line}", f"compiler flag {flag!r} is not allowed")
        for flag in ext.extra_ldflags:
            if not _LDFLAG.match(flag.strip()):
                yield RuleViolation("allowed-build-flags", f"python:{ext.line}", f"linker flag {flag!r} is not allowed")


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
