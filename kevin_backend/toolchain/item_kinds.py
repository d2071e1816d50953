"""What each top-level item is, so that it goes where it can compile.

  "pre", "pre-host", "pre-device"  a preprocessor line for both parts, the host part (torch's
                                   includes) or the device part (headers only nvcc reads)
  "type", "device-type"            a type for both parts, or for the device part (it names
                                   device-only libraries)
  "kernel", "device"               kernels, `__device__` functions and variables, top-level
                                   `__shared__`: the device part only
  "hostdevice", "plain"            `__host__ __device__` functions, torch-free helpers and
                                   constants: both parts
  "launching"                      a torch-free function that launches kernels itself: the device
                                   part, declared to the host part
  "host"                           what names torch: the host part only

On the way, the kernels and device variables are recorded in the `SplitState`, and the light torch
things device code names (c10's half types, at::opmath_type, the C10_ macros) in `needs`; any other
torch name in device code raises SplitError.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from kevin_backend.toolchain.cpp_text import (
    KERNEL_ATTRIBUTES, matching_end, split_top_level, template_head, top_level_index,
)
from kevin_backend.toolchain.cuda_items import Item
from kevin_backend.toolchain.kernel_declarations import Kernel, read_template_params, typed_params
from kevin_backend.toolchain.split_errors import SplitError

__all__ = ["SplitState", "classify_item", "check_device_torch", "kernels_first_declared_at"]

_TORCH = re.compile(r"\b(torch|at|c10|pybind11|py)::|\bTORCH_|\bAT_|\bC10_|\bPYBIND11|\bTensor\b")
_TORCH_INCLUDE = re.compile(r"#\s*include\s*[<\"](torch|ATen|c10|pybind11|Python)[/.]")
# Headers only nvcc can read: the device part alone gets them.
_DEVICE_INCLUDE = re.compile(r"#\s*include\s*[<\"](cub/|cooperative_groups|mma\.h|cuda/|thrust/|cuda_pipeline|cuda_awbarrier|"
                             r"sm_\d+_intrinsics|curand_kernel|curand_philox|device_launch_parameters)")
_DEVICE_ONLY_NAMES = re.compile(r"\b(cooperative_groups|cub|nvcuda|wmma|thrust|curandState\w*)\b")
_DEVICE = re.compile(r"\b(__device__|__constant__|__shared__|__managed__)\b")
_KERNEL = re.compile(r"__global__\s+" + KERNEL_ATTRIBUTES + r"void\s+" + KERNEL_ATTRIBUTES + r"(\w+)\s*\(")
_ATTRIBUTES = re.compile(r"\b(?:__align__|alignas|__launch_bounds__|__cluster_dims__|__maxnreg__|__attribute__|__declspec)"
                         r"\s*\((?:[^()]|\([^()]*\))*\)")

# Torch names device code may use, and what the device part then includes or defines.
_DEVICE_TORCH = {
    "at::Half": "half", "c10::Half": "half", "at::BFloat16": "bf16", "c10::BFloat16": "bf16",
    "at::opmath_type": "opmath", "at::OpMathType": "opmath", "c10::opmath_type": "opmath",
    "at::acc_type": "acc", "at::AccumulateType": "acc",
}
_DEVICE_MACROS = {
    "C10_WARP_SIZE", "C10_HOST_DEVICE", "C10_DEVICE", "C10_HOST", "C10_LAUNCH_BOUNDS_0", "C10_LAUNCH_BOUNDS_1",
    "C10_LAUNCH_BOUNDS_2", "C10_LIKELY", "C10_UNLIKELY", "C10_RESTRICT", "C10_ALWAYS_INLINE",
    "C10_MAX_THREADS_PER_BLOCK", "CUDA_KERNEL_ASSERT",
}
_TORCH_TOKEN = re.compile(r"\b(?:(?:torch|at|c10|pybind11|py)(?:\s*::\s*\w+)+|TORCH_\w+|AT_\w+|C10_\w+|CUDA_KERNEL_ASSERT|PYBIND11\w*|Tensor)\b")


@dataclass
class SplitState:
    """What the split learns of the file, stage by stage: the kernels and device variables (while
    the items are classified), then the host copies of the items host code holds."""

    items: list[Item]
    kernels: dict[str, list[Kernel]] = field(default_factory=dict)
    # device variable -> (item, typedef for the host part or "" when it cannot have one, __managed__)
    variables: dict[str, tuple[int, str, bool]] = field(default_factory=dict)
    host_copy: dict[int, str] = field(default_factory=dict)  # item -> host text (rewritten)


def classify_item(item: Item, index: int, state: SplitState, needs: set[str]) -> str:
    """The item's kind (module docstring); its kernels and device variables recorded in `state`,
    the light torch things it names added to `needs`."""
    b = item.blank
    if b.startswith("#"):
        if _TORCH_INCLUDE.search(item.text):
            return "pre-host"
        if _DEVICE_INCLUDE.search(item.text):
            return "pre-device"
        return "pre"
    kernel = _KERNEL.search(b)
    template = template_head(b)
    rest = b[template[1]:] if template else b
    head = _ATTRIBUTES.sub(" ", rest.split("{", 1)[0])
    is_type = bool(re.match(r"\s*(struct|class|union|enum|typedef|using)\b", rest)) and (
        "(" not in head or re.match(r"\s*(typedef|using)\b", rest) is not None)
    if re.match(r"\s*namespace\s+\w+\s*=", b):
        is_type = True
    if kernel is None and is_type:
        if _TORCH.search(b):
            light: set[str] = set()
            try:
                check_device_torch(b, light, "a type")
            except SplitError:
                if _DEVICE.search(b):
                    raise
                return "host"
            needs.update(light)
        if _DEVICE_ONLY_NAMES.search(b):
            return "device-type"
        return "type"
    if kernel:
        check_device_torch(b, needs, f"kernel {kernel.group(1)}")
        _record_kernels(item, index, state)
        return "kernel"
    if _DEVICE.search(b):
        what = "device code"
        check_device_torch(b, needs, what)
        decl_head = _declaration_head(rest)
        if "(" not in _ATTRIBUTES.sub(" ", decl_head):  # a variable
            if not re.search(r"\b__shared__\b", decl_head):
                _record_variable(item, index, state, decl_head)
            return "device"
        if re.search(r"\b__host__\b", decl_head):
            return "hostdevice"
        return "device"
    if _TORCH.search(b):
        return "host"
    if _DEVICE_ONLY_NAMES.search(b):
        return "device"
    if "<<<" in b and "{" in b and template is None:
        return "launching"
    return "plain"


def check_device_torch(blank: str, needs: set[str], what: str) -> None:
    """The light torch things device code `blank` names, added to `needs`; any other torch name
    raises SplitError saying that `what` names it."""
    for m in _TORCH_TOKEN.finditer(blank):
        token = re.sub(r"\s+", "", m.group(0))
        if token in _DEVICE_MACROS:
            needs.add("macros")
            continue
        key = next((v for k, v in _DEVICE_TORCH.items() if token == k or token.startswith(k + "::")), None)
        if key is None:
            raise SplitError(f"{what} names {token} (torch's headers, which the device part does not include)")
        needs.add(key)


def _declaration_head(blank: str) -> str:
    """A declaration's text up to its initializer, body or end."""
    depth = 0
    for i, ch in enumerate(blank):
        if ch in "([":
            depth += 1
        elif ch in ")]":
            depth -= 1
        elif depth == 0 and ch in "={;":
            return blank[:i]
    return blank


