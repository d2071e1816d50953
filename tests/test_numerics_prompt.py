"""The numerics a task runs under, told to the writer: the task message states the TF32 settings its
cache key names (`prompts.task_message`), a search under a key passes them on to every turn's
conversation, and the built-in writer reads them back (`prompts.numerics_in`) to decline a float32
convolution's implicit GEMM where cuDNN computes it in TF32 (three times less tensor-core work than
the writer's 3xTF32), while a float32 convolution cuDNN computes in float32 gets its kernel; and to
try each float32 GEMM tile in 3xTF32, then in one TF32 product, where cuBLAS computes float32
matmuls in TF32."""

from __future__ import annotations

from pathlib import Path

import pytest

from judge_cases import GATED_TASK
from kevin_backend.cache.key import CacheKey
from kevin_backend.generate import prompts
from kevin_backend.generate.engine import SearchConfig
from kevin_backend.generate.generator import SearchGenerator
from kevin_backend.generate.log import TrajectoryLog
from kevin_backend.generate.replay import ReplayPolicy
from kevin_backend.judge.judge import Judge
from kevin_backend.types import KernelTask

CONV_3X3_F32 = "conv2d-relu-bias-f32-128x128x32x32"  # 128 input channels: the implicit GEMM's
CONV_FEW_CHANNELS_F32 = "conv2d-min-tanh-f32-128x3x32x32"  # 3 input channels: the direct kernel's


def _suite_source(name: str) -> str:
    from kevin_backend.generate.builtin.gemm_suite import GEMM_SUITE

    return next(t.source for t in GEMM_SUITE if t.name == name)


def test_the_task_states_the_tf32_settings_its_key_names() -> None:
    said = prompts.task_message("PROGRAM", "NVIDIA H200", "9.0", cutlass=None,
                                numerics=(("cudnn_tf32", True), ("matmul_tf32", False), ("cudnn_benchmark", False)))
    text = said["content"]
    assert "float32 convolutions in TF32 (torch.backends.cudnn.allow_tf32 = True)" in text, text
    assert "float32 matmuls in full float32 (torch.backends.cuda.matmul.allow_tf32 = False)" in text, text
    assert prompts.numerics_in([said]) == {"cudnn_tf32": True, "matmul_tf32": False}
    # a key of a pointwise task names neither: the task says nothing of them
    plain = prompts.task_message("PROGRAM", "NVIDIA H200", "9.0", cutlass=None, numerics={"deterministic_algorithms": False})
    assert "Numerics:" not in plain["content"] and "TF32" not in plain["content"] and prompts.numerics_in([plain]) == {}
    strict = prompts.task_message("PROGRAM", "NVIDIA H200", cutlass=None, numerics={"deterministic_algorithms": True})
    assert "deterministic algorithms only" in strict["content"]


def test_a_program_that_speaks_of_numerics_is_not_read_as_the_task_saying_them() -> None:
    program = "# Numerics: float32 convolutions in TF32\nNumerics: float32 convolutions in TF32 (x)\nclass Model: pass"
    said = prompts.task_message(program, "NVIDIA H200", cutlass=None, numerics={"cudnn_tf32": False})
    assert prompts.numerics_in([said]) == {"cudnn_tf32": False}
    silent = prompts.task_message(program, "NVIDIA H200", cutlass=None)
    assert prompts.numerics_in([silent]) == {}


def test_a_search_under_a_key_tells_every_turn_its_numerics(tmp_path: Path) -> None:
    policy = ReplayPolicy(["I cannot write it.\nSummary: none."] * 2)
    generator = SearchGenerator(policy, Judge(tmp_path / "builds"), SearchConfig(trajectories=1, turns=2),
                                log=TrajectoryLog(tmp_path / "log.jsonl"))
    task = KernelTask.from_program("gated", GATED_TASK, "cpu")
    key = CacheKey(task.graph_hash, task.inputs, "NVIDIA H200", "9.0", "2.11.0", "13.0",
                   numerics={"cudnn_tf32": False, "matmul_tf32": True})
    generator.run(task, key.gpu, key.capability, key.numerics)
    assert policy.calls == 2
    for conversation in (c[0] for c in policy.received):
        assert prompts.numerics_in(conversation) == {"cudnn_tf32": False, "matmul_tf32": True}


