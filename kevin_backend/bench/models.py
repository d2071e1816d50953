"""The models `kevin bench` measures: an MLP, a ResNet-style CNN, a GPT-2-style transformer and a
Llama-style block, each for two workloads.

    model, inputs = make_model("gpt2", "train", device="cuda", dtype=torch.bfloat16)
    model(*inputs).backward()          # "train": the model returns its loss
    with torch.no_grad(): model(*inputs)  # "infer": the model returns its output

Every model takes its targets as an optional last input: given, it returns a scalar loss (the
training step is forward + loss + backward, the loss inside the compiled model); left out, it
returns its output. Weights are random (seeded), configurations are built in code: nothing is
downloaded. `size="full"` is sized for an H200 (a step takes milliseconds, a measurement seconds);
`size="small"` keeps the full size's layers at a small batch (one sequence of 128 tokens, 16 rows,
4 images), where launch overhead matters; `size="tiny"` is for CPU tests and smoke runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from kevin_backend.example_models import MLP

__all__ = ["MODELS", "WORKLOADS", "SIZES", "ModelSpec", "make_model", "describe", "needs_transformers"]

WORKLOADS = ("infer", "train")
SIZES = ("full", "small", "tiny")  # full: GPU-sized; small: the same layers at a small batch; tiny: CPU tests


class RegressionMLP(nn.Module):
    """The project's example MLP (SiLU layers, pointwise chains, LayerNorm); loss: MSE to a target."""

    def __init__(self, dim: int, hidden: int, depth: int) -> None:
        super().__init__()
        self.net = MLP(dim, hidden, depth)

    def forward(self, x: torch.Tensor, target: torch.Tensor | None = None) -> torch.Tensor:
        y = self.net(x)
        return y if target is None else F.mse_loss(y, target)


