"""Prompts and conversations for the kernel writer, in the Kevin-32B multi-turn format.

The words live in `templates/*.txt` (`string.Template`, `$name` placeholders, so CUDA braces need
no escaping); this module picks a template, fills it, and assembles the conversation:

    code = extract_code(reply.text)                     # the last python block defining ModelNew
    result = judge.judge(task.source, code) if code else None
    turn = Turn.of(reply, result)                        # code, summary and feedback of one turn
    messages = build_messages(task.source, gpu, turns, max_prompt_tokens=24_000, capability="9.0")

Each earlier turn comes back into the context as an assistant message holding only its program
and its summary (the chain of thought and other prose are dropped, as in the Kevin-32B recipe),
followed by a user message with the judge's feedback on it. When the prompt would overflow, the
oldest turns go first; the system and task messages always stay. `prompt_version()` hashes the
templates so caches and logs can record which prompts produced a kernel.
"""

from __future__ import annotations

import functools
import hashlib
import math
import re
import string
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Sequence

from kevin_backend.generate.policy import Message, Reply, split_reasoning
from kevin_backend.judge.result import JudgeResult, Mismatch, Reason
from kevin_backend.toolchain.cutlass_headers import CutlassHeaders, find_cutlass

__all__ = [
    "Turn",
    "extract_code",
    "extract_summary",
    "feedback_for",
    "system_message",
    "task_message",
    "numerics_in",
    "assistant_message",
    "build_messages",
    "approx_tokens",
    "count_prompt_tokens",
    "prompt_version",
    "render",
    "TEMPLATES_DIR",
    "SUMMARY_CHARS",
    "DERIVED_SUMMARY_CHARS",
    "MESSAGE_OVERHEAD_TOKENS",
]

TEMPLATES_DIR = Path(__file__).parent / "templates"

# Bump when the code that fills the templates changes what a prompt says (it is hashed in too).
_RENDER_SCHEMA = 5

SUMMARY_CHARS = 800  # an explicit `Summary:` is cut at this length
DERIVED_SUMMARY_CHARS = 400  # a summary derived from the reply's prose is cut at this length
DETAIL_CHARS = 4000  # judge text (errors, tracebacks) quoted in feedback is cut at this length
MESSAGE_OVERHEAD_TOKENS = 4  # what a chat template adds around each message (role tags, separators)

# ---------------------------------------------------------------------------------------------
# templates


@functools.lru_cache(maxsize=8)
def _templates(directory: Path) -> dict[str, str]:
    """Every `*.txt` of `directory` by stem (read once per directory)."""
    files = sorted(directory.glob("*.txt"))
    if not files:
        raise FileNotFoundError(f"no prompt templates in {directory}")
    return {f.stem: f.read_text(encoding="utf-8") for f in files}


def render(name: str, **values: object) -> str:
    """Fill template `name` (every placeholder must be given); runs of blank lines left by empty
    values collapse to one, and the ends are stripped."""
    text = string.Template(_templates(TEMPLATES_DIR)[name]).substitute({k: str(v) for k, v in values.items()})
    return re.sub(r"\n[ \t]*\n(?:[ \t]*\n)+", "\n\n", text).strip()


def prompt_version() -> str:
    """A short hash of every template's name and text (and of the render schema): it changes when
    any prompt wording changes, so a cache entry or a trajectory log can say which prompts it came
    from."""
    digest = hashlib.sha256(f"render-schema {_RENDER_SCHEMA}\n".encode())
    for name, text in sorted(_templates(TEMPLATES_DIR).items()):
        digest.update(f"{name}\0{len(text)}\0".encode())
        digest.update(text.encode("utf-8"))
    return digest.hexdigest()[:16]


# ---------------------------------------------------------------------------------------------
# reading a reply: fenced code blocks, the code, the summary

_PYTHON_TAGS = frozenset({"python", "py", "python3"})
_OPEN = re.compile(r"^ {0,3}(?P<fence>`{3,}|~{3,})[ \t]*(?P<info>[^`\n]*)$")
_MODELNEW = re.compile(r"^[ \t]*class[ \t]+ModelNew\b", re.M)


@dataclass(frozen=True)
class _Block:
    lang: str  # the first word of the info string, lower case ("" when none)
    body: str
    start: int  # first line (the opening fence)
    end: int  # one past the last line (the closing fence; the end of the text when unclosed)


