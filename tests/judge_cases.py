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
    expect: str  # a rule id, a Reason name (several: "A|B"), or "ACCEPTED"
    static_only: bool  # True when the static rules decide it (testable without a GPU)
    task: str = GATED_TASK


def task(forward: str, inputs: str) -> str:
    """A KernelBench task: Model.forward(*inputs) -> forward expression."""
    return (
        "import torch\nimport torch.nn as nn\n\n\nclass Model(nn.Module):\n    def __init__(self):\n"
        "        super().__init__()\n\n    def forward(self, *xs):\n"
        f"        return {forward}\n\n\ndef get_inputs():\n    return [{inputs}]\n\n\n"
        "def get_init_inputs():\n    return []\n"
    )


def standalone(doc: str, cuda: str, cpp: str, function: str, nargs: int) -> str:
    """A candidate whose forward calls one extension function on all its inputs."""
    args = ", ".join(f"x{i}" for i in range(nargs))
    return (
        f'"""{doc}"""\n'
        "import torch\nimport torch.nn as nn\nfrom torch.utils.cpp_extension import load_inline\n\n"
        f"cuda_source = r\'\'\'{cuda}\'\'\'\n\ncpp_source = \'{cpp}\'\n\n"
        f"ext = load_inline(name=\'{function}_ext\', cpp_sources=cpp_source, cuda_sources=cuda_source, functions=[\'{function}\'])\n\n\n"
        "class ModelNew(nn.Module):\n    def __init__(self):\n        super().__init__()\n\n"
        f"    def forward(self, {args}):\n        return ext.{function}({', '.join(f'x{i}.contiguous()' for i in range(nargs))})\n"
    )


_ROW_SUM = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>

__global__ void row_sum_kernel(const float* __restrict__ x, float* __restrict__ out, int cols) {
    const float* row = x + (int64_t)blockIdx.x * cols;
    float acc = 0.0f;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) acc += row[c];
    for (int offset = 16; offset > 0; offset /= 2) acc += __shfl_down_sync(0xffffffff, acc, offset);
    __shared__ float warp_sums[32];
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    if (lane == 0) warp_sums[warp] = acc;
    __syncthreads();
    if (warp == 0) {
        acc = lane < (blockDim.x + 31) / 32 ? warp_sums[lane] : 0.0f;
        for (int offset = 16; offset > 0; offset /= 2) acc += __shfl_down_sync(0xffffffff, acc, offset);
        if (lane == 0) out[blockIdx.x] = acc;
    }
}

torch::Tensor row_sum(torch::Tensor x) {
    int64_t rows = x.size(0), cols = x.size(1);
    auto out = torch::empty({rows}, x.options());
    row_sum_kernel<<<rows, 256, 0, at::cuda::getCurrentCUDAStream()>>>(x.data_ptr<float>(), out.data_ptr<float>(), (int)cols);
    return out;
}
"""

_SOFTMAX = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>

__device__ float block_reduce(float v, bool is_max) {
    __shared__ float scratch[32];
    for (int o = 16; o > 0; o /= 2) {
        float other = __shfl_down_sync(0xffffffff, v, o);
        v = is_max ? fmaxf(v, other) : v + other;
    }
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    int warps = (blockDim.x + 31) / 32;
    v = lane < warps ? scratch[lane] : (is_max ? -INFINITY : 0.0f);
    if (warp == 0) {
        for (int o = 16; o > 0; o /= 2) {
            float other = __shfl_down_sync(0xffffffff, v, o);
            v = is_max ? fmaxf(v, other) : v + other;
        }
        if (lane == 0) scratch[0] = v;
    }
    __syncthreads();
    float result = scratch[0];
    __syncthreads();
    return result;
}

__global__ void softmax_kernel(const float* __restrict__ x, float* __restrict__ out, int cols) {
    const float* row = x + (int64_t)blockIdx.x * cols;
    float* dst = out + (int64_t)blockIdx.x * cols;
    float m = -INFINITY;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) m = fmaxf(m, row[c]);
    m = block_reduce(m, true);
    float s = 0.0f;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) s += expf(row[c] - m);
    s = block_reduce(s, false);
    for (int c = threadIdx.x; c < cols; c += blockDim.x) dst[c] = expf(row[c] - m) / s;
}

torch::Tensor softmax_rows(torch::Tensor x) {
    auto out = torch::empty_like(x);
    softmax_kernel<<<x.size(0), 256, 0, at::cuda::getCurrentCUDAStream()>>>(x.data_ptr<float>(), out.data_ptr<float>(), (int)x.size(1));
    return out;
}
"""

_MATMUL = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#define TILE 16

__global__ void matmul_kernel(const float* __restrict__ a, const float* __restrict__ b, float* __restrict__ c, int M, int N, int K) {
    __shared__ float as[TILE][TILE], bs[TILE][TILE];
    int row = blockIdx.y * TILE + threadIdx.y, col = blockIdx.x * TILE + threadIdx.x;
    float acc = 0.0f;
    for (int t = 0; t < K; t += TILE) {
        as[threadIdx.y][threadIdx.x] = (row < M && t + threadIdx.x < K) ? a[(int64_t)row * K + t + threadIdx.x] : 0.0f;
        bs[threadIdx.y][threadIdx.x] = (col < N && t + threadIdx.y < K) ? b[(int64_t)(t + threadIdx.y) * N + col] : 0.0f;
        __syncthreads();
        for (int k = 0; k < TILE; ++k) acc += as[threadIdx.y][k] * bs[k][threadIdx.x];
        __syncthreads();
    }
    if (row < M && col < N) c[(int64_t)row * N + col] = acc;
}

torch::Tensor matmul_tiled(torch::Tensor a, torch::Tensor b) {
    int M = a.size(0), K = a.size(1), N = b.size(1);
    auto c = torch::empty({M, N}, a.options());
    dim3 block(TILE, TILE), grid((N + TILE - 1) / TILE, (M + TILE - 1) / TILE);
    matmul_kernel<<<grid, block, 0, at::cuda::getCurrentCUDAStream()>>>(a.data_ptr<float>(), b.data_ptr<float>(), c.data_ptr<float>(), M, N, K);
    return c;
}
"""

_HALF = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <TYPE_HEADER>

__global__ void gated_lowp_kernel(const SCALAR* __restrict__ x, const SCALAR* __restrict__ w, SCALAR* __restrict__ out, int64_t n) {
    int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i < n) {
        float xv = TO_FLOAT(x[i]), wv = TO_FLOAT(w[i]);
        out[i] = FROM_FLOAT(1.0f / (1.0f + expf(-xv)) * wv + 1.0f);
    }
}

torch::Tensor gated_lowp(torch::Tensor x, torch::Tensor w) {
    auto out = torch::empty_like(x);
    int64_t n = x.numel();
    gated_lowp_kernel<<<(n + 255) / 256, 256, 0, at::cuda::getCurrentCUDAStream()>>>(
        reinterpret_cast<const SCALAR*>(x.data_ptr<AT_TYPE>()), reinterpret_cast<const SCALAR*>(w.data_ptr<AT_TYPE>()),
        reinterpret_cast<SCALAR*>(out.data_ptr<AT_TYPE>()), n);
    return out;
}
"""


def _lowp(kind: str) -> str:
    if kind == "fp16":
        names = {"TYPE_HEADER": "cuda_fp16.h", "SCALAR": "__half", "TO_FLOAT": "__half2float", "FROM_FLOAT": "__float2half", "AT_TYPE": "at::Half"}
    else:
        names = {"TYPE_HEADER": "cuda_bf16.h", "SCALAR": "__nv_bfloat16", "TO_FLOAT": "__bfloat162float", "FROM_FLOAT": "__float2bfloat16", "AT_TYPE": "at::BFloat16"}
    code = _HALF
    for k, v in names.items():
        code = code.replace(k, v)
    return code


