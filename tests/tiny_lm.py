"""A tiny chat model made on the spot, for tests of the policies (and of training) without any
download: a byte-level BPE tokenizer trained here on a few lines of Python and CUDA, with a
Qwen-style chat template, and a randomly initialized two-layer Qwen2 causal LM.

    folder = build_tiny_lm(tmp_path / "tiny")      # about a second; loads with from_pretrained

The model's replies are noise, but they are real: chat-templated prompts, left-padded batches,
sampling, end-of-sequence and token counts all go through the same code as for Kevin-32B. The
builders are the package's (`kevin_backend/rl/tiny.py`); this file fixes the test sizes and corpus.
"""

from __future__ import annotations

from pathlib import Path

from kevin_backend.rl.tiny import CHAT_TEMPLATE, SPECIAL_TOKENS, make_model
from kevin_backend.rl.tiny import train_tokenizer as _train_tokenizer

__all__ = ["CHAT_TEMPLATE", "CORPUS", "SPECIAL_TOKENS", "train_tokenizer", "tiny_model", "build_tiny_lm"]

CORPUS = (
    "import torch",
    "import torch.nn as nn",
    "from torch.utils.cpp_extension import load_inline",
    "class ModelNew(nn.Module):",
    "    def __init__(self):",
    "        super().__init__()",
    "    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:",
    "        return self.kernel.fused_add_relu(x, y)",
    "cuda_source = '''",
    "#include <torch/extension.h>",
    "#include <cuda_runtime.h>",
    "__global__ void add_relu_kernel(const float* x, const float* y, float* out, int n) {",
    "    int i = blockIdx.x * blockDim.x + threadIdx.x;",
    "    if (i < n) { float v = x[i] + y[i]; out[i] = v > 0.f ? v : 0.f; }",
    "}",
    "torch::Tensor fused_add_relu(torch::Tensor x, torch::Tensor y) {",
    "    auto out = torch::empty_like(x);",
    "    int n = x.numel(); int threads = 256; int blocks = (n + threads - 1) / threads;",
    "    add_relu_kernel<<<blocks, threads>>>(x.data_ptr<float>(), y.data_ptr<float>(), out.data_ptr<float>(), n);",
    "    return out;",
    "}",
    "'''",
    "__shared__ float tile[32][33]; __syncthreads(); atomicAdd(&sum[0], partial);",
    "for (int k = 0; k < K; k += 32) { acc += a[row * K + k] * b[k * N + col]; }",
    "You are a CUDA kernel engineer. Write a faster kernel for the following PyTorch program.",
    "The kernel compiled and ran, but its output differs from the reference: max abs diff 0.25.",
    "Speedup over PyTorch eager: 1.8x. Reason about memory coalescing and occupancy.",
    "def get_inputs(): return [torch.randn(4096, 4096, device='cuda')]",
)


def train_tokenizer(corpus: tuple[str, ...] = CORPUS, vocab_size: int = 400):
    """A byte-level BPE `PreTrainedTokenizerFast` trained on `corpus` (any text encodes: the 256
    bytes are in the alphabet), with ChatML specials and the chat template."""
    return _train_tokenizer(corpus, vocab_size)


def tiny_model(tokenizer, seed: int = 0, hidden: int = 64, layers: int = 2, heads: int = 4):
    """A randomly initialized Qwen2 causal LM sized for `tokenizer`. The initialization is wider
    than a real model's so its next-token choices are clear-cut (greedy decoding does not hinge
    on rounding)."""
    return make_model(tokenizer, seed=seed, hidden=hidden, layers=layers, heads=heads, init_range=0.2)


def build_tiny_lm(folder: Path, seed: int = 0) -> Path:
    """Train the tokenizer, make the model, save both into `folder` (from_pretrained loads it)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer = train_tokenizer()
    tiny_model(tokenizer, seed=seed).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder
