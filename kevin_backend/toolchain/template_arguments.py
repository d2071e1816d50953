"""Which template arguments a templated kernel's launcher is instantiated for, read from the source.

A launch `k<T, BLOCK><<<...>>>(...)` in host code names things the device part must see to
instantiate `kevin_launch_k<T, BLOCK>`: literals and names from CUDA's headers need nothing;
constants in scope at the launch are copied (with what their initializers name) into the
instantiating function; `scalar_t` under an `AT_DISPATCH_*` macro gives one alternative per
dispatched type; a host function template's own parameters are followed to its calls (explicit
template arguments, or types deduced from `data_ptr<T>()`-style pointer arguments), through at
most four host function templates. Each way is an `Alternative`: the lines that give the names
their meaning.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from kevin_backend.toolchain.cpp_text import KEYWORDS, matching_end, split_top_level, strip_cpp, template_head
from kevin_backend.toolchain.item_kinds import SplitState
from kevin_backend.toolchain.kernel_declarations import Kernel, read_template_params, typed_params
from kevin_backend.toolchain.split_errors import SplitError

__all__ = ["Alternative", "CONCRETE_TYPES", "deduced_template_arguments", "resolve_template_arguments"]


@dataclass(frozen=True)
class Alternative:
    """One way to give a launch's template arguments their meaning in the device part."""

    lines: list[str]  # declarations (and opened scopes) that give the names their meaning
    scopes: int = 0  # scopes opened in `lines`
    bound: dict[str, str] = field(default_factory=dict)  # names bound to a concrete type
    simple: bool = True  # the lines only bind names to types (an explicit instantiation can stand in)


_POINTER_OF = (
    re.compile(r"\b(?:mutable_|const_)?data(?:_ptr)?\s*<\s*([\w:]+)\s*>\s*\(\s*\)\s*$"),  # x.data_ptr<float>()
    re.compile(r"^\(\s*(?:const\s+)?([\w:]+)\s*\*\s*\)"),  # (float*)p
    re.compile(r"^(?:reinterpret_cast|static_cast)\s*<\s*(?:const\s+)?([\w:]+)\s*\*\s*>"),
)


def deduced_template_arguments(kernel: Kernel, args: str) -> str | None:
    """The type arguments a launch without template arguments deduces, where each argument for a
    `T*` parameter names its pointee (x.data_ptr<scalar_t>(), (float*)p, reinterpret_cast<half*>(p));
    None when they cannot be read."""
    given = split_top_level(args)
    if len(given) != len(kernel.params):
        return None
    found: dict[str, str] = {}
    for param, arg in zip(typed_params(kernel.name, kernel.params, names=False), given):
        for tparam in kernel.tparams:
            if not re.search(rf"\b{re.escape(tparam.name)}\b", param):
                continue
            if tparam.kind != "type" or not re.fullmatch(rf"(?:const\s+)?{re.escape(tparam.name)}\s*(?:const\s*)?\*\s*(?:__restrict__\s*)?(?:const\s*)?",
                                                          param.strip()):
                continue  # read from the pointer parameters only
            m = next((m for p in _POINTER_OF if (m := p.search(strip_cpp(arg).strip()))), None)
            if m is None or found.setdefault(tparam.name, m.group(1)) != m.group(1):
                return None
    values = []
    for tparam in kernel.tparams:
        if tparam.name in found:
            values.append(found[tparam.name])
        elif tparam.default is None:
            return None
        else:
            break
    return ", ".join(values)


