"""The built-in writer's task suite: KernelBench-format programs for what it writes.

    for task in SUITE: task.name, task.category, task.source

Categories: `chain1`/`chain2` (one or two pointwise ops), `chain3+` (three to eight), `reduction`,
`norm` (softmax, log-softmax, logsumexp, layer norm, RMS norm, normalisation). Dtypes fp32, fp16
and bf16; odd lengths, misaligned tails, broadcasting, a transposed (non-contiguous) input, a
boolean mask, per-channel vectors viewed into [N, C, H, W]. `benchmarks/bench_builtin.py` runs every task through the search and the judge.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["SuiteTask", "SUITE", "kernelbench_program", "size_literal"]


@dataclass(frozen=True)
class SuiteTask:
    name: str
    category: str  # chain1, chain2, chain3+, reduction, norm
    source: str


_DT = {"f32": "torch.float32", "f16": "torch.float16", "bf16": "torch.bfloat16"}


def _program(forward: str, inputs: list[str], args: str) -> str:
    made = ",\n        ".join(inputs)
    return f'''import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, {args}):
        return {forward}


def get_inputs():
    return [
        {made},
    ]


def get_init_inputs():
    return []
'''


def _randn(shape: tuple[int, ...], dt: str) -> str:
    return f"torch.randn({', '.join(map(str, shape))}, device='cuda', dtype={_DT[dt]})"


def _task(name: str, category: str, forward: str, shapes: list[tuple[int, ...]], dt: str, extra: list[str] | None = None) -> SuiteTask:
    names = "xyzwv"[: len(shapes)]
    inputs = [_randn(s, dt) for s in shapes] + (extra or [])
    args = ", ".join(list(names) + [f"m{i}" for i in range(len(extra or []))])
    return SuiteTask(name, category, _program(forward, inputs, args))


B, N = 4096, 1024
SUITE: tuple[SuiteTask, ...] = (
    # one and two ops
    _task("relu-f32", "chain1", "torch.relu(x)", [(B, N)], "f32"),
    _task("gelu-erf-f32", "chain1", "F.gelu(x)", [(B, N)], "f32"),
    _task("gelu-tanh-f16", "chain1", "F.gelu(x, approximate='tanh')", [(B, N)], "f16"),
    _task("sigmoid-bf16", "chain1", "torch.sigmoid(x)", [(B, N)], "bf16"),
    _task("add-broadcast-row-f32", "chain1", "x + y", [(B, N), (N,)], "f32"),
    _task("mul-bf16-odd", "chain1", "x * y", [(1001, 999), (1001, 999)], "bf16"),
    _task("silu-mul-bf16", "chain2", "F.silu(x) * y", [(B, N), (B, N)], "bf16"),
    _task("bias-gelu-f32", "chain2", "F.gelu(x + y)", [(B, N), (N,)], "f32"),
    _task("softplus-f16", "chain2", "F.softplus(x) * 2.0", [(B, N)], "f16"),
    _task("hardswish-f32-odd", "chain2", "F.hardswish(x) - y", [(777, 1025), (777, 1025)], "f32"),
    # three to eight ops
    _task("gated-f32", "chain3+", "torch.sigmoid(x) * y + 1.0", [(B, N), (B, N)], "f32"),
    _task("gated-f16", "chain3+", "torch.sigmoid(x) * y + 1.0", [(B, N), (B, N)], "f16"),
    _task("gated-bf16", "chain3+", "torch.sigmoid(x) * y + 1.0", [(B, N), (B, N)], "bf16"),
    _task("bias-relu-scale-f16", "chain3+", "torch.relu(x + y) * 0.5", [(B, N), (N,)], "f16"),
    _task("leaky-affine-f32-odd", "chain3+", "F.leaky_relu(x * 2.0 - 1.0, 0.1)", [(1000, 999)], "f32"),
    _task("clamp-fma-f32", "chain3+", "torch.clamp(x, -1.0, 1.0) * y + z", [(B, N)] * 3, "f32"),
    _task("mish-residual-bf16", "chain3+", "F.mish(x) + y * 0.5", [(B, N), (B, N)], "bf16"),
    _task("elu-hardsigmoid-f32", "chain3+", "F.elu(x) * F.hardsigmoid(y)", [(B, N), (B, N)], "f32"),
    _task("rsqrt-scale-f32", "chain3+", "torch.rsqrt(x.abs() + 1e-5) * y", [(B, N), (B, N)], "f32"),
    _task("where-relu-f16", "chain3+", "torch.where(x > 0, x, y * 0.1)", [(B, N), (B, N)], "f16"),
    _task("row-scale-f32", "chain3+", "(x - y) * z", [(B, N), (B, 1), (B, 1)], "f32"),
    _task("bcast-3d-f16", "chain3+", "torch.tanh(x + y) * z", [(32, 128, 768), (768,), (32, 128, 768)], "f16"),
    _task("transposed-input-f32", "chain3+", "torch.sigmoid(m0) * x + 1.0", [(B, N)], "f32",
          ["torch.randn(1024, 4096, device='cuda').t()"]),
    _task("eight-ops-f32", "chain3+", "torch.log1p(torch.sqrt(((torch.tanh(x * 1.5 + y) * 0.5 + 0.5) ** 2) + 1e-6))",
          [(B, N), (B, N)], "f32"),
    _task("six-ops-bf16-odd", "chain3+", "torch.sigmoid(-torch.abs(x - y) * 3.0 + 1.0) * z", [(2049, 1023)] * 3, "bf16"),
    _task("mask-where-f32", "chain3+", "torch.where(m0, x * 2.0, torch.exp(-x))", [(B, N)], "f32",
          ["torch.rand(4096, 1024, device='cuda') > 0.5"]),
    _task("batchnorm-relu-f32", "chain3+",
          "torch.relu((x - y[:, None, None]) * torch.rsqrt(z + 1e-5)[:, None, None] * w[:, None, None] + v[:, None, None])",
          [(32, 64, 56, 56), (64,), (64,), (64,), (64,)], "f32"),
    _task("channel-bias-gelu-f16", "chain2", "F.gelu(x + y.view(1, -1, 1, 1))", [(32, 128, 28, 28), (128,)], "f16"),
    _task("cast-chain-f16", "chain3+", "(x.float() * y.float() + 1.0).exp().half()", [(B, N), (B, N)], "f16"),
    # reductions over the last dimension
    _task("sum-f32", "reduction", "x.sum(-1)", [(B, N)], "f32"),
    _task("mean-f16", "reduction", "x.mean(-1, keepdim=True)", [(B, N)], "f16"),
    _task("amax-bf16", "reduction", "x.amax(-1)", [(B, N)], "bf16"),
    _task("amin-f32-odd", "reduction", "x.amin(-1)", [(777, 1023)], "f32"),
    _task("var-f32", "reduction", "x.var(-1)", [(B, N)], "f32"),
    _task("var-mean-f32", "reduction", "torch.var_mean(x, -1, keepdim=True)", [(B, N)], "f32"),
    _task("sum-exp-f32", "reduction", "x.exp().sum(-1)", [(B, N)], "f32"),
    _task("center-f16", "reduction", "x - x.mean(-1, keepdim=True)", [(B, N)], "f16"),
    _task("long-rows-sum-f32", "reduction", "x.sum(-1)", [(64, 65536)], "f32"),
    # norms
    _task("softmax-f32", "norm", "torch.softmax(x, -1)", [(B, N)], "f32"),
    _task("softmax-f16", "norm", "torch.softmax(x, -1)", [(8192, 512)], "f16"),
    _task("softmax-f32-odd", "norm", "torch.softmax(x, -1)", [(1000, 1001)], "f32"),
    _task("softmax-short-rows-f32", "norm", "torch.softmax(x, -1)", [(65536, 64)], "f32"),
    _task("log-softmax-bf16", "norm", "torch.log_softmax(x, -1)", [(B, N)], "bf16"),
    _task("logsumexp-f32", "norm", "torch.logsumexp(x, -1)", [(B, N)], "f32"),
    _task("layernorm-f32", "norm", "F.layer_norm(x, (1024,))", [(B, N)], "f32"),
    _task("layernorm-affine-f16", "norm", "F.layer_norm(x, (768,), y, z)", [(B, 768), (768,), (768,)], "f16"),
    _task("layernorm-odd-f32", "norm", "F.layer_norm(x, (777,))", [(333, 777)], "f32"),
    _task("rmsnorm-f32", "norm", "x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * y", [(B, N), (N,)], "f32"),
    _task("rmsnorm-bf16", "norm", "(x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6)).to(torch.bfloat16) * y",
          [(2048, 4096), (4096,)], "bf16"),
    _task("l2-normalize-f32", "norm", "x / torch.sqrt((x * x).sum(-1, keepdim=True) + 1e-12)", [(B, N)], "f32"),
    _task("residual-layernorm-f16", "norm", "F.layer_norm(x + y, (1024,))", [(B, N), (B, N)], "f16"),
)


def size_literal(value: int | str) -> str:
    """A size as a program writes it (10_000 and up with underscores)."""
    return f"{value:_}" if isinstance(value, int) and value >= 10_000 else str(value)


def kernelbench_program(doc: str, sizes: dict[str, int | str], body: str, inputs: list[tuple[str, str]],
                        init: tuple[str, str, str] = ("", "", "")) -> str:
    """A KernelBench-format program of the generated suites (roofline, GEMM). `init` is (the constructor's parameters, its body's lines,
    what `get_init_inputs()` returns); `body` is the forward (an expression, or lines ending in a
    return) of the inputs, each (name, expression building it on the CPU)."""
    params, init_body, init_inputs = init
    lines = body.strip().splitlines()
    if len(lines) == 1 and not lines[0].startswith("return "):
        lines = [f"return {lines[0]}"]
    forward = "\n        ".join(lines)
    made = "\n    ".join(f"{name} = {expr}" for name, expr in inputs)
    args = ", ".join(name for name, _ in inputs)
    constants = "\n".join(f"{k} = {size_literal(v)}" for k, v in sizes.items())
    setup = "".join(f"\n        {line}" for line in init_body.strip().splitlines())
    return f'''import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """
    {doc}
    """

    def __init__(self{", " + params if params else ""}):
        super(Model, self).__init__(){setup}

    def forward(self, {args}):
        {forward}


{constants}


def get_inputs():
    {made}
    return [{args}]


def get_init_inputs():
    return [{init_inputs}]
'''
