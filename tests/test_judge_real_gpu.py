"""The judge on real tasks, on a GPU: KernelBench problems whose inputs are made on the CPU and
weigh hundreds of megabytes, inputs with their true layouts (stride-0 broadcasts, transposes),
the runtime's load check on those layouts, and bounded memory beside another process (a verdict
when it fits, RESOURCE and no cached decision when it does not)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest
import torch

from kb_corpus.corpus import load_corpus, problem_source

pytestmark = pytest.mark.gpu
needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

CASES = {c.name: c for c in load_corpus()}


@pytest.fixture(scope="module")
def judge():  # type: ignore[no-untyped-def]
    from kevin_backend.config import Config
    from kevin_backend.judge.judge import Judge
    from kevin_backend.judge.sandbox import RunConfig

    return Judge(Config.from_env().cache_dir / "builds", RunConfig(trials=5, warmup=1, inductor=False))


@needs_gpu
def test_an_honest_candidate_for_a_cpu_input_problem_is_accepted_and_its_key_names_the_gpu(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    from kevin_backend.cache.key import make_key
    from kevin_backend.cli.main import main
    from kevin_backend.types import KernelTask

    case = CASES["gelu__float4_tail"]
    assert "torch.randn(batch_size, dim)" in case.problem_source  # made on the CPU, as published
    (tmp_path / "problem.py").write_text(case.problem_source)
    (tmp_path / "candidate.py").write_text(case.candidate_source)
    from kevin_backend.config import Config

    code = main(["--cache-dir", str(Config.from_env().cache_dir), "eval", str(tmp_path / "problem.py"), str(tmp_path / "candidate.py"),
                 "--json", "--trials", "10"])
    verdict = json.loads(capsys.readouterr().out)
    print({k: verdict[k] for k in ("reason", "device", "exact", "memory", "timings")})
    assert code == 0 and verdict["reason"] == "ACCEPTED", verdict["feedback"]
    assert verdict["device"] == f"cuda:{torch.cuda.current_device()}" and verdict["exact"] == "float64"
    assert verdict["memory"]["task_bytes"] >= 2 * (256 << 20)  # >= 256 MB of inputs (and as much output)
    task = KernelTask.from_program("gelu", case.problem_source)
    key = make_key(task)
    assert key.gpu == torch.cuda.get_device_name() and {s.device for s in task.inputs} == {"cuda"}


@needs_gpu
@pytest.mark.parametrize("problem, strides", [("l2norm_transposed", (1, 8192)), ("add_broadcast", (0, 1))])
def test_inputs_reach_the_candidate_with_the_task_strides(problem: str, strides: tuple[int, int]) -> None:
    from kevin_backend.measure.inputs import make_input_set
    from kevin_backend.types import load_program

    values = make_input_set(load_program(problem_source(problem), problem), 11, "cuda").values
    assert values[-1].is_cuda and values[-1].stride() == strides


@needs_gpu
def test_a_kernel_that_ignores_strides_is_rejected_naming_the_input_and_its_strides(judge) -> None:  # type: ignore[no-untyped-def]
    case = CASES["l2norm_transposed__ignores_strides"]
    result = judge.judge(case.problem_source, case.candidate_source)
    print(result.reason.name, result.feedback[:600])
    assert result.reason.name == "MISMATCH"
    assert "input 0: shape [8192, 16384], strides (1, 8192)" in result.feedback
    honest = CASES["l2norm_transposed__strided_thread_per_row"]
    assert judge.judge(honest.problem_source, honest.candidate_source).reason.name == "ACCEPTED"


RUNTIME_TASK = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return x / torch.norm(x, p=2, dim=1, keepdim=True)


def get_inputs():
    return [torch.randn(16384, 8192, device="cuda").t()]


def get_init_inputs():
    return []
'''


@needs_gpu
def test_the_runtime_load_check_catches_a_kernel_that_ignores_strides() -> None:
    from kevin_backend.runtime import registry as runtime
    from kevin_backend.cache.format import CacheEntry, EntryKind
    from kevin_backend.cache.key import make_key
    from kevin_backend.config import Config
    from kevin_backend.types import KernelTask

    task = KernelTask.from_program("l2norm_t", RUNTIME_TASK)
    assert task.inputs[0].stride == (1, 8192)
    key = make_key(task)
    config = Config.from_env()  # builds under the environment's cache folder
    wrong = CacheEntry(key, EntryKind.KERNEL, task, CASES["l2norm_transposed__ignores_strides"].candidate_source)
    with pytest.raises(runtime.KernelMismatch):
        runtime.load_entry(wrong, config)
    honest = CacheEntry(key, EntryKind.KERNEL, task, CASES["l2norm_transposed__strided_thread_per_row"].candidate_source)
    kernel = runtime.load_entry(honest, config)
    x = torch.randn(16384, 8192, device="cuda").t()
    out = kernel([x])[0]
    assert torch.allclose(out, x / torch.norm(x, p=2, dim=1, keepdim=True), rtol=1e-4, atol=1e-6)


ELEMENTWISE = '''
import torch
import torch.nn as nn

n = {n}


class Model(nn.Module):
    def forward(self, x):
        return torch.relu(x) * 2.0


def get_inputs():
    return [torch.randn(n)]


def get_init_inputs():
    return []
'''

ELEMENTWISE_KERNEL = r'''"""A grid-stride relu * 2 with 64-bit indices."""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>

__global__ void relu2_kernel(const float* __restrict__ x, float* __restrict__ y, int64_t n) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        float v = x[i];
        y[i] = (v > 0.0f ? v : 0.0f) * 2.0f;
    }
}

torch::Tensor relu2(torch::Tensor x) {
    auto y = torch::empty_like(x);
    int64_t n = x.numel();
    relu2_kernel<<<132 * 16, 256, 0, at::cuda::getCurrentCUDAStream()>>>(x.data_ptr<float>(), y.data_ptr<float>(), n);
    return y;
}
"""