def _blocks(lines: list[str]) -> list[_Block]:
    """Fenced blocks in order; one left open at the end (a reply cut at its token limit) runs to
    the end of the text."""
    blocks: list[_Block] = []
    i = 0
    while i < len(lines):
        opening = _OPEN.match(lines[i])
        if not opening:
            i += 1
            continue
        fence = opening.group("fence")
        info = opening.group("info").strip().split()
        closing = re.compile(r"^ {0,3}" + re.escape(fence[0]) + "{" + str(len(fence)) + r",}[ \t]*$")
        j = i + 1
        while j < len(lines) and not closing.match(lines[j]):
            j += 1
        blocks.append(_Block(info[0].lower() if info else "", "\n".join(lines[i + 1:j]), i, min(j + 1, len(lines))))
        i = j + 1
    return blocks


def _answer(text: str) -> str:
    """`text` without any `<think>` reasoning left in it."""
    return split_reasoning(text or "")[0]


def extract_code(text: str) -> str | None:
    """The program of a reply: the last python code block that defines `ModelNew`; else the last
    block tagged python; else the last untagged block; None when the reply has no such block.

    A block left open at the end of the reply (cut at the token limit) counts, so the judge can
    say what is wrong with it."""
    blocks = [b for b in _blocks(_answer(text).splitlines()) if b.body.strip()]
    python = [b for b in blocks if b.lang in _PYTHON_TAGS or b.lang == ""]
    for group in ([b for b in python if _MODELNEW.search(b.body)], [b for b in python if b.lang], python):
        if group:
            return group[-1].body.strip("\n") + "\n"
    return None


def _prose_lines(text: str) -> list[str]:
    """The lines of `text` outside fenced blocks."""
    lines = text.splitlines()
    inside = set()
    for block in _blocks(lines):
        inside.update(range(block.start, block.end))
    return [line for k, line in enumerate(lines) if k not in inside]


# "Summary:", "**Summary:**", "## Summary", "Summary of changes:", "- Summary: ..."
_SUMMARY_LINE = re.compile(r"^summary(?:\s+of\s[^:]{0,40})?[*_\s]*(?::[*_]*\s*(?P<rest>.*)|$)", re.I)


def _clip(text: str, limit: int) -> str:
    """`text` cut to at most `limit` characters at a word boundary, marked with '...' when cut."""
    if len(text) <= limit:
        return text
    cut = text[: max(limit - 3, 0)]
    space = cut.rfind(" ")
    if space > limit // 2:
        cut = cut[:space]
    return cut.rstrip(" ,;:") + "..."


def _first_sentences(text: str, limit: int) -> str:
    """Whole sentences from the start of `text` while they fit in `limit` characters (at least
    the first, cut at a word boundary when it alone is longer)."""
    sentences = re.split(r"(?<=[.!?])\s+", text)
    out = ""
    for sentence in sentences:
        joined = f"{out} {sentence}".strip()
        if len(joined) > limit:
            break
        out = joined
    return out or _clip(text, limit)


def extract_summary(answer_text: str) -> str:
    """The summary a reply carries forward: the text after its last `Summary:` line (outside code
    blocks, at most SUMMARY_CHARS); when there is none, the first sentences of the reply's prose
    outside code blocks (at most DERIVED_SUMMARY_CHARS). Any `<think>` reasoning still in the
    text is dropped first, so the chain of thought never leaks into later turns."""
    lines = _prose_lines(_answer(answer_text))
    for k in range(len(lines) - 1, -1, -1):
        cleaned = re.sub(r"^[\s#>*_-]+", "", lines[k])
        match = _SUMMARY_LINE.match(cleaned)
        if match:
            parts = [match.group("rest") or ""] + lines[k + 1:]
            summary = re.sub(r"\n{3,}", "\n\n", "\n".join(p.rstrip() for p in parts)).strip()
            if summary:
                return _clip(summary, SUMMARY_CHARS)
    prose = " ".join(re.sub(r"^[\s#>]+", "", line).strip() for line in lines)
    prose = re.sub(r"\s+", " ", prose).strip()
    return _first_sentences(prose, DERIVED_SUMMARY_CHARS) if prose else ""


# ---------------------------------------------------------------------------------------------
# feedback


