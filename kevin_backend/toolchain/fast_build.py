"""The fast build: a candidate's extension in seconds instead of a minute.

Plain `load_inline` spends nearly all of its time parsing torch's headers: nvcc parses
<torch/extension.h> (twice: device and host passes) for a few lines of kernel, and g++ parses it
again, with pybind11, for the bindings. Here (measurements in docs/BUILD_NOTES.md):

1. `split_cuda` cuts the CUDA file into a torch-free device part (kernels, launchers; nvcc, the
   present architecture only, about a second) and a host part (the functions that take tensors).
2. The host part and the candidate's `cpp_sources` compile with g++ against a precompiled header
   of <torch/types.h>, <torch/library.h> and the CUDA context headers, built once per toolchain
   and shared by every build (`ensure_pch`).
3. No pybind11: each function named in `functions=[...]` is registered as a torch operator in a
   namespace of its own (`kevin_<digest>`), through a wrapper that widens `int`/`float`
   parameters to the operator schema's `int64_t`/`double`. Python loads the library with
   `torch.ops.load_library` and calls `torch.ops.kevin_<digest>.<function>`.

The two compiles run at once, then one link. nvcc's own steps for the device part run as two
chains at once (`nvcc_chains`): its host pass (cudafe++) beside its device pass (cicc, ptxas),
then the host compile that embeds the device code; on a CUTLASS 3.x GEMM that is 37 s where nvcc
takes 47 s one step after another. Anything this path cannot take (`SplitError`, a
compile or link error outside the candidate's own kernel code) goes to the whole build, so no
candidate is lost, only slower to judge; `FastOutcome.fallback` (and the builder's
`BuildResult.fast_fallback`) says why: the construct the split cannot take, or the step that
failed with its first error. An error that nvcc reports in the candidate's own kernel code is
final: the whole build would fail on the same line (not when the split generated
instantiations, nor when only the host part failed).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import hashlib
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Callable, Sequence

from kevin_backend.config import child_env, cuda_toolkit_dirs
from kevin_backend.toolchain.build_errors import SourceFile, parse_errors, trim_compiler_output
from kevin_backend.toolchain.host_device import SOURCE_NAME, SplitError, split_cuda
from kevin_backend.locks import file_lock

# Part of every fast build's cache key: bump it when what this module produces changes.
FAST_BUILD_VERSION = 3

__all__ = ["FAST_BUILD_VERSION", "Toolchain", "FastSources", "FastOutcome", "fast_sources", "ensure_pch", "pch_header", "pch_built", "build_fast", "ops_namespace",
           "build_arch", "cuda_home_of", "device_command", "nvcc_chains", "NvccChains", "niced", "compile_parts"]

# Headers every host part gets, precompiled once. The adapter turns a candidate's function into
# one whose parameter and return types an operator schema accepts.
_PCH_HEADER = r"""#pragma once
#include <torch/types.h>
#include <torch/library.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <cstdint>
#include <type_traits>
#include <vector>

template <class T> struct kevin_schema_type { using type = T; };
template <class T> struct kevin_schema_type<T&> { using type = T; };
template <class T> struct kevin_schema_type<const T&> { using type = const T&; };
template <> struct kevin_schema_type<int> { using type = int64_t; };
template <> struct kevin_schema_type<unsigned> { using type = int64_t; };
template <> struct kevin_schema_type<long long> { using type = int64_t; };
template <> struct kevin_schema_type<short> { using type = int64_t; };
template <> struct kevin_schema_type<float> { using type = double; };
template <> struct kevin_schema_type<const int&> { using type = int64_t; };
template <> struct kevin_schema_type<const float&> { using type = double; };
template <class T> using kevin_schema_t = typename kevin_schema_type<T>::type;

