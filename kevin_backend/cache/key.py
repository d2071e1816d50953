"""Cache keys: what a verified kernel is valid for.

A key covers the task's computation (`KernelTask.graph_hash`: ops and constants, not names), the
exact input specs (shapes, strides, dtypes: a kernel is used only on what it was verified on), the
GPU (name and compute capability), the torch and CUDA versions, the numerics settings that bear on
the task (see `numerics_settings`), and the key schema version. It is an explicit dict, printable,
and its digest names the cache entry.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Union

import torch

from kevin_backend.types import KernelTask, TensorSpec

__all__ = [
    "SCHEMA_VERSION",
    "DeviceInfo",
    "CacheKey",
    "make_key",
    "numerics_settings",
    "default_numerics",
    "current_numerics",
    "apply_numerics",
    "NUMERICS_DOC",
    "VersionTarget",
    "is_digest",
]

# Bump when the key's contents or the meaning of an entry change: old entries stop matching.
# 1: graph, inputs, GPU, capability, torch, CUDA.
# 2: + "numerics", the TF32 / reduced-precision / cuDNN / determinism settings the task depends on.
SCHEMA_VERSION = 2

# The shape of `CacheKey.digest`; digests become path components, so nothing else may pass.
_DIGEST_RE = re.compile(r"[0-9a-f]{32}")

Setting = Union[bool, str]

# Why each setting is in the key. A kernel is verified against eager's output (the judge's bound
# scales with eager's own error) and kept only when it beats Inductor's code for the same task:
# a setting belongs in the key when it changes eager's numerics for the task (so the bound the
# kernel passed) or the code Inductor generates or calls for it (so the baseline it beat). The
# kernel itself is hand-written CUDA and reads none of them. Settings are recorded only for tasks
# whose ops they can affect, so that turning TF32 on (as torch.compile itself suggests) does not
# make every pointwise or norm entry miss.
NUMERICS_DOC: dict[str, str] = {
    "matmul_tf32": (
        "torch.backends.cuda.matmul.allow_tf32 (or matmul.fp32_precision == 'tf32'): float32 "
        "matmuls through cuBLAS in TF32 (10-bit mantissa) change eager's result, hence the judge's "
        "bound, and Inductor's Triton matmul templates are generated with ALLOW_TF32 from it. "
        "Matmul tasks only."
    ),
    "float32_matmul_precision": (
        "torch.get_float32_matmul_precision(): 'highest', 'high' (TF32) or 'medium' (bf16 inside "
        "float32 matmuls where a backend has it); Inductor keys its matmul autotuning on it. "
        "Matmul tasks only."
    ),
    "fp16_reduced_precision_reduction": (
        "torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction: cuBLAS may reduce fp16 "
        "matmuls in fp16, changing eager's result; Inductor's cache key includes it. Matmul tasks only."
    ),
    "bf16_reduced_precision_reduction": (
        "torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction: the same for bf16. "
        "Matmul tasks only."
    ),
    "cudnn_enabled": (
        "torch.backends.cudnn.enabled: whether eager and Inductor's extern calls run cuDNN's "
        "convolutions (and batch norms, RNNs) or PyTorch's native ones, with other numerics and "
        "speed. Tasks with cuDNN ops only."
    ),
    "cudnn_tf32": (
        "torch.backends.cudnn.allow_tf32 (or cudnn.conv.fp32_precision == 'tf32'): float32 "
        "convolutions in TF32 (torch's default: on); Inductor's convolution templates read it as "
        "ALLOW_TF32. Tasks with cuDNN ops only."
    ),
    "cudnn_deterministic": (
        "torch.backends.cudnn.deterministic: only deterministic cuDNN algorithms, another summation "
        "order and speed for eager and Inductor's extern convolutions. Tasks with cuDNN ops only."
    ),
    "deterministic_algorithms": (
        "torch.are_deterministic_algorithms_enabled(): the user asked for reproducible results; "
        "Inductor generates other code under it (its own cache key includes it), and a kernel "
        "chosen without it (atomics, split reductions) need not be deterministic. Every task."
    ),
}
# Left out on purpose: torch.backends.cudnn.benchmark (it picks, at run time, among the
# algorithms the settings above allow: the same precision, neither Inductor's code nor the
# task's numerics class changes; keying on it would split the cache on a speed switch), and
# allow_fp16_bf16_reduction_math_sdp, fill_uninitialized_memory and the like (no op a writer
# declares reaches them).

_MATMUL_SETTINGS = (
    "matmul_tf32",
    "float32_matmul_precision",
    "fp16_reduced_precision_reduction",
    "bf16_reduced_precision_reduction",
)
_CUDNN_SETTINGS = ("cudnn_enabled", "cudnn_tf32", "cudnn_deterministic")

# Ops (their aten name without namespace and overload) that reach cuBLAS matmuls / cuDNN.
_MATMUL_OP = re.compile(
    r"(mm|addmm|bmm|baddbmm|addbmm|matmul|linear|mv|addmv|dot|vdot|einsum|tensordot|_scaled_mm|_int_mm"
    r"|_addmm_activation|_scaled_dot_product\w*|_flash_attention\w*|_efficient_attention\w*)"
)
_CUDNN_OP = re.compile(
    r"(_?convolution\w*|conv[123]d|conv_transpose[123]d|conv_tbc|_?cudnn\w*|\w*batch_norm\w*"
    r"|\w*rnn\w*|\w*lstm\w*|\w*gru\w*|\w*ctc_loss\w*|grid_sampler\w*|affine_grid\w*)"
)


def _base_name(op: str) -> str:
    """'mm' for 'aten.mm.default', 'convert_element_type' for 'prims.convert_element_type.default'."""
    parts = op.split(".")
    return parts[1] if len(parts) >= 2 else op


def _uses_matmul(ops: Iterable[str]) -> bool:
    return any(_MATMUL_OP.fullmatch(_base_name(op)) for op in ops)


def _uses_cudnn(ops: Iterable[str]) -> bool:
    return any(_CUDNN_OP.fullmatch(_base_name(op)) for op in ops)


def _new_api_precision(*chain: tuple[str, str]) -> str | None:
    """The first explicit value of torch's `fp32_precision` settings along `chain` (the op's own,
    then its backend's, then the global one); None when all say 'none' or torch lacks them."""
    getter = getattr(torch._C, "_get_fp32_precision_getter", None)
    if getter is None:
        return None
    for backend, op in chain:
        try:
            value = str(getter(backend, op))
        except (RuntimeError, TypeError, ValueError):
            continue
        if value != "none":
            return value
    return None


