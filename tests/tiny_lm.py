"""A tiny chat model made on the spot, for tests of the policies (and of training) without any
download: a byte-level BPE tokenizer trained here on a few lines of Python and CUDA, with a
Qwen-style chat template, and a randomly initialized two-layer Qwen2 causal LM.

    folder = build_tiny_lm(tmp_path / "tiny")      # about a second; loads with from_pretrained

The model's replies are noise, but they are real: chat-templated prompts, left-padded batches,
sampling, end-of-sequence and token counts all go through the same code as for Kevin-32B.
"""

from __future__ import annotations

from pathlib import Path

import torch

__all__ = ["CHAT_TEMPLATE", "CORPUS", "SPECIAL_TOKENS", "train_tokenizer", "tiny_model", "build_tiny_lm"]

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")

# Qwen's ChatML layout: <|im_start|>role\ncontent<|im_end|>\n, the assistant's turn opened last.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

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
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    core.train_from_iterator(list(corpus) * 4, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        chat_template=CHAT_TEMPLATE,
        model_max_length=2048,
    )


def tiny_model(tokenizer, seed: int = 0, hidden: int = 64, layers: int = 2, heads: int = 4):
    """A randomly initialized Qwen2 causal LM sized for `tokenizer`. The initialization is wider
    than a real model's so its next-token choices are clear-cut (greedy decoding does not hinge
    on rounding)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    end = [tokenizer.convert_tokens_to_ids("<|im_end|>"), tokenizer.convert_tokens_to_ids("<|endoftext|>")]
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads // 2,
        max_position_embeddings=2048,
        initializer_range=0.2,
        tie_word_embeddings=True,
        eos_token_id=end,
        pad_token_id=end[1],
        bos_token_id=None,
    )
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
    model.generation_config.eos_token_id = end
    model.generation_config.pad_token_id = end[1]
    return model.eval()


def build_tiny_lm(folder: Path, seed: int = 0) -> Path:
    """Train the tokenizer, make the model, save both into `folder` (from_pretrained loads it)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer = train_tokenizer()
    tiny_model(tokenizer, seed=seed).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder
