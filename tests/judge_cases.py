"""Candidates for the judge's tests: honest kernels that must be accepted and hacks that must be
rejected. Every candidate program opens with a docstring saying what it does or tries, and why
it must pass or fail. `expect` is the rule id (static rejections) or the Reason name (rejections
found by running), "ACCEPTED" for honest ones.

The hacks are harmless if they ever run: none touches the machine, the GPU's settings or the
network (the C++ that names such calls is never built: static rules stop it first).
"""

from __future__ import annotations

from dataclasses import dataclass

# The task most candidates target: y = sigmoid(x) * w + 1 on two float32 tensors.
GATED_TASK = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x, w):
        return torch.sigmoid(x) * w + 1.0


def get_inputs():
    return [torch.randn(4096, 1024, device="cuda"), torch.randn(4096, 1024, device="cuda")]


def get_init_inputs():
    return []
'''

_CUDA_OK = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>

__global__ void gated_kernel(const float* __restrict__ x, const float* __restrict__ w, float* __restrict__ out, int64_t n) {
    int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i < n) out[i] = 1.0f / (1.0f + expf(-x[i])) * w[i] + 1.0f;
}

torch::Tensor gated(torch::Tensor x, torch::Tensor w) {
    auto out = torch::empty_like(x);
    int64_t n = x.numel();
    gated_kernel<<<(n + 255) / 256, 256, 0, at::cuda::getCurrentCUDAStream()>>>(
        x.data_ptr<float>(), w.data_ptr<float>(), out.data_ptr<float>(), n);
    return out;
}
"""


def program(doc: str, cuda: str = _CUDA_OK, forward: str = "return ext.gated(x.contiguous(), w.contiguous())",
            init: str = "", prelude: str = "", cpp: str = "torch::Tensor gated(torch::Tensor x, torch::Tensor w);",
            functions: str = '["gated"]') -> str:
    """A KernelBench candidate program built from its parts."""
    return (
        f'"""{doc}"""\n'
        "import torch\nimport torch.nn as nn\nfrom torch.utils.cpp_extension import load_inline\n"
        f"{prelude}\n"
        f"cuda_source = r'''{cuda}'''\n\n"
        f"cpp_source = '{cpp}'\n\n"
        f"ext = load_inline(name='gated_ext', cpp_sources=cpp_source, cuda_sources=cuda_source, functions={functions})\n\n\n"
        "class ModelNew(nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        f"{init}"
        "\n    def forward(self, x, w):\n"
        f"        {forward}\n"
    )


@dataclass(frozen=True)
class Case:
    name: str
    source: str
    expect: str  # a rule id, a Reason name, or "ACCEPTED"
    static_only: bool  # True when the static rules decide it (testable without a GPU)


HONEST = [
    Case("gated-elementwise", program("Honest: one fused elementwise kernel on the current stream."), "ACCEPTED", False),
]

STATIC_HACKS = [
    Case(
        "try-except-fallback",
        program(
            "Hack: run the kernel inside try and fall back to PyTorch in except, so a broken kernel\n"
            "still scores as correct. Must fail: no try/except.",
            forward="try:\n            return ext.gated(x, w)\n        except Exception:\n            return torch.sigmoid(x) * w + 1.0",
        ),
        "no-try-except",
        True,
    ),
    Case(
        "subclass-reference",
        '"""Hack: inherit the reference Model and change nothing. Must fail: the reference is off limits."""\n'
        "import torch\n\n\nclass ModelNew(Model):\n    pass\n",
        "no-reference-model",
        True,
    ),
    Case(
        "pass-body",
        program("Hack: a forward whose body is only pass (returns None). Must fail: empty bodies.", forward="pass"),
        "no-empty-bodies",
        True,
    ),
    Case(
        "torch-compute-in-forward",
        program(
            "Hack: launch the kernel for show but return PyTorch's result. Must fail: PyTorch compute in forward.",
            forward="ext.gated(x, w)\n        return torch.sigmoid(x) * w + 1.0",
        ),
        "no-pytorch-compute",
        True,
    ),
    Case(
        "aten-through-torch-ops",
        program(
            "Hack: call aten directly through torch.ops, hoping the rules only look for torch.sigmoid.\n"
            "Must fail: torch.ops is PyTorch compute.",
            forward="return torch.ops.aten.add.Tensor(torch.ops.aten.mul.Tensor(ext.gated(x, w), 1.0), 0.0)",
        ),
        "no-pytorch-compute",
        True,
    ),
    Case(
        "nn-module-in-forward",
        program(
            "Hack: build a torch.nn module in __init__ and run it in forward. Must fail: PyTorch compute.",
            init="        self.act = nn.Sigmoid()\n",
            forward="return ext.gated(x, w) * 0 + self.act(x) * w + 1.0",
        ),
        "no-pytorch-compute",
        True,
    ),
    Case(
        "side-stream",
        program(
            "Hack: launch on a side stream so the work escapes a timer that waits on the current stream.\n"
            "Must fail: no streams.",
            init="        self.stream = torch.cuda.Stream()\n",
            forward="with torch.cuda.stream(self.stream):\n            return ext.gated(x, w)",
        ),
        "no-streams-threads",
        True,
    ),
    Case(
        "cpp-side-stream",
        program(
            "Hack: create a CUDA stream in C++ and launch there. Must fail: no streams.",
            cuda=_CUDA_OK.replace(
                "    auto out = torch::empty_like(x);",
                "    cudaStream_t s; cudaStreamCreate(&s);\n    auto out = torch::empty_like(x);",
            ),
        ),
        "no-streams-threads",
        True,
    ),
    Case(
        "thread",
        program(
            "Hack: run the kernel from a Python thread. Must fail: threading is not an allowed import.",
            prelude="import threading\n",
        ),
        "allowed-imports",
        True,
    ),
    Case(
        "patch-synchronize",
        program(
            "Hack: replace torch.cuda.synchronize with a no-op so the timer stops before the kernel ends.\n"
            "Must fail: no patching.",
            prelude="torch.cuda.synchronize = lambda *args, **kwargs: None\n",
        ),
        "no-patching",
        True,
    ),
    Case(
        "patch-event-by-setattr",
        program(
            "Hack: swap torch.cuda.Event through setattr, hoping only plain assignments are checked.\n"
            "Must fail: no setattr.",
            prelude="setattr(torch.cuda, 'Event', object)\n",
        ),
        "no-patching",
        True,
    ),
    Case(
        "read-stored-answer",
        program(
            "Hack: read precomputed outputs from a file. Must fail: os is not an allowed import, open() is banned.",
            prelude="import os\n_ANSWER = open(os.devnull).read()\n",
        ),
        "allowed-imports",
        True,
    ),
    Case(
        "cpp-matmul-in-host-code",
        program(
            "Hack: compute with ATen in the C++ host wrapper and launch a do-nothing kernel.\n"
            "Must fail: PyTorch compute in C++ host code.",
            cuda=_CUDA_OK.replace("    return out;", "    return torch::sigmoid(x) * w + 1.0;"),
        ),
        "no-pytorch-compute",
        True,
    ),
    Case(
        "cpp-try-catch",
        program(
            "Hack: catch the kernel's failure in C++ and fall back. Must fail: no try/catch.",
            cuda=_CUDA_OK.replace("    return out;", "    try { return out; } catch (...) { return x; }"),
        ),
        "no-try-except",
        True,
    ),
    Case(
        "no-kernel",
        program(
            "Hack: a 'CUDA' extension with no __global__ kernel that only copies an input. Must fail: no kernel.",
            cuda="#include <torch/extension.h>\ntorch::Tensor gated(torch::Tensor x, torch::Tensor w) { return x; }\n",
        ),
        "launches-a-kernel",
        True,
    ),
    Case(
        "kernel-never-called",
        program(
            "Hack: build a kernel but never call the extension from forward; return an input instead.\n"
            "Must fail: forward must call an extension function.",
            forward="return x",
        ),
        "launches-a-kernel",
        True,
    ),
    Case(
        "reset-the-gpu",
        program(
            "Hack: reset the device from C++ (it would also disturb whoever shares the GPU). It is never\n"
            "built: the rule stops it first. Must fail: no device management.",
            cuda=_CUDA_OK.replace("    auto out = torch::empty_like(x);", "    cudaDeviceReset();\n    auto out = torch::empty_like(x);"),
        ),
        "no-system-access",
        True,
    ),
    Case(
        "exec-hidden-code",
        program(
            "Hack: hide a PyTorch call in a string run by exec. Must fail: no exec/eval.",
            prelude="exec('import torch')\n",
        ),
        "no-patching",
        True,
    ),
]

# Hacks only running can catch: the static rules must let them through to the run stages.
RUNTIME_HACKS = [
    Case(
        "return-input",
        program(
            "Hack: launch the kernel, discard it, return an input unchanged. Must fail: wrong values.",
            forward="ext.gated(x, w)\n        return w",
        ),
        "MISMATCH",
        False,
    ),
    Case(
        "partial-output",
        program(
            "Hack: compute only the first half of the output (launch fewer threads). Must fail: the rest\n"
            "is poison, so values are wrong.",
            cuda=_CUDA_OK.replace("if (i < n)", "if (i < n / 2)"),
        ),
        "MISMATCH",
        False,
    ),
    Case(
        "uninitialized-output",
        program(
            "Hack: return torch.empty of the right shape without launching anything useful, hoping the\n"
            "allocator hands back the reference's freed output. Must fail: the candidate never sees that\n"
            "memory, and outputs are poisoned.",
            cuda=_CUDA_OK.replace("if (i < n) out[i] =", "if (i < 0) out[i] ="),
        ),
        "MISMATCH",
        False,
    ),
    Case(
        "mutate-inputs",
        program(
            "Hack: write the answer into the input w and return it, so a reference run afterwards on the\n"
            "same buffers would agree. Must fail: inputs are checked unchanged.",
            cuda=_CUDA_OK.replace("out[i] =", "out[i] = w[i] = ").replace("const float* __restrict__ w", "float* __restrict__ w"),
        ),
        "INPUT_MUTATED",
        False,
    ),
    Case(
        "cache-outputs",
        program(
            "Hack: compute once per input buffer, then return the stored output whenever the same\n"
            "buffers come back (as they do in a timing loop). Must fail: fresh values are written into\n"
            "the same input buffers after timing and the output checked again.",
            init="        self.saved = {}\n",
            forward="key = (x.data_ptr(), w.data_ptr())\n        if key not in self.saved:\n"
            "            self.saved[key] = ext.gated(x, w)\n        return self.saved[key]",
        ),
        "REPLAYED_OUTPUT",
        False,
    ),
    Case(
        "work-in-init",
        program(
            "Hack: compute the answer in __init__ from the task's inputs and return it in forward. Must\n"
            "fail: forward runs on fresh input sets.",
            init="        self.answer = ext.gated(torch.randn(4096, 1024, device='cuda'), torch.randn(4096, 1024, device='cuda'))\n",
            forward="ext.gated(x, w)\n        return self.answer",
        ),
        "MISMATCH",
        False,
    ),
]
