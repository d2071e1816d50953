"""Small chat models made on the spot, with nothing downloaded: a byte-level BPE tokenizer trained
here, a Qwen-style chat template, and a randomly initialized Qwen2 or Qwen3 causal LM sized by
arguments.

Two uses. Tests build a tiny one in about a second (`tests/tiny_lm.py`). A short training run on
the built-in suite builds one big enough to learn a few kernel programs from the built-in
writer's demonstrations (the `sft:` warm start) and then improve on them with the real judge:

    python -m kevin_backend.rl.tiny write-tasks runs/h200-builtin-tasks
    python -m kevin_backend.rl.tiny make-model runs/h200-builtin-lm --tasks runs/h200-builtin-tasks \\
        --hidden 384 --layers 4 --vocab 8192
    kevin train --config configs/train/h200-builtin.yaml

`make-model` trains its tokenizer on the prompt templates, the tasks and the built-in writer's
replies to them, with `whole_lines`: pieces never cross a line end, but may cross spaces, so a
line that recurs in many programs (the writer's helpers, includes, launch code) becomes one
token and a whole program is a few hundred tokens instead of a few thousand.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Iterable, Sequence

import torch

__all__ = [
    "SPECIAL_TOKENS",
    "CHAT_TEMPLATE",
    "train_tokenizer",
    "make_model",
    "suite_tasks",
    "write_suite_tasks",
    "builtin_corpus",
    "build_model",
    "DEFAULT_SUITE_TASKS",
    "ARCHITECTURES",
    "main",
]

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")

# Qwen's ChatML layout: <|im_start|>role\ncontent<|im_end|>\n, the assistant's turn opened last.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

# Small, quick fp32 tasks of the built-in suite: pointwise chains of one to four ops and a
# row reduction (the writer's two kinds of kernel).
DEFAULT_SUITE_TASKS = ("relu-f32", "bias-gelu-f32", "gated-f32", "clamp-fma-f32", "elu-hardsigmoid-f32", "sum-f32")


def train_tokenizer(corpus: Sequence[str], vocab_size: int = 400, *, whole_lines: bool = False,
                    max_length: int = 2048, repeat: int = 4) -> Any:
    """A byte-level BPE `PreTrainedTokenizerFast` trained on `corpus` (any text encodes: the 256
    bytes are in the alphabet), with ChatML specials and the chat template.

    Pieces are words and punctuation as in GPT-2 by default; with `whole_lines` a piece is a
    whole line (its newline included), so merges may join the words of a frequent line into one
    token."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.BPE())
    if whole_lines:
        core.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(r"[^\n]*\n|[^\n]+"), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ])
    else:
        core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    core.train_from_iterator(list(corpus) * repeat, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        chat_template=CHAT_TEMPLATE,
        model_max_length=max_length,
    )


ARCHITECTURES = ("qwen2", "qwen3")


