"""A CUDA file read as top-level items: preprocessor lines, declarations and definitions, each in
its enclosing named namespaces (the contents of a namespace block are items of their own; an
anonymous namespace adds no name: one file is one translation unit either way)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from kevin_backend.toolchain.cpp_text import matching_end
from kevin_backend.toolchain.split_errors import SplitError

__all__ = ["Item", "read_items"]


@dataclass(frozen=True)
class Item:
    """One top-level item of the file."""

    text: str  # the candidate's text
    blank: str  # the same with comments and string contents blanked
    at: int  # offset in the file
    ns: tuple[str, ...]  # enclosing named namespaces


def read_items(code: str, blank: str, lo: int = 0, hi: int | None = None, ns: tuple[str, ...] = ()) -> list[Item]:
    """Top-level items (preprocessor lines, declarations, definitions) of code[lo:hi], the contents
    of namespace blocks read as items of their own."""
    hi = len(blank) if hi is None else hi
    items: list[Item] = []
    start, depth, i = lo, 0, lo
    while i < hi:
        c = blank[i]
        if depth == 0 and c == "#" and blank[start:i].strip() == "":
            end = i
            while True:  # a preprocessor line, with its continuations
                end = blank.find("\n", end, hi)
                if end < 0:
                    end = hi
                    break
                if blank[end - 1] != "\\":
                    break
                end += 1
            items.append(Item(code[i:end], blank[i:end], i, ns))
            start = i = end
            continue
        if c == "{" and depth == 0:
            head = blank[start:i]
            m = re.fullmatch(r"\s*(inline\s+)?namespace\s*((?:\w+\s*(?:::\s*)?)*)\s*", head)
            if m:
                if m.group(1):
                    raise SplitError("an inline namespace")
                close = matching_end(blank, i, "{", "}") - 1
                inner = ns + tuple(p.strip() for p in m.group(2).split("::") if p.strip())
                items += read_items(code, blank, i + 1, close, inner)
                start = i = close + 1
                continue
            if re.fullmatch(r'\s*extern\s*"\s*"\s*', head):
                raise SplitError('an extern "C" { ... } block')
        if c in "{(":
            depth += 1
        elif c in "})":
            depth -= 1
            if depth < 0:
                raise SplitError("unbalanced braces")
            if depth == 0 and c == "}":
                j = i + 1
                rest = blank[j:min(hi, j + 64)].lstrip()
                if rest.startswith(";"):
                    j = blank.index(";", j) + 1
                items.append(Item(code[start:j], blank[start:j], start, ns))
                start, i = j, j
                continue
        elif c == ";" and depth == 0:
            items.append(Item(code[start:i + 1], blank[start:i + 1], start, ns))
            start = i + 1
        i += 1
    if blank[start:hi].strip():
        raise SplitError("text after the last top-level item")
    trimmed = []
    for item in items:
        if item.blank.strip() and item.blank.strip() != ";":
            lead = len(item.blank) - len(item.blank.lstrip())
            trimmed.append(Item(item.text[lead:], item.blank[lead:], item.at + lead, item.ns))
    return trimmed
