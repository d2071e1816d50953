"""A scripted six-turn search on the gated task (y = sigmoid(x) * w + 1): every kind of judge
outcome once, then the fast kernel. Used by the generator's GPU test and the replay example."""

from __future__ import annotations

from judge_cases import _CUDA_OK, program

RULE_BROKEN = program("Turn 1: hides a fallback in try/except (a rule).",
                      forward="try:\n            return ext.gated(x, w)\n        except Exception:\n            return x")
COMPILE_ERROR = program("Turn 2: a syntax error in the kernel.",
                        cuda=_CUDA_OK.replace("* w[i] + 1.0f;", "* w[i] + ;"))
RUNTIME_ERROR = program("Turn 3: a host check that fails on the task's inputs.",
                        cuda=_CUDA_OK.replace("auto out = torch::empty_like(x);",
                                              'TORCH_CHECK(x.dim() == 3, "gated expects a 3-D input");\n    auto out = torch::empty_like(x);'))
WRONG = program("Turn 4: forgets the + 1.", cuda=_CUDA_OK.replace("* w[i] + 1.0f;", "* w[i];"))


def _looped(doc: str, iterations: int) -> str:
    """The fused kernel with a loop of `iterations` that leaves the value unchanged (time burnt)."""
    return program(doc, cuda=_CUDA_OK.replace(
        "if (i < n) out[i] = 1.0f / (1.0f + expf(-x[i])) * w[i] + 1.0f;",
        "if (i < n) {\n        float v = x[i];\n"
        f"        for (int k = 0; k < {iterations}; ++k) v = v * 1.0001f - v * 1.0001f + x[i];\n"
        "        out[i] = 1.0f / (1.0f + expf(-v)) * w[i] + 1.0f;\n    }"))


SLOW = _looped("Turn 5: correct, but burns time in a loop that leaves the value unchanged.", 2048)
FAST = program("Turn 6: the plain fused kernel.")
# faster than SLOW, and on an H200 about half Inductor's speed whatever the drift (the plain fused
# kernel is within a tenth of Inductor's, where a test cannot pin the decision)
SHORTER = _looped("Turn 6: a shorter loop.", 320)

STEPS = [RULE_BROKEN, COMPILE_ERROR, RUNTIME_ERROR, WRONG, SLOW, FAST]
SUMMARIES = ["added a safety net", "first kernel", "added an input check", "fixed the check", "made it correct", "removed the loop"]


def replies(last: str = FAST) -> list[str]:
    """The six replies, the sixth's program `last`."""
    return [f"<think>turn {i} reasoning</think>\n```python\n{code}\n```\nSummary: {summary}"
            for i, (code, summary) in enumerate(zip([*STEPS[:-1], last], SUMMARIES))]
