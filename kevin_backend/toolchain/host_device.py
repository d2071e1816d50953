"""Split a candidate's CUDA file into a torch-free CUDA part and a host part: the fast build's
first step (docs/BUILD_NOTES.md); `fast_build` compiles the two parts.

Before (one file, nvcc parses all of torch's headers for a few lines of kernel):

    #include <torch/extension.h>
    __global__ void k(const float* x, float* y, int64_t n) { ... }
    torch::Tensor f(torch::Tensor x) {
        auto y = torch::empty_like(x);
        k<<<blocks, 256, 0, at::cuda::getCurrentCUDAStream()>>>(x.data_ptr<float>(), y.data_ptr<float>(), x.numel());
        return y;
    }

After (`Split.device`, for nvcc, no torch headers; `Split.host`, for g++ with torch's headers):

    device:  #include <cuda_runtime.h> ...
             __global__ void k(const float* x, float* y, int64_t n) { ... }
             void kevin_launch_k(dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                                 const float* x, float* y, int64_t n) { k<<<grid, block, smem, stream>>>(x, y, n); }
    host:    #include <torch/extension.h>
             void kevin_launch_k(dim3, dim3, size_t, cudaStream_t, const float* x, float* y, int64_t n);
             torch::Tensor f(torch::Tensor x) { ... kevin_launch_k(blocks, 256, 0, at::cuda::getCurrentCUDAStream(), ...); ... }

The file is read as top-level items (preprocessor lines, declarations, definitions) in their
namespaces (named ones are kept, anonymous ones dropped: one file is one translation unit either
way). Each item goes where it can compile, in the file's order:

  device part only   kernels, `__device__` functions and variables, top-level `__shared__`
  both parts         preprocessor lines (torch's includes to the host part only), types (the host
                     copy without the bodies of `__device__`-only member functions), using
                     declarations, `__host__ __device__` functions, torch-free helpers and
                     constants (host copies in an anonymous namespace, launches rewritten)
  device part, declared to the host
                     a torch-free function that launches kernels itself
  host part only     what names torch (`torch::`, `at::`, `c10::`, `TORCH_*`, `AT_*`, `C10_*`)

Host code reaches device code through generated functions in the device part:

  k<<<g, b, s, st>>>(args)            -> kevin_launch_k(g, b, s, st, args)
  k<T, 256><<<...>>>(args)            -> kevin_launch_k<T, 256>(...), a launcher template
  cudaFuncSetAttribute(k, ...)        -> cudaFuncSetAttribute(kevin_kernel_k(), ...) (the kernel's address)
  cudaMemcpyToSymbol(c_w, ...)        -> c_w is, in the host part, a reference to the device
                                         variable's host shadow (kevin_symbol_c_w())
  LAUNCH(256) with #define LAUNCH(B) k<B><<<...>>>(...)
                                      -> the macro expanded first (same line count)

A launcher template is instantiated in the device part for the template arguments the host code
launches it with. Those are read from the source: literals, constants in scope at the launch
(copied into the instantiating function), `scalar_t` under an `AT_DISPATCH_*` macro (one
instantiation per dispatched type; c10::Half and c10::BFloat16 through c10's light headers), and
a host function template's own parameters (from its calls with explicit template arguments,
followed through callers). Device code may name a few light torch things (at::Half, c10::BFloat16,
at::opmath_type, at::acc_type, C10_WARP_SIZE and the other C10_ macros); anything else of torch's
in device code, template arguments the source does not show, and other constructs the split cannot
place raise SplitError with the construct named: such a candidate is built whole.

The stages, a module each: `launch_macros` (launch macros expanded), `cuda_items` (the file as
top-level items), `item_kinds` (what each item is; kernels and device variables recorded),
`host_rewrite` (the host copies, launches through launchers), `template_arguments` (what templated
launchers are instantiated for), `launchers` (the generated functions and instantiations) and
`split_parts` (the two parts written out); `kernel_declarations` reads a kernel's declaration,
`cpp_text` holds the C++ text helpers, `split_errors` the SplitError.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from kevin_backend.toolchain.cpp_text import strip_cpp
from kevin_backend.toolchain.cuda_items import read_items
from kevin_backend.toolchain.host_rewrite import rewrite_host_items, variables_used_by_host
from kevin_backend.toolchain.item_kinds import SplitState, classify_item
from kevin_backend.toolchain.launch_macros import expand_launch_macros
from kevin_backend.toolchain.launchers import instantiate_launchers
from kevin_backend.toolchain.split_errors import SplitError
from kevin_backend.toolchain.split_parts import SOURCE_NAME, write_parts

__all__ = ["SplitError", "Split", "split_cuda", "SOURCE_NAME"]


@dataclass(frozen=True)
class Split:
    """The two parts of a candidate's CUDA file, and the launchers host code calls."""

    device: str
    host: str
    launchers: tuple[str, ...]  # one per launched kernel
    templated: bool = False  # some launcher is a template, instantiated for the template arguments read from the source