def _matmul_tf32() -> bool:
    # The legacy getter raises once the new fp32_precision API was used for cuBLAS: read that then.
    try:
        return bool(torch.backends.cuda.matmul.allow_tf32)
    except RuntimeError:
        return _new_api_precision(("cuda", "matmul"), ("cuda", "all"), ("generic", "all")) == "tf32"


def _float32_matmul_precision(tf32: bool) -> str:
    try:
        return str(torch.get_float32_matmul_precision())
    except RuntimeError:  # new and legacy APIs mixed: what the new one says, in the old words
        return "high" if tf32 else "highest"


def _cudnn_tf32() -> bool:
    try:
        return bool(torch.backends.cudnn.allow_tf32)
    except RuntimeError:
        value = _new_api_precision(("cuda", "conv"), ("cuda", "all"), ("generic", "all"))
        return True if value is None else value == "tf32"


def _all_settings() -> dict[str, Setting]:
    """Every setting of NUMERICS_DOC as this process has it now."""
    tf32 = _matmul_tf32()
    matmul = torch.backends.cuda.matmul
    cudnn = torch.backends.cudnn
    return {
        "matmul_tf32": tf32,
        "float32_matmul_precision": _float32_matmul_precision(tf32),
        "fp16_reduced_precision_reduction": bool(matmul.allow_fp16_reduced_precision_reduction),
        "bf16_reduced_precision_reduction": bool(matmul.allow_bf16_reduced_precision_reduction),
        "cudnn_enabled": bool(cudnn.enabled),
        "cudnn_tf32": _cudnn_tf32(),
        "cudnn_deterministic": bool(cudnn.deterministic),
        "deterministic_algorithms": bool(torch.are_deterministic_algorithms_enabled()),
    }


def _relevant(ops: Iterable[str], settings: Mapping[str, Setting]) -> dict[str, Setting]:
    ops = tuple(ops)
    names = ["deterministic_algorithms"]
    if _uses_matmul(ops):
        names += _MATMUL_SETTINGS
    if _uses_cudnn(ops):
        names += _CUDNN_SETTINGS
    return {name: settings[name] for name in sorted(names)}


def numerics_settings(ops: Iterable[str]) -> dict[str, Setting]:
    """The settings (NUMERICS_DOC) a task with these ops depends on, as this process has them now.

    Read at every call, not cached: they are global switches a program may flip between compiles.
    """
    return _relevant(ops, _all_settings())


# torch's defaults (2.x): what an entry made without touching any switch was made under.
_DEFAULTS: dict[str, Setting] = {
    "matmul_tf32": False,
    "float32_matmul_precision": "highest",
    "fp16_reduced_precision_reduction": True,
    "bf16_reduced_precision_reduction": True,
    "cudnn_enabled": True,
    "cudnn_tf32": True,
    "cudnn_deterministic": False,
    "deterministic_algorithms": False,
}


