"""Prompts: feedback per judge outcome, code and summary extraction, the multi-turn conversation
(no chain of thought carried forward, oldest turns cut first), and the prompt version."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from kevin_backend.generate import prompts
from kevin_backend.generate.policy import Reply
from kevin_backend.generate.prompts import (
    Turn,
    approx_tokens,
    build_messages,
    count_prompt_tokens,
    extract_code,
    extract_summary,
    feedback_for,
    prompt_version,
    render,
)
from kevin_backend.judge.result import JudgeResult, JudgeTimings, Mismatch, Reason, RuleViolation, Stage

TASK = '''import torch
import torch.nn as nn

class Model(nn.Module):
    def forward(self, x):
        return torch.relu(x)

def get_inputs():
    return [torch.randn(1024, device="cuda")]

def get_init_inputs():
    return []
'''

CLOSING = render("closing")


def program(tag: str) -> str:
    return (
        "import torch\nimport torch.nn as nn\nfrom torch.utils.cpp_extension import load_inline\n\n"
        f'cuda_src = "__global__ void k_{tag}(const float* x, float* y, int n) {{ int i = blockIdx.x; }}"\n\n'
        f"class ModelNew(nn.Module):\n    def forward(self, x):\n        return x  # {tag}\n"
    )


def reply(tag: str, *, summary: bool = True) -> Reply:
    text = f"I will write a fused kernel for attempt {tag}.\n\n```python\n{program(tag)}```\n"
    if summary:
        text += f"\nSummary: attempt {tag} used one thread per element and a grid-stride loop.\n"
    return Reply(text=text, reasoning=f"SECRET-REASONING-{tag}: let me think about occupancy at length...")


# ---------------------------------------------------------------------------------------------
# feedback, one judge outcome at a time


def test_every_feedback_ends_with_the_instruction_to_reply_with_an_improved_program() -> None:
    results: list[JudgeResult | None] = [None]
    for reason in Reason:
        if not reason.judge_side:  # no verdict on the kernel: nothing is said (test below)
            results.append(JudgeResult(Stage.RUN, reason, feedback="details of what happened"))
    results.append(JudgeResult(Stage.CORRECTNESS, Reason.MISMATCH, mismatch=Mismatch(0, 1.0, 1.0, 1, 2, (0,), 0.0, 1.0, 0)))
    results.append(JudgeResult(Stage.CORRECTNESS, Reason.NAN_INF, mismatch=Mismatch(0, 1.0, 1.0, 1, 2, (0,), 0.0, 1.0, 0)))
    for result in results:
        text = feedback_for(result)
        assert text.endswith(CLOSING), result
        assert "$" not in text and "\n\n\n" not in text
        assert "Summary:" in CLOSING and "```python" in CLOSING


def test_rule_violations_are_listed() -> None:
    result = JudgeResult(
        Stage.STATIC,
        Reason.RULE_VIOLATION,
        feedback="The kernel program breaks these rules:\n- ...",
        violations=(
            RuleViolation("no-try-except", "python:12", "try/except is not allowed"),
            RuleViolation("no-pytorch-compute", "python:20", "calls torch.matmul"),
        ),
    )
    text = feedback_for(result)
    assert "- [no-try-except] (python:12) try/except is not allowed" in text
    assert "- [no-pytorch-compute] (python:20) calls torch.matmul" in text
    assert text.startswith("Your program breaks a rule")


def test_rule_reasons_without_violations_quote_the_judge() -> None:
    text = feedback_for(JudgeResult(Stage.RUN, Reason.PYTORCH_COMPUTE, feedback="forward ran PyTorch compute ops: aten::add.Tensor"))
    assert "computes with PyTorch ops in its forward" in text and "aten::add.Tensor" in text
    text = feedback_for(JudgeResult(Stage.STATIC, Reason.SYNTAX_ERROR, feedback="The program cannot be read: line 3: invalid syntax"))
    assert "is not valid Python" in text and "line 3: invalid syntax" in text


def test_compile_errors_are_quoted_in_a_block() -> None:
    errors = "cuda_sources line 7: error: identifier \"blockIdxx\" is undefined\n    int i = blockIdxx.x;"
    text = feedback_for(JudgeResult(Stage.BUILD, Reason.BUILD_ERROR, feedback=errors))
    assert "does not compile" in text
    assert "```\ncuda_sources line 7: error: identifier \"blockIdxx\" is undefined\n    int i = blockIdxx.x;\n```" in text
    timeout = feedback_for(JudgeResult(Stage.BUILD, Reason.BUILD_TIMEOUT, feedback="build timed out after 300 s"))
    assert "took too long" in timeout and "build timed out after 300 s" in timeout


def test_long_errors_are_cut_and_inner_fences_cannot_close_the_block() -> None:
    text = feedback_for(JudgeResult(Stage.BUILD, Reason.BUILD_ERROR, feedback="first error\n" + "x" * 20000))
    assert "first error" in text and "[... cut]" in text and len(text) < 6000
    traceback = "Traceback ...\n" + "y" * 20000 + "\nRuntimeError: the last line matters"
    text = feedback_for(JudgeResult(Stage.RUN, Reason.RUNTIME_ERROR, feedback=traceback))
    assert text.count("RuntimeError: the last line matters") == 1 and "[cut ...]" in text
    text = feedback_for(JudgeResult(Stage.RUN, Reason.RUNTIME_ERROR, feedback="printed ```python\nboom"))
    assert "````\nprinted ```python\nboom\n````" in text


@pytest.mark.parametrize(
    ("reason", "headline", "hint"),
    [
        (Reason.RUNTIME_ERROR, "raised an error", None),
        (Reason.CRASH, "crashed", "out-of-bounds"),
        (Reason.HANG, "did not finish in time", "__syncthreads()"),
        (Reason.ILLEGAL_ADDRESS, "illegal memory access", "partial block"),
        (Reason.OUT_OF_MEMORY, "ran out of memory", "scratch space"),
    ],
)
def test_run_failures_quote_the_error_text(reason: Reason, headline: str, hint: str | None) -> None:
    error = f"CUDA error text for {reason.name} at kernel k_relu"
    text = feedback_for(JudgeResult(Stage.RUN, reason, feedback=error))
    assert headline in text
    assert f"```\n{error}\n```" in text
    if hint:
        assert hint in text


def test_mismatch_gives_the_numbers_and_the_place() -> None:
    mismatch = Mismatch(output=1, max_abs_error=0.0123456, max_rel_error=3.5, bad_elements=37, total_elements=4096,
                        first_bad_index=(2, 17), expected=0.731, got=-0.25, trial=3)
    text = feedback_for(JudgeResult(Stage.CORRECTNESS, Reason.MISMATCH, feedback=f"wrong values: {mismatch}", mismatch=mismatch))
    assert "On input set 3, output 1 has 37 of 4096 elements (0.90%) outside the error bound" in text
    assert "max absolute error: 0.0123" in text
    assert "max relative error: 3.5" in text
    assert "first wrong element at index [2, 17]: expected 0.731, got -0.25" in text


def test_mismatch_carries_the_bound_and_the_layout_diagnosis() -> None:
    mismatch = Mismatch(0, 0.5, 0.9, 4096, 4096, (0, 1), 0.25, 0.75, 0, allowed=1.3e-5, exact="float64")
    note = "The kernel is right when every input is contiguous and wrong on the task's own layouts (input 1: shape [64, 32], strides (1, 64))."
    text = feedback_for(JudgeResult(Stage.CORRECTNESS, Reason.MISMATCH, feedback=f"wrong values: {mismatch}\n{note}", mismatch=mismatch))
    assert "allowed 1.3e-05" in text and "float64 reference" in text
    assert note in text and "strides (1, 64)" in text


def test_judge_side_verdicts_are_never_shown_to_the_writer() -> None:
    """The judge's own failure (memory, a crash of its own steps) is no verdict on the kernel: the
    writer gets no feedback for it, and the turn is left out of later conversations."""
    from kevin_backend.generate.policy import Reply

    lost = JudgeResult(Stage.RUN, Reason.RESOURCE, feedback="the judge could not get GPU memory while making inputs")
    assert feedback_for(lost) == ""
    judged = JudgeResult(Stage.CORRECTNESS, Reason.MISMATCH, feedback="wrong values: ...",
                         mismatch=Mismatch(0, 1.0, 1.0, 1, 2, (0,), 0.0, 1.0, 0))
    first = Turn.of(Reply(text="```python\nprint('first')\n```\nSummary: first"), judged)
    second = Turn.of(Reply(text="```python\nprint('second')\n```\nSummary: second"), lost)
    messages = build_messages("TASK", "NVIDIA H200", [first, second], 100_000)
    text = "\n".join(m["content"] for m in messages)
    assert "first" in text and "print('second')" not in text
    assert "could not get GPU memory" not in text and "the judge" not in text.lower()


def test_nan_inf_names_the_non_finite_elements() -> None:
    mismatch = Mismatch(0, float("inf"), float("inf"), 5, 100, (4,), 1.25, float("nan"), 0)
    text = feedback_for(JudgeResult(Stage.CORRECTNESS, Reason.NAN_INF, mismatch=mismatch))
    assert "NaN or Inf" in text and "5 of 100 elements (5.00%)" in text
    assert "index [4]: expected 1.25, got nan" in text


def test_mismatch_without_details_falls_back_to_the_judge_text() -> None:
    text = feedback_for(JudgeResult(Stage.CORRECTNESS, Reason.MISMATCH, feedback="integer output 0 differs"))
    assert "returns wrong values" in text and "integer output 0 differs" in text


@pytest.mark.parametrize("reason", [Reason.SHAPE_MISMATCH, Reason.DTYPE_MISMATCH])
def test_wrong_shape_or_dtype(reason: Reason) -> None:
    detail = "output 0 has shape [16, 32], expected [16, 64]" if reason is Reason.SHAPE_MISMATCH else "output 0 has dtype torch.float16, expected torch.float32"
    text = feedback_for(JudgeResult(Stage.CORRECTNESS, reason, feedback=detail))
    assert text.startswith(f"Your program {reason.value}.")
    assert detail in text and "same shape and dtype" in text


@pytest.mark.parametrize(
    ("reason", "headline"),
    [
        (Reason.INPUT_MUTATED, "changes its inputs"),
        (Reason.REPLAYED_OUTPUT, "returns stale outputs"),
        (Reason.SUSPICIOUS_SPEEDUP, "implausible speedup"),
    ],
)
def test_cheats_are_named(reason: Reason, headline: str) -> None:
    text = feedback_for(JudgeResult(Stage.CORRECTNESS, reason, feedback=f"detail-{reason.name}"))
    assert headline in text and f"detail-{reason.name}" in text


def test_no_code_feedback() -> None:
    text = feedback_for(None)
    assert "no python code block" in text


def test_correct_feedback_gives_timings_and_speedups() -> None:
    timings = JudgeTimings(kernel_ms=0.0412, eager_ms=0.1236, inductor_ms=0.0618, trials=100)
    text = feedback_for(JudgeResult(Stage.TIMING, Reason.ACCEPTED, timings=timings))
    assert "is correct" in text
    assert "your program: 0.0412 ms" in text
    assert "PyTorch eager: 0.1236 ms" in text
    assert "torch.compile (Inductor): 0.0618 ms" in text
    assert "speedup over eager: 3.00x" in text
    assert "speedup over Inductor: 1.50x" in text
    assert "faster" in text


def test_correct_feedback_without_inductor_says_not_measured() -> None:
    timings = JudgeTimings(kernel_ms=2.0, eager_ms=1.0, inductor_ms=None)
    text = feedback_for(JudgeResult(Stage.TIMING, Reason.ACCEPTED, timings=timings))
    assert "speedup over eager: 0.50x" in text
    assert "torch.compile (Inductor): not measured" in text and "speedup over Inductor: not measured" in text


# ---------------------------------------------------------------------------------------------
# reading replies


def test_extract_code_none_without_a_block() -> None:
    assert extract_code("I would write a kernel, but here is only prose. class ModelNew: ...") is None
    assert extract_code("```cuda\n__global__ void k() {}\n```") is None
    assert extract_code("") is None


def test_extract_code_takes_the_last_block_defining_modelnew() -> None:
    text = (
        "First a sketch:\n```python\nclass ModelNew:\n    v = 1\n```\n"
        "The CUDA part:\n```cpp\n__global__ void k() {}\n```\n"
        "The final program:\n```python\nimport torch\nclass ModelNew:\n    v = 2\n```\n"
        "And how to test it:\n```python\nprint(ModelNew().v)\n```\n"
    )
    code = extract_code(text)
    assert code == "import torch\nclass ModelNew:\n    v = 2\n"


def test_extract_code_falls_back_to_the_last_python_block() -> None:
    text = "```python\nx = 1\n```\ntext\n```py\ny = 2\n```\n```\nuntagged = 3\n```\n"
    assert extract_code(text) == "y = 2\n"
    assert extract_code("```\nclass ModelNew:\n    pass\n```") == "class ModelNew:\n    pass\n"


def test_extract_code_reads_a_block_cut_at_the_token_limit_and_ignores_reasoning() -> None:
    assert extract_code("Here:\n```python\nclass ModelNew:\n    def forward(self, x):\n        return") == (
        "class ModelNew:\n    def forward(self, x):\n        return\n"
    )
    text = "<think>\n```python\nclass ModelNew:\n    thought = 1\n```\n</think>\nNo code this time."
    assert extract_code(text) is None


def test_extract_summary_after_the_summary_line() -> None:
    text = f"Prose first.\n```python\n{program('a')}```\nSummary: Fused the bias add into the GEMM epilogue.\nUsed float4 loads."
    assert extract_summary(text) == "Fused the bias add into the GEMM epilogue.\nUsed float4 loads."
    assert extract_summary("**Summary:** tiled the reduction.") == "tiled the reduction."
    assert extract_summary("## Summary\nShared-memory tiling, 32x32.") == "Shared-memory tiling, 32x32."


def test_extract_summary_is_bounded() -> None:
    summary = extract_summary("Summary: " + "word " * 1000)
    assert summary.endswith("...") and len(summary) <= prompts.SUMMARY_CHARS


def test_missing_summary_is_derived_from_prose_without_code() -> None:
    text = (
        "I fused the three elementwise ops into one kernel. Each thread handles four floats. "
        + "This sentence is long filler that goes on and on. " * 20
        + f"\n```python\n{program('zz')}```\nMore prose after the code."
    )
    summary = extract_summary(text)
    assert summary.startswith("I fused the three elementwise ops into one kernel. Each thread handles four floats.")
    assert len(summary) <= prompts.DERIVED_SUMMARY_CHARS
    assert summary.endswith(".")  # whole sentences
    assert "k_zz" not in summary and "ModelNew" not in summary and "import" not in summary


def test_derived_summary_never_contains_reasoning_or_code() -> None:
    text = "<think>SECRET plan</think>\n```python\nclass ModelNew: pass\n```\nA short note."
    assert extract_summary(text) == "A short note."
    assert extract_summary("```python\nclass ModelNew: pass\n```") == ""
    # a prose sentence that starts with the word is not a summary line
    assert extract_summary("Summary statistics are computed per row. Done.") == "Summary statistics are computed per row. Done."


# ---------------------------------------------------------------------------------------------
# the conversation


def make_turns(n: int, result: JudgeResult | None = None) -> list[Turn]:
    default = JudgeResult(Stage.BUILD, Reason.BUILD_ERROR, feedback="cuda_sources line 3: error: expected a ';'")
    return [Turn.of(reply(str(i)), result or default) for i in range(1, n + 1)]


def test_turn_of_reads_code_summary_and_feedback() -> None:
    turn = Turn.of(reply("q"), None)
    assert turn.code == program("q")
    assert turn.summary == "attempt q used one thread per element and a grid-stride loop."
    assert turn.feedback == feedback_for(None)


def test_messages_at_turn_three_keep_code_and_summaries_but_no_reasoning_or_prose() -> None:
    turns = make_turns(2)
    messages = build_messages(TASK, "NVIDIA H200", turns, max_prompt_tokens=100_000, capability="9.0")
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user", "assistant", "user"]
    assert "CUDA kernel engineer" in messages[0]["content"]
    task = messages[1]["content"]
    assert TASK.strip() in task and "NVIDIA H200" in task and "9.0" in task and "sm_90" in task
    assert "ModelNew" in task and "load_inline" in task and "Summary:" in task
    everything = "\n".join(m["content"] for m in messages)
    assert "SECRET-REASONING" not in everything
    assert "I will write a fused kernel" not in everything  # prose beyond the summary is dropped
    for i, turn in zip((2, 4), turns):
        assistant = messages[i]["content"]
        assert f"```python\n{turn.code.strip()}\n```" in assistant
        assert f"Summary: attempt {i // 2} used one thread per element" in assistant
        assert messages[i + 1]["content"] == turn.feedback
    assert "left out" not in task


def test_reasoning_inside_think_tags_is_dropped_too() -> None:
    text = f"<think>SECRET-THINK plan the kernel</think>\n```python\n{program('t')}```\nSummary: vectorized."
    turn = Turn.of(Reply(text=text), None)
    messages = build_messages(TASK, "NVIDIA H200", [turn], max_prompt_tokens=100_000)
    assert "SECRET-THINK" not in "\n".join(m["content"] for m in messages)
    assert "Summary: vectorized." in messages[2]["content"]


def test_a_turn_without_code_keeps_its_summary() -> None:
    turn = Turn.of(Reply(text="I could not decide on a tiling. Summary: tried nothing yet."), None)
    assert turn.code is None and turn.result is None
    messages = build_messages(TASK, "NVIDIA H200", [turn], max_prompt_tokens=100_000)
    assert "```" not in messages[2]["content"] and "Summary: tried nothing yet." in messages[2]["content"]
    assert "no python code block" in messages[3]["content"]


def test_code_with_backtick_runs_gets_a_longer_fence() -> None:
    code = 'class ModelNew:\n    doc = "```"\n'
    turn = Turn(Reply(text=""), code, "s", None, "fb")
    content = build_messages(TASK, "gpu", [turn], 100_000)[2]["content"]
    assert content.startswith("````python\n") and "\n````\n" in content


def test_truncation_drops_the_oldest_turns_first_and_keeps_system_and_task() -> None:
    turns = make_turns(6)
    full = build_messages(TASK, "NVIDIA H200", turns, max_prompt_tokens=10**9)
    per_turn = count_prompt_tokens(full[2:4])
    head = count_prompt_tokens(full[:2])
    budget = head + 50 + 3 * per_turn  # room for three turns and the note
    messages = build_messages(TASK, "NVIDIA H200", turns, max_prompt_tokens=budget)
    assert count_prompt_tokens(messages) <= budget
    assert messages[0] == full[0] and messages[1]["content"].startswith(full[1]["content"])
    kept = [m["content"] for m in messages if m["role"] == "assistant"]
    assert len(kept) == 3
    assert [f"k_{i}" in k for k, i in zip(kept, (4, 5, 6))] == [True, True, True]
    assert "k_1" not in "".join(kept) and "k_3" not in "".join(kept)
    assert "left out" in messages[1]["content"] and "attempts omitted: 3" in messages[1]["content"]


def test_the_latest_turn_stays_even_over_budget() -> None:
    turns = make_turns(3)
    messages = build_messages(TASK, "gpu", turns, max_prompt_tokens=10)
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user"]
    assert "k_3" in messages[2]["content"] and "attempts omitted: 2" in messages[1]["content"]
    assert build_messages(TASK, "gpu", [], max_prompt_tokens=10)[1]["content"].count("left out") == 0


def test_a_custom_token_counter_is_used() -> None:
    turns = make_turns(4)
    calls: list[str] = []

    def words(text: str) -> int:
        calls.append(text)
        return len(text.split())

    full = build_messages(TASK, "gpu", turns, 10**9, words)
    budget = count_prompt_tokens(full, words) - 1  # one token short of everything
    messages = build_messages(TASK, "gpu", turns, budget, words)
    assert calls and len(messages) == len(full) - 2  # exactly the oldest turn went
    assert "k_1" not in "".join(m["content"] for m in messages) and "k_2" in messages[2]["content"]


def test_approx_tokens_is_a_quarter_of_the_characters() -> None:
    assert approx_tokens("") == 0 and approx_tokens("abcd") == 1 and approx_tokens("abcde") == 2


# ---------------------------------------------------------------------------------------------
# prompt version


def test_prompt_version_follows_the_template_text(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    original = prompt_version()
    assert original == prompt_version() and len(original) == 16
    same = tmp_path / "same"
    shutil.copytree(prompts.TEMPLATES_DIR, same)
    monkeypatch.setattr(prompts, "TEMPLATES_DIR", same)
    assert prompt_version() == original  # the text counts, not where it lives
    changed = tmp_path / "changed"
    shutil.copytree(prompts.TEMPLATES_DIR, changed)
    (changed / "feedback_mismatch.txt").write_text((same / "feedback_mismatch.txt").read_text() + "\nOne more hint.\n")
    monkeypatch.setattr(prompts, "TEMPLATES_DIR", changed)
    assert prompt_version() != original
    assert "One more hint." in feedback_for(JudgeResult(Stage.CORRECTNESS, Reason.MISMATCH, mismatch=Mismatch(0, 1, 1, 1, 1, (0,), 0, 1, 0)))


def test_templates_ship_with_the_package() -> None:
    names = {p.stem for p in prompts.TEMPLATES_DIR.glob("*.txt")}
    assert {"system", "task", "closing", "feedback_correct", "feedback_mismatch", "feedback_no_code"} <= names
    pyproject = (Path(__file__).resolve().parents[1] / "pyproject.toml").read_text()
    assert '"kevin_backend.generate" = ["templates/*.txt"]' in pyproject
