"""How close a kernel comes to the GPU's memory roofline: the bytes a task must move, the FLOPs
its reference does, and the GPU's measured copy bandwidth.

    bytes = task_bytes(inputs, outputs)             # each input read once, each output written once
    flops = task_flops(reference, inputs)           # matmul/convolution FLOPs, 0 for elementwise work
    copy = copy_bandwidth(device, store)            # GB/s of a device-to-device copy, measured once
    line = Roofline.of(bytes, flops, copy, kernel_ms, eager_ms, inductor_ms).describe()

Why: a speedup over Inductor says nothing about how much is left. Most of the tasks the backend
cuts out of a graph are memory-bound; for them the time a plain copy of the same bytes takes is
the floor, so "79% of the copy bandwidth" tells the writer (and the search) that at most 1.27x is
left, while "20%" says the kernel is far from done. The copy bandwidth is measured, not taken from
a datasheet: a device-to-device copy of a buffer far larger than L2, the same kind of traffic a
fused elementwise kernel makes, so a kernel can approach 100% and rarely pass it.

The bandwidth is measured once per GPU name, torch version and CUDA version and kept as a small
JSON file under the judge's build folder (beside `ReferenceTimes`'s), so the judge's workers read
it instead of measuring again. On a CPU there is no copy bandwidth (None), and no roofline.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import statistics
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

import torch

from kevin_backend.measure.timer import trial_times
from kevin_backend.types import TensorSpec

__all__ = ["COPY_BYTES", "Roofline", "record_fraction", "copy_bandwidth", "copy_bandwidth_key", "measure_copy_bandwidth", "read_copy_bandwidth",
           "spanned_bytes", "task_bytes", "task_flops"]

COPY_BYTES = 1 << 30  # the copy's buffer: 1 GiB, far beyond any GPU's L2
_COPY_REPEATS = 10
_COPY_WARMUP = 2


# -- bytes --------------------------------------------------------------------------------------


def spanned_bytes(value: torch.Tensor | TensorSpec) -> int:
    """The fewest bytes a kernel reads (or writes) for one tensor: its distinct elements.

    A broadcast input (stride 0 along a dimension) counts its storage once, not its expanded
    size; a transposed or otherwise permuted input counts its numel; a view with gaps (a slice
    with a step) counts the elements it addresses, not the gaps between them."""
    if isinstance(value, TensorSpec):
        shape, stride, size = value.shape, value.stride, torch.empty((), dtype=value.torch_dtype).element_size()
    else:
        shape, stride, size = tuple(value.shape), tuple(value.stride()), value.element_size()
    if any(n == 0 for n in shape):
        return 0
    distinct = math.prod(n for n, s in zip(shape, stride) if s != 0)
    extent = 1 + sum((n - 1) * abs(s) for n, s in zip(shape, stride))
    return min(distinct, extent) * size


def task_bytes(inputs: Iterable[Any], outputs: Iterable[Any]) -> int:
    """Bytes a kernel for the task must move at least: each input read once and each output
    written once (tensors or `TensorSpec`s; anything else, e.g. an int argument, moves nothing)."""
    return sum(spanned_bytes(v) for v in (*inputs, *outputs) if isinstance(v, (torch.Tensor, TensorSpec)))


# -- FLOPs --------------------------------------------------------------------------------------


def task_flops(reference: Any, inputs: Sequence[Any]) -> int:
    """FLOPs of the reference's matmul and convolution work on `inputs` (0 when it has none):
    torch's FlopCounterMode counts exactly those ops. The reference runs on fake tensors (no
    memory, no GPU time); a program that needs real values (data-dependent shapes) runs for real."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils.flop_counter import FlopCounterMode

    try:
        with FakeTensorMode(allow_non_fake_inputs=True) as mode:
            fake = [mode.from_tensor(v) if isinstance(v, torch.Tensor) else v for v in inputs]
            counter = FlopCounterMode(display=False)
            with torch.no_grad(), counter:
                reference(*fake)
        return int(counter.get_total_flops())
    except Exception:  # noqa: BLE001 - the reference needs real values: count a real run
        counter = FlopCounterMode(display=False)
        with torch.no_grad(), counter:
            reference(*inputs)
        return int(counter.get_total_flops())


# -- the copy bandwidth --------------------------------------------------------------------------


_KNOWN: dict[str, float] = {}
_KNOWN_LOCK = threading.Lock()


