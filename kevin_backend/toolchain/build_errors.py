"""Compiler output trimmed to what a kernel writer needs: the first errors, in its own source.

A failed `load_inline` build prints the ninja command lines, include stacks, notes, warnings and
every error, often thousands of lines, about files the writer never saw (`cuda.cu`, `main.cpp`,
torch's headers). The writer needs the first few errors, each placed in its own source
(`cuda_sources line 12`) with that line quoted. Both nvcc's format (`file(12): error: ...`) and
gcc's (`file:12:5: error: ...`) are read.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import PurePath

__all__ = ["SourceFile", "CompilerError", "parse_errors", "trim_compiler_output"]

_NVCC = re.compile(r"^(?P<file>[^\s()][^()]*?)\((?P<line>\d+)\): (?P<kind>error|catastrophic error)\s*:?\s*(?P<msg>.*)$")
_GCC = re.compile(r"^(?P<file>[^\s:][^:]*?):(?P<line>\d+):(?:(?P<col>\d+):)? (?P<kind>error|fatal error): (?P<msg>.*)$")
_LINKER = re.compile(r"(undefined reference to .*|undefined symbol: \S+|multiple definition of .*)")


@dataclass(frozen=True)
class SourceFile:
    """How a file the compiler saw maps back to the candidate: its label, and how many lines the
    build put in front of the candidate's own text."""

    label: str  # "cuda_sources", "cpp_sources"
    text: str  # the candidate's own source text
    offset: int = 0  # lines prepended by the build


@dataclass(frozen=True)
class CompilerError:
    where: str  # "cuda_sources line 12", or a file name and line for other files
    message: str
    quote: str  # the offending line of the candidate's source, when it is the candidate's

    def __str__(self) -> str:
        text = f"{self.where}: error: {self.message}"
        return text + (f"\n    {self.quote.strip()}" if self.quote.strip() else "")


def parse_errors(output: str, files: dict[str, SourceFile]) -> list[CompilerError]:
    """Every error in `output`, in order, with candidate files mapped to their labels and lines."""
    errors: list[CompilerError] = []
    seen: set[tuple[str, str]] = set()
    for raw in output.splitlines():
        line = raw.rstrip()
        match = _NVCC.match(line) or _GCC.match(line)
        if match:
            name = PurePath(match.group("file").strip()).name
            number = int(match.group("line"))
            message = match.group("msg").strip()
            source = files.get(name)
            if source is not None:
                own = number - source.offset
                lines = source.text.splitlines()
                quote = lines[own - 1] if 0 < own <= len(lines) else ""
                where = f"{source.label} line {own}" if own > 0 else f"{source.label} (a line the build added)"
            else:
                where, quote = f"{name} line {number}", ""
            error = CompilerError(where, message, quote)
        else:
            linker = _LINKER.search(line)
            if not linker:
                continue
            error = CompilerError("link", linker.group(1), "")
        key = (error.where, error.message)
        if key not in seen:
            seen.add(key)
            errors.append(error)
    return errors


def trim_compiler_output(output: str, files: dict[str, SourceFile], max_errors: int = 5, max_chars: int = 4000) -> str:
    """The first `max_errors` errors, located in the candidate's sources; the raw tail when no
    error line can be recognised (so the writer is never left with nothing)."""
    errors = parse_errors(output, files)
    if not errors:
        tail = "\n".join(line for line in output.strip().splitlines()[-20:])
        return tail[-max_chars:]
    shown = "\n".join(str(e) for e in errors[:max_errors])
    if len(errors) > max_errors:
        shown += f"\n... and {len(errors) - max_errors} more error(s)"
    return shown[:max_chars]
