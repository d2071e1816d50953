"""Runs the built-in writer's CUDA kernels on the CPU, one fiber (a stack of its own) per CUDA thread.

For CPU-only machines (CI): the kernels' device code, exactly as written, is compiled by g++
against CUDA's own fp16/bf16 headers, with a few definitions standing in for the CUDA built-ins
the kernels use: `threadIdx`/`blockIdx`/`blockDim`/`gridDim`, `__syncthreads` (a barrier of the
block's threads: each fiber runs to it in turn), `__shfl_xor_sync` (an exchange through memory between two barriers: the
kernels call their shuffles with every thread of the block), `__shared__` (a static: blocks run
one after another), and thread-block clusters (`__cluster_dims__`, `this_cluster()`: a
cluster's blocks run together, each with its own copy of the shared arrays). The grid and block sizes are read from the program's own host code, and the
kernel it launches for aligned data (the vector one, when there is one) is the one run. This
checks the generated code's arithmetic and indexing; it says nothing of speed, and the judge on a
GPU stays the authority on correctness.

    outputs = emulate(program_source, plan, inputs)     # CPU tensors, the kernel's outputs
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Sequence

import torch

from kevin_backend.toolchain.candidate import Candidate

def _cuda_include() -> Path:
    """CUDA's headers (cuda_fp16.h and friends): where torch finds the toolkit, else the usual place."""
    from torch.utils.cpp_extension import CUDA_HOME

    return Path(CUDA_HOME or "/usr/local/cuda") / "include"


CUDA_INCLUDE = _cuda_include()

