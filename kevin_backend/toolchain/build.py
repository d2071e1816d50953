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

Three ways to build, tried in order until one succeeds or fails for good:

  fast   `fast_build`: torch-free kernels through nvcc, host code against a precompiled header,
         functions registered as torch operators (seconds; most candidates)
  light  `load_inline` with <torch/types.h> in place of <torch/extension.h> in the CUDA file
  full   `load_inline` on the sources as written (what the candidate would get by itself)
"""

from __future__ import annotations

import concurrent.futures
import contextlib
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
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, Iterator, Sequence

import torch

from kevin_backend.config import child_env
from kevin_backend.toolchain.candidate import InlineExtension
from kevin_backend.toolchain.build_errors import SourceFile, trim_compiler_output
from kevin_backend.toolchain.cutlass_headers import CutlassHeaders, find_cutlass
from kevin_backend.toolchain.fast_build import (FAST_BUILD_VERSION, Toolchain, build_arch, build_fast, ensure_pch, fast_sources, niced,
                                                 pch_built, pch_header)
from kevin_backend.toolchain.host_device import SplitError
from kevin_backend.locks import file_lock

__all__ = ["BuildSpec", "BuildResult", "Builder", "light_cuda_sources", "load_built", "answering_load_inline",
           "judge_side_build_failure"]

_PATCH_LOCK = threading.RLock()

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
    # Try the fast build first (module docstring); needs `arch` and CUDA sources.
    fast: bool = True
    # CUTLASS's and CuTe's headers, on every compiler's include path (`find_cutlass`: the judge's
    # builds and a program's own load_inline find the same); None: not installed
    cutlass: CutlassHeaders | None = None

    @classmethod
    def of(cls, ext: InlineExtension, arch: str | None) -> "BuildSpec":
        return cls(ext.name, ext.cpp_sources, ext.cuda_sources, ext.functions, ext.extra_cflags, ext.extra_cuda_cflags, arch,
                   cutlass=find_cutlass())

    @property
    def include_dirs(self) -> tuple[str, ...]:
        """The header libraries' folders the compilers are given besides torch's and CUDA's."""
        return tuple(str(d) for d in self.cutlass.includes) if self.cutlass is not None else ()

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
            "fast": self.fast,
            "fast_version": FAST_BUILD_VERSION if self.fast else None,
            "torch": torch.__version__,
            "cuda_version": torch.version.cuda,
            "python": sys.version_info[:2],
        }
        if self.cutlass is not None:  # (absent without it: the digests of builds made before stay)
            fields["cutlass"] = [str(self.cutlass.include), self.cutlass.version]
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
    # Set when the build registered torch operators (the fast build) instead of a Python module:
    # the operators are torch.ops.<namespace>.<function>.
    namespace: str = ""
    functions: tuple[str, ...] = ()
    final: bool = True  # False: a fast build that failed in a way the whole build may not
    how: str = ""  # "fast", "light" or "full"
    # The build failed for the judge's reasons, not the candidate's: a timeout while the machine
    # was loaded, a full disk, a compiler killed for memory. Never cached; judged again later.
    infra: bool = False
    # Why the fast build could not be used and the whole build ran ("" when it was not tried or
    # worked): the construct the split cannot take, or the step that failed and its first error.
    fast_fallback: str = ""