def copy_bandwidth_key(device: torch.device) -> str:
    """Whose copy bandwidth: the GPU's name, torch's version and the CUDA version (as the judge's
    reference times are keyed)."""
    name = torch.cuda.get_device_name(device)
    return hashlib.sha256(f"copy-bandwidth\n{name}\n{torch.__version__}\n{torch.version.cuda}".encode()).hexdigest()[:32]


def measure_copy_bandwidth(device: torch.device, nbytes: int = COPY_BYTES, repeats: int = _COPY_REPEATS) -> tuple[float, dict[str, Any]]:
    """GB/s of a device-to-device copy of an `nbytes` buffer (read + write counted), the median of
    `repeats` copies timed by the project's timer (`timer.trial_times`) after a warm-up, and what
    was measured. The buffer shrinks
    (halving, never below 8x the L2 cache) when the device has not the memory for two of them."""
    props = torch.cuda.get_device_properties(device)
    l2 = int(getattr(props, "L2_cache_size", 0) or 0) or (64 << 20)
    free, _ = torch.cuda.mem_get_info(device)
    while 2 * nbytes > 0.8 * free and nbytes // 2 >= 8 * l2:
        nbytes //= 2
    if 2 * nbytes > 0.8 * free:
        raise RuntimeError(f"no memory for two {nbytes / 2**20:.0f} MiB buffers ({free / 2**20:.0f} MiB free)")
    elements = nbytes // 4
    src = torch.empty(elements, dtype=torch.float32, device=device).fill_(1.0)
    dst = torch.empty_like(src)
    try:
        with torch.cuda.device(device):
            samples = trial_times(lambda: dst.copy_(src), device, repeats, _COPY_WARMUP)
    finally:
        del src, dst
    ms = statistics.median(samples)
    moved = 2 * elements * 4
    gbps = moved / (ms * 1e-3) / 1e9
    return gbps, {"copy_gbps": gbps, "bytes": moved, "buffer_bytes": elements * 4, "repeats": repeats,
                  "median_ms": ms, "samples_ms": samples, "gpu": torch.cuda.get_device_name(device),
                  "torch": torch.__version__, "cuda": torch.version.cuda, "measured": time.time()}


def read_copy_bandwidth(device: torch.device, store: Path | None) -> float | None:
    """The copy bandwidth already measured for this GPU and software (this process's, else the
    one kept under `store`), or None."""
    key = copy_bandwidth_key(device)
    with _KNOWN_LOCK:
        if key in _KNOWN:
            return _KNOWN[key]
    if store is None:
        return None
    try:
        value = float(json.loads((Path(store) / f"{key}.json").read_text())["copy_gbps"])
    except (OSError, ValueError, KeyError, TypeError):
        return None  # not measured yet, or a damaged file: measured again
    if not value > 0 or math.isinf(value):
        return None
    with _KNOWN_LOCK:
        _KNOWN[key] = value
    return value


def copy_bandwidth(device: torch.device | str | None = None, store: Path | None = None) -> float | None:
    """The GPU's copy bandwidth in GB/s: read from `store` when measured before for this GPU and
    software, else measured now and kept there. None on a CPU. The caller holds the GPU alone
    while this measures (the judge's timing lock): another kernel running beside the copy would
    make the GPU look slower than it is."""
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type != "cuda" or not torch.cuda.is_available():
        return None
    if device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    known = read_copy_bandwidth(device, store)
    if known is not None:
        return known
    gbps, record = measure_copy_bandwidth(device)
    key = copy_bandwidth_key(device)
    with _KNOWN_LOCK:
        _KNOWN.setdefault(key, gbps)
    if store is not None:
        try:
            Path(store).mkdir(parents=True, exist_ok=True)
            tmp = Path(store) / f"{key}.{os.getpid()}.{threading.get_ident()}.tmp"
            tmp.write_text(json.dumps(record))
            os.replace(tmp, Path(store) / f"{key}.json")
        except OSError:
            pass  # kept in this process; another measures again
    return gbps


# -- the verdict's roofline ------------------------------------------------------------------------


def _gbps(nbytes: int, ms: float | None) -> float | None:
    return None if not ms or ms <= 0 or nbytes <= 0 else nbytes / (ms * 1e-3) / 1e9


def _fraction(gbps: float | None, copy_gbps: float | None) -> float | None:
    return None if gbps is None or not copy_gbps else gbps / copy_gbps


def _rate(gbps: float) -> str:
    return f"{gbps / 1000:.2f} TB/s" if gbps >= 1000 else f"{gbps:.3g} GB/s"


