"""Small example models: used by the tests, the examples and the benchmarks.

Each factory returns `(model, example_inputs)` with random weights; sizes are arguments so the
same models serve CPU tests (tiny) and GPU benchmarks (large).
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

__all__ = ["MLP", "ConvNet", "TransformerBlock", "EXAMPLES", "make_example"]


class MLP(nn.Module):
    def __init__(self, dim: int = 64, hidden: int = 256, depth: int = 3) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(dim if i == 0 else hidden, hidden) for i in range(depth))
        self.norm = nn.LayerNorm(hidden)
        self.head = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = F.silu(layer(x)) * 1.5 + 0.1
        return self.head(self.norm(x))


class ConvNet(nn.Module):
    """A small ResNet-style CNN: conv, BatchNorm, ReLU, a residual, pooling and a classifier."""

    def __init__(self, channels: int = 16, classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, channels, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv = nn.Conv2d(channels, channels, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(channels)
        self.fc = nn.Linear(channels, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.relu(self.bn1(self.stem(x)))
        h = F.relu(self.bn2(self.conv(h)) + h)
        return self.fc(h.mean(dim=(2, 3)))


class TransformerBlock(nn.Module):
    """Pre-norm transformer block: causal self-attention and a GELU MLP, with residuals."""

    def __init__(self, dim: int = 64, heads: int = 4) -> None:
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.ln2 = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, 4 * dim)
        self.fc2 = nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (z.reshape(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(d // self.heads)
        mask = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
        att = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
        y = (att @ v).transpose(1, 2).reshape(b, t, d)
        x = x + self.proj(y)
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


def make_example(
    name: str, device: str = "cpu", scale: int = 1, dtype: torch.dtype = torch.float32, size: str = "tiny"
):
    """(model, inputs) for one of `EXAMPLES`; `scale` multiplies the batch size.

    `size="tiny"` is for CPU tests; `size="large"` gives GPU-sized layers (benchmarks).
    """
    torch.manual_seed(0)
    large = size == "large"
    if size not in ("tiny", "large"):
        raise ValueError(f"size must be 'tiny' or 'large', got {size!r}")
    if name == "mlp":
        dim, hidden = (1024, 4096) if large else (64, 256)
        model, inputs = MLP(dim, hidden), (torch.randn((512 if large else 8) * scale, dim),)
    elif name == "cnn":
        channels, side = (64, 32) if large else (16, 16)
        model, inputs = ConvNet(channels), (torch.randn((32 if large else 2) * scale, 3, side, side),)
    elif name == "transformer":
        dim, heads, seq = (768, 12, 256) if large else (64, 4, 16)
        model, inputs = TransformerBlock(dim, heads), (torch.randn((8 if large else 2) * scale, seq, dim),)
    else:
        raise ValueError(f"unknown example {name!r}; choose from {EXAMPLES}")
    model = model.to(device=device, dtype=dtype)
    return model, tuple(t.to(device=device, dtype=dtype) for t in inputs)


EXAMPLES = ("mlp", "cnn", "transformer")