_SIG = "torch::Tensor {}({});"


HONEST = [
    Case("gated-elementwise", program("Honest: one fused elementwise kernel on the current stream."), "ACCEPTED", False),
    Case(
        "row-sum-reduction",
        standalone("Honest: a row sum, warp shuffles then shared memory.", _ROW_SUM,
                   _SIG.format("row_sum", "torch::Tensor x"), "row_sum", 1),
        "ACCEPTED", False,
        task("torch.sum(xs[0], dim=-1)", 'torch.randn(4096, 1024, device="cuda")'),
    ),
    Case(
        "softmax",
        standalone("Honest: a row softmax, max and sum by block reductions.", _SOFTMAX,
                   _SIG.format("softmax_rows", "torch::Tensor x"), "softmax_rows", 1),
        "ACCEPTED", False,
        task("torch.softmax(xs[0], dim=-1)", 'torch.randn(4096, 1024, device="cuda")'),
    ),
    Case(
        "matmul-tile",
        standalone("Honest: a 16x16 shared-memory tiled matrix product.", _MATMUL,
                   _SIG.format("matmul_tiled", "torch::Tensor a, torch::Tensor b"), "matmul_tiled", 2),
        "ACCEPTED", False,
        task("xs[0] @ xs[1]", 'torch.randn(512, 256, device="cuda"), torch.randn(256, 384, device="cuda")'),
    ),
    Case(
        "gated-fp16",
        standalone("Honest: the gated kernel in float16, computing in float32.", _lowp("fp16"),
                   _SIG.format("gated_lowp", "torch::Tensor x, torch::Tensor w"), "gated_lowp", 2),
        "ACCEPTED", False,
        task("torch.sigmoid(xs[0]) * xs[1] + 1.0",
             'torch.randn(4096, 1024, device="cuda", dtype=torch.float16), torch.randn(4096, 1024, device="cuda", dtype=torch.float16)'),
    ),
    Case(
        "gated-bf16",
        standalone("Honest: the gated kernel in bfloat16, computing in float32.", _lowp("bf16"),
                   _SIG.format("gated_lowp", "torch::Tensor x, torch::Tensor w"), "gated_lowp", 2),
        "ACCEPTED", False,
        task("torch.sigmoid(xs[0]) * xs[1] + 1.0",
             'torch.randn(4096, 1024, device="cuda", dtype=torch.bfloat16), torch.randn(4096, 1024, device="cuda", dtype=torch.bfloat16)'),
    ),
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
        "no-dynamic-code",
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
            "Hack: compute only the first half of the output (launch fewer threads). Must fail: the\n"
            "judge poisons free memory with NaN, so the unwritten half is NaN where the reference has none.",
            cuda=_CUDA_OK.replace("if (i < n)", "if (i < n / 2)"),
        ),
        "NAN_INF",
        False,
    ),
    Case(
        "uninitialized-output",
        program(
            "Hack: return torch.empty of the right shape without launching anything useful, hoping the\n"
            "allocator hands back the reference's freed output. Must fail: the candidate never sees that\n"
            "memory (it runs first), and free memory is poisoned with NaN.",
            cuda=_CUDA_OK.replace("if (i < n) out[i] =", "if (i < 0) out[i] ="),
        ),
        "NAN_INF",
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
            "the same input buffers after timing and the output checked again; an earlier input set\n"
            "whose buffers land where an older one's were already returns a stale output (MISMATCH).",
            init="        self.saved = {}\n",
            forward="key = (x.data_ptr(), w.data_ptr())\n        if key not in self.saved:\n"
            "            self.saved[key] = ext.gated(x, w)\n        return self.saved[key]",
        ),
        "REPLAYED_OUTPUT|MISMATCH",
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
