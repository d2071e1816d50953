"""Keys that name the numerics and the device (issue 34, point 5), on the CPU.

A task made from a KernelBench program has no ops list, so its key cannot tell which switches
bear on it: every numerics switch enters it. Inductor's mode and config patches (the baseline a
kernel beat) enter the task key and the graph key. The GPU a key names is the one the tensors are
on, never the current device.
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any, Callable

import pytest
import torch
import torch.fx as fx
from torch._inductor import list_mode_options

from kevin_backend.cache.key import DeviceInfo, apply_numerics, current_numerics, make_key
from kevin_backend.types import KernelTask, TensorSpec

H200 = DeviceInfo("NVIDIA H200", "9.0", "2.11.0", "13.0")

MATMUL_PROGRAM = textwrap.dedent(
    """
    import torch

    class Model(torch.nn.Module):
        def forward(self, a, b):
            return torch.matmul(a, b)

    def get_inputs():
        return [torch.randn(64, 32), torch.randn(32, 16)]

    def get_init_inputs():
        return []
    """
)


@pytest.fixture
def restore_flags():
    saved = current_numerics()
    yield
    apply_numerics(saved)


def program_task() -> KernelTask:
    return KernelTask.from_program("matmul", MATMUL_PROGRAM, "cpu")


def flag(name: str, value: Any) -> Callable[[], None]:
    def flip() -> None:
        if name == "deterministic_algorithms":
            torch.use_deterministic_algorithms(value)
        else:
            owner, attr = name.rsplit(".", 1)
            setattr(eval(owner, {"torch": torch}), attr, value)  # noqa: S307 - the names below
    return flip


FLAGS = [
    pytest.param("torch.backends.cuda.matmul.allow_tf32", True, id="matmul-tf32"),
    pytest.param("torch.backends.cudnn.allow_tf32", False, id="cudnn-tf32"),
    pytest.param("torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction", False, id="fp16-reduction"),
    pytest.param("torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction", False, id="bf16-reduction"),
    pytest.param("deterministic_algorithms", True, id="deterministic-algorithms"),
    pytest.param("torch.backends.cudnn.benchmark", True, id="cudnn-benchmark"),
    pytest.param("torch.backends.cudnn.enabled", False, id="cudnn-enabled"),
]


@pytest.mark.parametrize("name, value", FLAGS)
def test_a_program_tasks_key_changes_with_each_numerics_flag(restore_flags, name: str, value: Any) -> None:
    task = program_task()
    assert task.ops == ()  # a program: its ops are not known, so no switch may be left out
    before = make_key(task, H200)
    flag(name, value)()
    after = make_key(task, H200)
    assert after.digest != before.digest
    flag(name, not value)()
    assert make_key(task, H200).digest == before.digest  # read at each call


CONV_SPEC = TensorSpec(shape=(1, 3, 8, 8), stride=(192, 64, 8, 1), dtype="float32", device="cuda")


def test_cudnn_benchmark_enters_the_key_of_a_cudnn_task_only(restore_flags) -> None:
    conv = KernelTask("c", "# c\n", (CONV_SPEC,), (CONV_SPEC,), ("aten.convolution.default",), "c" * 32)
    pointwise = KernelTask("p", "# p\n", (CONV_SPEC,), (CONV_SPEC,), ("aten.relu.default",), "p" * 32)
    before = (make_key(conv, H200).digest, make_key(pointwise, H200).digest)
    torch.backends.cudnn.benchmark = True
    after = (make_key(conv, H200).digest, make_key(pointwise, H200).digest)
    assert after[0] != before[0] and after[1] == before[1]


# -- Inductor's mode and config patches ------------------------------------------------------


POINTWISE = KernelTask("p", "# p\n", (CONV_SPEC,), (CONV_SPEC,), ("aten.relu.default",), "p" * 32)


@pytest.mark.parametrize("task", [pytest.param(POINTWISE, id="graph-task"), pytest.param(None, id="program-task")])
def test_a_task_key_names_inductors_mode_and_patches(task: KernelTask | None) -> None:
    task = task or program_task()
    default = make_key(task, H200)
    assert "inductor_config" not in dict(default.numerics)  # default Inductor: keys made before still match
    with torch._inductor.config.patch(list_mode_options("max-autotune")):
        autotune = make_key(task, H200)
    with torch._inductor.config.patch({"epilogue_fusion": not torch._inductor.config.epilogue_fusion}):
        patched = make_key(task, H200)
    assert len({default.digest, autotune.digest, patched.digest}) == 3
    assert '"max_autotune": true' in dict(autotune.numerics)["inductor_config"]
    assert make_key(task, H200) == default


def test_inductor_config_leaves_out_passes_and_defaults() -> None:
    from kevin_backend.cache.key import inductor_config

    assert inductor_config() == "{}"
    with torch._inductor.config.patch({"post_grad_custom_pre_pass": None, "max_autotune": False}):
        assert inductor_config() == "{}"  # a pass object is no setting; a default is no patch
    assert inductor_config({"max_autotune": True}) == '{"max_autotune": true}'


def test_apply_numerics_sets_and_restores_inductors_config(restore_flags) -> None:
    own = current_numerics()
    with torch._inductor.config.patch(list_mode_options("max-autotune-no-cudagraphs")):
        wanted = current_numerics()
    apply_numerics(wanted)
    assert torch._inductor.config.max_autotune is True and torch._inductor.config.coordinate_descent_tuning is True
    assert current_numerics() == wanted
    apply_numerics(own)
    assert torch._inductor.config.max_autotune is False and current_numerics() == own


def _graph_keys(tmp_path: Path, fn: Callable[..., Any], inputs: list[Any], mode: str | None) -> str:
    """The graph key the backend computes for `fn` compiled with `mode` (the compile stops there)."""
    from kevin_backend.backend import entry
    from kevin_backend.backend.graph_check import graph_key

    seen: list[str] = []

    class Stop(Exception):
        pass

    def capture(gm: fx.GraphModule, example_inputs: Any, settings: dict[str, Any]) -> str:
        seen.append(graph_key(gm, example_inputs, settings))
        raise Stop

    gm = fx.symbolic_trace(fn)
    saved = entry.graph_key
    entry.graph_key = capture
    try:
        with pytest.raises(Stop):
            entry.kevin(gm, inputs, options={"cpu_kernels": True, "graph_check": True, "cache_dir": str(tmp_path)}, mode=mode)
    finally:
        entry.graph_key = saved
    return seen[0]


def _mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.relu(a @ b)


def test_the_graph_key_names_mode_patches_and_numerics(tmp_path: Path, restore_flags) -> None:
    inputs = [torch.randn(8, 8), torch.randn(8, 8)]
    default = _graph_keys(tmp_path, _mm, inputs, None)
    assert _graph_keys(tmp_path, _mm, inputs, None) == default
    keys = {"default": default, "max-autotune": _graph_keys(tmp_path, _mm, inputs, "max-autotune")}
    with torch._inductor.config.patch({"epilogue_fusion": not torch._inductor.config.epilogue_fusion}):
        keys["patched"] = _graph_keys(tmp_path, _mm, inputs, None)
    torch.backends.cuda.matmul.allow_tf32 = True
    keys["tf32"] = _graph_keys(tmp_path, _mm, inputs, None)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    keys["cudnn-tf32"] = _graph_keys(tmp_path, _mm, inputs, None)
    assert len(set(keys.values())) == len(keys), keys


# -- the tensors' device, not the current one -----------------------------------------------


@pytest.fixture
def two_gpus(monkeypatch):
    """A machine with two GPUs of different names whose current device must not be read."""
    names = {0: "GPU zero", 1: "GPU one"}

    def current() -> int:
        raise AssertionError("the current device was read")

    def index_of(device: Any = None) -> int:
        if device is None:
            current()
        return torch.device(device).index if not isinstance(device, int) else device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", current)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: names[index_of(device)])
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, index_of(device)))
    DeviceInfo.detect.cache_clear()
    yield names
    DeviceInfo.detect.cache_clear()


def test_a_task_key_names_the_device_its_tensors_are_on(two_gpus) -> None:
    task = KernelTask("p", "# p\n", (CONV_SPEC,), (CONV_SPEC,), ("aten.relu.default",), "p" * 32)
    one = make_key(task, torch.device("cuda", 1))
    zero = make_key(task, torch.device("cuda", 0))
    assert (one.gpu, one.capability) == ("GPU one", "9.1") and (zero.gpu, zero.capability) == ("GPU zero", "9.0")


def _on(device: torch.device, *shape: int) -> torch.Tensor:
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

    return FakeTensor(FakeTensorMode(), torch.empty(*shape, device="meta"), device)


def test_the_graph_key_names_the_device_its_tensors_are_on(two_gpus) -> None:
    from kevin_backend.backend.graph_check import graph_key
    from kevin_backend.cache.key import tensors_device

    gm = fx.symbolic_trace(_mm)
    on_one = [_on(torch.device("cuda", 1), 8, 8), _on(torch.device("cuda", 1), 8, 8)]
    on_zero = [_on(torch.device("cuda", 0), 8, 8), _on(torch.device("cuda", 0), 8, 8)]
    assert tensors_device(on_one) == torch.device("cuda", 1) and tensors_device([3, on_zero[0]]) == torch.device("cuda", 0)
    assert tensors_device([2.0]) is None
    first = graph_key(gm, on_one, {})
    assert graph_key(gm, on_one, {}) == first and graph_key(gm, on_zero, {}) != first
    two_gpus[1] = "GPU uno"  # another GPU at index 1: another key
    DeviceInfo.detect.cache_clear()
    assert graph_key(gm, on_one, {}) != first


def _partition_keys(mode: str | None) -> list[dict[str, Any]]:
    """The keys the kevin pass made for a compile with `mode` (cache mode on the CPU)."""
    import kevin_backend

    torch._dynamo.reset()
    fn = torch.compile(lambda x, y: torch.relu(x * y + 0.5).sum(dim=-1), backend="kevin", mode=mode)
    with torch.no_grad():
        fn(torch.randn(8, 16), torch.randn(8, 16))
    report = kevin_backend.last_report()
    torch._dynamo.reset()
    return [r.key_dict for r in report.records() if r.key_dict]


def test_the_kevin_pass_keys_a_partition_with_the_compiles_mode(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("KEVIN_CACHE_DIR", str(tmp_path))  # torch.compile takes a mode or options, not both
    default = _partition_keys(None)
    tuned = _partition_keys("max-autotune-no-cudagraphs")
    assert default and tuned and len(default) == len(tuned)
    assert all("inductor_config" not in k["numerics"] for k in default)
    assert all('"max_autotune": true' in k["numerics"]["inductor_config"] for k in tuned)
