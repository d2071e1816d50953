"""C++ text helpers shared by the static rules and the host/device split's modules: source read as
text, never compiled. Brackets that do not match raise SplitError (a source the split cannot read
goes to the whole build)."""

from __future__ import annotations

import re

from kevin_backend.toolchain.split_errors import SplitError

__all__ = ["KERNEL_ATTRIBUTES", "KEYWORDS", "strip_cpp", "split_top_level", "top_level_index", "matching_end", "template_head",
           "in_namespaces"]

# a kernel's attributes, before or after `void` (launch bounds, a compile-time cluster shape, a register cap)
KERNEL_ATTRIBUTES = r"(?:(?:__launch_bounds__|__cluster_dims__|__maxnreg__)\s*\([^)]*\)\s*)*"


# What strip_cpp blanks, leftmost first: a line comment, a block comment (to its end or the source's),
# a string or char literal (its contents: to the closing quote, the line's end or the source's; a
# backslash takes the character after it, a newline too)
_BLANKED = re.compile(r"//[^\n]*|/\*[\s\S]*?(?:\*/|\Z)"
                      r"|(?P<quote>[\"'])(?P<body>(?:\\[\s\S]?|(?!(?P=quote))[^\\\n])*)(?P<close>(?P=quote)?)")


def _spaces(text: str) -> str:
    """`text` as spaces, its newlines kept."""
    return " " * len(text) if "\n" not in text else "\n".join(" " * len(line) for line in text.split("\n"))


def strip_cpp(code: str) -> str:
    """C++ with comments and string/char literal contents blanked: same length, same offsets,
    so positions found in it hold in the original."""
    def blank(m: re.Match[str]) -> str:
        if m.group("quote") is None:
            return _spaces(m.group(0))
        return m.group("quote") + _spaces(m.group("body")) + m.group("close")

    return _BLANKED.sub(blank, code)


# Keywords and the standard integer types: never a name a template argument or a parameter gives.
KEYWORDS = frozenset(
    "sizeof alignof true false int unsigned signed long short char float double bool void const constexpr volatile "
    "static_cast reinterpret_cast const_cast dynamic_cast decltype nullptr typename template auto size_t int64_t "
    "int32_t int16_t int8_t uint64_t uint32_t uint16_t uint8_t std return if else new delete this struct class "
    "enum operator noexcept".split()
)


def split_top_level(text: str) -> list[str]:
    """The comma-separated parts of `text` outside brackets, stripped (a parameter or argument
    list's entries)."""
    parts, depth, current = [], 0, ""
    for ch in text:
        if ch in "(<[{":
            depth += 1
        elif ch in ")>]}":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(current.strip())
            current = ""
        else:
            current += ch
    if current.strip():
        parts.append(current.strip())
    return parts


def top_level_index(text: str, char: str) -> int:
    """Offset of the first `char` in `text` outside brackets, or -1."""
    depth = 0
    for i, ch in enumerate(text):
        if ch in "(<[{":
            depth += 1
        elif ch in ")>]}":
            depth -= 1
        elif ch == char and depth == 0:
            return i
    return -1


def matching_end(blank: str, open_at: int, opening: str = "(", closing: str = ")") -> int:
    """Index just past the bracket matching the one at `open_at`."""
    depth = 0
    for i in range(open_at, len(blank)):
        if blank[i] == opening:
            depth += 1
        elif blank[i] == closing:
            depth -= 1
            if depth == 0:
                return i + 1
    raise SplitError(f"unbalanced {opening}{closing}")


def template_head(blank: str) -> tuple[str, int] | None:
    """(the template parameter list, offset past the closing `>`) of an item that opens with
    `template <...>`, else None."""
    m = re.match(r"\s*template\s*<", blank)
    if m is None:
        return None
    depth, i = 1, m.end()
    while i < len(blank) and depth:
        if blank[i] == "<":
            depth += 1
        elif blank[i] == ">":
            depth -= 1
        elif blank[i] == "(":
            i = matching_end(blank, i) - 1
        i += 1
    return blank[m.end():i - 1], i


def in_namespaces(ns: tuple[str, ...], text: str) -> str:
    """`text` inside the named namespaces `ns`, outermost first (on one line each side, so the
    text's own lines keep their `#line` numbering)."""
    if not ns:
        return text
    return "".join(f"namespace {n} {{ " for n in ns) + "\n" + text + "\n" + "}" * len(ns) + "  // namespace " + "::".join(ns)
