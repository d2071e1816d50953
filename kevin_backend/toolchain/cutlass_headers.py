"""CUTLASS's and CuTe's headers, found at run time: the include folder of the installed PyPI
package `nvidia-cutlass` (the optional extra `kevin_backend[cutlass]`), or the folder that
KEVIN_CUTLASS_INCLUDE names.

    headers = find_cutlass()        # CutlassHeaders(include=..., version="4.2.0", ...) or None
    if headers is not None:
        flags = [f"-I{headers.include}"]

The judge's builds add the folder to every compiler's include path (`BuildSpec.cutlass`), so a
candidate's `#include <cutlass/...>` or `#include <cute/...>` builds without naming a path (the
static rules refuse include paths in `load_inline`); the prompt a model gets names the headers
and the folder when they are here and says nothing of them when they are not. The headers are
device and host templates, header-only: nothing is linked.

The package keeps them in `cutlass_library/source/include/` (4.x); they are found through the
package's record of its files, so another layout of a later version is found too. A folder given
in KEVIN_CUTLASS_INCLUDE must hold `cutlass/cutlass.h`, else `CutlassHeadersError` says what is
wrong: a setting that names the wrong folder fails loudly instead of building without CUTLASS.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from kevin_backend.config import ConfigError, env_value

__all__ = ["CutlassHeaders", "CutlassHeadersError", "PACKAGE", "find_cutlass", "headers_in"]

PACKAGE = "nvidia-cutlass"  # the PyPI package that ships the headers
_MARKER = ("cutlass", "cutlass.h")  # the file an include folder of CUTLASS's holds


class CutlassHeadersError(ConfigError):
    """KEVIN_CUTLASS_INCLUDE names a folder without CUTLASS's headers."""


@dataclass(frozen=True)
class CutlassHeaders:
    include: Path  # the folder that holds cutlass/ (and cute/): what -I names
    version: str  # CUTLASS's own, from cutlass/version.h ("4.2.0"), else the package's
    cute: bool  # cute/tensor.hpp is there too (CUTLASS 3 and later)
    source: str  # "nvidia-cutlass 4.2.0.0" or "KEVIN_CUTLASS_INCLUDE"

    @property
    def includes(self) -> tuple[Path, ...]:
        """What -I names: the include folder, and CUTLASS's utilities (`cutlass/util/...`, which
        CUTLASS 3.x's convolutions include) where the package or checkout has them beside it
        (`tools/util/include`)."""
        util = self.include.parent / "tools" / "util" / "include"
        return (self.include, util) if (util / "cutlass" / "util").is_dir() else (self.include,)


def find_cutlass() -> CutlassHeaders | None:
    """The headers KEVIN_CUTLASS_INCLUDE names (CutlassHeadersError when that folder lacks them),
    else those of the installed `nvidia-cutlass`, else None."""
    override = env_value("KEVIN_CUTLASS_INCLUDE")
    if override is not None:
        return headers_in(Path(override), "KEVIN_CUTLASS_INCLUDE")
    return _installed(PACKAGE)


def headers_in(folder: Path, source: str) -> CutlassHeaders:
    """The headers in `folder`, which must hold cutlass/cutlass.h."""
    folder = Path(folder).expanduser()
    if not folder.is_dir():
        raise CutlassHeadersError(f"{source}={folder}: no such folder (it must name the folder that holds cutlass/ and cute/)")
    if not folder.joinpath(*_MARKER).is_file():
        found = " (cutlass/ is one level down: name that folder)" if any(folder.glob("*/cutlass/cutlass.h")) else ""
        raise CutlassHeadersError(f"{source}={folder}: there is no cutlass/cutlass.h in it{found}; it must name the "
                                  "folder that holds cutlass/ and cute/")
    return CutlassHeaders(folder.resolve(), _header_version(folder) or "unknown",
                          (folder / "cute" / "tensor.hpp").is_file(), source)


@functools.lru_cache(maxsize=8)
def _installed(package: str) -> CutlassHeaders | None:
    """The headers of the installed `package` (its files' record read once a process), or None
    when it is not installed or ships no cutlass/cutlass.h."""
    try:
        dist = metadata.distribution(package)
    except metadata.PackageNotFoundError:
        return None
    for file in dist.files or ():
        if tuple(file.parts[-2:]) == _MARKER:
            include = Path(str(dist.locate_file(file))).parents[1]
            if include.joinpath(*_MARKER).is_file():
                headers = headers_in(include, f"{package} {dist.version}")
                return headers if headers.version != "unknown" else \
                    CutlassHeaders(headers.include, dist.version, headers.cute, headers.source)
    return None


def _header_version(folder: Path) -> str:
    """MAJOR.MINOR.PATCH from cutlass/version.h ("" when it cannot be read)."""
    try:
        text = (folder / "cutlass" / "version.h").read_text(errors="replace")
    except OSError:
        return ""
    parts = [re.search(rf"^#define CUTLASS_{p}\s+(\d+)", text, re.M) for p in ("MAJOR", "MINOR", "PATCH")]
    return ".".join(m.group(1) for m in parts if m) if all(parts) else ""
