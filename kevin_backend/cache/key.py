"""Cache keys: what a verified kernel is valid for.

A key covers the task's computation (`KernelTask.graph_hash`: ops and constants, not names), the
exact input specs (shapes, strides, dtypes: a kernel is used only on what it was verified on), the
GPU (name and compute capability), the torch and CUDA versions, the numerics settings that bear on
the task (see `numerics_settings`: torch's numerics switches and Inductor's mode and config
patches), and the key schema version. It is an explicit dict, printable, and its digest names the
cache entry. The GPU is the one the task's tensors are on (`make_key`'s device), never read from
the current device.

Entries made before a setting entered the key stay readable: their key is read back as it was
written, and a key made now for the same task under the new rules simply has another digest, so
the old entry misses (it is never misread or fatal). Settings at their default that entered later
(`cudnn_benchmark` off, Inductor's config unpatched) are left out of the key where that keeps the
keys of the tasks they bear on unchanged, and schema 2 stays: the seed cache keeps hitting.
"""

from __future__ import annotations

import contextlib
import dataclasses
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
    "inductor_config",
    "tensors_device",
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
    "environment_changes",
]

# Bump when the key's contents or the meaning of an entry change: old entries stop matching.
# 1: graph, inputs, GPU, capability, torch, CUDA.
# 2: + "numerics", the TF32 / reduced-precision / cuDNN / determinism settings the task depends on;
#    later within 2, without a bump (the keys made before miss, see the module docstring):
#    cudnn_benchmark for cuDNN tasks, every setting for a task whose ops are unknown (a program),
#    and inductor_config wherever Inductor's config is not its default.
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
    "cudnn_benchmark": (
        "torch.backends.cudnn.benchmark: eager and Inductor's extern convolutions time cuDNN's "
        "algorithms and run the fastest, so the baseline a kernel beat is another (faster) one. "
        "Tasks with cuDNN ops only."
    ),
    "deterministic_algorithms": (
        "torch.are_deterministic_algorithms_enabled(): the user asked for reproducible results; "
        "Inductor generates other code under it (its own cache key includes it), and a kernel "
        "chosen without it (atomics, split reductions) need not be deterministic. Every task."
    ),
    "inductor_config": (
        "torch._inductor.config where it differs from Inductor's defaults (`inductor_config`): "
        "torch.compile's mode (max-autotune's autotuning, reduce-overhead's CUDA graphs) and any "
        "config patch change the code Inductor makes, the baseline a kernel must beat. Every task, "
        "recorded only when some entry is not its default."
    ),
}
# Left out on purpose: allow_fp16_bf16_reduction_math_sdp, fill_uninitialized_memory and the like
# (no op a writer declares reaches them).

_MATMUL_SETTINGS = (
    "matmul_tf32",
    "float32_matmul_precision",
    "fp16_reduced_precision_reduction",
    "bf16_reduced_precision_reduction",
)
_CUDNN_SETTINGS = ("cudnn_enabled", "cudnn_tf32", "cudnn_deterministic", "cudnn_benchmark")

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


# Inductor's config entries that are no setting of the code it makes: the ones its own cache key
# leaves out (custom passes, which are objects, caches, paths, tracing), and ours.
_INDUCTOR_IGNORED = ("post_grad_custom_pre_pass", "post_grad_custom_post_pass", "trace.", "compile_threads")


def _inductor_entries() -> tuple[Any, dict[str, Any], tuple[str, ...]]:
    """(Inductor's config module, its entries by name, the prefixes left out of keys)."""
    from torch._inductor import config

    ignored = tuple(getattr(config, "_cache_config_ignore_prefix", ())) + _INDUCTOR_IGNORED
    not_compiled = set(getattr(config, "_compile_ignored_keys", ()))  # what Inductor's hash leaves out too
    entries = {name: entry for name, entry in getattr(config, "_config", {}).items() if name not in not_compiled}
    return config, entries, ignored