ext = load_inline(name="relu2_ext", cpp_sources="torch::Tensor relu2(torch::Tensor x);", cuda_sources=cuda_source,
                  functions=["relu2"])


class ModelNew(nn.Module):
    def forward(self, x):
        return ext.relu2(x.contiguous())
'''


@pytest.fixture
def other_process() -> Iterator:  # type: ignore[type-arg]
    """Start a process that holds a share of the GPU's memory, as a user's training job would."""
    procs: list[subprocess.Popen] = []  # type: ignore[type-arg]

    def hold(nbytes: int) -> None:
        code = (f"import torch, time\nt = torch.empty({nbytes}, dtype=torch.uint8, device='cuda')\n"
                "print('held', flush=True)\ntime.sleep(900)\n")
        p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
        procs.append(p)
        assert p.stdout is not None and p.stdout.readline().strip() == "held"
        return p

    yield hold
    for p in procs:
        p.kill()
        p.wait()
    time.sleep(1)


@needs_gpu
def test_a_task_of_a_twentieth_of_the_gpu_beside_a_process_holding_half_gets_a_verdict(judge, other_process) -> None:  # type: ignore[no-untyped-def]
    """Each input and output a twentieth of the GPU. With the candidate in a process of its own,
    correctness holds five buffers of that size at once (the judge's inputs and reference
    outputs, the candidate's copy of the inputs and its outputs, the judge's copy of those): a
    quarter of the GPU here. A tenth needs half, which beside a process holding half is not
    there (RESOURCE: measured on an H200, the judge's copy of a 14 GiB output found 11 GiB free)."""
    free, total = torch.cuda.mem_get_info()
    other_process(total // 2)
    n = int(total * 0.05) // 4
    result = judge.judge(ELEMENTWISE.format(n=n), ELEMENTWISE_KERNEL)
    memory = result.memory or {}
    from kevin_backend.measure.memory import JUDGE_FLOOR

    print(result.reason.name, result.exact, {k: f"{v / 2**30:.2f} GiB" if isinstance(v, int) else v for k, v in memory.items()})
    assert result.reason.name == "ACCEPTED", result.feedback
    assert memory["task_bytes"] >= 2 * n * 4
    assert memory["budget_bytes"] == max(3 * memory["task_bytes"], JUDGE_FLOOR) + memory["fixed_bytes"]
    assert 0 < memory["fixed_bytes"] <= 512 << 20  # the L2 flush buffer: small beside the task
    assert 0 <= memory["judge_extra_bytes"] <= memory["budget_bytes"]
    # the timing's slots, reported apart: within the judge's bound beside its extra, or their own allowance (<= 4 GiB)
    assert memory["slot_bytes"] <= max(4 << 30, memory["budget_bytes"] - memory["judge_extra_bytes"])


@needs_gpu
def test_with_memory_withheld_the_outcome_is_resource_and_nothing_is_decided(judge, other_process, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from kevin_backend.cache.key import make_key
    from kevin_backend.cache.store import KernelCache
    from kevin_backend.config import Config
    from kevin_backend.generate.engine import SearchConfig
    from kevin_backend.generate.generator import SearchGenerator, SearchIncomplete
    from kevin_backend.generate.log import TrajectoryLog
    from kevin_backend.generate.prompts import build_messages, feedback_for, Turn
    from kevin_backend.generate.replay import ReplayPolicy
    from kevin_backend.types import KernelTask

    free, total = torch.cuda.mem_get_info()
    n = int(total * 0.10) // 4
    task_source = ELEMENTWISE.format(n=n)
    other_process(free - n * 4 // 2)  # leaves half of one input's memory
    result = judge.judge(task_source, ELEMENTWISE_KERNEL)
    print(result.reason.name, result.feedback[:300])
    assert result.reason.name == "RESOURCE" and result.judge_side
    assert feedback_for(result) == ""
    reply = f"```python\n{ELEMENTWISE_KERNEL}\n```\nSummary: a grid-stride kernel"
    config = Config(cache_dir=tmp_path / "cache")
    task = KernelTask.from_program("relu2", task_source)
    key = make_key(task)
    generator = SearchGenerator(ReplayPolicy([reply] * 4), judge, SearchConfig(trajectories=1, turns=2), config,
                                log=TrajectoryLog(tmp_path / "log.jsonl"))
    with pytest.raises(SearchIncomplete, match="RESOURCE"):
        generator.generate(task, key)
    with KernelCache(config.cache_dir) as cache:
        assert cache.get(key) is None
    turn = Turn.of(generator.results[-1].records[0].step.reply, generator.results[-1].records[0].step.result)
    text = "\n".join(m["content"] for m in build_messages(task_source, "GPU", [turn], 100_000))
    assert "a grid-stride kernel" not in text and "could not get" not in text


@needs_gpu
def test_the_driver_count_of_another_process_gpu_memory_is_read(other_process) -> None:  # type: ignore[no-untyped-def]
    from kevin_backend.measure.gpu_processes import process_gpu_bytes

    device = torch.device("cuda", torch.cuda.current_device())
    holder = other_process(1 << 30)
    held = process_gpu_bytes(holder.pid, device)
    print("held by the other process:", held)
    assert held is not None and (1 << 30) <= held <= (3 << 30)  # the GiB and its context
    idle = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert process_gpu_bytes(idle.pid, device) == 0  # no CUDA context: nothing on the device
    finally:
        idle.kill()
        idle.wait()


HOLDING_KERNEL = ELEMENTWISE_KERNEL.replace('''class ModelNew(nn.Module):
    def forward(self, x):''', '''class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        # memory held for nothing, within the judge's bound for the task (3x its inputs and outputs)
        self.held = torch.empty({hold}, dtype=torch.uint8, device="cuda")

    def forward(self, x):''')


@needs_gpu
@pytest.mark.parametrize("judge_lacks", ["reference", "copy"])
def test_a_candidate_that_holds_memory_to_starve_the_judge_fails_and_vetoes_nothing(judge, other_process, judge_lacks: str) -> None:  # type: ignore[no-untyped-def]
    """A candidate's process that holds twice the task's output beside a process holding the rest
    of the GPU: the judge's next allocation (eager's outputs, or its copy of the candidate's) does
    not fit. The driver's count of what the process held, beyond its context, outputs and
    workspace, is what the judge lacked: the candidate's failure (OUT_OF_MEMORY), not a RESOURCE
    that would leave its task undecided and its failure unrecorded."""
    n = 1 << 30  # 4 GiB in, 4 GiB out
    out = 4 * n
    kernel = HOLDING_KERNEL.replace("{hold}", str(2 * out))
    assert "{hold}" not in kernel and "self.held" in kernel
    free, _ = torch.cuda.mem_get_info()
    # left beside the hog: what the candidate holds, a GiB of contexts, and room for 1.5 (the
    # reference's outputs do not fit) or 4.5 (the judge's copy of the candidate's does not) outputs
    left = 2 * out + (1 << 30) + int((1.5 if judge_lacks == "reference" else 4.5) * out)
    other_process(free - left)
    result = judge.judge(ELEMENTWISE.format(n=n), kernel)
    print(judge_lacks, result.reason.name, result.feedback[:600])
    assert result.reason.name == "OUT_OF_MEMORY" and not result.judge_side, result.feedback
    if judge_lacks == "reference":
        assert "the candidate's process held" in result.feedback
