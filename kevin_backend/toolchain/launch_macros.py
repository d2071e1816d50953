"""Function-like macros that hide a kernel launch, expanded before the split reads the file.

    #define LAUNCH(B) k<B><<<grid, B, 0, stream>>>(x, y, n)
    ... LAUNCH(256); ...            ->  ... k<256><<<grid, 256, 0, stream>>>(x, y, n); ...

The expansion stands on the use's first line and the use's other lines are kept empty, so every
line after it keeps its number (the device part's `#line` directives name the candidate's lines).
"""

from __future__ import annotations

import re

from kevin_backend.toolchain.cpp_text import matching_end, strip_cpp
from kevin_backend.toolchain.split_errors import SplitError

__all__ = ["expand_launch_macros"]


def expand_launch_macros(cuda: str) -> str:
    """`cuda` with every use of a function-like macro that hides a kernel launch expanded in place
    (the expansion on the use's first line, its other lines kept empty) and the macro's definition
    left out (its lines kept empty)."""
    blank = strip_cpp(cuda)
    macros = {}
    for m in re.finditer(r"^[ \t]*#[ \t]*define[ \t]+(\w+)(\([^)]*\))?((?:[^\n]*\\\n)*[^\n]*)", blank, re.M):
        if "<<<" not in m.group(3):
            continue
        if m.group(2) is None:
            raise SplitError(f"macro {m.group(1)} hides a kernel launch without parameters")
        params = [p.strip() for p in m.group(2)[1:-1].split(",") if p.strip()]
        body = re.sub(r"\\\n", " ", cuda[m.start(3):m.end(3)]).strip()
        macros[m.group(1)] = (params, body, m.start(), m.end())
    if not macros:
        return cuda
    edits = []
    for name, (params, body, start, end) in macros.items():
        for m in re.finditer(rf"\b{name}\s*\(", blank):
            if start <= m.start() < end:
                continue
            line_start = blank.rfind("\n", 0, m.start()) + 1
            if blank[line_start:m.start()].lstrip().startswith("#"):
                raise SplitError(f"macro {name}, which hides a kernel launch, is used by another macro")
            close = matching_end(blank, m.end() - 1)
            args = _macro_args(cuda, blank, m.end(), close - 1)
            expansion = _substitute(body, params, args, name)
            edits.append((m.start(), close, expansion + "\n" * cuda.count("\n", m.start(), close)))
        edits.append((start, end, "\n" * cuda.count("\n", start, end)))  # every use expanded: the definition goes
    for start, end, text in sorted(edits, reverse=True):
        cuda = cuda[:start] + text + cuda[end:]
    return cuda


def _macro_args(code: str, blank: str, lo: int, hi: int) -> list[str]:
    args, depth, last = [], 0, lo
    for i in range(lo, hi):
        if blank[i] == "(":
            depth += 1
        elif blank[i] == ")":
            depth -= 1
        elif blank[i] == "," and depth == 0:
            args.append(code[last:i].strip())
            last = i + 1
    if code[last:hi].strip() or args:
        args.append(code[last:hi].strip())
    return args


def _substitute(body: str, params: list[str], args: list[str], name: str) -> str:
    mapping = {}
    for i, p in enumerate(params):
        if p == "...":
            mapping["__VA_ARGS__"] = ", ".join(args[i:])
        elif p.endswith("..."):
            mapping[p[:-3].strip()] = ", ".join(args[i:])
        elif i < len(args):
            mapping[p] = args[i]
        else:
            raise SplitError(f"macro {name} is used with too few arguments")

    def token(m: re.Match[str]) -> str:
        if m.group(1) is not None:  # #param: the argument as a string literal
            return '"' + mapping.get(m.group(1), m.group(1)).replace("\\", "\\\\").replace('"', '\\"') + '"'
        return mapping.get(m.group(2), m.group(2))

    out = re.sub(r"(?<!#)#(?!#)\s*(\w+)|\b(\w+)\b", token, body)
    return re.sub(r"\s*##\s*", "", out)