def current_numerics() -> dict[str, Setting]:
    """Every setting of NUMERICS_DOC as this process has it now (what `apply_numerics` restores)."""
    return _all_settings()


def apply_numerics(settings: Mapping[str, Setting]) -> None:
    """Set this process's switches to `settings` (names of NUMERICS_DOC; others are ignored), so
    that a task is judged under the numerics its key names. The judge's workers apply a key's
    settings before a run and restore their own before the next one."""
    matmul, cudnn = torch.backends.cuda.matmul, torch.backends.cudnn
    if "float32_matmul_precision" in settings:
        torch.set_float32_matmul_precision(str(settings["float32_matmul_precision"]))
    if "matmul_tf32" in settings:
        matmul.allow_tf32 = bool(settings["matmul_tf32"])
    if "fp16_reduced_precision_reduction" in settings:
        matmul.allow_fp16_reduced_precision_reduction = bool(settings["fp16_reduced_precision_reduction"])
    if "bf16_reduced_precision_reduction" in settings:
        matmul.allow_bf16_reduced_precision_reduction = bool(settings["bf16_reduced_precision_reduction"])
    if "cudnn_enabled" in settings:
        cudnn.enabled = bool(settings["cudnn_enabled"])
    if "cudnn_tf32" in settings:
        cudnn.allow_tf32 = bool(settings["cudnn_tf32"])
    if "cudnn_deterministic" in settings:
        cudnn.deterministic = bool(settings["cudnn_deterministic"])
    if "deterministic_algorithms" in settings:
        torch.use_deterministic_algorithms(bool(settings["deterministic_algorithms"]))


def default_numerics(ops: Iterable[str]) -> dict[str, Setting]:
    """The settings a task with these ops has under torch's defaults (nothing switched)."""
    return _relevant(ops, _DEFAULTS)


@dataclass(frozen=True)
class DeviceInfo:
    """The device a kernel runs on and the software it was built with."""

    name: str  # "NVIDIA H200", or "cpu"
    capability: str  # "9.0"; "" for CPU
    torch_version: str
    cuda_version: str  # "" when torch has no CUDA

    @staticmethod
    @functools.lru_cache(maxsize=None)
    def detect(device_type: str = "cuda", index: int | None = None) -> "DeviceInfo":
        torch_version = torch.__version__.split("+")[0]
        cuda_version = torch.version.cuda or ""
        if device_type == "cuda" and torch.cuda.is_available():
            idx = torch.cuda.current_device() if index is None else index
            major, minor = torch.cuda.get_device_capability(idx)
            return DeviceInfo(torch.cuda.get_device_name(idx), f"{major}.{minor}", torch_version, cuda_version)
        return DeviceInfo(device_type, "", torch_version, cuda_version)


def _check_settings(data: Any) -> tuple[tuple[str, Setting], ...]:
    if not isinstance(data, Mapping):
        raise TypeError(f"numerics must be an object, not {type(data).__name__}")
    for name, value in data.items():
        if not isinstance(name, str) or not isinstance(value, (bool, str)):
            raise TypeError(f"numerics setting {name!r} must map a name to a bool or a string, not {value!r}")
    return tuple(sorted(data.items()))


