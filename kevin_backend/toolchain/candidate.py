"""A candidate kernel program in the KernelBench format, parsed without running it.

    import torch
    import torch.nn as nn
    from torch.utils.cpp_extension import load_inline

    cuda_source = "...__global__ void k(...) {...} torch::Tensor f(torch::Tensor x) {...}"
    cpp_source = "torch::Tensor f(torch::Tensor x);"
    ext = load_inline(name="f", cpp_sources=cpp_source, cuda_sources=cuda_source, functions=["f"])

    class ModelNew(nn.Module):
        def forward(self, x):
            return ext.f(x)

`Candidate.parse` finds every `load_inline` call and resolves its sources to text (string
constants, names bound to them at module level, concatenations, lists), so the static rules can
read the C++ and CUDA code and the builder can compile it.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

__all__ = ["CandidateError", "InlineExtension", "Candidate"]


class CandidateError(ValueError):
    """The candidate cannot be read: the message says why (fed back to the writer as is)."""


@dataclass(frozen=True)
class InlineExtension:
    """One `load_inline(...)` call of a candidate, with its sources as text."""

    name: str
    cpp_sources: str
    cuda_sources: str
    functions: tuple[str, ...]
    line: int  # line of the call in the Python source
    bound_to: str | None  # the name the module is assigned to (`ext` in `ext = load_inline(...)`)
    extra_cuda_cflags: tuple[str, ...] = ()
    extra_cflags: tuple[str, ...] = ()
    extra_ldflags: tuple[str, ...] = ()


@dataclass(frozen=True)
class Candidate:
    source: str
    tree: ast.Module
    extensions: tuple[InlineExtension, ...]

    @classmethod
    def parse(cls, source: str) -> "Candidate":
        try:
            tree = ast.parse(source)
        except SyntaxError as exc:
            raise CandidateError(f"line {exc.lineno}: {exc.msg}") from exc
        constants = _module_constants(tree)
        extensions = tuple(_extension(call, target, constants) for call, target in _load_inline_calls(tree))
        return cls(source, tree, extensions)

    def model_class(self) -> ast.ClassDef | None:
        for node in self.tree.body:
            if isinstance(node, ast.ClassDef) and node.name == "ModelNew":
                return node
        return None

    def method(self, name: str) -> ast.FunctionDef | None:
        cls = self.model_class()
        if cls is None:
            return None
        for node in cls.body:
            if isinstance(node, ast.FunctionDef) and node.name == name:
                return node
        return None


def _module_constants(tree: ast.Module) -> dict[str, ast.expr]:
    """Module-level `NAME = <expr>` bindings (the last one wins), for resolving sources."""
    bound: dict[str, ast.expr] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            bound[node.targets[0].id] = node.value
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
            bound[node.target.id] = node.value
    return bound


def _is_load_inline(call: ast.Call) -> bool:
    func = call.func
    return (isinstance(func, ast.Name) and func.id == "load_inline") or (
        isinstance(func, ast.Attribute) and func.attr == "load_inline"
    )


def _load_inline_calls(tree: ast.Module) -> list[tuple[ast.Call, str | None]]:
    found: list[tuple[ast.Call, str | None]] = []
    targets: dict[int, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) and len(node.targets) == 1:
            target = node.targets[0]
            if isinstance(target, ast.Name):
                targets[id(node.value)] = target.id
            elif isinstance(target, ast.Attribute):
                targets[id(node.value)] = target.attr
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and _is_load_inline(node):
            found.append((node, targets.get(id(node))))
    return sorted(found, key=lambda item: item[0].lineno)


def _text(node: ast.expr | None, constants: dict[str, ast.expr], what: str, depth: int = 0) -> str:
    """The string an expression stands for, if it is built from constants only."""
    if node is None:
        return ""
    if depth > 20:
        raise CandidateError(f"load_inline {what}: too deeply nested to read")
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.Name) and node.id in constants:
        return _text(constants[node.id], constants, what, depth + 1)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return _text(node.left, constants, what, depth + 1) + _text(node.right, constants, what, depth + 1)
    if isinstance(node, ast.JoinedStr) and all(isinstance(v, ast.Constant) for v in node.values):
        return "".join(str(v.value) for v in node.values)  # type: ignore[attr-defined]
    if isinstance(node, (ast.List, ast.Tuple)):
        return "\n".join(_text(e, constants, what, depth + 1) for e in node.elts)
    raise CandidateError(
        f"load_inline {what} at line {node.lineno} must be a string built from constants "
        "(the judge reads the CUDA and C++ code before running anything)"
    )


def _strings(node: ast.expr | None, constants: dict[str, ast.expr], what: str) -> tuple[str, ...]:
    if node is None:
        return ()
    if isinstance(node, ast.Name) and node.id in constants:
        node = constants[node.id]
    if isinstance(node, (ast.List, ast.Tuple)):
        return tuple(_text(e, constants, what) for e in node.elts)
    return (_text(node, constants, what),)


def _extension(call: ast.Call, bound_to: str | None, constants: dict[str, ast.expr]) -> InlineExtension:
    kwargs = {k.arg: k.value for k in call.keywords if k.arg}
    positional = ["name", "cpp_sources", "cuda_sources", "functions"]
    for name, value in zip(positional, call.args):
        kwargs.setdefault(name, value)
    return InlineExtension(
        name=_text(kwargs.get("name"), constants, "name") or "extension",
        cpp_sources=_text(kwargs.get("cpp_sources"), constants, "cpp_sources"),
        cuda_sources=_text(kwargs.get("cuda_sources"), constants, "cuda_sources"),
        functions=_strings(kwargs.get("functions"), constants, "functions"),
        line=call.lineno,
        bound_to=bound_to,
        extra_cuda_cflags=_strings(kwargs.get("extra_cuda_cflags"), constants, "extra_cuda_cflags"),
        extra_cflags=_strings(kwargs.get("extra_cflags"), constants, "extra_cflags"),
        extra_ldflags=_strings(kwargs.get("extra_ldflags"), constants, "extra_ldflags"),
    )
