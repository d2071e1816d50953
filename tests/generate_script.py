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
SLOW = program("Turn 5: correct, but burns time in a loop that leaves the value unchanged.",
               cuda=_CUDA_OK.replace(
                   "if (i < n) out[i] = 1.0f / (1.0f + expf(-x[i])) * w[i] + 1.0f;",
                   "if (i < n) {\n        float v = x[i];\n        for (int k = 0; k < 2048; ++k) v = v * 1.0001f - v * 1.0001f + x[i];\n"
                   "        out[i] = 1.0f / (1.0f + expf(-v)) * w[i] + 1.0f;\n    }"))
FAST = program("Turn 6: the plain fused kernel.")

STEPS = [RULE_BROKEN, COMPILE_ERROR, RUNTIME_ERROR, WRONG, SLOW, FAST]
SUMMARIES = ["added a safety net", "first kernel", "added an input check", "fixed the check", "made it correct", "removed the loop"]


def replies() -> list[str]:
    return [f"<think>turn {i} reasoning</think>\n```python\n{code}\n```\nSummary: {summary}"
            for i, (code, summary) in enumerate(zip(STEPS, SUMMARIES))]
