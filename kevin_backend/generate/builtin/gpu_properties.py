"""The GPU the built-in writer writes for: its multiprocessors, threads and registers, read from the
device where there is one, an H100's or H200's where there is none (so programs written on a
machine without a GPU are those the suites record).

    gpu = gpu_properties()      # GpuProperties(multiprocessors=132, ...)
    clusters_available()        # thread-block clusters (compute capability 9.0 and later)
    slot_share((128, 256, 64), (1, 2, 1), 8192, 768)   # 0.73: a GEMM's tiles fill 73% of its rounds
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import torch

__all__ = ["GpuProperties", "gpu_properties", "clusters_available", "slot_share", "FULL_ROUNDS"]


@dataclass(frozen=True)
class GpuProperties:
    multiprocessors: int = 132  # an H100 or H200 has 132
    threads_per_multiprocessor: int = 2048
    registers_per_multiprocessor: int = 65536  # 32-bit registers; a block may take them all


@lru_cache(maxsize=1)
def gpu_properties() -> GpuProperties:
    """The current GPU's properties; the defaults where no GPU can be asked."""
    try:
        if not torch.cuda.is_available():
            return GpuProperties()
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
    except Exception:  # noqa: BLE001 - a GPU that cannot be asked is written for as the default one
        return GpuProperties()
    default = GpuProperties()
    return GpuProperties(
        multiprocessors=int(getattr(props, "multi_processor_count", default.multiprocessors)),
        threads_per_multiprocessor=int(getattr(props, "max_threads_per_multi_processor", default.threads_per_multiprocessor)),
        registers_per_multiprocessor=int(getattr(props, "regs_per_multiprocessor", default.registers_per_multiprocessor)),
    )


def clusters_available() -> bool:
    """Whether the GPU here launches thread-block clusters (compute capability 9.0 and later);
    False without a GPU (the cluster variants then rank last: they build only for such GPUs)."""
    try:
        return torch.cuda.is_available() and torch.cuda.get_device_capability() >= (9, 0)
    except Exception:  # noqa: BLE001 - a GPU that cannot be asked is treated as one without clusters
        return False


# The share of the SMs' tile slots (`slot_share`) above which a tiling's rounds count as full
FULL_ROUNDS = 0.85


def slot_share(tile: tuple[int, ...], cluster: tuple[int, ...], m: int, n: int) -> float:
    """The share of the tile slots that a persistent kernel of one tile an SM at a time fills with
    output of an M x N result, over its rounds (tiles rounded up to whole clusters; each SM's slot a
    whole tile). 8192 x 768 in 128 x 256 tiles: 192 tiles, two rounds on 132 SMs, 0.73; in
    128 x 128 tiles: 384, three rounds, 0.97."""
    (tm, tn), (cm, cn) = tile[:2], cluster[:2]
    tiles = -(-m // (tm * cm)) * cm * -(-n // (tn * cn)) * cn
    sms = gpu_properties().multiprocessors
    return m * n / (-(-tiles // sms) * sms * tm * tn)