template <auto F> struct kevin_adapt;
template <class R, class... A, R (*F)(A...)>
struct kevin_adapt<F> {
    static kevin_schema_t<R> call(kevin_schema_t<A>... args) {
        return static_cast<kevin_schema_t<R>>(F(static_cast<A>(args)...));
    }
};
"""

_EXTENSION_INCLUDE = re.compile(r"^[ \t]*#[ \t]*include[ \t]*[<\"](torch/extension\.h|torch/python\.h|pybind11/[^>\"]*|Python\.h)[>\"]", re.M)
_FINAL_ERROR_EXCLUDES = re.compile(r"undefined|not declared|incomplete type|cannot open|no such file|has no member", re.I)


def ops_namespace(digest: str) -> str:
    return f"kevin_{digest}"


@dataclass(frozen=True)
class Toolchain:
    """Compilers, paths and flags for building against the running torch."""

    cxx: str
    nvcc: str
    include_dirs: tuple[str, ...]
    library_dirs: tuple[str, ...]
    cxx_flags: tuple[str, ...]
    nvcc_flags: tuple[str, ...]
    version: str  # torch and compiler versions: part of the precompiled header's identity

    @staticmethod
    @lru_cache(maxsize=1)
    def detect() -> "Toolchain":
        import torch
        import torch.utils.cpp_extension as cpp_extension

        nvcc = shutil.which("nvcc") or ""
        cuda_home = cuda_home_of(nvcc, cpp_extension.CUDA_HOME)
        if cuda_home and not nvcc:
            nvcc = str(Path(cuda_home) / "bin" / "nvcc")
        includes = list(cpp_extension.include_paths("cpu"))
        libraries = list(cpp_extension.library_paths("cpu"))
        if cuda_home:
            includes.append(str(Path(cuda_home) / "include"))
            libraries.append(str(Path(cuda_home) / "lib64"))
            if (Path(cuda_home) / "include" / "cccl").is_dir():  # CUDA 13 keeps <cuda/std/...> there (nvcc adds it; g++ does not)
                includes.append(str(Path(cuda_home) / "include" / "cccl"))
        abi = int(torch.compiled_with_cxx11_abi())
        cxx = shutil.which("c++") or "c++"
        std = "-std=c++20" if _torch_wants_cxx20(cpp_extension) else "-std=c++17"
        versions = [torch.__version__, str(torch.version.cuda), _version_line([cxx, "--version"]), _version_line([nvcc, "--version"])]
        return Toolchain(
            cxx=cxx,
            nvcc=nvcc,
            include_dirs=tuple(includes),
            library_dirs=tuple(libraries),
            cxx_flags=(std, "-fPIC", "-O2", f"-D_GLIBCXX_USE_CXX11_ABI={abi}"),
            nvcc_flags=("-std=c++17", "-O3", "-Xcompiler", "-fPIC", *cpp_extension.COMMON_NVCC_FLAGS),
            version=" | ".join(versions),
        )

    @property
    def digest(self) -> str:
        return hashlib.sha256(json.dumps([self.cxx, self.include_dirs, self.cxx_flags, self.version]).encode()).hexdigest()[:16]


def cuda_home_of(nvcc: str, *candidates: str | None) -> str:
    """The CUDA toolkit's folder: the first of `candidates`, $CUDA_HOME, $CUDA_PATH, the folder
    above nvcc's and /usr/local/cuda that has include/cuda_runtime.h (nvcc may be a wrapper
    script elsewhere); else the first one named."""
    named = [c for c in (*candidates, *cuda_toolkit_dirs(),
                         str(Path(os.path.realpath(nvcc)).parents[1]) if nvcc else None, "/usr/local/cuda") if c]
    return next((c for c in named if (Path(c) / "include" / "cuda_runtime.h").exists()), named[0] if named else "")


def _torch_wants_cxx20(cpp_extension: object) -> bool:
    try:
        return "-std=c++20" in Path(cpp_extension.__file__).read_text()  # type: ignore[attr-defined]
    except OSError:
        return False


def _version_line(command: list[str]) -> str:
    try:
        out = subprocess.run(command, capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return ""
    lines = [line for line in out.splitlines() if line.strip()]
    return lines[-1] if lines else ""


@dataclass(frozen=True)
class FastSources:
    device: str  # torch-free CUDA: kernels and launchers
    host: str  # host functions, the candidate's cpp_sources and the operator registration
    namespace: str
    templated: bool = False  # launchers instantiated for dispatched types: no nvcc error is final


def fast_sources(cpp_sources: str, cuda_sources: str, functions: Sequence[str], digest: str) -> FastSources:
    """The two files of a fast build, or SplitError when the candidate needs the whole build."""
    if not cuda_sources.strip():
        raise SplitError("no CUDA source")
    if not functions:
        raise SplitError("no functions to expose")
    if re.search(r"PYBIND11|pybind11|\bpy::", cpp_sources):
        raise SplitError("the C++ source defines Python bindings")
    for name in functions:
        if not re.fullmatch(r"[A-Za-z_]\w*", name):
            raise SplitError(f"function name {name!r} cannot name an operator")
    split = split_cuda(cuda_sources)
    namespace = ops_namespace(digest)
    registration = "\n".join(f'    m.def("{name}", &kevin_adapt<&{name}>::call);' for name in functions)
    host = "\n".join([
        _EXTENSION_INCLUDE.sub("", split.host),
        '#line 1 "kevin_cpp_sources.cpp"',
        _EXTENSION_INCLUDE.sub("", cpp_sources),
        '#line 1 "kevin_registration.cpp"',
        f"TORCH_LIBRARY_FRAGMENT({namespace}, m) {{\n{registration}\n}}",
    ]) + "\n"
    return FastSources(split.device, host, namespace, split.templated)


def pch_header(root: Path, toolchain: Toolchain) -> Path:
    """Where `ensure_pch` keeps the precompiled header for `toolchain` under `root`, built or not."""
    # the header's own text is part of the folder's name: a changed header is a new one
    return Path(root) / "pch" / f"{toolchain.digest}-{hashlib.sha256(_PCH_HEADER.encode()).hexdigest()[:8]}" / "kevin_pch.h"


def pch_built(root: Path, toolchain: Toolchain) -> bool:
    """Whether `ensure_pch` has already made the header under `root` (or found that it could not)."""
    return (pch_header(root, toolchain).parent / "done").exists()


def ensure_pch(root: Path, toolchain: Toolchain, timeout: float = 900.0) -> Path:
    """The precompiled header for `toolchain` under `root` (built on first use, under a file lock,
    so concurrent builders and processes build it once). Returns the header to `-include`; its
    `.gch` sits beside it when the precompile succeeded (otherwise g++ reads the header itself)."""
    header = pch_header(root, toolchain)
    folder = header.parent
    done = folder / "done"
    if done.exists():
        return header
    folder.mkdir(parents=True, exist_ok=True)
    with file_lock(folder / "lock"):
        if done.exists():
            return header
        gch = folder / "kevin_pch.h.gch"
        tmp = folder / "kevin_pch.h.gch.tmp"
        logs = []
        # Without the CUDA context headers when this machine's CUDA lacks the libraries'
        # headers they include (cuBLAS, cuSPARSE): a candidate that includes them then fails
        # the fast build and is built whole, as it would be anyway.
        for text in (_PCH_HEADER, _PCH_HEADER.replace("#include <ATen/cuda/CUDAContext.h>\n", "")):
            header.write_text(text)
            command = [toolchain.cxx, *toolchain.cxx_flags, *(f"-I{d}" for d in toolchain.include_dirs),
                       "-x", "c++-header", str(header), "-o", str(tmp)]
            output, ok, _ = run_group([command], timeout)
            logs.append(output)
            if ok:
                os.replace(tmp, gch)
                break
        (folder / "pch.log").write_text("\n".join(logs))
        done.write_text("ok" if ok else "failed")
    return header


@dataclass(frozen=True)
class FastOutcome:
    ok: bool
    final: bool  # a failure that the whole build would repeat: report it, do not fall back
    error: str  # trimmed, for the writer (when final)
    log: str  # everything the tools printed
    timed_out: bool = False
    fallback: str = ""  # why the whole build is needed (a failure that is not final): which step, its first error


def build_arch(arch: str, extra_cuda_cflags: Sequence[str]) -> str:
    """The architecture to build for: the present GPU's ("9.0"), in its arch-specific form ("9.0a")
    where the program's flags ask for that form of it (Hopper's wgmma and TMA, as CUTLASS 3.x uses
    them, exist only there). One form only: a pass for the plain form would compile those kernels
    without their features (CUTLASS's then trap at run time)."""
    num = arch.replace(".", "")
    if arch.endswith("a") or not any(re.search(rf"(?:compute|sm)_{num}a\b", flag) for flag in extra_cuda_cflags):
        return arch
    return arch + "a"


def device_command(tc: Toolchain, source: Path, output: Path, arch: str, extra_cuda_cflags: Sequence[str],
                   include_dirs: Sequence[str] = ()) -> list[str]:
    """nvcc on a device part: the present architecture only (`build_arch`), torch's first include
    folder (c10's light headers) and the header libraries' (`include_dirs`: CUTLASS's)."""
    num = build_arch(arch, extra_cuda_cflags).replace(".", "")
    gencode = f"-gencode=arch=compute_{num},code=sm_{num}"
    flags = [f for f in extra_cuda_cflags if f.strip()]  # models write extra_cuda_cflags=[""]
    return [tc.nvcc, *tc.nvcc_flags, gencode, *flags, *(f"-I{d}" for d in (*tc.include_dirs[:1], *include_dirs)),
            "-c", str(source), "-o", str(output)]


@dataclass(frozen=True)
class NvccChains:
    """nvcc's steps for one device part, as shell commands: `first` run at once (the host pass:
    preprocessing, cudafe++; the device pass: preprocessing, cicc, ptxas, fatbinary), `then` after
    both (the host compile that embeds the device code)."""

    first: tuple[list[str], list[str]]
    then: list[str]


_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")
_MODULE_ID = re.compile(r'--module_id_file_name "([^"]+)"')


def nvcc_chains(command: Sequence[str], keep: Path, module_id: str) -> NvccChains | None:
    """The steps nvcc would run for `command` (its `--dryrun`, intermediate files in `keep`) as two
    chains and a last step (`NvccChains`), or None where they are not of that form (another nvcc,
    `-rdc`, several architectures: nvcc then runs them itself). The two passes share the
    translation unit's module id, which cudafe++ writes and cicc reads: written here first
    (`module_id`), so cicc need not wait for cudafe++."""
    bash = shutil.which("bash")
    if bash is None:
        return None
    keep.mkdir(parents=True, exist_ok=True)
    try:
        dry = subprocess.run([*command, "--dryrun", "--keep", "--keep-dir", str(keep)], env=child_env(),
                             capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.SubprocessError):
        return None
    lines = [line[3:].strip() for line in (dry.stderr + dry.stdout).splitlines() if line.startswith("#$ ")]
    if dry.returncode != 0 or not lines:
        return None
    steps = [line for line in lines if not _ASSIGNMENT.match(line)]
    try:  # (nvcc's settings, NAME=words: the environment its steps run in)
        prelude = [f"export {name}={shlex.quote(' '.join(shlex.split(value)))}"
                   for name, value in (line.split("=", 1) for line in lines if _ASSIGNMENT.match(line))]
        tools = [os.path.basename(shlex.split(step)[0]) for step in steps]
    except ValueError:
        return None
    if tools.count("cudafe++") != 1 or tools.count("cicc") != 1 or tools.count("fatbinary") != 1:
        return None
    host, device, embed = tools.index("cudafe++"), tools.index("cicc"), tools.index("fatbinary")
    ids = [_MODULE_ID.findall(steps[i]) for i in (host, device)]
    if not (host < device < embed < len(steps) - 1 and ids[0] and ids[0] == ids[1] and "--gen_module_id_file" in steps[host]
            and " -c " in f" {steps[-1]} "):
        return None
    Path(ids[0][0]).write_text(module_id)
    steps[host] = steps[host].replace("--gen_module_id_file", "")

    def script(chain: list[str]) -> list[str]:
        return [bash, "-c", "\n".join(["set -e", *prelude, *chain])]

    return NvccChains((script(steps[:host + 1]), script(steps[host + 1:embed + 1])), script(steps[embed + 1:]))


def compile_parts(device_cmd: Sequence[str], host_cmd: Sequence[str], keep: Path, module_id: str, timeout: float,
                  niceness: int = 0, host_ready: Callable[[float], object] | None = None) -> tuple[list[tuple[str, int]], bool]:
    """The device part's nvcc (its two chains at once where `nvcc_chains` takes it) beside the
    host part's compiler: [(the device part's output, status), (the host part's)], timed out.
    `host_ready(seconds)`, where given, is waited for (at most the seconds left) before the host
    part's compiler starts, while the device part already compiles: a precompiled header the host
    part includes, made meanwhile (not made in time: the build timed out); what else it raises is
    raised here once the device part ends."""
    start = time.monotonic()
    chains = nvcc_chains(device_cmd, keep, module_id)
    device_cmds = list(chains.first) if chains else [device_cmd]
    # (where the host pass fails, nvcc would stop there: so does the device pass)
    stops = {0: 1} if chains else None
    if host_ready is None:
        results, timed_out = _run_each([*device_cmds, host_cmd], timeout, niceness, stops=stops)
    else:
        def host_part() -> tuple[list[tuple[str, int]], bool]:
            try:
                host_ready(timeout)
            except concurrent.futures.TimeoutError:
                return [(f"the host part's precompiled header was not made within {timeout:.0f} s", -1)], True
            return _run_each([host_cmd], max(1.0, timeout - (time.monotonic() - start)), niceness)

        with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="kevin-host-part") as pool:
            host = pool.submit(host_part)
            results, timed_out = _run_each(device_cmds, timeout, niceness, stops=stops)
            host_results, host_timed_out = host.result()
        results, timed_out = results + host_results, timed_out or host_timed_out
    if chains is None or timed_out:
        return results if chains is None else [("".join(out for out, _ in results[:2]), 1), results[2]], timed_out
    # each chain stops at its first failure: nvcc's own output, in nvcc's order
    (host_pass, host_code), (device_pass, device_code), host = results
    device = (host_pass, host_code) if host_code else (host_pass + device_pass, device_code)
    if not device[1]:
        embedded, ok, timed_out = run_group([chains.then], max(1.0, timeout - (time.monotonic() - start)), niceness)
        device = (device[0] + embedded, 0 if ok else 1)
    return [device, host], timed_out