def resolve_template_arguments(state: SplitState, kinds: list[str], index: int, pos: int, args: str, depth: int, owner: str) -> list[Alternative]:
    """The ways the names in `args` (template arguments written at `pos` in host item `index`)
    can be made to mean what they mean there, as declarations for a function in the device part."""
    if depth > 4:
        raise SplitError("template arguments passed through more than four host function templates")
    item = state.items[index]
    b = item.blank
    declarations: dict[int, str] = {}
    dispatched: list[str] | None = None
    dispatch_name = ""
    template_names: set[str] = set()
    template = template_head(b)
    host_tparams = {p.name: p for p in read_template_params(template[0], "a host function")} if template else {}
    work = [(name, pos) for name in _names(args)]
    seen: set[str] = set()
    while work:
        name, at = work.pop()
        if name in seen:
            continue
        seen.add(name)
        found = _local_declaration(b, name, at)
        if found is not None:
            start, end, init = found
            declarations[start] = item.text[start:end].strip()
            work += [(n, start) for n in _names(init)]
            continue
        span = _dispatch_at(b, at)
        if name == "scalar_t" and span is not None:
            dispatched, dispatch_name = span, name
            continue
        if name in host_tparams:
            template_names.add(name)
        elif not _visible(state, kinds, name):
            raise SplitError(f"template argument {name} of {owner} is neither a constant nor a dispatched type the split can read")
    local = ["    " + declarations[k] for k in sorted(declarations)]
    dispatch_alts = [[]] if dispatched is None else [[f"    using {dispatch_name} = {t};"] for t in dispatched]
    bound_alts = [{}] if dispatched is None else [{dispatch_name: t} for t in dispatched]
    if not template_names:
        return [Alternative([*d, *local], 0, dict(bd), not local) for d, bd in zip(dispatch_alts, bound_alts)]
    # the host function template's own parameters: from its calls
    fname = _function_name(b, template[1])
    callers = _calls(state, kinds, fname, index)
    if not callers:
        raise SplitError(f"host function template {fname} is never called with explicit template arguments")
    order = list(host_tparams)
    result = []
    for caller, at, given in callers:
        values = []
        for pname in order:
            i = order.index(pname)
            value = given[i] if i < len(given) else host_tparams[pname].default
            if value is None:
                raise SplitError(f"host function template {fname} is called with template arguments deduced from its arguments")
            values.append(value)
        needed = [values[order.index(n)] for n in order if n in template_names]
        for outer in resolve_template_arguments(state, kinds, caller, at, ", ".join(needed), depth + 1, f"the call of {fname}"):
            lines = list(outer.lines)
            for pname in order:
                if pname not in template_names:
                    continue
                value = values[order.index(pname)]
                tmp = f"kevin_bind_{depth}_{pname}"
                p = host_tparams[pname]
                lines.append(f"    using {tmp} = {value};" if p.kind == "type" else f"    constexpr auto {tmp} = ({value});")
            lines.append("    {")
            for pname in order:
                if pname in template_names:
                    p = host_tparams[pname]
                    tmp = f"kevin_bind_{depth}_{pname}"
                    lines.append(f"    using {pname} = {tmp};" if p.kind == "type" else f"    constexpr {p.type} {pname} = {tmp};")
            bound = {}
            for pname in order:
                if pname in template_names and host_tparams[pname].kind == "type":
                    v = values[order.index(pname)].strip()
                    bound[pname] = outer.bound.get(v, CONCRETE_TYPES.get(v, ""))
            simple = outer.simple and not local and all(host_tparams[n].kind == "type" and bound.get(n) for n in template_names)
            for d, bd in zip(dispatch_alts, bound_alts):
                result.append(Alternative([*lines, *d, *local], outer.scopes + 1, {**bound, **bd}, simple))
    return result


# Names CUDA's and the standard headers give both parts.
_HEADER_NAMES = re.compile(r"(?:__)?(?:half2?|nv_bfloat162?|(?:u?char|u?short|u?int|u?long|longlong|float|double)[1-4]|"
                           r"u?int(?:8|16|32|64)_t|size_t|ptrdiff_t|dim3|cudaStream_t|warpSize)")


def _visible(state: SplitState, kinds: list[str], name: str) -> bool:
    """Whether `name` is declared where the device part sees it (a macro, a constant, a type, a
    name from CUDA's headers)."""
    if _HEADER_NAMES.fullmatch(name):
        return True
    pattern = re.compile(rf"\b{re.escape(name)}\b")
    return any(kinds[i] in ("pre", "pre-device", "type", "device-type", "plain", "hostdevice", "device", "launching")
               and pattern.search(item.blank) for i, item in enumerate(state.items))


def _names(expression: str) -> list[str]:
    blank = strip_cpp(expression)
    names = []
    for m in re.finditer(r"(?<![\w.:>])(?<!->)\b([A-Za-z_]\w*)\b(?!\s*::)", blank):
        if m.group(1) not in KEYWORDS:
            names.append(m.group(1))
    return names


def _local_declaration(blank: str, name: str, pos: int) -> tuple[int, int, str] | None:
    """The last declaration of `name` before `pos` still in scope there: (start, end, initializer)."""
    n = re.escape(name)
    patterns = (
        rf"(?:\bstatic\s+)?\b(?:constexpr|const)\b[^;{{}}]*?\b{n}\s*((?:=(?!=)|\{{)[^;]*);",
        rf"\busing\s+{n}\s*=\s*([^;]*);",
        rf"\btypedef\s+([^;]*?)\b{n}\s*;",
    )
    best = None
    for pattern in patterns:
        for m in re.finditer(pattern, blank[:pos]):
            if _in_scope(blank, m.end(), pos) and (best is None or m.start() > best[0]):
                best = (m.start(), m.end(), next((g for g in m.groups() if g is not None), ""))
    return best


def _in_scope(blank: str, start: int, pos: int) -> bool:
    depth = 0
    for ch in blank[start:pos]:
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth < 0:
                return False
    return True


def _dispatch_at(blank: str, pos: int) -> list[str] | None:
    """The types `scalar_t` takes at `pos`, when it lies inside an AT_DISPATCH_* macro's lambda."""
    inner = None
    for m in re.finditer(r"\b(AT_DISPATCH_\w+)\s*\(", blank):
        close = matching_end(blank, m.end() - 1)
        if m.end() <= pos < close:
            inner = (m.group(1), blank[m.end():close - 1])
    if inner is None:
        return None
    return _dispatch_types(*inner)


# The types a dispatch macro hands its lambda as `scalar_t`.
_DISPATCH_TYPES = {
    "AT_DISPATCH_FLOATING_TYPES": ("float", "double"),
    "AT_DISPATCH_FLOATING_TYPES_AND_HALF": ("float", "double", "c10::Half"),
    "AT_DISPATCH_REDUCED_FLOATING_TYPES": ("c10::Half", "c10::BFloat16"),
}
_SCALAR_NAMES = {"Half": "c10::Half", "BFloat16": "c10::BFloat16", "Float": "float", "Double": "double"}
CONCRETE_TYPES = {"float": "float", "double": "double", "at::Half": "c10::Half", "c10::Half": "c10::Half",
             "at::BFloat16": "c10::BFloat16", "c10::BFloat16": "c10::BFloat16", "half": "__half", "__half": "__half",
             "__nv_bfloat16": "__nv_bfloat16", "nv_bfloat16": "__nv_bfloat16", "int": "int", "int64_t": "int64_t"}


def _dispatch_types(macro: str, args: str) -> list[str]:
    if macro in _DISPATCH_TYPES:
        return list(_DISPATCH_TYPES[macro])
    m = re.fullmatch(r"AT_DISPATCH_FLOATING_TYPES_AND(\d?)", macro)
    if m is None:
        raise SplitError(f"{macro} dispatches types the fast build does not instantiate")
    count = int(m.group(1) or 1)
    found = ["float", "double"]
    for extra in split_top_level(args)[:count]:
        name = re.sub(r"^(?:(?:at|c10|torch)\s*::\s*)?(?:ScalarType\s*::\s*|k)", "", extra.strip())
        if name not in _SCALAR_NAMES:
            raise SplitError(f"{macro} dispatches {extra.strip()}, which the fast build does not instantiate")
        found.append(_SCALAR_NAMES[name])
    return list(dict.fromkeys(found))


def _function_name(blank: str, after: int) -> str:
    paren = blank.find("(", after)
    m = re.search(r"(\w+)\s*$", blank[after:paren]) if paren >= 0 else None
    if m is None:
        raise SplitError("cannot read a host function template's name")
    return m.group(1)


def _calls(state: SplitState, kinds: list[str], fname: str, own: int) -> list[tuple[int, int, list[str]]]:
    """Calls of host function template `fname` anywhere in the file's code: (item, offset, template
    arguments), the arguments written (`fname<args>(...)`) or deduced from its pointer arguments."""
    item = state.items[own]
    template = template_head(item.blank)
    assert template is not None
    paren = item.blank.find("(", template[1])
    signature = Kernel(fname, item.ns, [p for p in split_top_level(item.text[paren + 1:matching_end(item.blank, paren) - 1]) if p != "void"],
                        template[0], read_template_params(template[0], f"host function template {fname}"), own)
    calls = []
    for index, other in enumerate(state.items):
        if kinds[index] not in ("host", "plain", "launching", "hostdevice"):
            continue
        b = other.blank
        for m in re.finditer(rf"(?<![\w.])(?<!->){re.escape(fname)}\s*<", b):
            lt = m.end() - 1
            try:
                gt = matching_end(b, lt, "<", ">")
            except SplitError:
                continue
            if not re.match(r"\s*\(", b[gt:]):
                continue
            calls.append((index, m.start(), split_top_level(other.text[lt + 1:gt - 1])))
        if index == own or template_head(b) and b.find("(", template_head(b)[1]) == b.find(fname, template_head(b)[1]) + len(fname):
            continue  # the definition itself, or another declaration of it
        for m in re.finditer(rf"(?<![\w.])(?<!->){re.escape(fname)}\s*\(", b):
            close = matching_end(b, m.end() - 1)
            deduced = deduced_template_arguments(signature, other.text[m.end():close - 1])
            if deduced is None:
                raise SplitError(f"host function template {fname} is called with template arguments deduced from arguments the split cannot read")
            calls.append((index, m.start(), split_top_level(deduced)))
    return calls
