"""Builds of candidate extensions: in worker processes, with a timeout, cached by source hash,
for the present GPU's architecture only, several at a time.

A candidate calls `load_inline(...)` when its program runs. The judge builds every such call
first, here, and the program's `load_inline` is then answered from this cache (`load_built`):

    spec = BuildSpec.of(extension, arch="9.0")     # an InlineExtension of the parsed candidate
    result = Builder(root).build(spec)             # cold: a worker process runs the compilers
    module = load_built(result)                    # warm: import the built .so (milliseconds)

A build's folder is named by the hash of everything that changes its output (sources, flags,
architecture, torch and compiler versions). Failed builds are cached too (the same source fails
the same way), with the compiler's output trimmed to the candidate's own lines.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import hashlib
import importlib.machinery
import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Sequence

import torch

from kevin_backend.config import child_env
from kevin_backend.judge.candidate import InlineExtension
from kevin_backend.judge.errors import SourceFile, trim_compiler_output

__all__ = ["BuildSpec", "BuildResult", "Builder", "light_cuda_sources", "load_built"]

# Lines load_inline puts before the candidate's own sources (see torch.utils.cpp_extension).
_CPP_PRELUDE_LINES = 1  # #include <torch/extension.h>
_CUDA_PRELUDE_LINES = 3  # #include <torch/types.h>, <cuda.h>, <cuda_runtime.h>


@dataclass(frozen=True)
class BuildSpec:
    """Everything that decides what a build produces."""

    name: str
    cpp_sources: str
    cuda_sources: str
    functions: tuple[str, ...]
    extra_cflags: tuple[str, ...] = ()
    extra_cuda_cflags: tuple[str, ...] = ()
    arch: str | None = None  # "9.0": build for this compute capability only; None: no CUDA
    # Compile the CUDA file against <torch/types.h> instead of <torch/extension.h> when it holds
    # no Python bindings (load_inline's main.cpp holds them): nvcc then parses a third of the
    # headers. A build that fails this way is retried with the sources as written.
    light_headers: bool = True

    @classmethod
    def of(cls, ext: InlineExtension, arch: str | None) -> "BuildSpec":
        return cls(ext.name, ext.cpp_sources, ext.cuda_sources, ext.functions, ext.extra_cflags, ext.extra_cuda_cflags, arch)

    @property
    def digest(self) -> str:
        fields = {
            "name": self.name,
            "cpp": self.cpp_sources,
            "cuda": self.cuda_sources,
            "functions": list(self.functions),
            "cflags": list(self.extra_cflags),
            "cuda_cflags": list(self.extra_cuda_cflags),
            "arch": self.arch,
            "light_headers": self.light_headers,
            "torch": torch.__version__,
            "cuda_version": torch.version.cuda,
            "python": sys.version_info[:2],
        }
        return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:24]

    @property
    def module_name(self) -> str:
        """A name unique to this build (a process can import many builds of one extension name)."""
        safe = "".join(ch if ch.isalnum() else "_" for ch in self.name)[:40] or "ext"
        return f"{safe}_{self.digest[:12]}"


@dataclass(frozen=True)
class BuildResult:
    spec_digest: str
    ok: bool
    module_path: Path | None  # the built shared object
    module_name: str
    seconds: float  # time spent on this call (cold: the compile; warm: the cache lookup)
    cached: bool
    error: str = ""  # trimmed compiler output, for the writer
    timed_out: bool = False


def load_built(result: BuildResult) -> ModuleType:
    """Import a successful build's extension module."""
    if not result.ok or result.module_path is None:
        raise ImportError(f"build {result.spec_digest} failed: {result.error}")
    if result.module_name in sys.modules:
        return sys.modules[result.module_name]
    loader = importlib.machinery.ExtensionFileLoader(result.module_name, str(result.module_path))
    spec = importlib.util.spec_from_file_location(result.module_name, result.module_path, loader=loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    sys.modules[result.module_name] = module
    return module


class Builder:
    """Builds BuildSpecs under `root`, one worker process per build, `jobs` at a time."""

    def __init__(self, root: Path, jobs: int | None = None, timeout: float = 600.0) -> None:
        self.root = Path(root)
        self.jobs = max(1, jobs or (os.cpu_count() or 1))
        self.timeout = timeout

    def _folder(self, spec: BuildSpec) -> Path:
        return self.root / spec.digest

    def cached(self, spec: BuildSpec) -> BuildResult | None:
        folder = self._folder(spec)
        status = folder / "status.json"
        if not status.exists():
            return None
        try:
            data = json.loads(status.read_text())
        except (OSError, ValueError):
            return None
        path = folder / f"{spec.module_name}.so"
        if data.get("ok") and not path.exists():
            return None
        return BuildResult(spec.digest, bool(data.get("ok")), path if data.get("ok") else None, spec.module_name, 0.0, True,
                           str(data.get("error", "")), bool(data.get("timed_out", False)))

    def build(self, spec: BuildSpec) -> BuildResult:
        result = self._build(spec)
        if not result.ok and not result.timed_out and spec.light_headers and light_cuda_sources(spec.cuda_sources) != spec.cuda_sources:
            again = self._build(dataclasses.replace(spec, light_headers=False))
            return dataclasses.replace(again, seconds=result.seconds + again.seconds)
        return result

    def _build(self, spec: BuildSpec) -> BuildResult:
        start = time.perf_counter()
        hit = self.cached(spec)
        if hit is not None:
            return BuildResult(hit.spec_digest, hit.ok, hit.module_path, hit.module_name, time.perf_counter() - start,
                               True, hit.error, hit.timed_out)
        folder = self._folder(spec)
        work = folder / "build"
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True, exist_ok=True)
        (folder / "spec.json").write_text(json.dumps(_spec_dict(spec)))
        # One compiler job per worker: parallelism comes from building several candidates at
        # once. Only the present GPU's architecture: most of a default build's time is others'.
        env = child_env(MAX_JOBS="1", **({"TORCH_CUDA_ARCH_LIST": spec.arch} if spec.arch else {}))
        output, ok, timed_out = _run_worker(folder, env, self.timeout)
        built = work / f"{spec.module_name}.so"
        error = ""
        if ok and built.exists():
            shutil.copy2(built, folder / built.name)
        else:
            ok = False
            files = {
                "main.cpp": SourceFile("cpp_sources", spec.cpp_sources, _CPP_PRELUDE_LINES),
                "cuda.cu": SourceFile("cuda_sources", spec.cuda_sources, _CUDA_PRELUDE_LINES),
            }
            error = f"build timed out after {self.timeout:.0f} s" if timed_out else trim_compiler_output(output, files)
            (folder / "build.log").write_text(output)
        status = {"ok": ok, "error": error, "timed_out": timed_out}
        tmp = folder / "status.json.tmp"
        tmp.write_text(json.dumps(status))
        os.replace(tmp, folder / "status.json")
        shutil.rmtree(work, ignore_errors=True)
        return BuildResult(spec.digest, ok, folder / built.name if ok else None, spec.module_name,
                           time.perf_counter() - start, False, error, timed_out)

    def build_many(self, specs: Sequence[BuildSpec]) -> list[BuildResult]:
        """Build several specs, `jobs` at a time (each in its own worker process)."""
        with concurrent.futures.ThreadPoolExecutor(max_workers=self.jobs) as pool:
            return list(pool.map(self.build, specs))


