"""Cache keys: what a verified kernel is valid for.

A key covers the task's computation (`KernelTask.graph_hash`: ops and constants, not names), the
exact input specs (shapes, strides, dtypes: a kernel is used only on what it was verified on), the
GPU (name and compute capability), the torch and CUDA versions, and the key schema version. It is
an explicit dict, printable, and its digest names the cache entry.
"""

from __future__ import annotations

import functools
import hashlib
import json
from dataclasses import dataclass
from typing import Any

import torch

from kevin_backend.types import KernelTask, TensorSpec

__all__ = ["SCHEMA_VERSION", "DeviceInfo", "CacheKey", "make_key"]

# Bump when the key's contents or the meaning of an entry change: old entries stop matching.
SCHEMA_VERSION = 1


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


@dataclass(frozen=True)
class CacheKey:
    graph: str
    inputs: tuple[TensorSpec, ...]
    gpu: str
    capability: str
    torch_version: str
    cuda_version: str
    schema: int = SCHEMA_VERSION

    def as_dict(self) -> dict[str, Any]:
        return {
            "graph": self.graph,
            "inputs": [s.as_dict() for s in self.inputs],
            "gpu": self.gpu,
            "capability": self.capability,
            "torch": self.torch_version,
            "cuda": self.cuda_version,
            "schema": self.schema,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "CacheKey":
        return cls(
            graph=str(data["graph"]),
            inputs=tuple(TensorSpec.from_dict(d) for d in data["inputs"]),
            gpu=str(data["gpu"]),
            capability=str(data["capability"]),
            torch_version=str(data["torch"]),
            cuda_version=str(data["cuda"]),
            schema=int(data["schema"]),
        )

    @functools.cached_property
    def digest(self) -> str:
        """A stable 32-hex-digit name for this key (the entry's folder name)."""
        text = json.dumps(self.as_dict(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()[:32]

    def __str__(self) -> str:
        return json.dumps(self.as_dict(), indent=2, sort_keys=True)


def make_key(task: KernelTask, device: DeviceInfo | None = None) -> CacheKey:
    """The cache key of `task` on `device` (detected from the task's inputs when omitted)."""
    if device is None:
        device_type = task.inputs[0].device if task.inputs else "cpu"
        device = DeviceInfo.detect(device_type)
    return CacheKey(
        graph=task.graph_hash,
        inputs=task.inputs,
        gpu=device.name,
        capability=device.capability,
        torch_version=device.torch_version,
        cuda_version=device.cuda_version,
    )
