"""The judge's static rules on the CPU: every static hack is rejected with the right rule; honest
candidates and the hacks only running can catch pass them."""

from __future__ import annotations

from pathlib import Path

import pytest

from judge_cases import HONEST, RUNTIME_HACKS, STATIC_HACKS, Case
from kevin_backend.toolchain.candidate import Candidate, CandidateError
from kevin_backend.toolchain.static_rules import check
from kevin_backend.toolchain.cpp_text import strip_cpp
from kevin_backend.judge.static_judge import judge_static
from kevin_backend.judge.result import Reason


@pytest.mark.parametrize("case", STATIC_HACKS, ids=lambda c: c.name)
def test_static_hacks_are_rejected_with_the_right_rule(case: Case) -> None:
    violations = check(Candidate.parse(case.source))
    assert case.expect in {v.rule for v in violations}, [str(v) for v in violations]


@pytest.mark.parametrize("case", HONEST + RUNTIME_HACKS, ids=lambda c: c.name)
def test_honest_and_runtime_only_candidates_pass_the_rules(case: Case) -> None:
    assert check(Candidate.parse(case.source)) == ()


def test_every_case_tells_its_story() -> None:
    for case in HONEST + STATIC_HACKS + RUNTIME_HACKS:
        doc = Candidate.parse(case.source).tree.body[0]
        assert doc.value.value.strip(), case.name  # type: ignore[attr-defined]
    assert len(STATIC_HACKS) + len(RUNTIME_HACKS) >= 12


def test_violations_name_the_line() -> None:
    case = next(c for c in STATIC_HACKS if c.name == "cpp-side-stream")
    (v,) = [v for v in check(Candidate.parse(case.source)) if v.rule == "no-streams-threads"]
    assert v.where.startswith("cuda:") and "cudaStreamCreate" in v.message
    line = int(v.where.split(":")[1])
    cuda = Candidate.parse(case.source).extensions[0].cuda_sources
    assert "cudaStreamCreate" in cuda.splitlines()[line - 1]


def test_comments_and_strings_do_not_trigger_cpp_rules() -> None:
    code = 'int a; // cudaStreamCreate(&s) in a comment\n/* std::thread t; */ const char* m = "try { fopen(x) }";\n'
    stripped = strip_cpp(code)
    assert "cudaStreamCreate" not in stripped and "thread" not in stripped and "fopen" not in stripped
    assert stripped.count("\n") == code.count("\n")


def _blanked_by_hand(code: str) -> str:
    """strip_cpp's rules spelled out a character at a time: a line comment to its line's end, a
    block comment to its `*/` (or the source's end), a literal's contents to its closing quote, its
    line's end or the source's (a backslash takes the character after it), newlines kept."""
    out, i, n = list(code), 0, len(code)

    def clear(a: int, b: int) -> None:
        for k in range(a, min(b, n)):
            out[k] = out[k] if out[k] == "\n" else " "

    while i < n:
        if code.startswith("//", i):
            j = code.find("\n", i)
            j = n if j < 0 else j
        elif code.startswith("/*", i):
            j = code.find("*/", i + 2)
            j = n if j < 0 else j + 2
        elif code[i] in "\"'":
            j = i + 1
            while j < n and code[j] not in (code[i], "\n"):
                j += 2 if code[j] == "\\" else 1
            clear(i + 1, j)
            i = j + 1
            continue
        else:
            i += 1
            continue
        clear(i, j)
        i = j
    return "".join(out)


def test_strip_cpp_blanks_what_the_rules_say_and_keeps_every_offset() -> None:
    import random

    cases = ['a = "x\\"y" + \'\\\'\' // tail "q"\nb', "/* a\n b */ c /* open", '"open\nnext', "1'000'000 + 'c'",
             '"ends in a backslash\\', "x /*/ y */ z", 'u8"s" L\'w\' R"(raw)"', "// only\n// lines\n"]
    rnd = random.Random(7)
    cases += ["".join(rnd.choice("ab/*\"'\\\n x") for _ in range(rnd.randint(0, 16))) for _ in range(20000)]
    for code in cases:
        stripped = strip_cpp(code)
        assert stripped == _blanked_by_hand(code), code
        assert len(stripped) == len(code) and [i for i, c in enumerate(stripped) if c == "\n"] == [i for i, c in enumerate(code) if c == "\n"]
    assert strip_cpp('f("a // b"); // c') == 'f("      ");     '


def test_sources_must_be_readable() -> None:
    with pytest.raises(CandidateError, match="line 2"):
        Candidate.parse("import torch\nx = (\n")
    src = "from torch.utils.cpp_extension import load_inline\nimport torch\nsrc = torch.__file__\next = load_inline(name='a', cpp_sources=src, functions=['f'])\n"
    with pytest.raises(CandidateError, match="cpp_sources"):
        Candidate.parse(src)


