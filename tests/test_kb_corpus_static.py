"""The KernelBench corpus (tests/kb_corpus) on the CPU: its shape, its problems, and the static
judge's verdict on every candidate. The GPU verdicts are for the judge's GPU tests; here nothing
is built or run, and no problem allocates its inputs (they are made on the meta device)."""

from __future__ import annotations

import ast
import re
import types
from collections import Counter

import pytest
import torch

from kb_corpus.corpus import CorpusCase, is_rule_id, load_corpus, problem_names, problem_source, verdict_matches
from kevin_backend.judge.result import Reason
from kevin_backend.judge.static_judge import check_problem, judge_static

CASES = load_corpus()
HONEST = [c for c in CASES if c.honest]
WRONG = [c for c in CASES if not c.honest]
PROBLEMS = problem_names()

MIN_BYTES = 256 * 2**20  # 256 MB (fp32 4096 x 16384)
MAX_BYTES = 3 * 2**29  # 1.5 GB

# Static rule ids a candidate may be expected to break (kevin_backend/toolchain/static_*.py).
RULE_IDS = frozenset({
    "defines-modelnew", "allowed-imports", "no-try-except", "no-reference-model", "no-empty-bodies", "no-patching",
    "no-streams-threads", "no-system-access", "no-timers", "no-pytorch-compute", "launches-a-kernel",
    "inert-top-level", "no-runtime-reach", "no-dynamic-code", "allowed-build-flags", "no-host-sync", "cpp-preprocessed",
    "allowed-headers", "no-python-api", "no-host-asm", "no-symbol-tricks", "allowed-namespaces",
})


def _ids(cases: list[CorpusCase]) -> list[str]:
    return [c.name for c in cases]


def _load_problem(name: str) -> types.ModuleType:
    module = types.ModuleType(f"kb_problem_{name}")
    exec(compile(problem_source(name), f"<problem {name}>", "exec"), module.__dict__)  # noqa: S102 - our own files
    return module


def _span_bytes(t: torch.Tensor) -> int:
    """Bytes of the memory a tensor spans (a stride-0 broadcast counts its one row)."""
    if t.numel() == 0:
        return 0
    extent = 1 + sum((n - 1) * abs(s) for n, s in zip(t.shape, t.stride()))
    return extent * t.element_size()


def _meta_inputs(name: str) -> list:
    module = _load_problem(name)
    with torch.device("meta"):
        return list(module.get_inputs())


# -- the corpus as a whole ---------------------------------------------------------------------


def test_corpus_size_and_balance() -> None:
    assert len(HONEST) >= 22, _ids(HONEST)
    assert len(WRONG) >= 12, _ids(WRONG)
    assert 10 <= len(PROBLEMS) <= 12, PROBLEMS
    by_problem = Counter(c.problem for c in CASES)
    honest_by_problem = Counter(c.problem for c in HONEST)
    assert set(by_problem) == set(PROBLEMS), "every problem has candidates, every candidate a problem"
    assert all(honest_by_problem[p] >= 1 for p in PROBLEMS), honest_by_problem
    assert len({c.name for c in CASES}) == len(CASES)


def test_expectations_name_reasons_or_rules() -> None:
    reasons = set(Reason.__members__)
    for case in CASES:
        for value in case.expect:
            assert value in reasons or value in RULE_IDS, f"{case.name}: unknown expectation {value!r}"
        assert not (case.honest and len(case.expect) > 1)
        # an expectation is either static (rule ids only) or dynamic (Reason names only)
        assert len({is_rule_id(v) for v in case.expect}) == 1, case.name


def test_wrong_candidates_cover_the_required_failures() -> None:
    expected = Counter(v for c in WRONG for v in c.expect)
    for reason in ("MISMATCH", "NAN_INF", "INPUT_MUTATED", "REPLAYED_OUTPUT", "SHAPE_MISMATCH", "DTYPE_MISMATCH",
                   "ILLEGAL_ADDRESS", "no-try-except", "no-pytorch-compute"):
        assert expected[reason] >= 1, reason


@pytest.mark.parametrize("case", CASES, ids=_ids(CASES))
def test_every_candidate_tells_its_story(case: CorpusCase) -> None:
    tree = ast.parse(case.candidate_source)
    first = tree.body[0]
    assert isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant), "opens with a module docstring"
    lines = [line.strip() for line in ast.get_docstring(tree).splitlines()]
    assert lines[0] and not lines[0].startswith("Expect:"), "the first line says what it is"
    expect_lines = [i for i, line in enumerate(lines) if line.startswith("Expect:")]
    assert len(expect_lines) == 1 and expect_lines[0] <= 3, "one Expect: line, right after the first"
    story = [line for line in lines[expect_lines[0] + 1:] if line]
    assert len(story) >= 2, "a few lines of story follow"
    assert any(isinstance(n, ast.ClassDef) and n.name == "ModelNew" for n in tree.body)
    assert "load_inline" in case.candidate_source and "cuda_sources" in case.candidate_source


