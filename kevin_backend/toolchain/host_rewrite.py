"""The host part's copies of host code: each kernel launch through its generated launcher, each
other use of a kernel's name through its address function.

    k<<<g, b, s, st>>>(args)          -> kevin_launch_k(g, b, s, st, args)
    k<T, 256><<<...>>>(args)          -> kevin_launch_k<T, 256>(...), a `Site` to instantiate
    cudaFuncSetAttribute(k, ...)      -> cudaFuncSetAttribute(kevin_kernel_k(), ...)

Line breaks inside a rewritten launch are kept, so host lines keep their numbers. Device
variables host code names (cudaMemcpyToSymbol and the like) are found here too: they get accessors.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from kevin_backend.toolchain.cpp_text import matching_end, split_top_level, strip_cpp
from kevin_backend.toolchain.cuda_items import Item
from kevin_backend.toolchain.item_kinds import SplitState
from kevin_backend.toolchain.kernel_declarations import Kernel
from kevin_backend.toolchain.split_errors import SplitError
from kevin_backend.toolchain.template_arguments import deduced_template_arguments

__all__ = ["Site", "HostUses", "rewrite_host_items", "variables_used_by_host"]


@dataclass(frozen=True)
class Site:
    """A launch or address of a templated kernel in host code, to be instantiated."""

    kernel: Kernel
    args: str  # template arguments as written ("" for all defaults)
    qual: str  # the qualifier written before the kernel's name ("a::" or "")
    what: str  # "launch" or "kernel": which generated template it names
    item: int
    pos: int  # offset in the item


@dataclass(frozen=True)
class HostUses:
    """What host code does with the kernels: the templated sites, the kernels it launches and
    those whose address it takes (each name once, in the order first met)."""

    sites: tuple[Site, ...]
    launched: dict[str, Kernel]
    accessed: dict[str, Kernel]


def rewrite_host_items(state: SplitState, kinds: list[str]) -> HostUses:
    """Every item the host part holds a copy of, rewritten into `state.host_copy`."""
    sites: list[Site] = []
    launched: dict[str, Kernel] = {}
    accessed: dict[str, Kernel] = {}
    for index, item in enumerate(state.items):
        if kinds[index] in ("host", "plain", "hostdevice"):
            state.host_copy[index] = _rewrite_host(item, index, state, sites, launched, accessed)
    return HostUses(tuple(sites), launched, accessed)


def _rewrite_host(item: Item, index: int, state: SplitState, sites: list[Site],
                  launched: dict[str, Kernel], accessed: dict[str, Kernel]) -> str:
    """The item's host text: every launch through its launcher, every other use of a kernel's
    name through its address function."""
    text = item.text
    edits = _launch_edits(item, index, state, sites, launched)
    edits += _address_edits(item, index, state, sites, accessed, [(s, e) for s, e, _ in edits])
    out, last = [], 0
    for start, end, replacement in sorted(edits):
        out.append(text[last:start] + replacement)
        last = end
    out.append(text[last:])
    return "".join(out)


def _launch_edits(item: Item, index: int, state: SplitState, sites: list[Site],
                  launched: dict[str, Kernel]) -> list[tuple[int, int, str]]:
    """(start, end, replacement) of each `k<<<...>>>(...)` in the item: a call of its launcher."""
    text, b = item.text, item.blank
    edits: list[tuple[int, int, str]] = []
    for q in [m.start() for m in re.finditer(r"<<<", b)]:
        name_start, name, targs, qual = _launched_name(b, q)
        if name not in state.kernels:
            raise SplitError(f"launch of {name}, which is not a kernel of this file")
        kernel = _pick(state.kernels[name], name)
        config_end = b.find(">>>", q + 3)
        if config_end < 0:
            raise SplitError(f"unterminated launch configuration of {name}")
        config = split_top_level(text[q + 3:config_end])
        if not 2 <= len(config) <= 4:
            raise SplitError(f"launch of {name} has {len(config)} configuration values")
        config += ["0", "0"][: 4 - len(config)]
        open_paren = config_end + 3
        while open_paren < len(b) and b[open_paren].isspace():
            open_paren += 1
        if open_paren >= len(b) or b[open_paren] != "(":
            raise SplitError(f"launch of {name} has no argument list")
        close = matching_end(b, open_paren)
        args = text[open_paren + 1:close - 1]
        if targs is None and kernel.template is not None:
            targs = deduced_template_arguments(kernel, args)
        targs = _template_arguments(kernel, targs, name)
        launched.setdefault(name, kernel)
        call = f"{qual}kevin_launch_{name}" + (f"<{targs}>" if targs is not None else "")
        if targs is not None:
            sites.append(Site(kernel, targs, qual, "launch", index, name_start))
        gap = "\n" * text.count("\n", name_start, open_paren)
        edits.append((name_start, close, f"{call}({', '.join(config)}" + (f",{gap} {args})" if args.strip() else f"){gap}")))
    return edits


def _address_edits(item: Item, index: int, state: SplitState, sites: list[Site], accessed: dict[str, Kernel],
                   taken: list[tuple[int, int]]) -> list[tuple[int, int, str]]:
    """(start, end, replacement) of each other use of a kernel's name outside the spans `taken`
    (cudaFuncSetAttribute(k, ...), (void*)k, &k): a call of its address function."""
    text, b = item.text, item.blank
    edits: list[tuple[int, int, str]] = []
    for name, kernels in state.kernels.items():
        for m in re.finditer(rf"((?:[(,&]|\(\s*(?:const\s+)?void\s*\*\s*\))\s*)((?:\w+::)*){re.escape(name)}\b", b):
            start = m.start(2)
            if any(s <= start < e for s, e in taken):
                continue
            kernel = _pick(kernels, name)
            end = m.end()
            targs = None
            after = b[end:].lstrip()
            if after.startswith("<") and not after.startswith("<<"):
                lt = b.index("<", end)
                gt = matching_end(b, lt, "<", ">")
                targs, end = text[lt + 1:gt - 1].strip(), gt
            if not re.match(r"\s*[,)]", b[end:]):
                continue
            targs = _template_arguments(kernel, targs, name)
            accessed.setdefault(name, kernel)
            if targs is not None:
                sites.append(Site(kernel, targs, m.group(2), "kernel", index, start))
            edits.append((start, end, f"{m.group(2)}kevin_kernel_{name}" + (f"<{targs}>" if targs is not None else "") + "()"))
            taken.append((start, end))
    return edits


def _launched_name(b: str, q: int) -> tuple[int, str, str | None, str]:
    """For the `<<<` at q: (start of the launched name with its qualifiers, the kernel's name, its
    template arguments as written or None, the qualifiers written before it)."""
    j = q - 1
    while j >= 0 and b[j].isspace():
        j -= 1
    targs = None
    if j >= 0 and b[j] == ">":
        depth, k = 0, j
        while k >= 0:
            if b[k] in ">)":
                depth += 1
            elif b[k] in "<(":
                depth -= 1
                if depth == 0:
                    break
            k -= 1
        if k < 0:
            raise SplitError("cannot read a launch's template arguments")
        targs = b[k + 1:j].strip()
        j = k - 1
        while j >= 0 and b[j].isspace():
            j -= 1
    end = j + 1
    while j >= 0 and (b[j].isalnum() or b[j] == "_"):
        j -= 1
    name = b[j + 1:end]
    if not name or name[0].isdigit():
        raise SplitError("a launch of something other than a kernel's name")
    start = j + 1
    m = re.search(r"(?:(?:\b\w+)?\s*::\s*)+$", b[:start])
    if m:
        start = m.start()
    return start, name, targs, re.sub(r"\s+", "", b[start:j + 1])


def _pick(kernels: list[Kernel], name: str) -> Kernel:
    """The record a use of kernel `name` goes by: the first declared (a plain kernel's overloads
    each get a launcher; a kernel template is never overloaded)."""
    return kernels[0]


def _template_arguments(kernel: Kernel, targs: str | None, name: str) -> str | None:
    """The template arguments a launch or address of `kernel` gives, as written ("" when all are
    defaults), or None for a plain kernel; SplitError where they are left to deduction."""
    if kernel.template is None:
        if targs is not None:
            raise SplitError(f"kernel {name} is not a template but is launched with template arguments")
        return None
    given = split_top_level(targs) if targs else []
    if len(given) > len(kernel.tparams):
        raise SplitError(f"kernel {name} is launched with more template arguments than it has")
    if any(p.default is None for p in kernel.tparams[len(given):]):
        raise SplitError(f"the launch of kernel template {name} leaves template arguments to be deduced from its arguments")
    return targs or ""


def variables_used_by_host(state: SplitState, kinds: list[str]) -> dict[int, tuple[str, str]]:
    """Device variables host code names (cudaMemcpyToSymbol and the like): item -> (name, typedef)."""
    used: dict[int, tuple[str, str]] = {}
    host_blank = "\n".join(strip_cpp(text) for i, text in state.host_copy.items() if kinds[i] in ("host", "plain"))
    for name, (index, typedef, managed) in state.variables.items():
        if not re.search(rf"(?<![\w.>]){re.escape(name)}\b", host_blank):
            continue
        if managed:
            raise SplitError(f"host code uses __managed__ variable {name}")
        if not typedef:
            raise SplitError(f"host code uses device variable {name}, declared with others in one declaration")
        used[index] = (name, typedef)
    return used