def _block(text: str) -> str:
    """`text` as a fenced block whose fence is longer than any backtick run inside it."""
    longest = max((len(m) for m in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}\n{text.strip()}\n{fence}"


def _head(text: str) -> str:
    return text if len(text) <= DETAIL_CHARS else text[:DETAIL_CHARS].rstrip() + "\n[... cut]"


def _tail(text: str) -> str:
    return text if len(text) <= DETAIL_CHARS else "[cut ...]\n" + text[-DETAIL_CHARS:].lstrip()


def _ms(value: float | None) -> str:
    return "not measured" if value is None else f"{value:.4g} ms"


def _times(value: float | None) -> str:
    return "not measured" if value is None else f"{value:.2f}x"


def _mismatch_values(m: Mismatch) -> dict[str, object]:
    share = m.bad_elements / m.total_elements if m.total_elements else 0.0
    return {
        "trial": m.trial,
        "output": m.output,
        "bad_elements": m.bad_elements,
        "total_elements": m.total_elements,
        "share": f"{share:.2%}",
        "max_abs_error": f"{m.max_abs_error:.3g}",
        "max_rel_error": f"{m.max_rel_error:.3g}",
        "index": list(m.first_bad_index),
        "expected": f"{m.expected:.6g}",
        "got": f"{m.got:.6g}",
        "allowed": "" if m.allowed is None or m.allowed != m.allowed else f" (error {abs(m.got - m.expected):.3g}, allowed {m.allowed:.3g})",
        "reference": "the float64 reference" if m.exact == "float64" else "the reference",
    }


def _roofline(result: JudgeResult) -> str:
    """The accepted kernel against the GPU's copy bandwidth, and how far it is from that roofline
    ("" when the judge measured none: a CPU, or a bandwidth it could not measure)."""
    if result.roofline is None:
        return ""
    roofline = result.roofline
    return f"Memory roofline: the task {roofline.describe()}. {roofline.headroom()}".strip()


_ERROR_TEMPLATES = {
    Reason.RUNTIME_ERROR: "feedback_runtime_error",
    Reason.CRASH: "feedback_crash",
    Reason.HANG: "feedback_hang",
    Reason.ILLEGAL_ADDRESS: "feedback_illegal_address",
    Reason.OUT_OF_MEMORY: "feedback_out_of_memory",
}
_DETAIL_TEMPLATES = {
    Reason.BUILD_TIMEOUT: "feedback_build_timeout",
    Reason.INPUT_MUTATED: "feedback_input_mutated",
    Reason.REPLAYED_OUTPUT: "feedback_replayed_output",
    Reason.SUSPICIOUS_SPEEDUP: "feedback_suspicious_speedup",
}
_RULE_REASONS = frozenset({Reason.RULE_VIOLATION, Reason.NO_MODELNEW, Reason.SYNTAX_ERROR, Reason.PYTORCH_COMPUTE})


def feedback_for(result: JudgeResult | None) -> str:
    """The user message that answers one judged turn (None: the reply had no code). A judge-side
    result (the judge could not run the candidate) is no verdict on it: nothing is said."""
    closing = render("closing")
    if result is None:
        return render("feedback_no_code", closing=closing)
    if result.judge_side:
        return ""
    reason, text = result.reason, result.feedback.strip()
    if reason is Reason.ACCEPTED:
        t = result.timings
        return render("feedback_correct", kernel_ms=_ms(t.kernel_ms), eager_ms=_ms(t.eager_ms),
                      inductor_ms=_ms(t.inductor_ms), speedup_vs_eager=_times(t.speedup_vs_eager),
                      speedup_vs_inductor=_times(t.speedup_vs_inductor), roofline=_roofline(result),
                      closing=closing)
    if reason in _RULE_REASONS:
        problems = "\n".join(f"- {v}" for v in result.violations) if result.violations else _head(text)
        return render("feedback_rules", what=reason.value, problems=problems, closing=closing)
    if reason is Reason.BUILD_ERROR:
        return render("feedback_compile", errors=_block(_head(text or "(the compiler gave no output)")), closing=closing)
    if reason in _ERROR_TEMPLATES:
        return render(_ERROR_TEMPLATES[reason], error=_block(_tail(text or "(no error text)")), closing=closing)
    if reason in (Reason.MISMATCH, Reason.NAN_INF) and result.mismatch is not None:
        name = "feedback_mismatch" if reason is Reason.MISMATCH else "feedback_nan_inf"
        notes = "\n".join(text.splitlines()[1:]).strip()  # after the summary line: e.g. which inputs' layouts it misreads
        return render(name, closing=closing, notes=notes, **_mismatch_values(result.mismatch))
    if reason in (Reason.SHAPE_MISMATCH, Reason.DTYPE_MISMATCH):
        return render("feedback_shape", what=reason.value, details=_head(text), closing=closing)
    if reason in _DETAIL_TEMPLATES:
        return render(_DETAIL_TEMPLATES[reason], details=_head(text), closing=closing)
    # MISMATCH / NAN_INF without details, STATIC_OK (not run), NO_GPU, and any reason added later
    return render("feedback_other", what=reason.value, details=_head(text), closing=closing)


# ---------------------------------------------------------------------------------------------
# turns and the conversation


@dataclass(frozen=True)
class Turn:
    """One finished turn: the reply, what was read from it, the verdict, and the feedback."""

    reply: Reply
    code: str | None  # the extracted program; None when the reply had no code block
    summary: str  # the reply's summary (never its chain of thought)
    result: JudgeResult | None  # None when no code was found (nothing was judged)
    feedback: str  # the user message that follows this turn

    @classmethod
    def of(cls, reply: Reply, result: JudgeResult | None, code: str | None = None) -> "Turn":
        """A turn from a reply and its verdict: code (extracted unless given), summary, feedback."""
        code = extract_code(reply.text) if code is None else code
        return cls(reply, code, extract_summary(reply.text), result, feedback_for(result))


def system_message() -> Message:
    return {"role": "system", "content": render("system")}


def _target(gpu: str, capability: str) -> str:
    gpu = gpu.strip() or "a CUDA GPU"
    if not capability:
        return gpu
    return f"{gpu}, compute capability {capability} (sm_{capability.replace('.', '')})"


FIND = "find"  # `cutlass=FIND`: the headers this process finds (`find_cutlass`)


def _libraries(cutlass: CutlassHeaders | None | str) -> str:
    """What the task says of CUTLASS's and CuTe's headers: their version and folder when the
    judge's build has them, nothing when it has not."""
    headers = find_cutlass() if cutlass == FIND else cutlass
    if not isinstance(headers, CutlassHeaders):
        return ""
    return render("cutlass", libraries=f"CUTLASS {headers.version}" + (" and CuTe" if headers.cute else ""),
                  include=headers.include,
                  includes="`#include <cutlass/...>` and `#include <cute/...>`" if headers.cute else "`#include <cutlass/...>`",
                  cute_example=", and CuTe's layouts and tensors in <cute/tensor.hpp>" if headers.cute else "")


# The settings of a cache key's numerics (`cache.key.NUMERICS_DOC`) that decide which math a kernel
# may match, as the task message names them: (the computation, the switch that sets it)
_TF32_SWITCHES = {
    "matmul_tf32": ("float32 matmuls", "torch.backends.cuda.matmul.allow_tf32"),
    "cudnn_tf32": ("float32 convolutions", "torch.backends.cudnn.allow_tf32"),
}
_TF32_SAID = re.compile(r"(float32 matmuls|float32 convolutions) (in TF32|in full float32)")


def _numerics(numerics: Mapping[str, object] | Sequence[tuple[str, object]]) -> str:
    """What the task says of the numerics it is judged and timed under: whether float32 matmuls
    and convolutions run in TF32 (of the settings the task's cache key names), and deterministic
    algorithms where they are asked for; nothing when none of them is named."""
    settings = dict(numerics)
    said = [f"{what} {'in TF32' if settings[name] else 'in full float32'} ({switch} = {bool(settings[name])})"
            for name, (what, switch) in _TF32_SWITCHES.items() if name in settings]
    if settings.get("deterministic_algorithms"):
        said.append("deterministic algorithms only (torch.use_deterministic_algorithms(True)): the same inputs give "
                    "the same outputs bit for bit")
    return render("numerics", settings="; ".join(said)) if said else ""


def numerics_in(messages: Sequence[Message]) -> dict[str, bool]:
    """The TF32 settings (`matmul_tf32`, `cudnn_tf32`) a conversation's task message states, as
    `task_message` wrote them; those it does not state are absent."""
    names = {what: name for name, (what, _) in _TF32_SWITCHES.items()}
    for m in messages:
        if m["role"] == "user" and m["content"].lstrip().startswith("Here is a PyTorch program"):
            after = m["content"].rpartition("\nTarget GPU: ")[2]  # (past the program, which may say anything)
            line = next((ln for ln in after.splitlines() if ln.startswith("Numerics: ")), "")
            return {names[what]: how == "in TF32" for what, how in _TF32_SAID.findall(line)}
    return {}


def task_message(task_source: str, gpu: str, capability: str = "", omitted: int = 0,
                 cutlass: CutlassHeaders | None | str = FIND,
                 numerics: Mapping[str, object] | Sequence[tuple[str, object]] = ()) -> Message:
    """The task: the program, the target GPU, the numerics it runs under (`numerics`: its cache
    key's settings), the header libraries the build has (`cutlass`: the headers, None for none,
    FIND for those found here), the rules and the reply format; with a note when `omitted` earlier
    turns were left out of the conversation."""
    content = render("task", program=task_source.strip("\n"), target=_target(gpu, capability),
                     numerics=_numerics(numerics), libraries=_libraries(cutlass))
    if omitted:
        content += "\n\n" + render("omitted", count=omitted)
    return {"role": "user", "content": content}


def assistant_message(turn: Turn) -> Message:
    """An earlier turn as the model sees it later: its program and its summary, nothing else."""
    summary = turn.summary.strip() or "(none)"
    if turn.code is None:
        return {"role": "assistant", "content": render("assistant_no_code", summary=summary)}
    code = turn.code.strip("\n")
    longest = max((len(m) for m in re.findall(r"`+", code)), default=0)
    fence = "`" * max(3, longest + 1)
    return {"role": "assistant", "content": render("assistant", fence=fence, lang="python", code=code, summary=summary)}


def approx_tokens(text: str) -> int:
    """The default token count: one token per four characters, rounded up (close for English
    prose and code with BPE tokenizers such as Qwen's; a policy with a real tokenizer passes its
    own counter)."""
    return math.ceil(len(text) / 4)


def count_prompt_tokens(messages: Sequence[Message], count_tokens: Callable[[str], int] | None = None) -> int:
    """Tokens of a conversation: each message's content plus MESSAGE_OVERHEAD_TOKENS."""
    count = count_tokens or approx_tokens
    return sum(count(m["content"]) + MESSAGE_OVERHEAD_TOKENS for m in messages)


def build_messages(
    task_source: str,
    gpu: str,
    turns: Sequence[Turn],
    max_prompt_tokens: int,
    count_tokens: Callable[[str], int] | None = None,
    *,
    capability: str = "",
    cutlass: CutlassHeaders | None | str = FIND,
    numerics: Mapping[str, object] | Sequence[tuple[str, object]] = (),
) -> list[Message]:
    """The conversation for the next turn: system, task, then each earlier turn as an assistant
    message (program and summary only) and a user message (its feedback).

    When the whole would exceed `max_prompt_tokens` (counted with `count_tokens`, default
    `approx_tokens`, plus MESSAGE_OVERHEAD_TOKENS per message), the oldest turns are dropped first
    and the task message says so. The system and task messages always stay, and so does the
    latest turn (the model must see the verdict on its last attempt): when those alone exceed the
    budget the result is over it, and the caller decides (`count_prompt_tokens` tells by how much).
    `cutlass` and `numerics` are `task_message`'s (the task names CUTLASS's headers when the
    build has them, and the TF32 settings its cache key names).
    """
    count = count_tokens or approx_tokens

    def cost(messages: Sequence[Message]) -> int:
        return sum(count(m["content"]) + MESSAGE_OVERHEAD_TOKENS for m in messages)

    # a turn the judge could not judge (its own failure) is left out: the writer is not told of it
    turns = [t for t in turns if t.result is None or not t.result.judge_side]
    pairs = [[assistant_message(t), {"role": "user", "content": t.feedback}] for t in turns]
    costs = [cost(p) for p in pairs]
    system = system_message()
    first = 0
    while first < len(pairs) - 1:
        head = [system, task_message(task_source, gpu, capability, omitted=first, cutlass=cutlass, numerics=numerics)]
        if cost(head) + sum(costs[first:]) <= max_prompt_tokens:
            break
        first += 1
    messages = [system, task_message(task_source, gpu, capability, omitted=first, cutlass=cutlass, numerics=numerics)]
    for pair in pairs[first:]:
        messages.extend(pair)
    return messages