@pytest.mark.parametrize("tf32", [True, False])
def test_the_writer_declines_a_float32_implicit_gemm_convolution_only_under_tf32(tf32: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    from kevin_backend.generate.builtin import builtin_policy
    from kevin_backend.generate.policy import Sampling

    monkeypatch.setattr(builtin_policy, "gemm_available", lambda: True)
    source = _suite_source(CONV_3X3_F32)
    messages = [prompts.system_message(),
                prompts.task_message(source, "NVIDIA H200", "9.0", cutlass=None, numerics={"cudnn_tf32": tf32})]
    (reply,) = builtin_policy.BuiltinPolicy().generate([messages], Sampling())
    if tf32:
        assert reply.finish_reason == "declined" and "```" not in reply.text, reply.text[:300]
        assert "cuDNN compute it in TF32" in reply.text and "cudnn.allow_tf32 off" in reply.text, reply.text
    else:  # cuDNN's float32 is no faster math than the writer's 3xTF32: its CUTLASS kernel
        assert reply.finish_reason != "declined" and "OpMultiplyAddFastF32" in reply.text, reply.text[:300]
        assert reply.extra["variant"].startswith("3xtf32"), reply.extra


def test_under_tf32_a_few_channel_float32_convolution_keeps_its_direct_kernel_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    from kevin_backend.generate.builtin import builtin_policy
    from kevin_backend.generate.builtin.gemm_plan import DirectConv, plan_gemm
    from kevin_backend.generate.policy import Sampling

    source = _suite_source(CONV_FEW_CHANNELS_F32)
    plain, tf32 = plan_gemm(source, "sm90"), plan_gemm(source, "sm90", conv_tf32=True)
    assert isinstance(plain, DirectConv) and plain.fallback is not None  # (its implicit GEMM: the search's later variants)
    assert isinstance(tf32, DirectConv) and tf32.fallback is None, tf32
    monkeypatch.setattr(builtin_policy, "gemm_available", lambda: True)
    messages = [prompts.task_message(source, "NVIDIA H200", "9.0", cutlass=None, numerics={"cudnn_tf32": True})]
    (reply,) = builtin_policy.BuiltinPolicy().generate([messages], Sampling())
    assert reply.finish_reason != "declined" and reply.extra["variant"].startswith("direct"), reply.extra


def test_a_16_bit_convolution_is_planned_whatever_the_tf32_setting() -> None:
    from kevin_backend.generate.builtin.gemm_plan import GEMM_PLANS, plan_gemm

    source = _suite_source("conv2d-hardswish-f16-128x128x32x32")
    assert isinstance(plan_gemm(source, "sm90", conv_tf32=True), GEMM_PLANS)


@pytest.mark.parametrize("tf32", [True, False])
def test_under_tf32_matmuls_a_float32_gemm_tries_each_tile_in_3xtf32_then_in_tf32(tf32: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    from kevin_backend.generate.builtin import builtin_policy
    from kevin_backend.generate.builtin.gemm_plan import plan_gemm, plan_tilings
    from kevin_backend.generate.policy import Sampling

    source = _suite_source("linear-gelu-f32-128x1024x512")
    names = [t.name for t in plan_tilings(plan_gemm(source, "sm90", matmul_tf32=tf32))]
    if tf32:
        assert names[:4] == ["3xtf32 tile 64x64x32 stages 4", "tf32 tile 64x64x32 stages 4",
                             "3xtf32 tile 128x64x32 stages 3", "tf32 tile 128x64x32 stages 3"], names
    else:
        assert names and all(n.startswith("3xtf32") for n in names), names
    monkeypatch.setattr(builtin_policy, "gemm_available", lambda: True)
    messages = [prompts.task_message(source, "NVIDIA H200", "9.0", cutlass=None, numerics={"matmul_tf32": tf32})]
    replies = builtin_policy.BuiltinPolicy().generate([messages] * 2, Sampling())  # (two trajectories: the first two variants)
    assert [r.extra["variant"] for r in replies] == names[:2]
    second = replies[1].text
    assert ("cutlass::arch::OpMultiplyAddFastF32" not in second) == tf32 and "cutlass::arch::OpMultiplyAdd" in second
    assert "cutlass::arch::OpMultiplyAddFastF32" in replies[0].text


def test_tf32_is_a_float32_gemms_alone() -> None:
    from kevin_backend.generate.builtin.gemm_kernel import GemmSpec
    from kevin_backend.generate.builtin.gemm_kernel_sm80 import Sm80Tiling
    from kevin_backend.generate.builtin.gemm_plan import GemmTail, plan_gemm

    with pytest.raises(ValueError, match="TF32 is a float32 GEMM's"):
        GemmSpec("bfloat16", tf32=True)
    with pytest.raises(ValueError, match="a 16-bit tiling has none"):
        Sm80Tiling((128, 128, 32), 4, (64, 64, 32), half=True, tf32=True)
    # a float32 convolution (cuDNN's TF32 is `cudnn_tf32`'s) and a 16-bit GEMM keep their tilings
    conv = plan_gemm(_suite_source("conv2d-groupnorm-scale-f32-128x128x32x32"), "sm90", matmul_tf32=True)
    assert isinstance(conv, GemmTail) and not conv.gemm.spec.tf32
    half = plan_gemm(_suite_source("mlp-up-gelu-f16-8192x768x3072"), "sm90", matmul_tf32=True)
    assert not half.spec.tf32


@pytest.mark.full
@pytest.mark.slow
def test_a_tf32_gemm_compiles_for_an_ampere_gpu_through_the_fast_builds_nvcc_command(tmp_path: Path) -> None:
    """One TF32 product a multiply-add: CUTLASS 2.x's float32 mainloop with `OpMultiplyAdd` (about 11 s of nvcc)."""
    from cutlass_builds import compiled_symbols
    from kevin_backend.generate.builtin.gemm_kernel import SM80_CUDA_FLAGS, Epilogue, GemmSpec, gemm_device_source
    from kevin_backend.generate.builtin.gemm_kernel_sm80 import TF32_TILINGS

    source = gemm_device_source(GemmSpec("float32", Epilogue(bias=True, activation="gelu"), "nk", 4, tf32=True), TF32_TILINGS[0])
    assert "cutlass::arch::OpMultiplyAdd>" in source and "FastF32" not in source
    symbols = compiled_symbols(tmp_path, source, "8.0", SM80_CUDA_FLAGS)
    assert "kevin_gemm_run" in symbols and "MmaMultistage" in symbols


def test_a_float32_softmax_after_a_product_is_planned_where_eagers_product_is_tf32s() -> None:
    # declined under float32 matmuls (the 3xTF32 products less exact than eager's, the exponent
    # magnifying it); where eager's product is TF32's too, the judge decides
    from kevin_backend.generate.builtin.gemm_plan import GemmTail, plan_gemm
    from kevin_backend.generate.builtin.plan import Declined

    source = _suite_source("mm-softmax-f32-2048x1024x2048")
    declined = plan_gemm(source, "sm90")
    assert isinstance(declined, Declined) and "exponentiated after it" in declined.reason
    planned = plan_gemm(source, "sm90", matmul_tf32=True)
    assert isinstance(planned, GemmTail) and planned.gemm.spec.tf32, planned


def test_a_search_under_cudnns_tf32_keeps_inductor_with_the_writers_reason(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # what the compile report and the cache say of such a convolution: Inductor's code, and why
    from kevin_backend.cache.format import EntryKind
    from kevin_backend.generate.builtin import builtin_policy

    monkeypatch.setattr(builtin_policy, "gemm_available", lambda: True)
    generator = SearchGenerator(builtin_policy.BuiltinPolicy(), Judge(tmp_path / "builds"), SearchConfig(trajectories=1, turns=2),
                                log=TrajectoryLog(tmp_path / "log.jsonl"))
    task = KernelTask.from_program("conv", _suite_source(CONV_3X3_F32), "cpu")
    key = CacheKey(task.graph_hash, task.inputs, "NVIDIA H200", "9.0", "2.11.0", "13.0", numerics={"cudnn_tf32": True})
    entry = generator.generate(task, key)
    assert entry.kind is EntryKind.INDUCTOR and "cuDNN compute it in TF32" in entry.reason, entry.reason
    assert len(generator.results[-1].records) == 1  # (one turn: the writer declined, nothing was built)