def _size(nbytes: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if nbytes >= scale:
            return f"{nbytes / scale:.3g} {unit}"
    return f"{nbytes} B"


@dataclass(frozen=True)
class Roofline:
    """An accepted kernel against the GPU's copy bandwidth: the bytes the task must move, its
    matmul/convolution FLOPs, the achieved GB/s of the kernel, Inductor and eager (bytes over
    their times), the copy bandwidth, and the kernel's and Inductor's fractions of it."""

    bytes: int
    flops: int
    kernel_gbps: float | None
    inductor_gbps: float | None
    eager_gbps: float | None
    copy_gbps: float | None
    kernel_fraction: float | None
    inductor_fraction: float | None
    kernel_tflops: float | None

    @classmethod
    def of(cls, nbytes: int, flops: int, copy_gbps: float | None, kernel_ms: float | None,
           eager_ms: float | None = None, inductor_ms: float | None = None) -> "Roofline":
        kernel, inductor = _gbps(nbytes, kernel_ms), _gbps(nbytes, inductor_ms)
        tflops = flops / (kernel_ms * 1e-3) / 1e12 if flops and kernel_ms and kernel_ms > 0 else None
        return cls(int(nbytes), int(flops), kernel, inductor, _gbps(nbytes, eager_ms), copy_gbps,
                   _fraction(kernel, copy_gbps), _fraction(inductor, copy_gbps), tflops)

    def retimed(self, kernel_ms: float | None, eager_ms: float | None, inductor_ms: float | None) -> "Roofline":
        """The same task and GPU with other times (the judge's kept reference times)."""
        return Roofline.of(self.bytes, self.flops, self.copy_gbps, kernel_ms, eager_ms, inductor_ms)

    def describe(self) -> str:
        """One line for the kernel writer and reports, e.g. "moves 1.07 GB: kernel 3.41 TB/s (79% of
        the GPU's 4.31 TB/s copy bandwidth), Inductor 2.95 TB/s (68%)"."""
        parts = []
        if self.kernel_gbps is not None:
            of = (f" ({self.kernel_fraction:.0%} of the GPU's {_rate(self.copy_gbps)} copy bandwidth)"
                  if self.kernel_fraction is not None and self.copy_gbps else "")
            parts.append(f"kernel {_rate(self.kernel_gbps)}{of}")
        if self.inductor_gbps is not None:
            of = f" ({self.inductor_fraction:.0%})" if self.inductor_fraction is not None else ""
            parts.append(f"Inductor {_rate(self.inductor_gbps)}{of}")
        text = f"moves {_size(self.bytes)}"
        if parts:
            text += ": " + ", ".join(parts)
        if self.flops:
            text += f"; {self.flops / 1e9:.3g} GFLOP"
            if self.kernel_tflops is not None:
                text += f" at {self.kernel_tflops:.3g} TFLOP/s"
        return text

    def headroom(self) -> str:
        """How far the kernel is from the roofline, in words (for the writer)."""
        if self.kernel_fraction is None:
            return ""
        if self.kernel_fraction >= 1.0:
            return ("It moves its bytes at least as fast as a plain copy of them: it is at the memory roofline, and "
                    "memory traffic leaves no more speed to gain.")
        left = 1.0 / self.kernel_fraction
        text = (f"It is at {self.kernel_fraction:.0%} of the memory roofline: moving these bytes at the copy "
                f"bandwidth would make it at most {left:.2f}x faster.")
        if self.flops:
            text += " Its matmul/convolution FLOPs may bound it before its bytes do."
        return text

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Roofline":
        def num(name: str) -> float | None:
            value = data.get(name)
            return None if value is None else float(value)

        return cls(int(data.get("bytes") or 0), int(data.get("flops") or 0), num("kernel_gbps"), num("inductor_gbps"),
                   num("eager_gbps"), num("copy_gbps"), num("kernel_fraction"), num("inductor_fraction"),
                   num("kernel_tflops"))


def record_fraction(judge_record: Any) -> float | None:
    """The kernel's fraction of the copy bandwidth in a stored judge record (a cache entry's
    `judge_record`, `JudgeResult.as_dict()`); None for records without a roofline (made before
    it, on a CPU, or with no bandwidth measured) or damaged ones."""
    if not isinstance(judge_record, dict) or not isinstance(judge_record.get("roofline"), dict):
        return None
    value = judge_record["roofline"].get("kernel_fraction")
    try:
        value = None if value is None or isinstance(value, bool) else float(value)
    except (TypeError, ValueError):
        return None
    return value if value is not None and math.isfinite(value) and value >= 0 else None