def test_extension_names_are_unique() -> None:
    names: list[str] = []
    for case in CASES:
        for node in ast.walk(ast.parse(case.candidate_source)):
            if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", "")) == "load_inline":
                (name,) = [k.value.value for k in node.keywords if k.arg == "name"]
                names.append(name)
    assert len(names) == len(set(names)), [n for n, k in Counter(names).items() if k > 1]


@pytest.mark.parametrize("case", CASES, ids=_ids(CASES))
def test_modelnew_takes_the_problems_init_inputs(case: CorpusCase) -> None:
    init = _load_problem(case.problem).get_init_inputs()
    tree = ast.parse(case.candidate_source)
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "ModelNew")
    inits = [n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"]
    if not inits:  # inherits its __init__ (only the reference-subclassing hack does)
        assert case.expect == {"no-reference-model"}
        return
    args = inits[0].args
    positional = len(args.args) - 1  # without self
    required = positional - len(args.defaults)
    assert required <= len(init) <= positional, (case.name, init)


# -- the problems ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", PROBLEMS)
def test_problem_is_a_kernelbench_task(name: str) -> None:
    source = problem_source(name)
    check_problem(source)
    tree = ast.parse(source)
    imports = [a.name for n in tree.body if isinstance(n, ast.Import) for a in n.names]
    assert imports[:2] == ["torch", "torch.nn"], imports
    module = _load_problem(name)
    assert issubclass(module.Model, torch.nn.Module)
    assert isinstance(module.get_init_inputs(), list)
    assert any(isinstance(n, ast.Assign) and isinstance(n.value, ast.Constant) and isinstance(n.value.value, int)
               for n in tree.body), "module-level size constants"


@pytest.mark.parametrize("name", PROBLEMS)
def test_problem_inputs_are_made_on_the_cpu(name: str) -> None:
    tree = ast.parse(problem_source(name))
    get_inputs = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "get_inputs")
    for node in ast.walk(get_inputs):
        if isinstance(node, ast.Call):
            assert all(k.arg != "device" for k in node.keywords), "no device= in get_inputs"
            assert getattr(node.func, "attr", None) not in ("cuda", "to"), "no .cuda() / .to() in get_inputs"
    inputs = _meta_inputs(name)
    assert inputs and all(isinstance(t, torch.Tensor) and t.is_meta for t in inputs)


@pytest.mark.parametrize("name", PROBLEMS)
def test_problem_sizes_are_realistic(name: str) -> None:
    total = sum(_span_bytes(t) for t in _meta_inputs(name))
    assert MIN_BYTES <= total <= MAX_BYTES, f"{name}: inputs span {total / 2**20:.0f} MiB"


@pytest.mark.parametrize("name", PROBLEMS)
def test_reference_runs_on_meta(name: str) -> None:
    module = _load_problem(name)
    with torch.device("meta"):
        model = module.Model(*module.get_init_inputs())
        inputs = module.get_inputs()
        with torch.no_grad():
            out = model(*inputs)
    assert isinstance(out, torch.Tensor) and out.dtype == inputs[0].dtype


def test_problem_set_covers_dtypes_and_layouts() -> None:
    inputs = {name: _meta_inputs(name) for name in PROBLEMS}
    dtypes = {t.dtype for ts in inputs.values() for t in ts}
    assert {torch.float32, torch.float16, torch.bfloat16} <= dtypes
    assert any(not t.is_contiguous() and 0 not in t.stride() for ts in inputs.values() for t in ts), "a transposed input"
    assert any(0 in t.stride() for ts in inputs.values() for t in ts), "a stride-0 broadcast input"
    # the float4 tail matters somewhere: an elementwise problem whose element count is not a multiple of 4
    assert any(t.numel() % 4 for ts in inputs.values() for t in ts)


# -- the static judge on every candidate ---------------------------------------------------------


@pytest.mark.parametrize("case", HONEST, ids=_ids(HONEST))
def test_honest_candidates_pass_the_static_rules(case: CorpusCase) -> None:
    result = judge_static(case.candidate_source)
    assert result.reason is Reason.STATIC_OK, result.feedback
    assert not verdict_matches(case, result.reason.name) and verdict_matches(case, "ACCEPTED")


STATIC_WRONG = [c for c in WRONG if all(is_rule_id(v) for v in c.expect)]
RUNTIME_WRONG = [c for c in WRONG if not any(is_rule_id(v) for v in c.expect)]