def _write(tmp_path, name: str, text: str):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_kevin_eval_static_only_exit_codes_and_json(tmp_path, capsys) -> None:
    import json

    from judge_cases import GATED_TASK
    from kevin_backend.cli.main import main

    problem = _write(tmp_path, "problem.py", GATED_TASK)
    good = _write(tmp_path, "good.py", HONEST[0].source)
    bad = _write(tmp_path, "bad.py", next(c for c in STATIC_HACKS if c.name == "try-except-fallback").source)

    assert main(["eval", str(problem), str(good), "--static-only"]) == 0
    assert "passes the static rules" in capsys.readouterr().out
    assert main(["eval", str(problem), str(bad), "--static-only", "--json"]) == 1
    verdict = json.loads(capsys.readouterr().out)
    assert verdict["stage"] == "static" and verdict["reason"] == "RULE_VIOLATION" and verdict["score"] == 0.0
    assert verdict["violations"][0]["rule"] == "no-try-except"
    # usage errors: a missing file, a problem without Model
    assert main(["eval", str(tmp_path / "nope.py"), str(good), "--static-only"]) == 2
    no_model = _write(tmp_path, "no_model.py", "def get_inputs():\n    return []\n")
    assert main(["eval", str(no_model), str(good), "--static-only"]) == 2
    assert "defines no Model" in capsys.readouterr().err