class BasicBlock(nn.Module):
    """conv-BN-ReLU-conv-BN plus the input (projected by a strided 1x1 conv + BN when the shape changes)."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = nn.Sequential()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(h)) + self.shortcut(x))


class ResNet(nn.Module):
    """ResNet-style classifier: a stem, stages of residual blocks (the first of each stage after
    the first halves the resolution), global average pooling, a linear head; loss: cross-entropy."""

    def __init__(self, widths: tuple[int, ...], blocks: tuple[int, ...], classes: int) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, widths[0], 3, 1, 1, bias=False), nn.BatchNorm2d(widths[0]), nn.ReLU())
        layers: list[nn.Module] = []
        cin = widths[0]
        for i, (width, count) in enumerate(zip(widths, blocks)):
            for j in range(count):
                layers.append(BasicBlock(cin, width, 2 if i > 0 and j == 0 else 1))
                cin = width
        self.stages = nn.Sequential(*layers)
        self.head = nn.Linear(cin, classes)

    def forward(self, x: torch.Tensor, labels: torch.Tensor | None = None) -> torch.Tensor:
        logits = self.head(self.stages(self.stem(x)).mean(dim=(2, 3)))
        return logits if labels is None else F.cross_entropy(logits, labels)


class CausalLM(nn.Module):
    """A transformers causal LM on token ids: logits, or with labels its own next-token loss."""

    def __init__(self, lm: nn.Module) -> None:
        super().__init__()
        self.lm = lm

    def forward(self, ids: torch.Tensor, labels: torch.Tensor | None = None) -> torch.Tensor:
        out = self.lm(input_ids=ids, labels=labels, use_cache=False)
        return out.logits if labels is None else out.loss


class DecoderStack(nn.Module):
    """A transformers base model (no LM head) on token ids: the last hidden states; with a target,
    the MSE to it (a distillation-style loss)."""

    def __init__(self, base: nn.Module) -> None:
        super().__init__()
        self.base = base

    def forward(self, ids: torch.Tensor, target: torch.Tensor | None = None) -> torch.Tensor:
        hidden = self.base(input_ids=ids, use_cache=False).last_hidden_state
        return hidden if target is None else F.mse_loss(hidden, target)


@dataclass(frozen=True)
class ModelSpec:
    """One benchmark model: what it is, and how to build it with its inputs."""

    name: str
    full: str  # one line for tables: the full size
    small: str  # ... the small batch (launch overhead matters)
    tiny: str  # ... and the tiny one
    build: Callable[[str], tuple[nn.Module, tuple[Any, ...], tuple[Any, ...]]]  # size -> model, inputs, targets
    transformers: bool = False


def _mlp(size: str) -> tuple[nn.Module, tuple[Any, ...], tuple[Any, ...]]:
    dim, hidden, depth, batch = {"tiny": (16, 32, 2, 4), "small": (1024, 4096, 4, 16)}.get(size, (1024, 4096, 4, 4096))
    return RegressionMLP(dim, hidden, depth), (torch.randn(batch, dim),), (torch.randn(batch, dim),)


def _cnn(size: str) -> tuple[nn.Module, tuple[Any, ...], tuple[Any, ...]]:
    if size == "tiny":
        widths, blocks, classes, batch, side = (4, 8), (1, 1), 10, 2, 8
    else:  # ResNet-18's stages at 128 x 128
        widths, blocks, classes, batch, side = (64, 128, 256, 512), (2, 2, 2, 2), 1000, 4 if size == "small" else 128, 128
    model = ResNet(widths, blocks, classes)
    return model, (torch.randn(batch, 3, side, side),), (torch.randint(0, classes, (batch,)),)


def _gpt2(size: str) -> tuple[nn.Module, tuple[Any, ...], tuple[Any, ...]]:
    from transformers import GPT2Config, GPT2LMHeadModel

    if size == "tiny":
        layers, dim, heads, vocab, batch, seq = 1, 32, 2, 64, 2, 8
    else:
        layers, dim, heads, vocab, batch, seq = (4, 768, 12, 50257) + ((1, 128) if size == "small" else (8, 512))
    config = GPT2Config(n_layer=layers, n_embd=dim, n_head=heads, vocab_size=vocab, n_positions=max(seq, 64),
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=vocab - 1, eos_token_id=vocab - 1)
    ids = torch.randint(0, vocab, (batch, seq))
    return CausalLM(GPT2LMHeadModel(config)), (ids,), (ids.clone(),)


def _llama(size: str) -> tuple[nn.Module, tuple[Any, ...], tuple[Any, ...]]:
    from transformers import LlamaConfig, LlamaModel

    if size == "tiny":
        dim, inter, layers, heads, kv, vocab, batch, seq = 32, 64, 1, 2, 1, 64, 2, 8
    else:  # two decoder layers of a 1B-class Llama, grouped-query attention
        dim, inter, layers, heads, kv, vocab, batch, seq = (2048, 5632, 2, 16, 4, 32000) + ((1, 128) if size == "small" else (4, 1024))
    config = LlamaConfig(hidden_size=dim, intermediate_size=inter, num_hidden_layers=layers, num_attention_heads=heads,
                         num_key_value_heads=kv, vocab_size=vocab, max_position_embeddings=max(seq, 64),
                         bos_token_id=1, eos_token_id=2, pad_token_id=None)
    return DecoderStack(LlamaModel(config)), (torch.randint(0, vocab, (batch, seq)),), (torch.randn(batch, seq, dim),)


_SPECS = {
    s.name: s
    for s in (
        ModelSpec("mlp", "MLP 1024-4096x4-1024, batch 4096", "MLP 1024-4096x4-1024, batch 16", "MLP 16-32x2-16, batch 4", _mlp),
        ModelSpec("cnn", "ResNet-18-style (BasicBlocks, BatchNorm), batch 128 at 128x128",
                  "ResNet-18-style, batch 4 at 128x128", "ResNet, 2 blocks, batch 2 at 8x8", _cnn),
        ModelSpec("gpt2", "GPT-2 (transformers), 4 layers, d 768, LM head + loss, 8 x 512 tokens",
                  "GPT-2, 4 layers, d 768, 1 x 128 tokens", "GPT-2, 1 layer, d 32, 2 x 8 tokens", _gpt2, True),
        ModelSpec("llama", "Llama (transformers), 2 decoder layers, d 2048, GQA 16/4, 4 x 1024 tokens",
                  "Llama, 2 decoder layers, d 2048, 1 x 128 tokens", "Llama, 1 layer, d 32, 2 x 8 tokens", _llama, True),
    )
}
MODELS: tuple[str, ...] = tuple(_SPECS)


def describe(name: str, size: str = "full") -> str:
    """The model's one-line description at this size."""
    spec = _spec(name)
    return {"tiny": spec.tiny, "small": spec.small}.get(size, spec.full)


def needs_transformers(name: str) -> bool:
    return _spec(name).transformers


def _spec(name: str) -> ModelSpec:
    if name not in _SPECS:
        raise ValueError(f"unknown model {name!r}; valid models: {', '.join(MODELS)}")
    return _SPECS[name]


def make_model(
    name: str,
    workload: str = "infer",
    device: str | torch.device = "cuda",
    dtype: torch.dtype = torch.float32,
    size: str = "full",
    seed: int = 0,
) -> tuple[nn.Module, tuple[Any, ...]]:
    """(model, example_inputs) of benchmark model `name` for `workload` ("infer": the model in eval
    mode returns its output; "train": in train mode, with targets as its last input, it returns the
    loss). Floating-point weights and inputs take `dtype`; token ids and labels stay integers."""
    spec = _spec(name)
    if workload not in WORKLOADS:
        raise ValueError(f"unknown workload {workload!r}; valid workloads: {', '.join(WORKLOADS)}")
    if size not in SIZES:
        raise ValueError(f"unknown size {size!r}; valid sizes: {', '.join(SIZES)}")
    torch.manual_seed(seed)
    model, inputs, targets = spec.build(size)
    train = workload == "train"
    model = model.to(device=device, dtype=dtype).train(train)
    values = inputs + targets if train else inputs
    return model, tuple(_to(v, device, dtype) for v in values)


def _to(value: Any, device: str | torch.device, dtype: torch.dtype) -> Any:
    if not isinstance(value, torch.Tensor):
        return value
    return value.to(device=device, dtype=dtype) if value.is_floating_point() else value.to(device=device)