_SHIM = r"""
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <vector_types.h>
#include <vector_functions.h>
#include <cmath>
#include <math.h>
#include <cfloat>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <algorithm>
#include <sys/mman.h>
#include <vector>
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __restrict__
#define __shared__ static
// A block's CUDA threads are fibers of one host thread, each on a stack of its own: a fiber runs
// until its __syncthreads (or its end) and hands over to the next, so a barrier is passed once
// every thread of the block has reached it, as on the GPU, and costs a switch of stacks, not a
// wake-up of a thousand host threads. The built-ins are set for the fiber resumed at each switch
// (external linkage: code after a switch reads them again).
struct KevinDim { unsigned x, y, z; };
KevinDim blockDim, gridDim, threadIdx, blockIdx;
unsigned kevin_emu_slot;  // the fiber's place among those running at once
struct KevinFiber { void* sp; char* stack; bool done; };
std::vector<KevinFiber> kevin_emu_fibers;
unsigned kevin_emu_current;
void* kevin_emu_main_sp;
void (*kevin_emu_body)(void*);
void* kevin_emu_body_arg;
const size_t KEVIN_EMU_STACK = 256 << 10;
#if defined(__x86_64__)
// saves the callee-saved registers on the running stack, stores its pointer in *from, and resumes
// the stack `to` the same way
extern "C" __attribute__((naked, noinline, noipa)) void kevin_emu_switch(void** from, void* to) {
    asm volatile("pushq %rbp\n pushq %rbx\n pushq %r12\n pushq %r13\n pushq %r14\n pushq %r15\n"
                 "movq %rsp, (%rdi)\n movq %rsi, %rsp\n"
                 "popq %r15\n popq %r14\n popq %r13\n popq %r12\n popq %rbx\n popq %rbp\n ret\n");
}
#else
#include <ucontext.h>
std::vector<ucontext_t> kevin_emu_contexts;
ucontext_t kevin_emu_main_context;
#endif
extern "C" __attribute__((noinline, noipa)) void kevin_emu_yield() {
#if defined(__x86_64__)
    kevin_emu_switch(&kevin_emu_fibers[kevin_emu_current].sp, kevin_emu_main_sp);
#else
    swapcontext(&kevin_emu_contexts[kevin_emu_current], &kevin_emu_main_context);
#endif
}
extern "C" __attribute__((noinline, noipa)) void kevin_emu_entry() {
    kevin_emu_body(kevin_emu_body_arg);
    kevin_emu_fibers[kevin_emu_current].done = true;
    kevin_emu_yield();
    abort();  // a finished fiber is never resumed
}
static void kevin_emu_start(unsigned t) {  // fiber t at the start of the kernel
    KevinFiber& f = kevin_emu_fibers[t];
    if (!f.stack) {
        void* p = mmap(nullptr, KEVIN_EMU_STACK, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (p == MAP_FAILED) abort();
        mprotect(p, 4096, PROT_NONE);  // a guard page: an overflowing stack faults
        f.stack = static_cast<char*>(p);
    }
    f.done = false;
#if defined(__x86_64__)
    void** sp = reinterpret_cast<void**>(f.stack + KEVIN_EMU_STACK) - 8;  // 16-byte aligned
    for (int k = 0; k < 6; ++k) sp[k] = nullptr;  // r15 r14 r13 r12 rbx rbp
    sp[6] = reinterpret_cast<void*>(&kevin_emu_entry);  // `ret` enters it as if called
    sp[7] = nullptr;
    f.sp = sp;
#else
    ucontext_t& c = kevin_emu_contexts[t];
    getcontext(&c);
    c.uc_stack.ss_sp = f.stack + 4096;
    c.uc_stack.ss_size = KEVIN_EMU_STACK - 4096;
    c.uc_link = nullptr;
    makecontext(&c, kevin_emu_entry, 0);
#endif
}
static void kevin_emu_resume(unsigned t) {
    kevin_emu_current = t;
#if defined(__x86_64__)
    kevin_emu_switch(&kevin_emu_main_sp, kevin_emu_fibers[t].sp);
#else
    swapcontext(&kevin_emu_main_context, &kevin_emu_contexts[t]);
#endif
}
struct KevinBarrier {
    void wait() { kevin_emu_yield(); }
};
static KevinBarrier kevin_emu_barrier;
inline void __syncthreads() { kevin_emu_barrier.wait(); }
static unsigned kevin_emu_cluster = 1;  // blocks per cluster of the kernel running
template <class T> inline T __shfl_xor_sync(unsigned, T v, int o) {  // float and int64_t (index reductions)
    static T exchange[16384];
    const unsigned i = kevin_emu_slot;
    exchange[i] = v;
    __syncthreads();
    const T r = exchange[(i & ~31u) | ((i & 31u) ^ (unsigned)o)];
    __syncthreads();
    return r;
}
// Thread-block clusters: a cluster's blocks run together (a fiber per CUDA thread of all
// of them), the cluster's barrier is theirs, and each block's shared arrays (rewritten by
// `emulate` into kevin_emu_shared) lie KEVIN_EMU_SHARED elements apart, so map_shared_rank moves
// a pointer from one block's copy to another's.
#define __cluster_dims__(...)
#define KEVIN_EMU_SHARED 4096
template <class T, int Line> static T* kevin_emu_shared() {
    static T storage[16][KEVIN_EMU_SHARED];
    return storage[blockIdx.x % kevin_emu_cluster];
}
namespace cooperative_groups {
struct cluster_group {
    void sync() { kevin_emu_barrier.wait(); }
    unsigned block_rank() const { return blockIdx.x % kevin_emu_cluster; }
    template <class T> T* map_shared_rank(T* p, int rank) const {
        return p + ((long long)rank - (long long)(blockIdx.x % kevin_emu_cluster)) * KEVIN_EMU_SHARED;
    }
};
inline cluster_group this_cluster() { return {}; }
}
template <class F> static void kevin_emu_launch(unsigned grid, unsigned block, F kernel, unsigned cluster = 1) {
    // a fiber per CUDA thread of a block (of a cluster's blocks); the blocks (clusters) run one
    // after another. In each round every fiber not finished runs to its next barrier or its end;
    // a round ends with all of them at a barrier (the next round passes it) or all finished.
    gridDim = {grid, 1, 1};
    blockDim = {block, 1, 1};
    kevin_emu_cluster = cluster;
    const unsigned n = block * cluster;
    if (kevin_emu_fibers.size() < n) kevin_emu_fibers.resize(n, KevinFiber{nullptr, nullptr, false});
#if !defined(__x86_64__)
    if (kevin_emu_contexts.size() < n) kevin_emu_contexts.resize(n);
#endif
    kevin_emu_body = [](void* k) { (*static_cast<F*>(k))(); };
    kevin_emu_body_arg = &kernel;
    for (unsigned b = 0; b < grid; b += cluster) {
        for (unsigned t = 0; t < n; ++t) kevin_emu_start(t);
        for (;;) {
            unsigned finished = 0;
            for (unsigned t = 0; t < n; ++t) {
                if (kevin_emu_fibers[t].done) { ++finished; continue; }
                kevin_emu_slot = t;
                threadIdx = {t % block, 0, 0};
                blockIdx = {b + t / block, 0, 0};
                kevin_emu_resume(t);
                finished += kevin_emu_fibers[t].done;
            }
            if (finished == n) break;
            if (finished) {  // some at a barrier that the finished ones never reach
                fprintf(stderr, "block %u: %u of %u threads finished while the others wait at a barrier\n", b, finished, n);
                abort();
            }
        }
    }
}
"""

_CT = {torch.float32: "float", torch.float16: "__half", torch.bfloat16: "__nv_bfloat16", torch.bool: "bool", torch.int64: "int64_t"}