def _run_worker(folder: Path, env: dict[str, str], timeout: float) -> tuple[str, bool, bool]:
    """Run the build worker in its own process group; on timeout the whole group (ninja, nvcc,
    the compilers it started) is killed. Returns (output, succeeded, timed out)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "kevin_backend.judge.build_worker", str(folder)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )
    try:
        output, _ = proc.communicate(timeout=timeout)
        return output, proc.returncode == 0, False
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        output, _ = proc.communicate()
        return output, False, True


_EXTENSION_INCLUDE = re.compile(r"^[ \t]*#[ \t]*include[ \t]*<torch/extension\.h>", re.M)


def light_cuda_sources(cuda: str) -> str:
    """`cuda` with <torch/extension.h> replaced by <torch/types.h> (same line count), unless the
    file defines Python bindings itself."""
    if "PYBIND11" in cuda or "pybind11" in cuda or "py::" in cuda:
        return cuda
    return _EXTENSION_INCLUDE.sub("#include <torch/types.h>", cuda)


def _spec_dict(spec: BuildSpec) -> dict[str, object]:
    return {
        "name": spec.module_name,
        "cpp_sources": spec.cpp_sources,
        "cuda_sources": light_cuda_sources(spec.cuda_sources) if spec.light_headers else spec.cuda_sources,
        "functions": list(spec.functions),
        "extra_cflags": list(spec.extra_cflags),
        "extra_cuda_cflags": list(spec.extra_cuda_cflags),
        "with_cuda": bool(spec.cuda_sources),
    }
