"""A CUTLASS device source compiled on this machine as the judge's fast build compiles it
(`toolchain.fast_build.device_command`: nvcc with the program's flags and CUTLASS's include
folders), for the tests that check a kernel the writer emits really builds; skips where nvcc or
CUTLASS's headers are missing."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Sequence

import pytest


def compiled_symbols(tmp_path: Path, source: str, capability: str, flags: Sequence[str], timeout: int = 600) -> str:
    """The object file's symbols (`nm -C`) after compiling `source` for `capability` ("9.0", "8.0")
    with `flags`; the test fails with nvcc's output where it does not build."""
    from kevin_backend.toolchain.cutlass_headers import find_cutlass
    from kevin_backend.toolchain.fast_build import Toolchain, device_command

    headers = find_cutlass()
    if headers is None or shutil.which("nvcc") is None:
        pytest.skip("needs nvcc and CUTLASS's headers (pip install 'kevin_backend[cutlass]')")
    (tmp_path / "kernel.cu").write_text(source)
    command = device_command(Toolchain.detect(), tmp_path / "kernel.cu", tmp_path / "kernel.o", capability, tuple(flags),
                             tuple(str(d) for d in headers.includes))
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    return subprocess.run(["nm", "-C", str(tmp_path / "kernel.o")], capture_output=True, text=True).stdout