def _split(cuda_source: str) -> tuple[str, str]:
    """The program's CUDA source as (device code without includes, host function kevin_run)."""
    host = re.search(r"^(?:torch::Tensor|std::vector<torch::Tensor>) kevin_run\(", cuda_source, re.M)
    assert host is not None, "no host function kevin_run in the program"
    device = "\n".join(line for line in cuda_source[: host.start()].splitlines() if not line.lstrip().startswith("#include"))
    return device, cuda_source[host.start():]


def _launches(host: str, vector: bool) -> list[tuple[str, int, int, list[str]]]:
    """(kernel, grid, block, argument names) of each launch the host code makes, in order: its
    vector kernels when `vector` and it has them, else the others (a split plan launches several)."""
    found = re.findall(r"(kevin_\w+)<<<\(unsigned\)(\w+), (\d+), 0, stream>>>\((.*?)\);", host)
    blocks = re.findall(r"const long long blocks = (.*?);\n", host)
    use_vector = vector and any(name.endswith("_vec") for name, *_ in found)
    paired = {name for name, *_ in found if name + "_vec" in {n for n, *_ in found}}  # a scalar kernel with a vector twin
    result = []
    for k, (name, grid, block, args) in enumerate(found):
        if (use_vector and name in paired) or (not use_vector and name.endswith("_vec")):
            continue
        if grid == "blocks":  # the `blocks` computed before this launch (each branch computes its own)
            expr = blocks[min(k, len(blocks) - 1)]
            expr = expr.replace("std::min<long long>", "min").replace("LL", "").replace("/", "//")
            grid = str(int(eval(expr, {"min": min})))  # noqa: S307 - arithmetic on integers written by the writer
        names = re.findall(r"\((\w+)\.data_ptr\(\)\)", args)
        result.append((name, int(grid), int(block), names))
    return result


def emulate(program: str, inputs: Sequence[torch.Tensor], outputs: Sequence[tuple[tuple[int, ...], torch.dtype]],
            vector: bool = True, workdir: Path | None = None) -> list[torch.Tensor]:
    """Run `program`'s kernel on `inputs` (CPU tensors, any strides) and return its outputs
    (contiguous, of the given shapes and dtypes)."""
    (ext,) = Candidate.parse(program).extensions
    cuda = ext.cuda_sources if isinstance(ext.cuda_sources, str) else "\n".join(ext.cuda_sources)
    device, host = _split(cuda)
    launches = _launches(host, vector)
    clusters = {int(c) for c in re.findall(r"__cluster_dims__\((\d+), 1, 1\)", device)}
    assert len(clusters) <= 1, "kernels of different cluster shapes in one program"
    cluster = clusters.pop() if clusters else 1
    if cluster > 1:  # each block's shared arrays: a copy per block of the cluster (see the shim)
        line = iter(range(1_000_000))
        device = re.sub(r"__shared__ (\w+) (\w+)\[(\d+)\];",
                        lambda m: f"{m[1]}* {m[2]} = kevin_emu_shared<{m[1]}, {next(line)}>();", device)
        device = re.sub(r"__shared__ (\w+) (\w+)\[(\d+)\]\[(\d+)\];",  # a tile: rows of the array's copy
                        lambda m: f"{m[1]} (*{m[2]})[{m[4]}] = reinterpret_cast<{m[1]} (*)[{m[4]}]>(kevin_emu_shared<{m[1]}, {next(line)}>());",
                        device)
        assert "__shared__" not in device, "a cluster kernel's shared memory the emulator does not lay out"
    # workspaces the host function allocates besides the outputs (a split plan's partials and row values)
    workspaces = [(name, int(n), kind) for name, n, kind in
                  re.findall(r"auto (\w+) = torch::empty\(\{(\d+)\}, \w+\.options\(\)\.dtype\(torch::k(\w+)\)\);", host)
                  if not re.fullmatch(r"out\d+", name)]
    calls = [(grid, block, f"{kernel}({', '.join(names)})") for kernel, grid, block, names in launches]
    return run_device_code(device, inputs, outputs, calls, cluster, workspaces, workdir)