def load_built(result: BuildResult) -> ModuleType:
    """Import a successful build: its extension module, or for a fast build a module whose
    attributes are the registered operators (called like the module's functions)."""
    if not result.ok or result.module_path is None:
        raise ImportError(f"build {result.spec_digest} failed: {result.error}")
    if result.module_name in sys.modules:
        return sys.modules[result.module_name]
    if result.namespace:
        torch.ops.load_library(str(result.module_path))
        ops = ModuleType(result.module_name, f"operators of the fast build {result.spec_digest}")
        for name in result.functions:
            setattr(ops, name, getattr(getattr(torch.ops, result.namespace), name))
        sys.modules[result.module_name] = ops
        return ops
    loader = importlib.machinery.ExtensionFileLoader(result.module_name, str(result.module_path))
    spec = importlib.util.spec_from_file_location(result.module_name, result.module_path, loader=loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    sys.modules[result.module_name] = module
    return module


_CPP_EXTENSION = "torch.utils.cpp_extension"


class _LazyCppExtension(ModuleType):
    """`torch.utils.cpp_extension` as a program sees it while `answering_load_inline` is active and
    the real module was not imported: `load_inline` is the builder's, and any other name imports the
    real module (with CUDA about 0.4 s, which a program that only calls `load_inline` never pays)
    and is read from it, its `load_inline` the builder's too until the block ends."""

    def __init__(self, load_inline: Any) -> None:
        super().__init__(_CPP_EXTENSION)
        self.load_inline = load_inline
        self._real: Any = None
        self._saved: Any = None

    def __getattr__(self, name: str) -> Any:  # (only names the stub lacks; of the dunders only __file__,
        if name.startswith("__") and name != "__file__":  # which the toolchain reads: others are import machinery's probes)
            raise AttributeError(name)
        if self._real is None:
            if sys.modules.get(_CPP_EXTENSION) is self:
                del sys.modules[_CPP_EXTENSION]
            real = importlib.import_module(_CPP_EXTENSION)
            self._saved, real.load_inline = real.load_inline, self.load_inline
            self._real = real
        return getattr(self._real, name)


@contextlib.contextmanager
def answering_load_inline(builder: "Builder", arch: str | None) -> Iterator[None]:
    """While active, `torch.utils.cpp_extension.load_inline` builds through `builder` (for `arch`)
    and returns the loaded build; a failed build raises RuntimeError with the trimmed error. A
    program executed inside the block binds this `load_inline` when it imports it. Where torch's
    module is not imported yet, the program gets a stand-in (`_LazyCppExtension`) that imports it
    only for a name besides `load_inline`."""

    def load_inline(name: str, cpp_sources: Any = "", cuda_sources: Any = None, functions: Any = None,
                    extra_cflags: Any = None, extra_cuda_cflags: Any = None, **_: Any) -> Any:
        def text(value: Any) -> str:
            return "\n".join(value) if isinstance(value, (list, tuple)) else (value or "")

        def items(value: Any) -> tuple[str, ...]:
            return tuple(value) if isinstance(value, (list, tuple)) else ((value,) if value else ())

        spec = BuildSpec(name, text(cpp_sources), text(cuda_sources), items(functions), items(extra_cflags),
                         items(extra_cuda_cflags), arch, cutlass=find_cutlass())
        result = builder.build(spec)
        if not result.ok:
            raise RuntimeError(f"build failed: {result.error}")
        return load_built(result)

    with _PATCH_LOCK:
        real = sys.modules.get(_CPP_EXTENSION)
        if real is not None and not isinstance(real, _LazyCppExtension):
            saved = real.load_inline
            real.load_inline = load_inline
            try:
                yield
            finally:
                real.load_inline = saved
            return
        stub = _LazyCppExtension(load_inline)
        had = torch.utils.__dict__.get("cpp_extension")
        sys.modules[_CPP_EXTENSION] = stub
        torch.utils.cpp_extension = stub  # type: ignore[attr-defined]  (`import torch.utils.cpp_extension as x` reads it)
        try:
            yield
        finally:
            if sys.modules.get(_CPP_EXTENSION) is stub:
                del sys.modules[_CPP_EXTENSION]
            if stub._real is not None:
                stub._real.load_inline = stub._saved
                torch.utils.cpp_extension = stub._real  # type: ignore[attr-defined]
            elif had is not None:
                torch.utils.cpp_extension = had  # type: ignore[attr-defined]
            else:
                torch.utils.__dict__.pop("cpp_extension", None)


class Builder:
    """Builds BuildSpecs under `root`, one worker process per build, `jobs` at a time."""

    def __init__(self, root: Path, jobs: int | None = None, timeout: float = 600.0, pch_root: Path | None = None) -> None:
        self.root = Path(root)
        # The fast build's precompiled header is the same for every candidate: built once per
        # toolchain under `pch_root` and shared by every builder of one kernel cache, by default
        # the cache folder whose build folder `root` is (`config.build_root`).
        self.pch_root = Path(pch_root) if pch_root is not None else _default_pch_root(self.root)
        self.jobs = max(1, jobs or (os.cpu_count() or 1))
        self.timeout = timeout
        # at most `jobs` builds at once however many callers build at once (evaluate_many per
        # task, several tasks at a time): more would only slow every one of them towards its timeout;
        # a turn's own build before any build ahead (`BuildSlots`)
        self._slots = BuildSlots(self.jobs)

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
        if not data.get("ok") and (data.get("timed_out") or data.get("infra")):
            return None  # the judge's failure, not the source's: build again
        return BuildResult(spec.digest, bool(data.get("ok")), path if data.get("ok") else None, spec.module_name, 0.0, True,
                           str(data.get("error", "")), bool(data.get("timed_out", False)), str(data.get("namespace", "")),
                           spec.functions, bool(data.get("final", True)), str(data.get("how", "")),
                           fast_fallback=str(data.get("fallback", "")))

    def build(self, spec: BuildSpec, background: bool = False) -> BuildResult:
        """Build `spec` the fastest way that works (module docstring); the result's `seconds`
        count every way tried. `background`: a build ahead of its turn, its compilers at
        `BACKGROUND_NICENESS` so that a turn's own build, started beside it, gets the cores."""
        spent, fallback = 0.0, ""
        if spec.fast and spec.arch and spec.cuda_sources.strip():
            result = self._build(spec, background)
            if result.ok or result.final:
                return result
            spent = result.seconds
            fallback = result.fast_fallback or result.error or "the fast build failed"
        whole = dataclasses.replace(spec, fast=False)
        result = self._build(whole, background)
        if not result.ok and not result.timed_out and not result.infra and whole.light_headers \
                and light_cuda_sources(whole.cuda_sources) != whole.cuda_sources:
            again = self._build(dataclasses.replace(whole, light_headers=False), background)
            result = dataclasses.replace(again, seconds=result.seconds + again.seconds)
        return dataclasses.replace(result, seconds=spent + result.seconds, fast_fallback=fallback)

    def _build(self, spec: BuildSpec, background: bool = False) -> BuildResult:
        start = time.perf_counter()
        hit = self.cached(spec)
        if hit is not None:
            return dataclasses.replace(hit, seconds=time.perf_counter() - start)
        # One build per folder at a time, across threads and processes (the judge and its
        # sandboxes share a root): a second caller waits, then finds the first one's result.
        folder = self._folder(spec)
        folder.mkdir(parents=True, exist_ok=True)
        with file_lock(folder / "lock"):
            hit = self.cached(spec)
            if hit is not None:
                return dataclasses.replace(hit, seconds=time.perf_counter() - start)
            with self._slots.taken(background):
                niceness = BACKGROUND_NICENESS if background else 0
                return self._build_fast(spec, start, niceness) if spec.fast else self._build_whole(spec, start, niceness)

    def _build_whole(self, spec: BuildSpec, start: float, niceness: int = 0) -> BuildResult:
        folder = self._folder(spec)
        work = folder / "build"
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True, exist_ok=True)
        (folder / "spec.json").write_text(json.dumps(_spec_dict(spec)))
        # One compiler job per worker: parallelism comes from building several candidates at
        # once. Only the present GPU's architecture: most of a default build's time is others'.
        arch = build_arch(spec.arch, spec.extra_cuda_cflags) if spec.arch else None
        env = child_env(MAX_JOBS="1", **({"TORCH_CUDA_ARCH_LIST": arch} if arch else {}))
        output, ok, timed_out = _run_worker(folder, env, self.timeout, niceness)
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
        how = "light" if spec.light_headers and light_cuda_sources(spec.cuda_sources) != spec.cuda_sources else "full"
        infra = "" if ok else judge_side_build_failure(output, timed_out)
        if infra:
            error = infra
        else:
            _write_status(folder, {"ok": ok, "error": error, "timed_out": timed_out, "how": how})
        shutil.rmtree(work, ignore_errors=True)
        return BuildResult(spec.digest, ok, folder / built.name if ok else None, spec.module_name,
                           time.perf_counter() - start, False, error, timed_out, how=how, infra=bool(infra))

    def _build_fast(self, spec: BuildSpec, start: float, niceness: int = 0) -> BuildResult:
        folder = self._folder(spec)
        try:
            sources = fast_sources(spec.cpp_sources, spec.cuda_sources, spec.functions, spec.digest)
        except SplitError as exc:  # not cached: splitting again costs milliseconds
            return BuildResult(spec.digest, False, None, spec.module_name, time.perf_counter() - start, False,
                               f"fast build not possible: {exc}", final=False, how="fast",
                               fast_fallback=f"the split cannot take it: {exc}")
        assert spec.arch is not None
        toolchain = Toolchain.detect()
        # A first build of this cache makes the precompiled header beside its device part (which
        # does not include it): its host part waits for the header, its device part does not.
        header = None if pch_built(self.pch_root, toolchain) else _in_background(ensure_pch, self.pch_root, toolchain)
        pch = pch_header(self.pch_root, toolchain)
        work = folder / "build"
        shutil.rmtree(work, ignore_errors=True)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "spec.json").write_text(json.dumps(_spec_dict(spec)))
        built = folder / f"{spec.module_name}.so"
        outcome = build_fast(sources, work, built, spec.arch, pch, spec.extra_cflags, spec.extra_cuda_cflags,
                             spec.cuda_sources, self.timeout, toolchain, include_dirs=spec.include_dirs, niceness=niceness,
                             pch_ready=header.result if header else None)
        error = outcome.error
        infra = "" if outcome.ok else judge_side_build_failure(outcome.log, outcome.timed_out)
        if not outcome.ok:
            (folder / "build.log").write_text(outcome.log)
        if infra:
            error = infra
        else:
            _write_status(folder, {"ok": outcome.ok, "error": outcome.error, "timed_out": outcome.timed_out,
                                   "namespace": sources.namespace if outcome.ok else "", "final": outcome.ok or outcome.final,
                                   "how": "fast", "fallback": outcome.fallback})
        shutil.rmtree(work, ignore_errors=True)
        return BuildResult(spec.digest, outcome.ok, built if outcome.ok else None, spec.module_name,
                           time.perf_counter() - start, False, error, outcome.timed_out,
                           sources.namespace if outcome.ok else "", spec.functions, outcome.ok or outcome.final or bool(infra),
                           "fast", infra=bool(infra), fast_fallback=outcome.fallback)

    def build_many(self, specs: Sequence[BuildSpec], background: bool = False) -> list[BuildResult]:
        """Build several specs, `jobs` at a time (each in its own worker process; `background`: `build`'s)."""
        with concurrent.futures.ThreadPoolExecutor(max_workers=self.jobs) as pool:
            return list(pool.map(lambda spec: self.build(spec, background), specs))


