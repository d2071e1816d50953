"""kevin_backend: a torch.compile backend that swaps in verified CUDA kernels written by a
kernel-writing model, with Inductor compiling everything else.

    model = torch.compile(model, backend="kevin")

The backend is registered through the `torch_dynamo_backends` entry point (pyproject.toml), so
`backend="kevin"` works without importing the package. Importing it changes no global torch
setting, and imports no torch of its own: the `kevin` command's help texts and usage errors start
without it (importing torch is most of a command's start-up time). The names that need torch
(`KernelTask`, `TensorSpec`, `CompileReport`, `last_report`) load on first use.

The runtime op `kevin::launch`, which cached Inductor code calls by name, is defined by the
backend's pass (torch.compile loads it through the entry point before any compiled code runs),
and by this import or the first use of a name above whenever torch is imported by then.
"""

import sys
from typing import Any

from kevin_backend.version import __version__
from kevin_backend.config import Config, Mode
from kevin_backend.runtime.counters import counters

__all__ = ["__version__", "Config", "Mode", "KernelTask", "TensorSpec", "CompileReport", "counters", "last_report"]


def _define_op_with_torch() -> None:
    """Define `kevin::launch` if torch is imported (without importing torch for it)."""
    if "torch" in sys.modules:
        from kevin_backend.runtime import op  # noqa: F401  (defines kevin::launch)


def __getattr__(name: str) -> Any:
    """The public names that need torch, imported on first use (PEP 562)."""
    if name in ("KernelTask", "TensorSpec"):
        from kevin_backend import types as module
    elif name in ("CompileReport", "last_report"):
        from kevin_backend.backend import report as module
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    _define_op_with_torch()
    value = getattr(module, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


_define_op_with_torch()