def build_fast(sources: FastSources, work: Path, output: Path, arch: str, pch: Path,
               extra_cflags: Sequence[str], extra_cuda_cflags: Sequence[str], cuda_text: str,
               timeout: float, toolchain: Toolchain | None = None, include_dirs: Sequence[str] = (), niceness: int = 0,
               pch_ready: Callable[[float], object] | None = None) -> FastOutcome:
    """Compile the device and host parts at once, link them into `output`; `include_dirs` (the
    header libraries', CUTLASS's) go to both compilers; `niceness`: the compilers' (a build ahead
    of its turn yields the cores to the turn's own); `pch_ready`: where the precompiled header
    `pch` is still being made, waited for before the host part compiles (`compile_parts`)."""
    tc = toolchain or Toolchain.detect()
    work.mkdir(parents=True, exist_ok=True)
    (work / "device.cu").write_text(sources.device)
    (work / "host.cpp").write_text(sources.host)
    extra_cflags = [f for f in extra_cflags if f.strip()]  # models write extra_cflags=[""]
    device_cmd = device_command(tc, work / "device.cu", work / "device.o", arch, extra_cuda_cflags, include_dirs)
    host_flags = [f for f in extra_cflags if not f.startswith("-O")]  # optimisation flags would void the header
    host_cmd = [tc.cxx, *tc.cxx_flags, *host_flags, "-include", str(pch), "-Winvalid-pch",
                *(f"-I{d}" for d in (*tc.include_dirs, *include_dirs)), "-c", str(work / "host.cpp"), "-o", str(work / "host.o")]
    start = time.monotonic()
    module_id = "_kevin_" + hashlib.sha256(f"{work}\n{sources.device}".encode()).hexdigest()[:16]
    results, timed_out = compile_parts(device_cmd, host_cmd, work / "nvcc", module_id, timeout, niceness, pch_ready)
    log = "".join(out for out, _ in results)
    if timed_out:
        return FastOutcome(False, True, f"build timed out after {timeout:.0f} s", log, True)
    (device_out, device_code), (host_out, host_code) = results
    if device_code or host_code:
        fallback = "; ".join(f"the {step} did not compile: {_first_error(out)}" for step, out, code in
                             (("device part (nvcc)", device_out, device_code), ("host part (g++)", host_out, host_code)) if code)
        if sources.templated or not device_code:
            # an instantiation for template arguments the candidate never runs may fail where its
            # own build would not; the host part's errors alone are never final (its headers differ)
            return FastOutcome(False, False, "", log, fallback=fallback)
        outcome = _failure(device_out + (host_out if host_code else ""), cuda_text)
        return outcome if outcome.final else dataclasses.replace(outcome, fallback=fallback)
    # -Bsymbolic: the library's own functions bind to its own definitions, even where another
    # loaded build exports the same names (every candidate may call its function `forward`)
    link = [tc.cxx, "-shared", "-Wl,-Bsymbolic", str(work / "device.o"), str(work / "host.o"), "-o", str(output),
            *(f"-L{d}" for d in tc.library_dirs), "-lc10", "-lc10_cuda", "-ltorch_cpu", "-ltorch_cuda", "-ltorch", "-lcudart"]
    link_log, ok, timed_out = run_group([link], max(1.0, timeout - (time.monotonic() - start)), niceness)
    log += link_log
    if timed_out:
        return FastOutcome(False, True, f"build timed out after {timeout:.0f} s", log, True)
    return FastOutcome(True, False, "", log) if ok else FastOutcome(False, False, "", log, fallback=f"the link failed: {_first_error(link_log)}")