def run_device_code(device: str, inputs: Sequence[torch.Tensor], outputs: Sequence[tuple[tuple[int, ...], torch.dtype]],
                    calls: Sequence[tuple[int, int, str]], cluster: int = 1, workspaces: Sequence[tuple[str, int, str]] = (),
                    workdir: Path | None = None) -> list[torch.Tensor]:
    """Compile `device` (CUDA device code without includes) with the shim and run `calls` ((grid,
    block, the kernel's call on `in0, in1, ...`, `out0, ...` and the `workspaces`' names), in order,
    on `inputs` (CPU tensors, any strides: each passed as the memory it spans); the outputs back."""
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        folder = Path(tmp)
        setup, save = [], []
        for k, t in enumerate(inputs):
            raw = t.view(torch.int16) if t.dtype in (torch.float16, torch.bfloat16) else t
            extent = 1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride())) if t.numel() else 0
            flat = torch.as_strided(raw, (extent,), (1,)).contiguous()
            (folder / f"in{k}.bin").write_bytes(flat.numpy().tobytes())
            setup.append(f"auto* in{k} = alloc<{_CT[t.dtype]}>({extent}); read(\"in{k}.bin\", in{k}, {extent} * sizeof({_CT[t.dtype]}));")
        for k, (shape, dtype) in enumerate(outputs):
            numel = 1
            for n in shape:
                numel *= n
            setup.append(f"auto* out{k} = alloc<{_CT[dtype]}>({numel});")
            save.append(f"write(\"out{k}.bin\", out{k}, {numel} * sizeof({_CT[dtype]}));")
        for name, numel, kind in workspaces:
            setup.append(f"auto* {name} = alloc<{ {'Float32': 'float', 'Int64': 'int64_t'}[kind]}>({numel});")
        main = (
            "static void read(const char* p, void* d, size_t n) { FILE* f = fopen(p, \"rb\"); if (n && fread(d, 1, n, f) != n) abort(); fclose(f); }\n"
            "static void write(const char* p, const void* d, size_t n) { FILE* f = fopen(p, \"wb\"); fwrite(d, 1, n, f); fclose(f); }\n"
            "template <class T> static T* alloc(size_t n) {  // 64-byte aligned, as CUDA's allocator\n"
            "    void* p = aligned_alloc(64, (n * sizeof(T) + 127) / 64 * 64); if (!p) abort(); return static_cast<T*>(p); }\n"
            "int main() {\n    " + "\n    ".join(setup) + "\n"
            + "".join(f"    kevin_emu_launch({grid}u, {block}u, [&] {{ {call}; }}, {cluster}u);\n"
                      for grid, block, call in calls) + "    "
            + "\n    ".join(save) + "\n    return 0;\n}\n"
        )
        (folder / "emu.cpp").write_text(f'#include "{_SHIM_NAME}"\n' + device + "\n" + main)
        build = subprocess.run([*_GXX, *_LINKER, f"-I{_shim_folder()}", "emu.cpp", "-o", "emu"],
                               cwd=folder, capture_output=True, text=True, timeout=600)
        assert build.returncode == 0, build.stderr[-4000:]
        run = subprocess.run(["./emu"], cwd=folder, capture_output=True, text=True, timeout=600)
        assert run.returncode == 0, run.stderr[-2000:]
        result = []
        for k, (shape, dtype) in enumerate(outputs):
            data = (folder / f"out{k}.bin").read_bytes()
            store = torch.int16 if dtype in (torch.float16, torch.bfloat16) else dtype
            t = torch.frombuffer(bytearray(data), dtype=store).clone() if data else torch.empty(0, dtype=store)
            result.append((t.view(dtype) if store is not dtype else t).reshape(shape))
        return result


_GXX = ["g++", "-std=c++17", "-O1", "-w", "-pthread", f"-I{CUDA_INCLUDE}"]
_SHIM_NAME = "kevin_emu_shim.h"
_LINKER = ["-fuse-ld=gold"] if shutil.which("ld.gold") else []  # links in a third of ld.bfd's time (0.04 s, 0.13 s)


def _shim_folder() -> Path:
    """A folder holding the shim as a header and, precompiled once for every test process of the
    machine (CUDA's fp16/bf16 headers are most of a build: 1.0 s a kernel without it, 0.4 s with
    it), its `.gch` beside it; g++ takes the precompiled one where it matches the flags and the
    header otherwise, so a stale or missing one costs time, never a result."""
    key = hashlib.sha256((_SHIM + "\0".join(_GXX)).encode()).hexdigest()[:16]
    folder = Path(tempfile.gettempdir()) / f"kevin_emu_{key}"
    if (folder / f"{_SHIM_NAME}.gch").exists():
        return folder
    folder.mkdir(exist_ok=True)
    header = folder / _SHIM_NAME
    if not header.exists():
        part = folder / f"{_SHIM_NAME}.{os.getpid()}"
        part.write_text(_SHIM)
        part.replace(header)  # (processes racing write the same text)
    gch = folder / f"{_SHIM_NAME}.gch.{os.getpid()}"
    built = subprocess.run([*_GXX, "-x", "c++-header", str(header), "-o", str(gch)], capture_output=True, text=True, timeout=600)
    if built.returncode == 0:
        gch.replace(folder / f"{_SHIM_NAME}.gch")
    return folder


def has_cuda_headers() -> bool:
    return (CUDA_INCLUDE / "cuda_fp16.h").exists()