@pytest.mark.parametrize("case", STATIC_WRONG, ids=_ids(STATIC_WRONG))
def test_static_hacks_are_rejected_with_their_rule(case: CorpusCase) -> None:
    result = judge_static(case.candidate_source)
    assert result.reason is Reason.RULE_VIOLATION, result.reason
    assert case.expect & {v.rule for v in result.violations}, result.feedback
    assert verdict_matches(case, result.reason.name, [v.rule for v in result.violations])


@pytest.mark.parametrize("case", RUNTIME_WRONG, ids=_ids(RUNTIME_WRONG))
def test_runtime_failures_pass_the_static_rules(case: CorpusCase) -> None:
    """A candidate meant to fail at run time must get there: the static rules pass it."""
    result = judge_static(case.candidate_source)
    assert result.reason is Reason.STATIC_OK, result.feedback


# -- the habits the honest candidates show -----------------------------------------------------

_TWO_KERNELS = re.compile(r"__global__(?:(?!__global__).)*__global__", re.DOTALL)

STYLE_FEATURES: list[tuple[str, re.Pattern[str]]] = [
    ("template <int ...> kernel", re.compile(r"template\s*<\s*int\b")),
    ("AT_DISPATCH_FLOATING_TYPES*", re.compile(r"AT_DISPATCH_FLOATING_TYPES")),
    ("extern __shared__ (dynamic shared memory)", re.compile(r"extern\s+__shared__")),
    ("warp shuffle", re.compile(r"__shfl_(?:down|xor)_sync")),
    ("two or more __global__ kernels", _TWO_KERNELS),
    ("at::cuda::getCurrentCUDAStream()", re.compile(r"getCurrentCUDAStream\s*\(")),
    ("launch on the default stream", re.compile(r"<<<\s*[^,<>]+,\s*[^,<>]+(?:,\s*[^,<>]+)?\s*>>>")),
    ("float4 with a scalar tail", re.compile(r"float4.*(?:tail|n_vec\s*\*\s*4)", re.DOTALL)),
    ("CUDAGuard / OptionalCUDAGuard", re.compile(r"\b(?:Optional)?CUDAGuard\b")),
    ("__device__ helper function", re.compile(r"__device__\s+(?:__forceinline__\s+|inline\s+)?\w[\w:<>]*\s+\w+\s*\(")),
    ("--use_fast_math", re.compile(r"""["']--use_fast_math["']""")),
    ("CHECK_CUDA / CHECK_CONTIGUOUS macros", re.compile(r"#define\s+CHECK_CUDA")),
    ("template <typename scalar_t>", re.compile(r"template\s*<\s*typename\s+scalar_t\s*>")),
    ("half / bfloat16 dispatch", re.compile(r"AT_DISPATCH_FLOATING_TYPES_AND(?:_HALF|2)")),
    ("strides passed to the kernel", re.compile(r"\.stride\(0\).*\.stride\(1\)", re.DOTALL)),
    ("atomicAdd", re.compile(r"\batomicAdd\s*\(")),
    (".contiguous() in forward", re.compile(r"def forward[^\n]*\n(?:[^\n]*\n)*?[^\n]*\.contiguous\(\)")),
    ("module-level extension", re.compile(r"^\w+\s*=\s*load_inline\(", re.MULTILINE)),
    ("extension kept on the module (self.x = load_inline)", re.compile(r"self\.\w+\s*=\s*load_inline\(")),
    ("parameters read from an nn module", re.compile(r"self\.\w+\.weight")),
]


def _default_stream_launch(source: str) -> bool:
    """A <<<grid, block>>> or <<<grid, block, smem>>> launch: no stream argument."""
    return any(len(_split_args(m.group(1))) in (2, 3) for m in re.finditer(r"<<<(.*?)>>>", source, re.DOTALL))


def _split_args(text: str) -> list[str]:
    depth, parts, current = 0, [], ""
    for ch in text:
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += ch
    parts.append(current)
    return [p.strip() for p in parts if p.strip()]


@pytest.mark.parametrize("feature,pattern", STYLE_FEATURES, ids=[f for f, _ in STYLE_FEATURES])
def test_honest_candidates_show_each_habit(feature: str, pattern: re.Pattern[str]) -> None:
    if feature == "launch on the default stream":
        hits = [c.name for c in HONEST if _default_stream_launch(c.candidate_source)]
    else:
        hits = [c.name for c in HONEST if pattern.search(c.candidate_source)]
    assert hits, f"no honest candidate shows: {feature}"


def test_habits_vary_across_honest_candidates() -> None:
    """No single habit is everywhere: some launch on the current stream and some on the default."""
    current = {c.name for c in HONEST if re.search(r"getCurrentCUDAStream", c.candidate_source)}
    default = {c.name for c in HONEST if _default_stream_launch(c.candidate_source)}
    assert current and default and current != default