def niced(command: Sequence[str], niceness: int) -> list[str]:
    """`command` run at `niceness` (through `nice`; as it is where there is none, or at 0)."""
    tool = shutil.which("nice") if niceness else None
    return [tool, "-n", str(niceness), *command] if tool else list(command)


def _first_error(output: str) -> str:
    """The first line of compiler output that reports an error (or the first line at all)."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    for line in lines:
        if re.search(r"\berror\b|undefined reference|cannot find", line, re.I):
            return line[:300]
    return lines[0][:300] if lines else "no output"


def _failure(log: str, cuda_text: str) -> FastOutcome:
    """Final when every error nvcc reports lies in the candidate's own kernel code and none looks
    like a name the whole build's headers would have supplied."""
    files = {SOURCE_NAME: SourceFile("cuda_sources", cuda_text, 0)}
    errors = parse_errors(log, files)
    own = [e for e in errors if e.where.startswith("cuda_sources line")]
    if errors and len(own) == len(errors) and not any(_FINAL_ERROR_EXCLUDES.search(e.message) for e in errors):
        return FastOutcome(False, True, trim_compiler_output(log, files), log)
    return FastOutcome(False, False, "", log)


def run_group(commands: Sequence[Sequence[str]], timeout: float, niceness: int = 0) -> tuple[str, bool, bool]:
    """Run `commands` at once, each in its own process group (at `niceness`, where `nice` is
    there); kill them all at the timeout. Returns (their output, all succeeded, timed out)."""
    results, timed_out = _run_each(commands, timeout, niceness)
    return "".join(out for out, _ in results), not timed_out and all(code == 0 for _, code in results), timed_out


def _run_each(commands: Sequence[Sequence[str]], timeout: float, niceness: int = 0,
              stops: dict[int, int] | None = None) -> tuple[list[tuple[str, int]], bool]:
    """`run_group`, each command's output and exit status apart; `stops`: where command i fails,
    command j is killed (its output no longer wanted; i before j in `commands`)."""
    env = child_env()
    commands = [niced(c, niceness) for c in commands]
    procs = [subprocess.Popen(list(c), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              start_new_session=True) for c in commands]
    deadline = time.monotonic() + timeout
    outputs: list[str] = []
    timed_out = False
    for proc in procs:
        try:
            out, _ = proc.communicate(timeout=max(0.01, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            timed_out = True
            for p in procs:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            out, _ = proc.communicate()
        outputs.append(out or "")
        after = (stops or {}).get(len(outputs) - 1)
        if after is not None and proc.returncode:
            try:
                os.killpg(procs[after].pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    return [(out, proc.returncode if proc.returncode is not None else -1) for out, proc in zip(outputs, procs)], timed_out


if __name__ == "__main__":  # pragma: no cover - a manual check: python -m kevin_backend.toolchain.fast_build ROOT
    print(ensure_pch(Path(sys.argv[1]), Toolchain.detect()))