def _record_kernels(item: Item, index: int, state: SplitState) -> None:
    b = item.blank
    for kernel in _KERNEL.finditer(b):
        name = kernel.group(1)
        template = template_head(b)
        head, tparams = None, []
        if template is not None and template[1] <= kernel.start():
            head = item.text[b.index("<", b.index("template")) + 1:template[1] - 1].strip()
            tparams = read_template_params(template[0], f"kernel {name}")
        close = matching_end(b, kernel.end() - 1)
        params = split_top_level(item.text[kernel.end():close - 1])
        if params == ["void"]:
            params = []
        found = Kernel(name, item.ns, params, head, tparams, index)
        known = state.kernels.setdefault(name, [])
        if any(k.ns != item.ns for k in known):
            raise SplitError(f"two kernels named {name} in different namespaces")
        if not any(_signature(k) == _signature(found) for k in known):
            if known and (head is not None or any(k.template is not None for k in known)):
                raise SplitError(f"kernel template {name} is overloaded")
            known.append(found)


def _signature(kernel: Kernel) -> str:
    return re.sub(r"\s+", " ", ",".join(typed_params(kernel.name, kernel.params, names=False)) + "|" + (kernel.template or ""))


def _record_variable(item: Item, index: int, state: SplitState, decl_head: str) -> None:
    managed = bool(re.search(r"\b__managed__\b", decl_head))
    text = re.sub(r"\b(__constant__|__device__|__managed__|static|extern|inline)\b", " ", decl_head)
    text = _ATTRIBUTES.sub(lambda m: m.group(0) if m.group(0).startswith(("__align__", "alignas")) else " ", text)
    if top_level_index(text, ",") >= 0:
        for name in re.findall(r"(\w+)\s*(?:\[[^\]]*\]\s*)*(?:,|$)", text.strip()):
            state.variables[name] = (index, "", managed)  # several in one declaration: no host reference
        return
    m = re.fullmatch(r"\s*(.*?)\b(\w+)\s*((?:\[[^\]]*\]\s*)*)", text, re.S)
    if m is None or not m.group(1).strip():
        return
    name = m.group(2)
    state.variables[name] = (index, f"typedef {m.group(1).strip()} kevin_type_{name}{m.group(3).strip()};", managed)


def kernels_first_declared_at(state: SplitState, index: int) -> list[Kernel]:
    """The kernels item `index` declares first (the host part declares their launchers after it)."""
    return [k for ks in state.kernels.values() for k in ks if k.first == index]
