"""kevin_backend: a torch.compile backend that swaps in verified CUDA kernels written by a
kernel-writing model, with Inductor compiling everything else.

    model = torch.compile(model, backend="kevin")

Importing the package defines the runtime op `kevin::launch` (cached Inductor code calls it by
name) and changes no global torch setting.
"""

from kevin_backend.version import __version__  # noqa: E402

from kevin_backend.runtime import op as _runtime  # noqa: E402,F401  (defines kevin::launch)
from kevin_backend.backend.report import CompileReport, last_report  # noqa: E402
from kevin_backend.runtime.counters import counters  # noqa: E402
from kevin_backend.config import Config, Mode  # noqa: E402
from kevin_backend.types import KernelTask, TensorSpec  # noqa: E402

__all__ = ["__version__", "Config", "Mode", "KernelTask", "TensorSpec", "CompileReport", "counters", "last_report"]