def make_model(tokenizer: Any, *, seed: int = 0, hidden: int = 64, layers: int = 2, heads: int = 4,
               kv_heads: int | None = None, intermediate: int | None = None, max_positions: int = 2048,
               init_range: float = 0.2, arch: str = "qwen2") -> Any:
    """A randomly initialized Qwen2 (or Qwen3) causal LM sized for `tokenizer` (tied embeddings),
    stopping at `<|im_end|>` or `<|endoftext|>`. The default `init_range` is wider than a real
    model's, so a test model's next-token choices are clear-cut (greedy decoding does not hinge on
    rounding); a model meant to be trained wants a real model's 0.02.

    A `whole_lines` tokenizer needs `arch="qwen3"`: for a folder whose model is a qwen2,
    transformers 5's AutoTokenizer loads Qwen2's own tokenizer class, which splits text into
    words again whatever the saved tokenizer says (Qwen3 is the same decoder with normalized
    queries and keys, and its folders keep the saved tokenizer)."""
    import transformers

    if arch not in ARCHITECTURES:
        raise ValueError(f"arch must be one of {', '.join(ARCHITECTURES)}, got {arch!r}")
    config_class = transformers.Qwen3Config if arch == "qwen3" else transformers.Qwen2Config
    model_class = transformers.Qwen3ForCausalLM if arch == "qwen3" else transformers.Qwen2ForCausalLM
    if hidden % heads:
        raise ValueError(f"hidden ({hidden}) must be a multiple of heads ({heads})")
    kv_heads = kv_heads or max(1, heads // 2)
    if heads % kv_heads:
        raise ValueError(f"heads ({heads}) must be a multiple of kv_heads ({kv_heads})")
    end = [tokenizer.convert_tokens_to_ids("<|im_end|>"), tokenizer.convert_tokens_to_ids("<|endoftext|>")]
    config = config_class(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=intermediate or 2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=max_positions,
        initializer_range=init_range,
        tie_word_embeddings=True,
        eos_token_id=end,
        pad_token_id=end[1],
        bos_token_id=None,
    )
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = model_class(config)
    model.generation_config.eos_token_id = end
    model.generation_config.pad_token_id = end[1]
    return model.eval()


# ---------------------------------------------------------------------------------------------
# the built-in suite as a task folder, and a corpus for its tokenizer


def suite_tasks(names: Iterable[str] = DEFAULT_SUITE_TASKS) -> list[Any]:
    """The built-in suite's tasks of these names, in the order given (an unknown name is a
    ValueError listing the suite)."""
    from kevin_backend.generate.builtin.suite import SUITE

    by_name = {t.name: t for t in SUITE}
    names = list(names)
    unknown = [n for n in names if n not in by_name]
    if unknown:
        raise ValueError(f"not in the built-in suite: {', '.join(unknown)}; the suite has {', '.join(by_name)}")
    return [by_name[n] for n in names]


def write_suite_tasks(folder: str | Path, names: Iterable[str] = DEFAULT_SUITE_TASKS) -> list[Path]:
    """Write the named suite tasks into `folder` as `<name>.py` (a folder `tasks.folders` reads);
    other files there are left alone."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for task in suite_tasks(names):
        path = folder / f"{task.name}.py"
        path.write_text(task.source, encoding="utf-8")
        paths.append(path)
    return paths


def builtin_corpus(sources: Sequence[str], variants: int = 8, gpu: str = "", capability: str = "") -> list[str]:
    """Texts to train a tokenizer on: every prompt template, each task's first-turn conversation
    as the engine builds it, and the built-in writer's first replies to it in its first
    `variants` variants (the writer starts trajectory i at variant i)."""
    from kevin_backend.generate.builtin.builtin_policy import BuiltinPolicy
    from kevin_backend.generate.policy import Sampling
    from kevin_backend.generate.prompts import TEMPLATES_DIR, build_messages

    texts = [p.read_text(encoding="utf-8") for p in sorted(TEMPLATES_DIR.glob("*.txt"))]
    writer = BuiltinPolicy()
    for source in sources:
        messages = build_messages(source, gpu, [], 1 << 30, capability=capability)
        texts.extend(m["content"] for m in messages)
        replies = writer.generate([messages] * variants, Sampling())
        texts.extend(r.text for r in replies if r.finish_reason != "declined")
    return texts


def build_model(folder: str | Path, *, tasks: str | Path | None = None, hidden: int = 384, layers: int = 4,
                heads: int = 6, vocab: int = 8192, max_positions: int = 4096, seed: int = 0,
                init_range: float = 0.02, gpu: str = "", capability: str = "") -> Path:
    """Train a `whole_lines` tokenizer (on `builtin_corpus` of the tasks in folder `tasks`,
    default the default suite tasks), make a Qwen3 model for it, save both into `folder`
    (`from_pretrained` loads it). The corpus names the target `gpu` as the prompts will."""
    if tasks is not None:
        from kevin_backend.rl.tasks import tasks_from_folder

        sources = [t.source for t in tasks_from_folder(tasks)]
        if not sources:
            raise ValueError(f"no KernelBench-format task in {tasks}")
    else:
        sources = [t.source for t in suite_tasks()]
    corpus = builtin_corpus(sources, gpu=gpu, capability=capability)
    tokenizer = train_tokenizer(corpus, vocab, whole_lines=True, max_length=max_positions)
    model = make_model(tokenizer, seed=seed, hidden=hidden, layers=layers, heads=heads, max_positions=max_positions,
                       init_range=init_range, arch="qwen3")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    _check_reload(folder, tokenizer, corpus[-1])
    return folder


def _check_reload(folder: Path, tokenizer: Any, text: str) -> None:
    """The folder's tokenizer, as `AutoTokenizer` loads it, must cut text as the trained one does
    (a transformers version that swaps in another tokenizer class would make every program
    thousands of tokens long)."""
    from transformers import AutoTokenizer

    want = tokenizer(text, add_special_tokens=False).input_ids
    got = AutoTokenizer.from_pretrained(str(folder))(text, add_special_tokens=False).input_ids
    if got != want:
        raise RuntimeError(f"AutoTokenizer loads the tokenizer of {folder} differently from how it was trained "
                           f"({len(got)} tokens instead of {len(want)} for a program); this transformers version "
                           "does not keep a saved tokenizer's pre-tokenizer for this model type")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kevin_backend.rl.tiny", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    actions = parser.add_subparsers(dest="action", required=True)
    tasks = actions.add_parser("write-tasks", help="write built-in suite tasks into a folder")
    tasks.add_argument("folder", type=Path)
    tasks.add_argument("--tasks", default=",".join(DEFAULT_SUITE_TASKS), help="comma-separated suite task names")
    model = actions.add_parser("make-model", help="train a tokenizer and save a randomly initialized Qwen3 model")
    model.add_argument("folder", type=Path)
    model.add_argument("--tasks", type=Path, help="task folder whose programs and built-in replies train the "
                                                   "tokenizer (default: the default suite tasks)")
    model.add_argument("--hidden", type=int, default=384)
    model.add_argument("--layers", type=int, default=4)
    model.add_argument("--heads", type=int, default=6)
    model.add_argument("--vocab", type=int, default=8192)
    model.add_argument("--max-positions", type=int, default=4096)
    model.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    try:
        if args.action == "write-tasks":
            for path in write_suite_tasks(args.folder, [n for n in args.tasks.split(",") if n]):
                print(path)
            return 0
        folder = build_model(args.folder, tasks=args.tasks, hidden=args.hidden, layers=args.layers, heads=args.heads,
                             vocab=args.vocab, max_positions=args.max_positions, seed=args.seed)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(folder)
    return 0


if __name__ == "__main__":
    sys.exit(main())