def _plain_default(entry: Any) -> tuple[bool, Any]:
    """(True, the default) when `entry` declares a plain default; (False, None) for one computed
    at run time (torch marks those with a sentinel object)."""
    default = getattr(entry, "default", None)
    if type(default) is object:
        return False, None
    return True, default


def _jsonable(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if callable(value):  # a function's address is no setting: its name is
        return f"<{getattr(value, '__module__', '')}.{getattr(value, '__qualname__', type(value).__name__)}>"
    return repr(value)


def inductor_config(patches: Mapping[str, Any] | None = None) -> str:
    """Inductor's config entries that differ from their defaults, with `patches` (a compile's
    `config_patches`, e.g. its mode's options) applied over the live config: canonical JSON, "{}"
    for default Inductor. Inside an Inductor compile (the kevin pass) the live config already
    holds the compile's patches. Entries Inductor's own cache key leaves out (custom passes,
    caches, paths, tracing) are left out here too."""
    from torch._inductor import config

    with config.patch(dict(patches)) if patches else contextlib.nullcontext():
        return _changed_entries()


def _changed_entries() -> str:
    """`inductor_config` of the live config."""
    config, entries, ignored = _inductor_entries()
    try:  # the entries set by hand, from the config module's own cached export (microseconds)
        values = config._get_dict(ignored_prefixes=list(ignored), skip_default=True, readonly_values=True)
    except (AttributeError, TypeError):  # a torch without it: every entry read (milliseconds)
        values = {}
        for name in entries:
            try:
                values[name] = getattr(config, name)
            except AttributeError:
                continue
    changed: dict[str, Any] = {}
    for name, value in values.items():
        if name not in entries or name.startswith(ignored):
            continue
        plain, default = _plain_default(entries[name])
        if plain and value != default:
            changed[name] = _jsonable(value)
    return json.dumps(changed, sort_keys=True)


def _apply_inductor_config(text: str) -> None:
    """Inductor's config as `inductor_config` wrote it: the named entries set, every other entry
    that is not its default set back to it. Entries this torch lacks, and values JSON cannot
    carry back (objects, written as their name), are skipped."""
    config, entries, ignored = _inductor_entries()
    wanted = json.loads(text)
    for name in json.loads(_changed_entries()):
        if name not in wanted:
            setattr(config, name, _plain_default(entries[name])[1])
    for name, value in wanted.items():
        if name not in entries or name.startswith(ignored):
            continue
        default = _plain_default(entries[name])[1]
        if isinstance(default, tuple) and isinstance(value, list):
            value = tuple(value)
        if value is None or default is None or isinstance(value, type(default)) or (
                isinstance(default, float) and isinstance(value, int)):
            if not (isinstance(value, str) and value.startswith("<") and not isinstance(default, str)):
                setattr(config, name, value)


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
        "cudnn_benchmark": bool(cudnn.benchmark),
        "deterministic_algorithms": bool(torch.are_deterministic_algorithms_enabled()),
        "inductor_config": inductor_config(),
    }


def _relevant(ops: Iterable[str], settings: Mapping[str, Setting]) -> dict[str, Setting]:
    """The settings of `settings` a task with `ops` depends on. No ops (a task made from a
    KernelBench program, whose ops are not known): every switch, since any may bear on it."""
    ops = tuple(ops)
    names = ["deterministic_algorithms"]
    if not ops or _uses_matmul(ops):
        names += _MATMUL_SETTINGS
    if not ops or _uses_cudnn(ops):
        names += _CUDNN_SETTINGS
    if settings.get("inductor_config", "{}") != "{}":
        names.append("inductor_config")
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
    "cudnn_benchmark": False,
    "deterministic_algorithms": False,
    "inductor_config": "{}",
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
    if "cudnn_benchmark" in settings:
        cudnn.benchmark = bool(settings["cudnn_benchmark"])
    if "deterministic_algorithms" in settings:
        torch.use_deterministic_algorithms(bool(settings["deterministic_algorithms"]))
    if "inductor_config" in settings:  # the baseline compiled under the config the key names
        _apply_inductor_config(str(settings["inductor_config"]))


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
    def detect(device_type: str = "cuda", index: int | None = None) -> "DeviceInfo":
        """The device `device_type`:`index`. A CUDA device named without an index is the current
        one (where torch puts a tensor made on "cuda"), read at each call; a device named with
        its index never reads the current device."""
        if device_type == "cuda" and index is None and torch.cuda.is_available():
            index = torch.cuda.current_device()
        return _detect(device_type, index)


