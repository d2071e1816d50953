"""The GEMM writer's programs, run on the CPU with the CUTLASS extension stood in for by PyTorch
computing what the kernel's host function is asked for (x, the N x K or K x N weight, the bias, the
residual, as `gemm_kernel` documents them): each operand reaches the kernel, the output has the
task's shape, and a task's own parameters (a KernelBench nn.Linear) are the ones its Model makes
under the same seed."""

from __future__ import annotations

import types
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from test_gemm_function import run_statements
from test_gemm_plan import BF16, task

F16 = "dtype=torch.float16"

_ACTIVATIONS = {"identity": lambda y: y, "relu": F.relu, "gelu": F.gelu, "gelu_tanh": lambda y: F.gelu(y, approximate="tanh"),
                "silu": F.silu, "sigmoid": torch.sigmoid}


def _load(program: str, plan: Any, monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    """The program as a module, its `load_inline` giving an extension that computes the plan's
    epilogue in float32 from the operands it is passed."""
    import torch.utils.cpp_extension as cpp_extension

    from kevin_backend.types import load_program

    calls: list[tuple[torch.Tensor, ...]] = []
    plans = getattr(plan, "plans", None)
    functions = ({f"gemm_epilogue{j}": _kernel(p, calls) for j, p in enumerate(plans)} if plans else
                 {"gemm_epilogue": _kernel(plan, calls)})
    monkeypatch.setattr(cpp_extension, "load_inline", lambda **kwargs: types.SimpleNamespace(**functions))
    module = load_program(program, "kevin_test_gemm_wiring")
    module.calls = calls
    return module


def _kernel(plan: Any, calls: list[tuple[torch.Tensor, ...]]) -> Any:
    """What one kernel's host function computes, in float32 from the operands it is passed."""
    e, weight, stored = plan.spec.epilogue, plan.spec.weight, getattr(torch, plan.spec.output)

    def gemm_epilogue(x: torch.Tensor, w: torch.Tensor, *operands: torch.Tensor) -> torch.Tensor:
        calls.append((x, w, *operands))
        if plan.spec.convolution is not None:
            return _convolution(plan.spec, x, w, *operands)
        assert x.is_contiguous() and w.is_contiguous(), "the kernel reads x and w row by row"
        k = x.shape[-1]
        assert w.dim() == 2 or (w.dim() == 3 and w.is_contiguous()), "w: one matrix, or a batch of them (packed)"
        batch = w.shape[0] if w.dim() == 3 else 1  # (a batch: w's L matrices, x holding L times M rows)
        product = (x.reshape(batch, -1, k).float() @ (w.float().transpose(-1, -2) if weight == "nk" else w.float())).reshape(-1, w.shape[-1 if weight == "kn" else -2])
        if e.tree:  # each operand as the kernel broadcasts it: over the columns, over the rows, or whole
            assert len(operands) == len(e.operands)
            shapes = {"n": (1, -1), "m": (-1, 1), "mn": tuple(product.shape)}
            read = [a.reshape(shapes[kind]) for a, kind in zip(operands, e.operands)]
            if e.after:  # (the tree's value kept in the kernel's dtype; the output its function)
                value = run_statements(e.function, product, *read)
                return [run_statements(e.after, value, *read).to(stored).reshape(*x.shape[:-1], -1),
                        value.to(x.dtype).reshape(*x.shape[:-1], -1)]
            return run_statements(e.function, product, *read).to(stored).reshape(*x.shape[:-1], -1)
        bias, residual = operands
        y = e.alpha * product
        if e.bias:
            y = y + bias.float()
        if e.residual:
            y = y + e.beta * residual.reshape(y.shape).float()
        activation = (lambda z: run_statements(e.function, z)) if e.function else _ACTIVATIONS[e.activation]
        out = activation(y).to(stored).reshape(*x.shape[:-1], -1)  # (x's leading sizes, N)
        if plan.spec.row_pad:  # (its rows padded to 16 bytes, the output a view of their first N columns)
            from kevin_backend.generate.builtin.gemm_tail import padded_rows

            out = padded_rows(out).copy_(out)
        return out

    return gemm_epilogue


def _convolution(spec: Any, x: torch.Tensor, w: torch.Tensor, *operands: torch.Tensor) -> torch.Tensor:
    """What the implicit GEMM's host function computes (`conv_kernel.py`): the convolution of x
    (N x C x [D x] H x W, as laid out when it was written) by w (C_out x C x filter; a transposed
    one's C x C_out x filter), its epilogue, and the output N x ... x C_out (a channels-last input)
    or N x C_out x ...."""
    c, e = spec.convolution, spec.epilogue
    layout = torch.channels_last if c.dims == 2 else torch.channels_last_3d
    assert x.dim() == w.dim() == c.dims + 2 and tuple(w.shape[2:]) == c.filter
    assert w.is_contiguous() or (w.is_contiguous(memory_format=layout) and not c.transposed), "w plain, or a channels-last filter"
    assert x.is_contiguous(memory_format=layout) if c.channels_last else x.is_contiguous()
    if c.transposed:
        f = F.conv_transpose2d
        y = f(x.float(), w.float(), None, c.stride, c.padding, c.output_padding, 1, c.dilation)
    else:
        y = (F.conv2d if c.dims == 2 else F.conv3d)(x.float(), w.float(), None, c.stride, c.padding, c.dilation)
    if e.tree:  # (its operands: vectors over the output channels, a tensor of the output's size in any layout)
        assert len(operands) == len(e.operands) and all(a.numel() == (y.shape[1] if kind == "n" else y.numel())
                                                        for a, kind in zip(operands, e.operands))
        read = [a.reshape(1, -1, *[1] * c.dims) if kind == "n" else a for a, kind in zip(operands, e.operands)]
        y = run_statements(e.function, y, *read).to(getattr(torch, spec.output))
    else:
        bias, _ = operands
        y = e.alpha * y
        if e.bias:
            y = y + bias.float().reshape(1, -1, *[1] * c.dims)
        assert not e.residual
        activation = (lambda z: run_statements(e.function, z)) if e.function else _ACTIVATIONS[e.activation]
        y = activation(y).to(getattr(torch, spec.output))
    return y.permute(0, *range(2, c.dims + 2), 1).contiguous() if c.channels_last or c.out_as_it_lies else y.contiguous()


def _made_alike(reference: types.ModuleType, new: types.ModuleType, seed: int) -> tuple[Any, Any]:
    """The task's Model and the program's ModelNew, each made under `seed` (as the judge makes them)."""
    torch.manual_seed(seed)
    model = reference.Model(*reference.get_init_inputs())
    torch.manual_seed(seed)
    return model, new.ModelNew(*reference.get_init_inputs())


def _runs_as_its_model(source: str, program: str, plan: Any, monkeypatch: pytest.MonkeyPatch, seed: int,
                       tolerance: float) -> tuple[types.ModuleType, list[Any]]:
    """The program (its extension stood in for) and the task's Model, made under `seed`, give the
    same output on the task's inputs; the program's module and those inputs."""
    from kevin_backend.types import load_program

    new = _load(program, plan, monkeypatch)
    reference = load_program(source, "kevin_test_gemm_wiring_task")
    model, candidate = _made_alike(reference, new, seed)
    values = reference.get_inputs()
    torch.testing.assert_close(candidate(*values), model(*values), rtol=tolerance, atol=tolerance)
    return new, values


_LINEAR = """import torch
import torch.nn as nn


class Model(nn.Module):
    \"\"\"A level-2 chain in bfloat16: Linear, then ReLU.\"\"\"
    def __init__(self, in_features, out_features):
        super().__init__()
        self.gemm = nn.Linear(in_features, out_features, dtype=torch.bfloat16)

    def forward(self, x):
        return torch.relu(self.gemm(x))


def get_inputs():
    return [torch.randn(2, 24, 64, dtype=torch.bfloat16)]


def get_init_inputs():
    return [64, 48]
"""


def test_a_kernelbench_linear_uses_the_parameters_its_model_makes(monkeypatch: pytest.MonkeyPatch) -> None:
    from kevin_backend.generate.builtin.gemm_kernel import GemmTiling
    from kevin_backend.generate.builtin.gemm_plan import GemmPlan, plan_gemm, write_gemm_program
    from kevin_backend.types import load_program

    plan = plan_gemm(_LINEAR)
    assert isinstance(plan, GemmPlan), plan
    assert plan.inputs == 1 and plan.state == ("gemm.weight", "gemm.bias") and plan.spec.epilogue.activation == "relu"
    with pytest.raises(ValueError, match="its source is needed"):
        write_gemm_program(plan, GemmTiling())
    program = write_gemm_program(plan, GemmTiling(), task_source=_LINEAR)
    assert "class ModelNew(KevinTaskParameters):" in program and "self.get_parameter('gemm.weight')" in program
    assert "torch.relu(self.gemm(x))" not in program  # the task's forward is not in it
    from kevin_backend.toolchain.static_rules import check_program

    assert check_program(program) == ()  # the task's own code within the program passes the static rules too
    new = _load(program, plan, monkeypatch)
    reference = load_program(_LINEAR, "kevin_test_gemm_wiring_task")
    model, candidate = _made_alike(reference, new, 3)
    for (name, a), (other, b) in zip(model.named_parameters(), candidate.named_parameters()):
        assert name == other and torch.equal(a, b), name
    x = reference.get_inputs()[0]
    torch.testing.assert_close(candidate(x), model(x), rtol=2e-2, atol=2e-2)
    (call,) = new.calls
    assert call[1] is candidate.gemm.weight and call[2] is candidate.gemm.bias  # the model's own, N x K as kept


@pytest.mark.parametrize("forward, inputs", [
    ("F.gelu(F.linear(v[0], v[1], v[2]))", f"torch.randn(2, 16, 64, {BF16}), torch.randn(48, 64, {BF16}), torch.randn(48, {BF16})"),
    ("F.relu(v[0] @ v[1])", f"torch.randn(32, 64, {BF16}), torch.randn(64, 48, {BF16})"),
    ("F.silu(torch.add((v[0] @ v[1].t()) * 0.25, v[2], alpha=2.0))",
     f"torch.randn(32, 64, {BF16}), torch.randn(48, 64, {BF16}), torch.randn(32, 48, {BF16})"),
    # batches of products (bmm): attention's q @ k^T over 4-D heads, keys read transposed; baddbmm
    # (its c the residual, alpha the scale) with K x N matrices; a bias over N shared by the batch
    ("torch.tanh(v[0] @ v[1].transpose(-2, -1) * 0.125)", f"torch.randn(2, 3, 16, 64, {BF16}), torch.randn(2, 3, 24, 64, {BF16})"),
    ("torch.relu(torch.baddbmm(v[0], v[1], v[2], alpha=0.5))", "torch.randn(4, 16, 24), torch.randn(4, 16, 32), torch.randn(4, 32, 24)"),
    ("F.gelu(torch.bmm(v[0], v[1]) + v[2])", f"torch.randn(4, 16, 32, {BF16}), torch.randn(4, 32, 24, {BF16}), torch.randn(24, {BF16})"),
    # several outputs, views of the one product: a QKV projection split into queries, keys and values
    ("F.linear(v[0], v[1], v[2]).chunk(3, dim=-1)", f"torch.randn(2, 16, 64, {BF16}), torch.randn(144, 64, {BF16}), torch.randn(144, {BF16})"),
    # rows of N = 50 (not 16-byte aligned): stored directly, a scale and a residual
    ("torch.add((v[0] @ v[1].t()) * 0.5, v[2], alpha=2.0)", f"torch.randn(32, 64, {BF16}), torch.randn(50, 64, {BF16}), torch.randn(32, 50, {BF16})"),
    # a 1x1 convolution of a channels-last input: its N*H*W rows of channels, as they lie
    ("F.relu(F.conv2d(v[0], v[1], v[2]))", f"torch.randn(2, 16, 4, 6, {BF16}).contiguous(memory_format=torch.channels_last), "
     f"torch.randn(24, 16, 1, 1, {BF16}), torch.randn(24, {BF16})"),
])
@pytest.mark.parametrize("arch", ["sm90", "sm80"])
def test_each_operand_reaches_the_kernel(forward: str, inputs: str, arch: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from kevin_backend.generate.builtin.gemm_kernel import tilings_for
    from kevin_backend.generate.builtin.gemm_plan import GemmPlan, plan_gemm, write_gemm_program
    from kevin_backend.types import load_program

    source = task(forward, inputs)
    plan = plan_gemm(source, arch=arch)
    plan = getattr(plan, "fallback", None) or plan  # (a direct convolution's implicit GEMM)
    assert isinstance(plan, GemmPlan) and not plan.state, plan
    assert plan.batch == (4 if "bmm" in forward else 6 if "transpose" in forward else 1), plan.describe()
    assert plan.spec.direct_store == (plan.n == 50 and arch == "sm90") and plan.spec.arch == arch
    assert plan.conv == ("conv2d" in forward) and (plan.m, plan.n, plan.k) == ((48, 24, 16) if plan.conv else (plan.m, plan.n, plan.k))
    program = write_gemm_program(plan, tilings_for(plan.spec)[0])
    assert ("cutlass::arch::Sm80" in program) == plan.spec.sm80 and ("compute_90a" in program) == (arch == "sm90")
    new = _load(program, plan, monkeypatch)
    reference = load_program(source, "kevin_test_gemm_wiring_task")
    values = reference.get_inputs()
    got, want = new.ModelNew()(*values), reference.Model()(*values)
    torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2)
    if plan.conv:  # (the convolution's output channels-last, as eager's of a channels-last input)
        assert got.is_contiguous(memory_format=torch.channels_last) and new.calls[0][0].data_ptr() == values[0].data_ptr()
    if isinstance(want, tuple):  # (views as eager's: the same shapes and strides, into one tensor)
        assert [(g.shape, g.stride()) for g in got] == [(w.shape, w.stride()) for w in want]
        assert len({g.untyped_storage().data_ptr() for g in got}) == 1 and plan.views[-1] == "return (o3, o4, o5)", plan.views


@pytest.mark.parametrize("forward, inputs", [
    ("F.relu(v[0] @ v[1].t()) * v[2] + v[3]", f"torch.randn(32, 64, {BF16}), torch.randn(48, 64, {BF16}), "
     f"torch.randn(32, 48, {BF16}), torch.randn(32, 1, {BF16})"),
    ("torch.sigmoid(F.linear(v[0], v[1], v[2]).view(2, 16, 48) + v[3]) + v[4]",
     f"torch.randn(32, 64, {BF16}), torch.randn(48, 64, {BF16}), torch.randn(48, {BF16}), torch.randn(48, {BF16}), "
     f"torch.randn(2, 16, 1, {BF16})"),
    # a Linear then an inference batch norm (its running mean and variance, weight and bias) and
    # ReLU: five vectors over N
    ("F.relu(F.batch_norm(F.linear(v[0], v[1], v[2]), v[3], v[4], v[5], v[6], False, 0.1, 1e-5))",
     f"torch.randn(32, 64, {BF16}), torch.randn(48, 64, {BF16}), torch.randn(48, {BF16}), torch.randn(48, {BF16}), "
     f"torch.rand(48, {BF16}) + 0.5, torch.randn(48, {BF16}), torch.randn(48, {BF16})"),
    # two tensors of the output's size (a backward pass's gradients summed with the product's): the
    # first the kernel's source C, the other loaded beside it
    ("(v[0] @ v[1].t() + v[2]) * v[3]", f"torch.randn(32, 64, {BF16}), torch.randn(48, 64, {BF16}), "
     f"torch.randn(32, 48, {BF16}), torch.randn(32, 48, {BF16})"),
    ("v[3] + (v[0] @ v[1] + v[2]) + v[4]", f"torch.randn(2, 16, 64, {BF16}), torch.randn(64, 48, {BF16}), "
     f"torch.randn(2, 16, 48, {BF16}), torch.randn(48, {BF16}), torch.randn(2, 16, 48, {BF16})"),
])
@pytest.mark.parametrize("arch", ["sm90", "sm80"])
def test_a_trees_operands_reach_the_kernel_in_order(forward: str, inputs: str, arch: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from kevin_backend.generate.builtin.gemm_kernel import tilings_for
    from kevin_backend.generate.builtin.gemm_plan import GemmPlan, plan_gemm, write_gemm_program
    from kevin_backend.types import load_program

    source = task(forward, inputs)
    plan = plan_gemm(source, arch=arch)
    assert isinstance(plan, GemmPlan) and plan.spec.epilogue.tree, plan
    program = write_gemm_program(plan, tilings_for(plan.spec)[0])
    assert ("Sm90EVT" if arch == "sm90" else "Sm80EVT") in program and f"torch::Tensor a{len(plan.operands) - 1});" in program
    new = _load(program, plan, monkeypatch)
    reference = load_program(source, "kevin_test_gemm_wiring_task")
    values = reference.get_inputs()
    torch.testing.assert_close(new.ModelNew()(*values), reference.Model()(*values), rtol=2e-2, atol=2e-2)
    (call,) = new.calls
    assert [a.data_ptr() for a in call[2:]] == [values[i].data_ptr() for i in plan.operands]


@pytest.mark.parametrize("name", ["linear-relu-scale-f32-128x1024x512", "linear-tanh-residual-f32-1000x999x777",
                                  "linear-bias-swish-scale-f16-1024x4096x4096", "mm-bias-rows-f16-512x16384x512"])
def test_a_kernelbench_suite_task_is_wired_with_its_parameters(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # level-2 problems as KernelBench publishes them: float32, nn.Linear, an elementwise chain
    # after it (the second with K = 999 and N = 777: rows that are not 16-byte aligned)
    from kevin_backend.generate.builtin.gemm_kernel import tilings_for
    from kevin_backend.generate.builtin.gemm_plan import GemmPlan, plan_gemm, write_gemm_program
    from kevin_backend.generate.builtin.gemm_suite import GEMM_SUITE
    from kevin_backend.toolchain.static_rules import check_program

    source = next(t.source for t in GEMM_SUITE if t.name == name)
    plan = plan_gemm(source)
    assert isinstance(plan, GemmPlan), plan
    if plan.spec.dtype == "float32":
        assert plan.spec.align == (1 if "999" in name else 4) and plan.state == ("gemm.weight", "gemm.bias")
    else:  # (16-bit: a visitor tree, its operands a second bias after the linear's, or a column of biases)
        assert plan.spec.epilogue.tree and plan.spec.epilogue.operands == (("n", "n") if "swish" in name else ("m",))
    tiling = tilings_for(plan.spec)[0]
    program = write_gemm_program(plan, tiling, task_source=source)
    assert check_program(program) == () and ("OpMultiplyAddFastF32" in program) == (plan.spec.dtype == "float32")
    _runs_as_its_model(source, program, plan, monkeypatch, 5, 1e-4 if plan.spec.dtype == "float32" else 2e-2)


@pytest.mark.parametrize("name", ["gpt2-mlp-f32-2048x768x3072", "swiglu-small-bf16"])
def test_a_chain_runs_its_kernels_in_order_each_reading_the_ends_before_it(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # GPT-2's MLP with its parameters (up with its bias and GELU, then down with its bias: the
    # second kernel's x is the first's end); a SiLU-gated MLP (the gate with its SiLU, then the up
    # projection whose epilogue multiplies by the gate: a tree reading the first kernel's end)
    from kevin_backend.generate.builtin.gemm_plan import GemmChain, plan_gemm, plan_tilings, write_gemm_program
    from kevin_backend.generate.builtin.gemm_suite import GEMM_SUITE
    from kevin_backend.toolchain.static_rules import check_program

    source = (next(t.source for t in GEMM_SUITE if t.name == name) if name.startswith("gpt2") else
              task("F.silu(F.linear(v[0], v[1])) * F.linear(v[0], v[2])",
                   f"torch.randn(2, 16, 64, {BF16}), torch.randn(96, 64, {BF16}), torch.randn(96, 64, {BF16})"))
    chain = plan_gemm(source)
    assert isinstance(chain, GemmChain) and len(chain.plans) == 2, chain
    first, second = chain.plans
    ends = first.inputs + len(first.state)  # y0's number: after the task's inputs and parameters
    if name.startswith("gpt2"):
        assert chain.state == ("up.weight", "up.bias", "down.weight", "down.bias")
        assert first.spec.epilogue.activation == "gelu_tanh" and second.x == ends and second.bias == 4
    else:
        assert first.spec.epilogue.activation == "silu" and second.x == 0 and second.operands == (ends,)
        assert second.spec.epilogue.operands == ("mn",)
    tiling = plan_tilings(chain)[0]
    program = write_gemm_program(chain, tiling, task_source=source)
    assert check_program(program) == ()
    assert "namespace kevin_gemm0" in program and "namespace kevin_gemm1" in program
    assert program.index("namespace kevin_gemm1") < program.index("#include <torch/extension.h>")  # devices first
    new, values = _runs_as_its_model(source, program, chain, monkeypatch, 11, 1e-4 if first.spec.dtype == "float32" else 3e-2)
    assert len(new.calls) == 2 and new.calls[0][0].data_ptr() == values[0].data_ptr()


_AROUND = {  # small tasks whose GEMM has the built-in writer's own kernel before or after it
    # an LM head's logits over 37 (odd) classes, read only by their loss: the GEMM stores them in rows
    # padded to 16 bytes, the loss's kernel reads the rows where they lie
    "lm-head-log-softmax-loss-bf16": ("F.cross_entropy(F.linear(v[0], v[1]).float(), v[2])",
                                      f"torch.randn(6, 16, {BF16}), torch.randn(37, 16, {BF16}), torch.randint(0, 37, (6,))"),
    "prenorm-small-f16": ("F.linear(F.layer_norm(v[0], (64,), v[1], v[2]), v[3], v[4])",
                          f"torch.randn(2, 12, 64, {F16}), torch.randn(64, {F16}), torch.randn(64, {F16}), "
                          f"torch.randn(96, 64, {F16}), torch.randn(96, {F16})"),
    "cast-prologue-bf16": ("torch.relu(v[0].to(torch.bfloat16) @ v[1])", f"torch.randn(24, 64), torch.randn(64, 96, {BF16})"),
    # a left operand given as the transpose of a row-major matrix (a tied LM head's weight gradient
    # reads the logits gradient so), copied into row-major by the writer's kernel, then the GEMM
    "layout-cast-prologue-bf16": ("v[0] @ v[1] + v[2]", f"torch.randn(64, 24, {BF16}).t(), torch.randn(64, 96, {BF16}), "
                                                         f"torch.randn(24, 96, {BF16})"),
    "softmax-small-bf16": ("torch.softmax(F.linear(v[0], v[1], v[2]), -1)",
                           f"torch.randn(24, 64, {BF16}), torch.randn(96, 64, {BF16}), torch.randn(96, {BF16})"),
    "prenorm-sum-f32": ("torch.sigmoid(F.layer_norm(v[0], (64,)) @ v[1]).sum(-1)", "torch.randn(24, 64), torch.randn(64, 96)"),
    # a reduction after a convolution (its output N x K x P x Q): a min over the channels, a group norm
    "conv-min-tanh-f32": ("torch.tanh(torch.min(F.conv2d(v[0], v[1], v[2]), dim=1, keepdim=True)[0])",
                          "torch.randn(2, 3, 8, 9), torch.randn(8, 3, 3, 3), torch.randn(8)"),
    "conv-groupnorm-f32": ("F.group_norm(F.conv2d(v[0], v[1], v[2], padding=1), 4, v[3], v[4]) * 2.0",
                           "torch.randn(2, 6, 7, 5), torch.randn(16, 6, 3, 3), torch.randn(16), torch.randn(16), torch.randn(16)"),
    # a softmax over the channels of a 3-D convolution (its output N x K x Z x P x Q), in float32
    "conv3d-softmax-f32": ("torch.softmax(F.conv3d(v[0], v[1], v[2]), dim=1)",
                           "torch.randn(2, 3, 5, 6, 7), torch.randn(16, 3, 3, 3, 3), torch.randn(16)"),
    # after a convolution of a channels-last input (its output as it lies): a softmax over the
    # channels; ReLU then the mean over the positions (a classifier's pooling)
    "conv-softmax-channels-last-bf16": ("torch.softmax(F.conv2d(v[0], v[1], v[2]), dim=1)",
                                        f"torch.randn(2, 16, 8, 9, {BF16}).contiguous(memory_format=torch.channels_last), "
                                        f"torch.randn(16, 16, 3, 3, {BF16}), torch.randn(16, {BF16})"),
    # the partitions a compiled transformer hands on (GPT-2's and Llama's in bf16): the residual
    # stream after a projection with its float32 copy for the next norm (and its square: an RMS
    # norm's); the pre-activation saved for the backward pass beside the activation
    "residual-stream-bf16": ("(h := F.linear(v[0], v[1], v[2]).view(2, 8, 32) + v[3], h.float())",
                             f"torch.randn(16, 64, {BF16}), torch.randn(32, 64, {BF16}), torch.randn(32, {BF16}), "
                             f"torch.randn(2, 8, 32, {BF16})"),
    "residual-square-bf16": ("(h := v[2] + (v[0] @ v[1]).view(2, 8, 32), f := h.float(), f.pow(2))",
                             f"torch.randn(16, 64, {BF16}), torch.randn(64, 32, {BF16}), torch.randn(2, 8, 32, {BF16})"),
    "residual-stream-second-bf16": ("((h := v[2] + (v[0] @ v[1]).view(2, 8, 32)).float(), h)",
                                    f"torch.randn(16, 64, {BF16}), torch.randn(64, 32, {BF16}), torch.randn(2, 8, 32, {BF16})"),
    "pre-activation-gelu-bf16": ("(y := F.linear(v[0], v[1], v[2]), F.gelu(y.view(2, 8, 96), approximate='tanh'))",
                                 f"torch.randn(16, 32, {BF16}), torch.randn(96, 32, {BF16}), torch.randn(96, {BF16})"),
    # Llama's gate projection in training: kept, and its SiLU times the up projection's output
    "gate-silu-up-bf16": ("(g := v[0] @ v[1], F.silu(g.view(2, 8, 64).float()).to(torch.bfloat16) * v[2])",
                          f"torch.randn(16, 32, {BF16}), torch.randn(32, 64, {BF16}), torch.randn(2, 8, 64, {BF16})"),
    # a ResNet's convolution in training, as a compiled model hands it on: its output and the float32
    # copy its batch statistics read (the writer's cast kernel after the convolution)
    "conv-float-copy-bf16": ("(y := F.conv2d(v[0], v[1], padding=1), y.float())",
                             f"torch.randn(2, 16, 8, 9, {BF16}), torch.randn(32, 16, 3, 3, {BF16})"),
    "conv-pool-channels-last-bf16": ("F.relu(F.conv2d(v[0], v[1], v[2], padding=1)).mean(dim=(2, 3))",
                                     f"torch.randn(2, 16, 8, 9, {BF16}).contiguous(memory_format=torch.channels_last), "
                                     f"torch.randn(32, 16, 3, 3, {BF16}), torch.randn(32, {BF16})"),
}


@pytest.mark.parametrize("name", ["linear-sigmoid-sum-f32-128x1024x512", "linear-groupnorm-hardtanh-f32-128x1024x512",
                                  "linear-max-sub-gelu-f32-128x1024x512", *_AROUND,
                                  "softmax-small-bf16-wide", "lm-head-log-softmax-loss-bf16-wide"])
def test_the_writers_own_kernels_run_around_the_gemm(name: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    wide = name.endswith("-wide")  # (the variant storing the GEMM's end in float32)
    name = name.removesuffix("-wide")
    # the GEMM with the elementwise part of its epilogue (stood in for by PyTorch), and the built-in
    # writer's kernels before it (a layer norm, a cast: its left operand) or after it (a sum after a
    # sigmoid; a group norm with its own parameters, then hardtanh; a softmax), emulated on the CPU
    # as written (tests/kernel_emulator.py), against the task's Model
    import shutil

    import torch.utils.cpp_extension as cpp_extension

    from kernel_emulator import emulate, has_cuda_headers
    from kevin_backend.generate.builtin.gemm_plan import (GemmHead, GemmTail, KeptEnd, WideEnd, own_variant, plan_gemm, plan_tilings,
                                                          write_gemm_program)
    from kevin_backend.generate.builtin.gemm_suite import GEMM_SUITE
    from kevin_backend.generate.builtin.host_function import returned
    from kevin_backend.generate.builtin.program import write_program
    from kevin_backend.toolchain.static_rules import check_program
    from kevin_backend.types import load_program

    if shutil.which("g++") is None or not has_cuda_headers():
        pytest.skip("needs g++ and CUDA's headers (the kernel emulator)")
    source = next(t.source for t in GEMM_SUITE if t.name == name) if name not in _AROUND else task(*_AROUND[name])
    plan = plan_gemm(source)
    plan = getattr(plan, "fallback", None) or plan  # (a direct convolution's implicit GEMM)
    head = plan if isinstance(plan, GemmHead) else None
    tail = (head.gemm if head else plan) if isinstance(head.gemm if head else plan, GemmTail) else None
    assert (head is not None) == ("prenorm" in name or "prologue" in name) and (tail is not None) == ("cast" not in name
                                                                                                     and "small-f16" not in name), plan
    # a 16-bit product the tail exponentiates has variants storing it unrounded (float32), tried last
    # (not a convolution's: its kernel stores the inputs' dtype)
    magnified = tail is not None and tail.gemm.spec.dtype != "float32" and ("softmax" in name or "logsumexp" in name) and "conv" not in name
    tilings = plan_tilings(plan)
    assert (tail is not None and tail.wide is not None) == magnified
    assert [isinstance(t, WideEnd) for t in tilings] == [False] * (len(tilings) - 2 * magnified) + [True] * (2 * magnified)
    # (a tail whose end the task returns too: its one-kernel variants last, or first where its value is a
    # float32 one of the 16-bit end, `test_a_gemm_keeps_its_end_beside_its_output`)
    kept = [isinstance(t, KeptEnd) for t in tilings]
    twice = [True] * 3 * (tail is not None and tail.kept is not None)
    rest = [False] * (len(tilings) - len(twice))
    assert kept == (twice + rest if tail is not None and tail.kept_first else rest + twice), tilings
    # (the GEMM and the writer's kernels: the first variant not keeping the end)
    program = write_gemm_program(plan, tilings[-1] if wide else next(t for t in tilings if not isinstance(t, KeptEnd)), task_source=source)
    assert check_program(program) == () and program.count("load_inline(") == 1 + bool(head) + bool(tail)
    assert ("using ElementD = float;" in program) == (wide or "f32" in name)
    assert ("dtype(at::kFloat)" in program) == (wide or "f32" in name) or "conv" in name  # (a convolution's output: x's options)
    if wide:
        tail = tail.wide
    if "lm-head" in name:  # (logits read only by their loss: stored by TMA in rows padded to 16 bytes, read where they lie)
        assert tail.gemm.spec.row_pad and not tail.gemm.spec.direct_store and tail.tail.inputs[-1].stride == (40, 1), tail
        assert "its rows padded to 16 bytes" in plan.describe() and ".narrow(-1, 0, n)" in program
    own = {kind: (write_program(part, own_variant(part)), returned(part), part.inputs)
           for kind, part in (("_head", head and head.head), ("_tail", tail and tail.tail)) if part is not None}
    gemm = _kernel(tail.gemm if tail else (head.gemm if head else plan), [])
    # the own kernel's variant as ranked for its shape: rows of 16 channels (after a convolution) one
    # thread a row, rows read across the threads, where they lie a column apart (N x C x ...); each
    # read along the row where the convolution's output lies as the kernel leaves it (channels
    # innermost: a reduction over the channels alone, or of a channels-last input); rows of 512 a
    # warp's vectors or more
    c = tail.gemm.spec.convolution if tail is not None else None
    lies = c is not None and (c.channels_last or c.out_as_it_lies)
    assert lies == (name in ("conv-min-tanh-f32", "conv3d-softmax-f32") or "channels-last" in name), (name, c)
    if tail is not None and tail.tail.is_rows and tail.tail.cols <= 16:
        assert own_variant(tail.tail).columns != lies, own_variant(tail.tail)
    elif tail is not None and tail.tail.is_rows and tail.tail.cols >= 512:
        assert not own_variant(tail.tail).columns and own_variant(tail.tail).name != "t256", own_variant(tail.tail)

    def run(kind: str) -> Any:
        written, outputs, inputs = own[kind]

        def kevin_run(*a: torch.Tensor) -> Any:
            # (the host function's checks: each input of the sizes and strides the kernel was written for)
            assert [(tuple(t.shape), t.stride()) for t in a] == [(i.shape, i.stride) for i in inputs], (kind, inputs)
            got = emulate(written, [t.detach() for t in a], outputs, workdir=tmp_path)  # (as laid out: their memory)
            return got[0] if len(outputs) == 1 else got
        return kevin_run

    def load_inline(**kwargs: Any) -> Any:
        kind = kwargs["name"][-5:]
        if kind in own:  # the writer's own kernel, as written in the program
            assert kwargs["cuda_sources"] in own[kind][0]
            return types.SimpleNamespace(kevin_run=run(kind))
        return types.SimpleNamespace(gemm_epilogue=gemm)

    monkeypatch.setattr(cpp_extension, "load_inline", load_inline)
    new = load_program(program, "kevin_test_gemm_around")
    reference = load_program(source, "kevin_test_gemm_wiring_task")
    model, candidate = _made_alike(reference, new, 13)
    values = reference.get_inputs()
    tolerance = 1e-4 if "f32" in name else 2e-2
    torch.testing.assert_close(candidate(*values), model(*values), rtol=tolerance, atol=tolerance)


@pytest.mark.parametrize("name", ["residual-stream-bf16", "residual-stream-second-bf16", "pre-activation-gelu-bf16", "residual-square-bf16",
                                  "gate-silu-up-bf16",
                                  "stream-residual-float-bf16-8192x768x768", "mlp-up-pre-activation-gelu-bf16-8192x768x3072"])
@pytest.mark.parametrize("arch", ["sm90", "sm80"])
def test_a_gemm_keeps_its_end_beside_its_output(name: str, arch: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # a compiled model's partition returning the GEMM's end and one value computed from it alone (the
    # residual stream and its float32 copy, the pre-activation and its GELU): on Hopper, one kernel
    # storing the end beside that value (`Epilogue.after`), its variants last (slower on the H200:
    # `gemm_turn` tries them next after a refusal) except where that value is a float32 one of the
    # bf16 end (the two kernels' copy of the rounded end the judge refused on the H200: first); two
    # values computed from it (the float32 copy and its square) and CUTLASS 2.x's kernel keep the
    # writer's kernel after it
    from kevin_backend.generate.builtin.gemm_plan import GemmTail, KeptEnd, plan_gemm, plan_tilings, write_gemm_program
    from kevin_backend.generate.builtin.gemm_suite import GEMM_SUITE
    from kevin_backend.toolchain.static_rules import check_program

    source = task(*_AROUND[name]) if name in _AROUND else next(t.source for t in GEMM_SUITE if t.name == name)
    plan = plan_gemm(source, arch=arch)
    if arch == "sm80" or "square" in name:  # (the sm80 kernel declines a bias beside a residual)
        assert not isinstance(plan, GemmTail) or (plan.kept is None and not any(isinstance(t, KeptEnd) for t in plan_tilings(plan))), plan
        return
    assert isinstance(plan, GemmTail) and plan.ends, plan
    assert plan.kept is not None and plan.kept.spec.epilogue.after and plan.kept.spec.epilogue.tree, plan
    assert plan.kept.spec.output == ("float32" if "stream" in name else "bfloat16"), plan.kept.describe()
    tilings = plan_tilings(plan)
    kept = [i for i, t in enumerate(tilings) if isinstance(t, KeptEnd)]
    assert plan.kept_first == ("stream" in name) and kept == ([0, 1, 2] if plan.kept_first else [len(tilings) - 3, len(tilings) - 2, len(tilings) - 1]), tilings
    # (stored through shared memory and TMA in two tilings, as the output is; then from registers in the first)
    assert [tilings[i].staged for i in kept] == [True, True, False] and tilings[kept[2]].tiling == tilings[kept[0]].tiling
    program = write_gemm_program(plan, tilings[kept[0]], task_source=source)
    registers = write_gemm_program(plan, tilings[kept[2]], task_source=source)
    assert "Sm90AuxStore<0, TileShape, Element" in registers and "EpilogueTileAuto, float, float" in registers
    assert "Sm90AuxStore<2, EpilogueTile, Element" in program and "sm90_get_smem_store_op_for_accumulator<KeptStride" in program
    assert "using EpilogueTile = decltype(" in program and "    EpilogueTile, float, float," in program
    from kevin_backend.generate.builtin.gemm_plan import gemm_turn

    if plan.kept_first:  # (the first turn keeps the end, and its second the other tiling)
        choice, _, why = gemm_turn(source, plan, 0, [])
        assert choice == tilings[0].name and "a float32 one of the 16-bit end" in why, (choice, why)
        assert gemm_turn(source, plan, 0, [(tilings[0].name, 0.5)])[0] == tilings[1].name
    else:  # a turn not accepted: the kept variant next
        choice, again, why = gemm_turn(source, plan, 0, [(tilings[0].name, None)])
        assert choice == tilings[kept[0]].name and "in one kernel" in why and again.count("load_inline(") == 1, (choice, why)
        assert gemm_turn(source, plan, 0, [(tilings[0].name, 0.5)])[0] == tilings[1].name
    assert check_program(program) == () and check_program(registers) == () and program.count("load_inline(") == 1
    assert "std::vector<torch::Tensor> gemm_epilogue(" in program and "return {out, kept};" in program
    assert ("view([2, 8, 96])" in program or "view([2, 8, 64])" in program) == (name in ("pre-activation-gelu-bf16", "gate-silu-up-bf16"))
    # (the second function's operands after the tree's own: the up projection's, loaded beside)
    e = plan.kept.spec.epilogue
    assert len(e.operands) - e.after_from == ("gate" in name) and ("Sm90AuxLoad" in program) == ("gate" in name), plan.kept
    new, values = _runs_as_its_model(source, program, plan.kept, monkeypatch, 5, 2e-2)
    (call,) = new.calls
    assert [a.data_ptr() for a in call[2:]] == [values[i].data_ptr() for i in plan.kept.operands]


def test_a_float_copy_kept_beside_a_16_bit_end_is_within_the_judges_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    # On the H200 the residual stream's float32 copy made from the stored bf16 end (rounded, as
    # eager's) was refused by the judge: 74492 of 6.3M elements past the float32 rule's bound (2e-3
    # of the scale; a bf16 ulp is up to 3.9e-3 of the value). Kept beside the end, the copy is the
    # unrounded float32 value, as the exact run's: within it. The judge's own rule, on the CPU.
    from kevin_backend.generate.builtin.gemm_plan import KeptEnd, plan_gemm, plan_tilings, write_gemm_program
    from kevin_backend.measure.compare import compare_outputs
    from kevin_backend.types import load_program

    source = task("(h := F.linear(v[0], v[1], v[2]).view(4, 128, 768) + v[3], h.float())",
                  f"torch.randn(512, 768, {BF16}), torch.randn(768, 768, {BF16}), torch.randn(768, {BF16}), "
                  f"torch.randn(4, 128, 768, {BF16})")
    plan = plan_gemm(source, arch="sm90")
    tiling = plan_tilings(plan)[0]
    assert isinstance(tiling, KeptEnd), plan
    new = _load(write_gemm_program(plan, tiling, task_source=source), plan.kept, monkeypatch)
    reference = load_program(source, "kevin_test_gemm_wiring_task")
    torch.manual_seed(3)
    values = reference.get_inputs()
    model = reference.Model()
    got, eager = list(new.ModelNew()(*values)), list(model(*values))
    exact = list(model.double()(*[v.double() for v in values]))
    assert compare_outputs(got, eager, exact) is None
    copied = compare_outputs([got[0], got[0].float()], eager, exact)  # (the GEMM's bf16 end, then a cast kernel's copy of it)
    assert copied is not None and copied.output == 1 and copied.bad_elements > 100, copied


def test_a_compiled_models_attention_scores_are_one_batched_gemm(hopper_with_cutlass, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    # as the backend gets them: the partition's inputs are the 3-D views the bmm reads, the keys'
    # the (L, K, N) transpose of packed (L, N, K) values; the program passes them packed
    from torch.fx.experimental.proxy_tensor import make_fx

    from kevin_backend.backend.partition import partition_graph
    from kevin_backend.backend.task import extract_task
    from kevin_backend.generate.builtin.builtin_support import BuiltinSupport
    from kevin_backend.generate.builtin.gemm_kernel import GemmTiling
    from kevin_backend.generate.builtin.gemm_plan import GemmPlan, plan_gemm, write_gemm_program

    def model(q, k):  # type: ignore[no-untyped-def]
        return torch.softmax(q @ k.transpose(-2, -1) * 0.125, -1)

    gm = make_fx(model)(torch.randn(2, 3, 16, 64, dtype=torch.bfloat16), torch.randn(2, 3, 24, 64, dtype=torch.bfloat16))
    (partition,) = [p for p in partition_graph(gm.graph, BuiltinSupport()).partitions
                    if any(n.target is torch.ops.aten.bmm.default for n in p.nodes)]
    source = extract_task(partition).source
    plan = plan_gemm(source)
    assert isinstance(plan, GemmPlan) and (plan.batch, plan.m, plan.n, plan.k) == (6, 16, 24, 64), plan
    assert plan.w_view and plan.spec.weight == "nk" and plan.spec.epilogue.alpha == 0.125, plan.describe()
    program = write_gemm_program(plan, GemmTiling())
    assert "v1.transpose(-2, -1).reshape(" in program
    new, values = _runs_as_its_model(source, program, plan, monkeypatch, 7, 2e-2)
    assert new.calls[0][1].is_contiguous() and new.calls[0][1].shape == (6, 24, 64)  # (the keys packed, N x K)


# a KernelBench level-2 problem's form (float32, nn.Conv2d's parameters, a function after it) at a CPU's size
_CONV_MODULE = '''import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, padding=1)

    def forward(self, x):
        return F.hardswish(self.conv(x)) * 0.5


def get_inputs():
    return [torch.randn(2, 6, 10, 12)]


def get_init_inputs():
    return [6, 24, 3]
'''


@pytest.mark.parametrize("forward, inputs", [
    # a 3x3 convolution of a plain input, its bias and a ReLU: x and w packed, the output transposed back
    ("F.relu(F.conv2d(v[0], v[1], v[2], padding=1))", f"torch.randn(2, 16, 8, 8, {BF16}), torch.randn(32, 16, 3, 3, {BF16}), "
     f"torch.randn(32, {BF16})"),
    # a channels-last input, stride 2, an odd size: read in place, the output channels-last as eager's
    ("F.hardswish(F.conv2d(v[0], v[1], stride=2, padding=1))", "torch.randn(2, 8, 9, 7, dtype=torch.float16).contiguous("
     "memory_format=torch.channels_last), torch.randn(16, 8, 3, 3, dtype=torch.float16)"),
    # a 1-D convolution (as 2-D of height 1), dilated, in float32
    ("F.gelu(F.conv1d(v[0], v[1], v[2], padding=2, dilation=2))", "torch.randn(2, 8, 20), torch.randn(12, 8, 3), torch.randn(12)"),
    # a 3-D convolution, strided and padded unevenly, of a plain input and of a channels-last one
    ("torch.relu(F.conv3d(v[0], v[1], v[2], stride=(1, 2, 2), padding=(0, 1, 2)))", f"torch.randn(2, 8, 4, 9, 7, {BF16}), "
     f"torch.randn(16, 8, 3, 3, 3, {BF16}), torch.randn(16, {BF16})"),
    ("F.silu(F.conv3d(v[0], v[1], padding=1))", "torch.randn(2, 4, 3, 5, 6).contiguous(memory_format=torch.channels_last_3d), "
     "torch.randn(8, 4, 3, 3, 3)"),
    # transposed: a 4x4 of stride 2 (as a GAN's generator upsamples) with its bias; output padding; 1-D
    ("torch.sigmoid(F.conv_transpose2d(v[0], v[1], v[2], stride=2, padding=1)) * 2.0", "torch.randn(2, 16, 5, 6), "
     "torch.randn(16, 8, 4, 4), torch.randn(8)"),
    ("F.conv_transpose2d(v[0], v[1], stride=(2, 3), padding=(1, 0), output_padding=(1, 2))",
     f"torch.randn(2, 8, 4, 5, {F16}).contiguous(memory_format=torch.channels_last), torch.randn(8, 16, 3, 3, {F16})"),
    ("F.gelu(F.conv_transpose1d(v[0], v[1], v[2], stride=2))", "torch.randn(2, 8, 11), torch.randn(8, 4, 5), torch.randn(4)"),
    # tensors read after the activation (a tree): a (C_out, 1, 1) parameter; the input itself as a residual
    # (plain: packed by the program; channels-last: read in place); a 3-D one gated by a tensor of the output's size
    ("torch.relu(F.conv2d(v[0], v[1], v[2], padding=1)) + v[3]", "torch.randn(2, 8, 6, 7), torch.randn(12, 8, 3, 3), "
     "torch.randn(12), torch.randn(12, 1, 1)"),
    ("F.silu(F.conv2d(v[0], v[1], v[2], padding=1)) + v[0]", f"torch.randn(2, 16, 6, 5, {BF16}), torch.randn(16, 16, 3, 3, {BF16}), "
     f"torch.randn(16, {BF16})"),
    ("F.silu(F.conv2d(v[0], v[1], v[2], padding=1)) + v[0]", f"torch.randn(2, 16, 6, 5, {BF16}).contiguous("
     f"memory_format=torch.channels_last), torch.randn(16, 16, 3, 3, {BF16}), torch.randn(16, {BF16})"),
    ("torch.sigmoid(F.conv3d(v[0], v[1], padding=1)) * v[2]", "torch.randn(2, 4, 3, 5, 6), torch.randn(8, 4, 3, 3, 3), "
     "torch.randn(2, 8, 3, 5, 6)"),
    # a 1-D one (as 2-D of height 1): its tensor of the output's size passed with the height too; a (C_out, 1) parameter
    ("F.gelu(F.conv1d(v[0], v[1], padding=1)) * v[2] - v[3]", "torch.randn(2, 8, 20), torch.randn(12, 8, 3), "
     "torch.randn(2, 12, 20), torch.randn(12, 1)"),
    # an output viewed in another shape (flattened for a classifier's head; channels and positions apart), the kernel's viewed
    ("torch.relu(F.conv2d(v[0], v[1], v[2], padding=1)).flatten(1)", "torch.randn(2, 16, 8, 8), torch.randn(32, 16, 3, 3), "
     "torch.randn(32)"),
    ("torch.relu(F.conv2d(v[0], v[1], v[2], padding=1).view(2, 32, 64) * 2.0) + v[3]", f"torch.randn(2, 16, 8, 8, {F16}), "
     f"torch.randn(32, 16, 3, 3, {F16}), torch.randn(32, {F16}), torch.randn(32, 1, {F16})"),
    ("F.gelu(F.conv1d(v[0], v[1], v[2], padding=1)).flatten(1)", "torch.randn(2, 16, 8), torch.randn(32, 16, 3), torch.randn(32)"),
    # a ResNet block's convolution, then an inference batch norm (its running mean and variance,
    # weight and bias: four vectors, unsqueezed to C x 1 x 1) and ReLU, of a channels-last input and
    # of a plain one; the block's end, the input added back before the ReLU (four vectors and a tensor)
    ("F.relu(F.batch_norm(F.conv2d(v[0], v[1], padding=1), v[2], v[3], v[4], v[5], False, 0.1, 1e-5))",
     f"torch.randn(2, 16, 8, 8, {BF16}).contiguous(memory_format=torch.channels_last), torch.randn(32, 16, 3, 3, {BF16}), "
     f"torch.randn(32, {BF16}), torch.rand(32, {BF16}) + 0.5, torch.randn(32, {BF16}), torch.randn(32, {BF16})"),
    ("F.relu(F.batch_norm(F.conv2d(v[0], v[1], v[2], stride=2, padding=1), v[3], v[4], v[5], v[6], False, 0.1, 1e-3))",
     f"torch.randn(2, 8, 9, 7, {F16}), torch.randn(16, 8, 3, 3, {F16}), torch.randn(16, {F16}), torch.randn(16, {F16}), "
     f"torch.rand(16, {F16}) + 0.5, torch.randn(16, {F16}), torch.randn(16, {F16})"),
    ("F.relu(F.batch_norm(F.conv2d(v[0], v[1], padding=1), v[2], v[3], v[4], v[5], False, 0.1, 1e-5) + v[0])",
     f"torch.randn(2, 16, 6, 5, {BF16}).contiguous(memory_format=torch.channels_last), torch.randn(16, 16, 3, 3, {BF16}), "
     f"torch.randn(16, {BF16}), torch.rand(16, {BF16}) + 0.5, torch.randn(16, {BF16}), torch.randn(16, {BF16})"),
    ("module", ""),
])
def test_a_convolution_reaches_the_implicit_gemm_and_returns_eagers_layout(forward: str, inputs: str,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    from kevin_backend.generate.builtin.conv_kernel import sm90_conv_fits
    from kevin_backend.generate.builtin.gemm_kernel import tilings_for
    from kevin_backend.generate.builtin.gemm_plan import GemmPlan, plan_gemm, write_gemm_program
    from kevin_backend.toolchain.static_rules import check_program
    from kevin_backend.types import load_program

    source = _CONV_MODULE if forward == "module" else task(forward, inputs)
    plan = plan_gemm(source)
    plan = getattr(plan, "fallback", None) or plan  # (a direct convolution's implicit GEMM)
    assert isinstance(plan, GemmPlan) and plan.spec.convolution is not None, plan
    c = plan.spec.convolution
    assert c.channels_last == ("channels_last" in inputs) and plan.conv1d == ("1d(" in forward)
    assert (c.dims, c.transposed) == ((3 if "conv3d" in forward else 2), "transpose" in forward), c
    # (a tensor read after it: a tree)
    assert plan.spec.epilogue.tree == ("v[" in forward.rsplit(")", 1)[-1] or "batch_norm" in forward), plan.describe()
    program = write_gemm_program(plan, tilings_for(plan.spec)[0], task_source=source)
    assert check_program(program) == () and ("ConvUniversal" if sm90_conv_fits(plan.spec) else "ImplicitGemmConvolution") in program
    assert ("CUTLASS 3.x (sm90)" in program) == sm90_conv_fits(plan.spec)
    if forward == "module":
        assert plan.state == ("conv.weight", "conv.bias"), plan.state
        _runs_as_its_model(source, program, plan, monkeypatch, 5, 1e-4)
        return
    new = _load(program, plan, monkeypatch)
    reference = load_program(source, "kevin_test_gemm_wiring_task")
    values = reference.get_inputs()
    got, want = new.ModelNew()(*values), reference.Model()(*values)
    tolerance = 1e-4 if want.dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got, want, rtol=tolerance, atol=tolerance)
    assert got.shape == want.shape and got.stride() == want.stride()  # (eager's layout: channels-last of a channels-last input)


@pytest.mark.parametrize("dtype, channels_last", [(torch.bfloat16, True), (torch.float16, False)])
def test_a_compiled_resnet_blocks_convolutions_take_their_batch_norm_and_relu(dtype: torch.dtype, channels_last: bool,
                                                                               hopper_with_cutlass: Any,
                                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    # the example CNN in inference, as the kevin pass partitions it: each convolution with its bias,
    # the batch norm a compiled model makes of it (the running mean and reciprocal deviation in
    # float32, computed by another kernel; the weight and bias in the model's dtype, each C x 1 x 1)
    # and ReLU, the second with the block's input added back; a channels-last model's filters too
    from conftest import builtin_partitions
    from kevin_backend.backend.task import extract_task
    from kevin_backend.example_models import make_example
    from kevin_backend.generate.builtin.conv_kernel import ConvTiling
    from kevin_backend.generate.builtin.gemm_kernel import tilings_for
    from kevin_backend.generate.builtin.gemm_plan import GemmPlan, plan_gemm, write_gemm_program
    from kevin_backend.generate.builtin.plan import Declined
    from kevin_backend.toolchain.static_rules import check_program
    from kevin_backend.types import load_program

    model, (x,) = make_example("cnn", dtype=dtype)
    model.eval()
    if channels_last:
        model, x = model.to(memory_format=torch.channels_last), x.contiguous(memory_format=torch.channels_last)
    parts = [p for p in builtin_partitions(model, x).partitions if "aten.convolution.default" in p.ops]
    assert len(parts) == 2 and all({"aten.sub.Tensor", "aten.relu.default"} <= set(p.ops) for p in parts), [p.ops for p in parts]
    for part in parts:
        source = extract_task(part).source
        plan = plan_gemm(source, arch="sm90")
        plan = getattr(plan, "fallback", None) or plan  # (a direct convolution's implicit GEMM)
        assert isinstance(plan, GemmPlan) and plan.spec.convolution.channels_last == channels_last, plan
        e = plan.spec.epilogue
        assert e.operands.count("n") == 5 and len(e.wide) == 2 and "(2 of float32 values)" in plan.describe(), plan.describe()
        assert all(isinstance(t, ConvTiling) for t in tilings_for(plan.spec))  # (Hopper's alone reads float32 vectors)
        declined = plan_gemm(source, arch="sm80")
        # (the first convolution's 3 input channels: the direct kernel's, any GPU's, alone)
        assert isinstance(declined, Declined) and "CUTLASS 2.x's reads" in declined.reason or (
            getattr(declined, "fallback", "") is None and getattr(declined, "channels", (0,))[0] == 3), declined
        program = write_gemm_program(plan, tilings_for(plan.spec)[0], task_source=source)
        assert check_program(program) == () and program.count("Sm90RowBroadcast<0, TileShape, float, float>") == 2
        new = _load(program, plan, monkeypatch)
        reference = load_program(source, "kevin_test_gemm_wiring_task")
        values = reference.get_inputs()
        got, want = new.ModelNew()(*values), reference.Model()(*values)
        torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2)
        assert got.shape == want.shape and got.stride() == want.stride()
        (call,) = new.calls
        assert [a.dtype for a in call[2:] if a.numel() == a.shape[0]].count(torch.float32) == 2  # (the vectors as they are)
        assert call[1].data_ptr() == values[1].data_ptr()  # (the filter as it lies: packed by the kernel's program, if at all)


@pytest.mark.parametrize("arch", ["sm90", "sm80"])
def test_a_float32_output_of_a_16_bit_product_is_stored_by_the_gemm_or_cast_after_it(arch: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # a compiled transformer's last residual stream, handed on in float32: Hopper's kernel stores
    # its end in float32; the sm80 kernel, which reads its bias in the output's dtype, stores the
    # inputs' dtype and the writer's cast kernel follows
    from kevin_backend.generate.builtin.gemm_plan import GemmPlan, GemmTail, plan_gemm, plan_tilings, write_gemm_program
    from kevin_backend.types import load_program

    source = task("(F.linear(v[0], v[1], v[2]).view(2, 8, 32) + 1.0).float()",
                  f"torch.randn(16, 64, {BF16}), torch.randn(32, 64, {BF16}), torch.randn(32, {BF16})")
    plan = plan_gemm(source, arch=arch)
    if arch == "sm80":
        assert isinstance(plan, GemmTail) and plan.gemm.spec.output == "bfloat16" and plan.tail.ops == ("aten._to_copy.default",), plan
        return
    assert isinstance(plan, GemmPlan) and plan.spec.output == "float32" and "stored in float32" in plan.describe(), plan
    program = write_gemm_program(plan, plan_tilings(plan)[0])
    assert "using ElementD = float;" in program
    # a float32 output keeps the precise math; the same product stored in bfloat16 takes the device's
    assert "#define KEVIN_FAST_MATH" not in program and "kevin_silu(float x)" in program
    narrow = plan_gemm(source.replace(".float()", ""), arch=arch)
    assert narrow.spec.output == "bfloat16" and "cuda_source = r'''#define KEVIN_FAST_MATH 1\n" in write_gemm_program(narrow, plan_tilings(narrow)[0])
    new = _load(program, plan, monkeypatch)
    reference = load_program(source, "kevin_test_gemm_wiring_task")
    values = reference.get_inputs()
    got, want = new.ModelNew()(*values), reference.Model()(*values)
    assert got.dtype == want.dtype == torch.float32
    torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2)
