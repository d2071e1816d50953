"""A kernel as its declaration gives it: name, namespace, parameters and template parameters, and
the parameters' types as the generated launchers declare them."""

from __future__ import annotations

import re
from dataclasses import dataclass

from kevin_backend.toolchain.cpp_text import KEYWORDS, split_top_level, top_level_index
from kevin_backend.toolchain.split_errors import SplitError

__all__ = ["TemplateParam", "Kernel", "read_template_params", "typed_params"]


@dataclass(frozen=True)
class TemplateParam:
    """One template parameter of a kernel or host function template."""

    kind: str  # "type" or "value"
    name: str
    type: str  # a value parameter's type
    default: str | None


@dataclass(frozen=True)
class Kernel:
    """A `__global__` function of the file (one per distinct signature)."""

    name: str
    ns: tuple[str, ...]
    params: list[str]
    template: str | None  # the template parameter list as written, without the angle brackets
    tparams: list[TemplateParam]
    first: int  # index of the item that declares it first


def read_template_params(head: str, owner: str) -> list[TemplateParam]:
    """The parameters of a template parameter list as written (without the angle brackets); a
    pack or a template template parameter raises SplitError naming `owner`."""
    result = []
    for p in split_top_level(head):
        default = None
        eq = top_level_index(p, "=")
        if eq >= 0:
            p, default = p[:eq].strip(), p[eq + 1:].strip()
        if "..." in p:
            raise SplitError(f"{owner} has a template parameter pack")
        if re.match(r"template\b", p):
            raise SplitError(f"{owner} has a template template parameter")
        m = re.fullmatch(r"(typename|class)\s+(\w+)", p)
        if m:
            result.append(TemplateParam("type", m.group(2), "", default))
            continue
        m = re.fullmatch(r"(.*?[\w*&>])\s*\b(\w+)", p, re.S)
        if m is None:
            raise SplitError(f"cannot read template parameter {p!r} of {owner}")
        result.append(TemplateParam("value", m.group(2), m.group(1).strip(), default))
    return result


def typed_params(name: str, params: list[str], names: bool = True) -> list[str]:
    """Kernel `name`'s parameters as a launcher declares them: each type (an array as a pointer),
    named `kevin_arg<i>` with its default, or the types alone when `names` is false."""
    typed = []
    for i, param in enumerate(params):
        p, default = param, None
        eq = top_level_index(param, "=")
        if eq >= 0:
            p, default = param[:eq].strip(), param[eq + 1:].strip()
        array = re.fullmatch(r"(.*?)\s*\[[^\]]*\]\s*", p, re.S)
        pointer = ""
        if array:
            p, pointer = array.group(1), "*"
        m = re.fullmatch(r"(.*?[\s*&>])(\w+)\s*", p, re.S)
        if m is None or not m.group(1).strip() or m.group(2) in KEYWORDS | {"__restrict__", "const"}:
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
