"""The host part of the built-in writer's GEMM programs (`gemm_kernel.gemm_cuda_source`): the
`gemm_epilogue` function that checks its operands, allocates the output (and the workspace) and
calls the device part's `kevin_gemm_run` on the current stream.

    HOST.format(scalar=..., stored=..., operands=CLASSIC_OPERANDS.format(...), pack=PACK_CALLS.format(...), ...)
"""

from __future__ import annotations

__all__ = ["CLASSIC_OPERANDS", "HOST", "PACK_CALLS"]

# a bias over N and a residual of the output's size, each where the epilogue reads it
CLASSIC_OPERANDS = """    const void* bias_ptr = nullptr;
    const void* residual_ptr = nullptr;
    if ({bias:d}) {{
        TORCH_CHECK(bias.numel() == n && bias.scalar_type() == {scalar}, "gemm_epilogue: a bias of N values");
        bias = bias.contiguous();
        bias_ptr = bias.data_ptr();
    }}
    if ({residual:d}) {{
        TORCH_CHECK(residual.numel() == batch * m * n && residual.scalar_type() == {scalar}, "gemm_epilogue: a residual the output's size");
        residual = residual.contiguous();
        residual_ptr = residual.data_ptr();
    }}
"""

# x and w packed into rows of K rounded up to 8 (`GemmSpec.pad_k`), w's (row, column) strides as N x K
PACK_CALLS = """    // rows of odd length: x and w copied into rows of K rounded up to 8, zeros after K (w as N x K)
    k_run = (k + 7) / 8 * 8;
    auto xp = torch::empty({{batch * m, k_run}}, xs.options()), wp = torch::empty({{batch * n, k_run}}, ws.options());
    int packed = kevin_gemm_pack(xs.data_ptr(), xp.data_ptr(), static_cast<int>(batch), m, k, k_run, m * k, k, 1, stream);
    if (packed == 0) packed = kevin_gemm_pack(ws.data_ptr(), wp.data_ptr(), static_cast<int>(batch), n, k, k_run, n * k, {w_strides}, stream);
    TORCH_CHECK(packed == 0, "gemm_epilogue: packing x and w: CUDA error ", packed);
    a_ptr = xp.data_ptr();
    b_ptr = wp.data_ptr();
"""

HOST = """
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>

torch::Tensor gemm_epilogue({params}) {{
    // w of 3 dimensions: a batch of products, x (any leading dimensions) holding as many
    const int64_t k = x.size(-1), n = {n}, batch = w.dim() == 3 ? w.size(0) : 1, m = x.numel() / k / batch;
    TORCH_CHECK(x.is_cuda() && w.is_cuda() && x.scalar_type() == {scalar} && w.scalar_type() == {scalar},
                "gemm_epilogue: x and w on the GPU, of the kernel's dtype");
    TORCH_CHECK((w.dim() == 2 || w.dim() == 3) && w.size({kdim}) == k && x.numel() == batch * m * k,
                "gemm_epilogue: w is {shape} (a batch of them: x holding as many products' rows)");
    TORCH_CHECK(k % {align} == 0 && n % {n_align} == 0, "gemm_epilogue: K a multiple of {align}, N of {n_align} (the kernel's aligned rows)");
    auto xs = x.contiguous(), ws = w.contiguous();
    auto out_sizes = x.sizes().vec();
    out_sizes.back() = {out_row};
    auto out = torch::empty(out_sizes, x.options().dtype({stored})){narrow};
{operands}    if (m == 0 || n == 0) return out;
    cudaStream_t stream = at::cuda::getCurrentCUDAStream().stream();
    const void* a_ptr = xs.data_ptr();
    const void* b_ptr = ws.data_ptr();
    int64_t k_run = k;
{pack}    auto workspace = torch::empty({{static_cast<int64_t>(kevin_gemm_workspace(m, n, k_run, batch))}}, x.options().dtype(torch::kUInt8));
    int status = kevin_gemm_run(static_cast<int>(m), static_cast<int>(n), static_cast<int>(k_run), static_cast<int>(batch), a_ptr, b_ptr,
                                bias_ptr, residual_ptr, out.data_ptr(), workspace.data_ptr(), stream);
    TORCH_CHECK(status == 0, "gemm_epilogue: CUTLASS status ", status);
    return out;
}}
"""