def split_cuda(cuda: str) -> Split:
    """The two parts of `cuda` (module docstring), or SplitError naming what the split cannot take."""
    try:
        return _split_cuda(cuda)
    except SplitError:
        raise
    except Exception as exc:  # a source the reader does not follow: the whole build takes it
        raise SplitError(f"the split could not read this source ({type(exc).__name__}: {exc})") from exc


def _split_cuda(cuda: str) -> Split:
    """The stages in order: the first that cannot take the source raises SplitError."""
    library = _library_split(cuda)
    if library is not None:
        return library
    cuda = expand_launch_macros(cuda)
    blank = strip_cpp(cuda)
    if re.search(r"PYBIND11|pybind11|\bpy::", blank):
        raise SplitError("the CUDA source defines Python bindings")
    state = SplitState(read_items(cuda, blank))
    needs: set[str] = set()  # the light torch things device code names
    kinds = [classify_item(item, index, state, needs) for index, item in enumerate(state.items)]
    uses = rewrite_host_items(state, kinds)
    if not uses.launched and not any(k == "launching" for k in kinds):
        raise SplitError("no kernel launch found in host code")
    used_variables = variables_used_by_host(state, kinds)
    instances = instantiate_launchers(state, kinds, uses.sites, needs)
    device, host = write_parts(cuda, state, kinds, needs, used_variables, uses, instances)
    return Split(device, host, tuple(f"kevin_launch_{n}" for n in uses.launched), bool(instances.explicit or instances.sinks))


_TORCH_INCLUDE = re.compile(r"^[ \t]*#[ \t]*include[ \t]*<torch/extension\.h>", re.M)
_TORCH_NAMES = re.compile(r"\b(?:torch|at|c10)::|\bTORCH_|\bAT_|\bC10_")
_EXTERN_C = re.compile(r'extern\s+"C"\s+([^;{}()]+\([^;{}()]*\))\s*\{')


def _library_split(cuda: str) -> Split | None:
    """A file whose kernels come from a header library (CUTLASS: no `__global__` nor launch of the
    file's own), written in two parts already: a torch-free first part that defines `extern "C"`
    functions, then `#include <torch/extension.h>` and the functions that take tensors and call
    them. The first part is the device part as it stands; the host part is the rest, after the C
    functions' declarations. None for any other file (the item split takes it)."""
    at = _TORCH_INCLUDE.search(cuda)
    if at is None:
        return None
    device, host = cuda[:at.start()], cuda[at.start():]
    blank_device, blank_host = strip_cpp(device), strip_cpp(host)
    externs = _EXTERN_C.findall(device)  # (on the text: the blanked one has no string literals)
    if not externs or _TORCH_NAMES.search(blank_device) or "<<<" in blank_host or "__global__" in blank_host:
        return None
    declarations = "".join(f'extern "C" {" ".join(signature.split())};\n' for signature in externs)
    first = cuda.count("\n", 0, at.start()) + 1
    return Split(f'#line 1 "{SOURCE_NAME}"\n{device}',
                 f'#include <cuda_runtime.h>\n{declarations}#line {first} "{SOURCE_NAME}"\n{host}', ())
