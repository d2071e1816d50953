"""The values that pass between stages: tensor specs and kernel tasks."""

from __future__ import annotations

import contextlib
import types
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["TensorSpec", "KernelTask", "channels_last_form", "dtype_from_name", "load_program", "placement_device"]


def dtype_from_name(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown dtype name {name!r}")
    return dtype


@dataclass(frozen=True)
class TensorSpec:
    """Shape, strides, dtype and device type of one tensor (concrete sizes only)."""

    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: str  # torch dtype name without the "torch." prefix, e.g. "float32"
    device: str  # device type, e.g. "cuda" or "cpu"

    @classmethod
    def of(cls, tensor: torch.Tensor) -> "TensorSpec":
        return cls(
            shape=tuple(int(s) for s in tensor.shape),
            stride=tuple(int(s) for s in tensor.stride()),
            dtype=str(tensor.dtype).removeprefix("torch."),
            device=tensor.device.type,
        )

    @property
    def torch_dtype(self) -> torch.dtype:
        return dtype_from_name(self.dtype)

    def as_dict(self) -> dict[str, Any]:
        return {"shape": list(self.shape), "stride": list(self.stride), "dtype": self.dtype, "device": self.device}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "TensorSpec":
        return cls(tuple(data["shape"]), tuple(data["stride"]), str(data["dtype"]), str(data["device"]))


@dataclass(frozen=True)
class KernelTask:
    """One partition as a standalone KernelBench-format program.

    `source` defines `Model` (the partition's exact computation), `get_inputs()` and
    `get_init_inputs()`; it imports only torch and runs on its own. `graph_hash` covers the
    program's computation (ops, constants, arity) but not names: two partitions that compute the
    same thing on the same input specs have the same hash.
    """

    name: str
    source: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    ops: tuple[str, ...]
    graph_hash: str

    def load(self) -> types.ModuleType:
        """Execute the program in a fresh module and return it (has Model, get_inputs, ...)."""
        return load_program(self.source, f"kevin_task_{self.name}")

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "inputs": [s.as_dict() for s in self.inputs],
            "outputs": [s.as_dict() for s in self.outputs],
            "ops": list(self.ops),
            "graph_hash": self.graph_hash,
        }

    @classmethod
    def from_program(cls, name: str, source: str, device: str | torch.device | None = None) -> "KernelTask":
        """A task from a KernelBench-format program file; its hash covers the program text (it has
        no graph). Its inputs are placed as the judge places them, on `device` (default: the
        current CUDA device, else the CPU), whatever device the program makes them on; the input
        and output specs come from a run on fake tensors (no memory, no compute), or from a real
        run where the program needs real values."""
        import hashlib

        module = load_program(source, f"kevin_task_{name}")
        for attr in ("Model", "get_inputs", "get_init_inputs"):
            if not hasattr(module, attr):
                raise ValueError(f"task {name} defines no {attr}")
        inputs, outs = _program_specs(module, placement_device(device))
        digest = hashlib.sha256(b"kernelbench-program\0" + source.encode()).hexdigest()
        return cls(name, source, inputs, outs, (), digest)

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str) -> "KernelTask":
        return cls(
            name=str(data["name"]),
            source=source,
            inputs=tuple(TensorSpec.from_dict(d) for d in data["inputs"]),
            outputs=tuple(TensorSpec.from_dict(d) for d in data["outputs"]),
            ops=tuple(data["ops"]),
            graph_hash=str(data["graph_hash"]),
        )


def placement_device(device: str | torch.device | None = None) -> torch.device:
    """The device a task's tensors go to: `device`, else the current CUDA device, else the CPU."""
    if device is not None:
        device = torch.device(device)
        if device.type == "cuda" and device.index is None and torch.cuda.is_available():
            device = torch.device("cuda", torch.cuda.current_device())
        return device
    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")


def _program_specs(module: types.ModuleType, device: torch.device) -> tuple[tuple[TensorSpec, ...], tuple[TensorSpec, ...]]:
    """The specs of a program's inputs and outputs, placed on `device`."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from kevin_backend.placement import placed_on

    # fake tensors of a CUDA device need CUDA; without it, the CPU stands in (same specs)
    run_on = device if device.type != "cuda" or torch.cuda.is_available() else torch.device("cpu")

    def specs(fake: bool) -> tuple[tuple[TensorSpec, ...], tuple[TensorSpec, ...]]:
        mode = FakeTensorMode(allow_non_fake_inputs=True) if fake else contextlib.nullcontext()
        with mode, torch.no_grad():
            with placed_on(run_on):
                inputs = list(module.get_inputs())
                init = list(module.get_init_inputs())
            model = module.Model(*init).to(run_on)
            out = model(*inputs)
        outs = out if isinstance(out, (list, tuple)) else (out,)
        return (tuple(_placed(TensorSpec.of(t), device) for t in inputs if isinstance(t, torch.Tensor)),
                tuple(_placed(TensorSpec.of(t), device) for t in outs if isinstance(t, torch.Tensor)))

    try:
        return specs(fake=True)
    except Exception:  # noqa: BLE001 - a program that needs real values (data-dependent shapes)
        return specs(fake=False)


def _placed(spec: TensorSpec, device: torch.device) -> TensorSpec:
    return TensorSpec(spec.shape, spec.stride, spec.dtype, device.type)


def load_program(source: str, module_name: str) -> types.ModuleType:
    """Execute a KernelBench-format program (task or candidate) as a module."""
    module = types.ModuleType(module_name)
    module.__file__ = f"<{module_name}>"
    code = compile(source, module.__file__, "exec")
    exec(code, module.__dict__)  # noqa: S102 - task programs are ours; candidates are judged first
    return module


def channels_last_form(t: torch.Tensor) -> torch.memory_format | None:
    """`torch.channels_last` (4-D) or `torch.channels_last_3d` (5-D) where `t` lies so (a tensor
    may lie plainly too, as one of a single channel does), else None."""
    form = {4: torch.channels_last, 5: torch.channels_last_3d}.get(t.dim())
    return form if form is not None and t.is_contiguous(memory_format=form) else None