def test_kevin_eval_over_a_folder_static_only(tmp_path, capsys) -> None:
    import json

    from judge_cases import GATED_TASK
    from kevin_backend.cli.main import main

    problem = _write(tmp_path, "problem.py", GATED_TASK)
    folder = tmp_path / "candidates"
    folder.mkdir()
    _write(folder, "a_good.py", HONEST[0].source)
    _write(folder, "b_bad.py", next(c for c in STATIC_HACKS if c.name == "try-except-fallback").source)
    (folder / "notes.txt").write_text("not a candidate")
    assert main(["eval", str(problem), str(folder), "--static-only"]) == 1
    out = capsys.readouterr().out
    assert "a_good.py: passes the static rules" in out
    assert "b_bad.py: rejected: breaks a rule [no-try-except, " in out  # the rules broken, by id
    # nothing ran: the summary counts passes of the rules, not acceptances
    assert out.strip().splitlines()[-1] == "1 passed the static rules, 0 no verdict, 1 rejected"
    assert main(["eval", str(problem), str(folder), "--static-only", "--json"]) == 1
    verdicts = json.loads(capsys.readouterr().out)
    assert [Path(v["candidate"]).name for v in verdicts] == ["a_good.py", "b_bad.py"]
    assert [v["reason"] for v in verdicts] == ["STATIC_OK", "RULE_VIOLATION"]
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["eval", str(problem), str(empty), "--static-only"]) == 2
    assert "no candidate programs" in capsys.readouterr().err
    assert main(["eval", str(problem), str(folder), "--workers", "0"]) == 2


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="about machines without a GPU")
def test_kevin_eval_without_a_gpu_says_so(tmp_path, capsys) -> None:
    from judge_cases import GATED_TASK
    from kevin_backend.cli.main import main

    problem = _write(tmp_path, "problem.py", GATED_TASK)
    good = _write(tmp_path, "good.py", HONEST[0].source)
    assert main(["eval", str(problem), str(good)]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err


KEVIN_STYLE = '''"""Honest, in the style models write: a templated kernel under AT_DISPATCH, the extension kept
on the module, weights as parameters, options built with torch:: helpers."""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

scale_add_source = """
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>

template <typename scalar_t>
__global__ void scale_add_kernel(const scalar_t* __restrict__ x, const scalar_t* __restrict__ b, scalar_t* __restrict__ y,
                                 int64_t n, int64_t cols) {
    int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i] * static_cast<scalar_t>(2) + b[i % cols];
}

torch::Tensor scale_add_cuda(torch::Tensor x, torch::Tensor b) {
    TORCH_CHECK(x.is_cuda(), "x must be a CUDA tensor");
    auto y = torch::empty(x.sizes(), torch::TensorOptions().dtype(x.dtype()).device(x.device()));
    const int64_t n = x.numel();
    const int threads = 256;
    AT_DISPATCH_FLOATING_TYPES_AND_HALF(x.scalar_type(), "scale_add_cuda", ([&] {
        scale_add_kernel<scalar_t><<<(n + threads - 1) / threads, threads, 0, at::cuda::getCurrentCUDAStream()>>>(
            x.data_ptr<scalar_t>(), b.data_ptr<scalar_t>(), y.data_ptr<scalar_t>(), n, x.size(-1));
    }));
    return y;
}
"""

scale_add_cpp = "torch::Tensor scale_add_cuda(torch::Tensor x, torch::Tensor b);"

scale_add = load_inline(
    name="scale_add",
    cpp_sources=scale_add_cpp,
    cuda_sources=scale_add_source,
    functions=["scale_add_cuda"],
    verbose=False,
    extra_cuda_cflags=["-O3", "--use_fast_math"],
)


class ModelNew(nn.Module):
    def __init__(self, features: int):
        super().__init__()
        self.bias = nn.Parameter(torch.randn(features))
        self.scale_add = scale_add

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        batch = x.size(0)
        out = self.scale_add.scale_add_cuda(x, self.bias)
        return out.view(batch, -1)
'''


def test_a_typical_model_written_candidate_passes() -> None:
    candidate = Candidate.parse(KEVIN_STYLE)
    (ext,) = candidate.extensions
    assert ext.extra_cuda_cflags == ("-O3", "--use_fast_math") and ext.bound_to == "scale_add"
    assert check(candidate) == ()


def test_judge_stops_at_the_rules_and_says_when_it_needs_a_gpu(tmp_path) -> None:
    import torch

    from judge_cases import GATED_TASK
    from kevin_backend.judge.judge import Judge
    from kevin_backend.judge.result import Reason, Stage

    judge = Judge(tmp_path)
    bad = next(c for c in STATIC_HACKS if c.name == "side-stream")
    result = judge.judge(GATED_TASK, bad.source)
    assert result.stage is Stage.STATIC and result.reason is Reason.RULE_VIOLATION
    assert "no-streams-threads" in result.feedback and result.score == 0.0
    if not torch.cuda.is_available():
        result = judge.judge(GATED_TASK, HONEST[0].source)
        assert result.reason is Reason.NO_GPU and not list(tmp_path.iterdir())  # nothing was built


def test_launch_bounds_after_void_names_the_kernel() -> None:
    """`__global__ void __launch_bounds__(256) k(...)` is as common as the other order."""
    source = HONEST[0].source.replace("__global__ void gated_kernel(", "__global__ void __launch_bounds__(256) gated_kernel(")
    assert "__launch_bounds__(256) gated_kernel" in source
    assert check(Candidate.parse(source)) == ()


@pytest.mark.parametrize("call", ["x.clamp_min(0.0)", "x.sigmoid_()", "x.expm1()", "x.log1p()", "x.cumprod(0)", "x.sign()",
                                  "x.to(torch.float16)", "x.float()", "x.nan_to_num()", "x.abs_()"])
def test_any_tensor_method_outside_the_allowlist_is_pytorch_compute(call: str) -> None:
    """A forward that computes part of the work with PyTorch before its kernel: the rule is an
    allowlist of view and metadata methods, so no compute method is missed."""
    from judge_cases import program

    source = program(f"calls {call} first", forward=f"x = {call}\n        return ext.gated(x.contiguous(), w.contiguous())")
    result = judge_static(source)
    assert result.reason is Reason.RULE_VIOLATION
    assert [v.rule for v in result.violations] == ["no-pytorch-compute"], result.feedback
    assert call.split(".")[1].split("(")[0] in result.feedback


def test_compute_hidden_in_a_helper_method_or_function_is_found_and_views_are_allowed() -> None:
    from judge_cases import program

    helper = program("a helper method computes", forward="return self.prep(x, w)",
                     init="\n    def prep(self, x, w):\n        return ext.gated(x.clamp_min(0.0), w)\n")
    assert "clamp_min" in judge_static(helper).feedback
    views = program("views, metadata, moves and allocation only",
                    forward="n = x.size(0) * x.stride(0)\n        x = x.to(x.device).view(x.size(0), -1).contiguous()\n"
                            "        out = x.new_zeros(x.shape)\n        out.zero_()\n        return ext.gated(x, w.cuda())")
    assert judge_static(views).reason is Reason.STATIC_OK, judge_static(views).feedback


def test_computing_tensor_methods_in_cpp_host_code_are_rejected() -> None:
    from judge_cases import _CUDA_OK, program

    cuda = _CUDA_OK.replace("auto out = torch::empty_like(x);", "auto out = torch::empty_like(x);\n    x = x.clamp_min(0.0);")
    result = judge_static(program("host code computes", cuda=cuda))
    assert any(v.rule == "no-pytorch-compute" and "clamp_min" in v.message for v in result.violations)