@dataclass(frozen=True)
class CacheKey:
    graph: str
    inputs: tuple[TensorSpec, ...]
    gpu: str
    capability: str
    torch_version: str
    cuda_version: str
    schema: int = SCHEMA_VERSION
    # (name, value) pairs, sorted: the numerics settings the task depends on (numerics_settings)
    numerics: tuple[tuple[str, Setting], ...] = ()

    def __post_init__(self) -> None:
        if isinstance(self.numerics, Mapping):
            object.__setattr__(self, "numerics", _check_settings(self.numerics))
        else:
            object.__setattr__(self, "numerics", _check_settings(dict(self.numerics)))

    def as_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "graph": self.graph,
            "inputs": [s.as_dict() for s in self.inputs],
            "gpu": self.gpu,
            "capability": self.capability,
            "torch": self.torch_version,
            "cuda": self.cuda_version,
            "numerics": dict(self.numerics),
            "schema": self.schema,
        }
        if self.schema < 2:  # schema 1 had no numerics: its keys keep their dict and digest
            del data["numerics"]
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "CacheKey":
        """The key `as_dict` wrote; a key of schema 1 (no "numerics") reads back as schema 1, so
        the store can say it is stale rather than malformed."""
        return cls(
            graph=str(data["graph"]),
            inputs=tuple(TensorSpec.from_dict(d) for d in data["inputs"]),
            gpu=str(data["gpu"]),
            capability=str(data["capability"]),
            torch_version=str(data["torch"]),
            cuda_version=str(data["cuda"]),
            schema=int(data["schema"]),
            numerics=_check_settings(data.get("numerics", {})),
        )

    @functools.cached_property
    def digest(self) -> str:
        """A stable 32-hex-digit name for this key (the entry's folder name)."""
        text = json.dumps(self.as_dict(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()[:32]

    def __str__(self) -> str:
        return json.dumps(self.as_dict(), indent=2, sort_keys=True)


def is_digest(text: str) -> bool:
    """True when `text` has the shape of a CacheKey digest (32 lowercase hex digits)."""
    return _DIGEST_RE.fullmatch(text) is not None


def make_key(
    task: KernelTask, device: DeviceInfo | None = None, numerics: Mapping[str, Setting] | None = None
) -> CacheKey:
    """The cache key of `task` on `device` (detected from the task's inputs when omitted), under
    `numerics` (this process's current settings for the task's ops when omitted)."""
    if device is None:
        device_type = task.inputs[0].device if task.inputs else "cpu"
        device = DeviceInfo.detect(device_type)
    if numerics is None:
        numerics = numerics_settings(task.ops)
    return CacheKey(
        graph=task.graph_hash,
        inputs=task.inputs,
        gpu=device.name,
        capability=device.capability,
        torch_version=device.torch_version,
        cuda_version=device.cuda_version,
        numerics=_check_settings(numerics),
    )


@dataclass(frozen=True)
class VersionTarget:
    """The GPU and versions whose entries a machine can use (`kevin cache prune`, `info`).

    A field that is None is not compared: a machine without a GPU cannot say which GPU's entries
    it will use, and a torch without CUDA which CUDA version's. Entries made for the CPU (`gpu`
    "cpu": tasks on CPU tensors) are never told apart by GPU, since every machine has a CPU.
    """

    gpu: str | None = None
    capability: str | None = None  # compared only when gpu is set
    torch_version: str | None = None
    cuda_version: str | None = None

    @classmethod
    def this_machine(
        cls, gpu: str | None = None, torch_version: str | None = None, cuda_version: str | None = None
    ) -> "VersionTarget":
        """This machine's GPU (its first), torch and CUDA, each replaced by the value given."""
        device = DeviceInfo.detect("cuda")
        has_gpu = device.capability != ""
        if gpu is None and has_gpu:
            gpu, capability = device.name, device.capability
        else:
            capability = None  # a GPU named by hand: any capability of that name
        return cls(
            gpu=gpu,
            capability=capability,
            torch_version=(torch_version or device.torch_version).split("+")[0],
            cuda_version=cuda_version or device.cuda_version or None,
        )

    def mismatch(self, key: CacheKey) -> tuple[str, str] | None:
        """(what, why) when an entry with `key` cannot be used here, None when it can.

        `what` is one of "schema" (an older kevin_backend's key), "newer" (a newer one's, not
        ours to judge), "torch", "cuda", "gpu"."""
        if key.schema < SCHEMA_VERSION:
            return "schema", f"key schema {key.schema}, from an older kevin_backend (this one reads {SCHEMA_VERSION})"
        if key.schema > SCHEMA_VERSION:
            return "newer", f"key schema {key.schema}, from a newer kevin_backend (this one reads {SCHEMA_VERSION})"
        if self.torch_version is not None and key.torch_version != self.torch_version:
            return "torch", f"torch {key.torch_version or '?'}, not {self.torch_version}"
        if self.cuda_version is not None and key.gpu != "cpu" and key.cuda_version != self.cuda_version:
            return "cuda", f"CUDA {key.cuda_version or 'none'}, not {self.cuda_version}"
        if self.gpu is not None and key.gpu != "cpu":
            if key.gpu != self.gpu:
                return "gpu", f"GPU {key.gpu}, not {self.gpu}"
            if self.capability is not None and key.capability != self.capability:
                return "gpu", f"GPU {key.gpu} of capability {key.capability}, not {self.capability}"
        return None

    def describe(self) -> str:
        """'NVIDIA H200 (9.0), torch 2.11.0, CUDA 13.0'; 'any GPU, ...' for what is not compared."""
        if self.gpu is None:
            gpu = "any GPU"
        else:
            gpu = self.gpu + (f" ({self.capability})" if self.capability else "")
        torch_text = f"torch {self.torch_version}" if self.torch_version else "any torch"
        cuda_text = f"CUDA {self.cuda_version}" if self.cuda_version else "any CUDA"
        return f"{gpu}, {torch_text}, {cuda_text}"
