"""C++ text helpers shared by the static rules and the host/device split: source read as text,
never compiled."""

from __future__ import annotations

__all__ = ["KERNEL_ATTRIBUTES", "strip_cpp"]

# a kernel's attributes, before or after `void` (launch bounds, a compile-time cluster shape, a register cap)
KERNEL_ATTRIBUTES = r"(?:(?:__launch_bounds__|__cluster_dims__|__maxnreg__)\s*\([^)]*\)\s*)*"


def strip_cpp(code: str) -> str:
    """C++ with comments and string/char literal contents blanked: same length, same offsets,
    so positions found in it hold in the original."""
    out = list(code)
    n = len(code)

    def clear(a: int, b: int) -> None:
        for k in range(a, min(b, n)):
            if out[k] != "\n":
                out[k] = " "

    i = 0
    while i < n:
        if code.startswith("//", i):
            j = code.find("\n", i)
            j = n if j < 0 else j
            clear(i, j)
            i = j
        elif code.startswith("/*", i):
            j = code.find("*/", i + 2)
            j = n if j < 0 else j + 2
            clear(i, j)
            i = j
        elif code[i] in "\"'":
            quote, j = code[i], i + 1
            while j < n and code[j] != quote and code[j] != "\n":
                j += 2 if code[j] == "\\" else 1
            clear(i + 1, j)
            i = j + 1
        else:
            i += 1
    return "".join(out)