@functools.lru_cache(maxsize=None)
def _detect(device_type: str, index: int | None) -> DeviceInfo:
    torch_version = torch.__version__.split("+")[0]
    cuda_version = torch.version.cuda or ""
    if device_type == "cuda" and torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability(index)
        return DeviceInfo(torch.cuda.get_device_name(index), f"{major}.{minor}", torch_version, cuda_version)
    return DeviceInfo(device_type, "", torch_version, cuda_version)


# `DeviceInfo.detect.cache_clear()`: forget the devices seen (tests that fake a machine's GPUs)
DeviceInfo.detect.cache_clear = _detect.cache_clear  # type: ignore[attr-defined]


def tensors_device(values: Iterable[Any]) -> torch.device | None:
    """The device of the first tensor among `values` (real or fake: a fake tensor reports the
    device it stands for), None when there is none: what a key names as its GPU."""
    for value in values:
        if isinstance(value, torch.Tensor):
            return value.device
    return None


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

    def same_task(self, other: "CacheKey") -> bool:
        """True when `other` names the same task as this key (computation, inputs, numerics,
        schema) whatever GPU, torch and CUDA each was made for: a kernel verified under one is a
        known candidate for the other, to be judged again there (`kevin cache revalidate`)."""
        return (self.graph, self.inputs, self.numerics, self.schema) == (
            other.graph, other.inputs, other.numerics, other.schema)

    def on_device(self, device: DeviceInfo) -> "CacheKey":
        """This key's task on `device`: its GPU, capability, torch and CUDA versions, what
        `make_key` names for the task there (the numerics stay: the task is judged under them)."""
        return dataclasses.replace(self, gpu=device.name, capability=device.capability,
                                   torch_version=device.torch_version, cuda_version=device.cuda_version)


def is_digest(text: str) -> bool:
    """True when `text` has the shape of a CacheKey digest (32 lowercase hex digits)."""
    return _DIGEST_RE.fullmatch(text) is not None


def environment_changes(old: CacheKey, new: CacheKey) -> tuple[str, ...]:
    """How `new`'s environment differs from `old`'s, one phrase each ("torch 2.11.0 -> 2.13.0",
    "CUDA 13.0 -> 12.8", "GPU NVIDIA H200 (9.0) -> NVIDIA A100 (8.0)"); empty when they match."""
    changes = []
    if old.torch_version != new.torch_version:
        changes.append(f"torch {old.torch_version or '?'} -> {new.torch_version or '?'}")
    if old.cuda_version != new.cuda_version:
        changes.append(f"CUDA {old.cuda_version or 'none'} -> {new.cuda_version or 'none'}")
    if (old.gpu, old.capability) != (new.gpu, new.capability):
        def gpu(key: CacheKey) -> str:
            return key.gpu + (f" ({key.capability})" if key.capability else "")

        changes.append(f"GPU {gpu(old)} -> {gpu(new)}")
    return tuple(changes)


def make_key(
    task: KernelTask,
    device: DeviceInfo | torch.device | str | None = None,
    numerics: Mapping[str, Setting] | None = None,
) -> CacheKey:
    """The cache key of `task` on `device`, under `numerics` (this process's current settings
    for the task's ops when omitted).

    `device` is the device the task's tensors are on (the one the judge times on): a torch
    device ("cuda:1") is detected as that GPU, whatever the current device is. When omitted,
    the device type of the task's inputs (their specs carry no index), a CUDA one being the
    current device, where a program task's tensors are placed."""
    if not isinstance(device, DeviceInfo):
        if device is None:
            device = torch.device(task.inputs[0].device if task.inputs else "cpu")
        device = torch.device(device)
        device = DeviceInfo.detect(device.type, device.index)
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