def _run_worker(folder: Path, env: dict[str, str], timeout: float, niceness: int = 0) -> tuple[str, bool, bool]:
    """Run the build worker in its own process group (at `niceness`); on timeout the whole group
    (ninja, nvcc, the compilers it started) is killed. Returns (output, succeeded, timed out)."""
    proc = subprocess.Popen(
        niced([sys.executable, "-m", "kevin_backend.toolchain.build_worker", str(folder)], niceness),
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


# A build ahead of its turn runs at this niceness: the turn's own build, started at the same time
# (the engine hands the foreseen programs over as it judges a turn), gets the cores first.
BACKGROUND_NICENESS = 10
# Slots builds ahead leave free for turns' own builds (a search of several tasks foresees more
# programs than there are slots: without these, a new turn's build would queue behind them).
FOREGROUND_SLOTS = 2


class BuildSlots:
    """At most `jobs` builds at once. A turn's own build takes the next free slot; a build ahead
    of its turn (`background`) takes one only while no turn's build waits for a slot, and at most
    `jobs - FOREGROUND_SLOTS` of them run at once (at least one), so a turn's build never waits
    for more than builds ahead already running to end when the builder has more than that."""

    def __init__(self, jobs: int, reserved: int = FOREGROUND_SLOTS) -> None:
        self.jobs = jobs
        self.ahead_limit = max(1, jobs - reserved)
        self._changed = threading.Condition()
        self._running = 0
        self._ahead = 0
        self._waiting = 0  # turns' own builds waiting for a slot

    @contextlib.contextmanager
    def taken(self, background: bool = False) -> Iterator[None]:
        with self._changed:
            if background:
                self._changed.wait_for(lambda: self._running < self.jobs and not self._waiting
                                       and self._ahead < self.ahead_limit)
                self._ahead += 1
            else:
                self._waiting += 1
                self._changed.wait_for(lambda: self._running < self.jobs)
                self._waiting -= 1
            self._running += 1
        try:
            yield
        finally:
            with self._changed:
                self._running -= 1
                self._ahead -= background
                self._changed.notify_all()

    def counts(self) -> tuple[int, int, int]:
        """(builds running, of them ahead of their turn, turns' builds waiting)."""
        with self._changed:
            return self._running, self._ahead, self._waiting

# Compiler output that says the machine, not the source, failed.
_MACHINE_FAILURES = ("no space left on device", "cannot allocate memory", "virtual memory exhausted",
                     "killed signal terminated program", "out of memory allocating", "resource temporarily unavailable")


def judge_side_build_failure(output: str, timed_out: bool) -> str:
    """Why a failed build is the judge's failure rather than the candidate's ("" when it is the
    candidate's): a timeout while the machine was loaded (more runnable processes than cores),
    or a compiler stopped by the machine (disk, memory)."""
    text = (output or "").lower()
    for sign in _MACHINE_FAILURES:
        if sign in text:
            return f"the build machine failed ({sign}), not the kernel: it will be built again"
    if timed_out:
        load, cores = os.getloadavg()[0], os.cpu_count() or 1
        if load > cores:
            return (f"the build timed out while the machine was loaded (load average {load:.1f} on {cores} cores); "
                    "it will be built again")
    return ""


_EXTENSION_INCLUDE = re.compile(r"^[ \t]*#[ \t]*include[ \t]*<torch/extension\.h>", re.M)


def light_cuda_sources(cuda: str) -> str:
    """`cuda` with <torch/extension.h> replaced by <torch/types.h> (same line count), unless the
    file defines Python bindings itself."""
    if "PYBIND11" in cuda or "pybind11" in cuda or "py::" in cuda:
        return cuda
    return _EXTENSION_INCLUDE.sub("#include <torch/types.h>", cuda)


def _in_background(fn: Callable[..., Any], *args: Any) -> "concurrent.futures.Future[Any]":
    """`fn(*args)` run in a daemon thread of its own, its future returned (an executor's threads
    would hold the interpreter's exit until a header of up to 15 minutes is made)."""
    future: concurrent.futures.Future[Any] = concurrent.futures.Future()

    def run() -> None:
        try:
            future.set_result(fn(*args))
        except BaseException as exc:  # noqa: BLE001 - handed to whoever waits for it
            future.set_exception(exc)

    threading.Thread(target=run, name="kevin-pch", daemon=True).start()
    return future


def _default_pch_root(root: Path) -> Path:
    """Where a builder of the build folder `root` keeps the precompiled header when it is not
    told: the kernel cache folder `root` belongs to (`config.cache_dir_of`), so that the judges,
    their workers and the runtime of one cache share it; for a build folder of no kernel cache,
    the user's default cache folder."""
    from kevin_backend.config import Config, cache_dir_of

    return cache_dir_of(root) or Config().cache_dir


def _write_status(folder: Path, status: dict[str, object]) -> None:
    tmp = folder / "status.json.tmp"
    tmp.write_text(json.dumps(status))
    os.replace(tmp, folder / "status.json")


def _spec_dict(spec: BuildSpec) -> dict[str, object]:
    return {
        "name": spec.module_name,
        "cpp_sources": spec.cpp_sources,
        "cuda_sources": light_cuda_sources(spec.cuda_sources) if spec.light_headers else spec.cuda_sources,
        "functions": list(spec.functions),
        "extra_cflags": list(spec.extra_cflags),
        "extra_cuda_cflags": list(spec.extra_cuda_cflags),
        "extra_include_paths": list(spec.include_dirs),
        "with_cuda": bool(spec.cuda_sources),
    }
