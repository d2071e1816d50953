"""SGEMM with 64 x 64 block tiles, BK = 16, and a 4 x 4 register tile per thread (256 threads).

Expect: ACCEPTED

The "optimised" second attempt: A's tile is stored transposed in shared memory (As[k][m]) so each
thread reads 4 A values and 4 B values per k and does 16 FMAs into a float acc[4][4]; loads are
bounds-checked with zero fill, stores checked against M and N. `template <int BM, int BN, int BK,
int TM, int TN>` kernel launched on the current stream with a device guard. Accumulation stays
in float32, sequential along K per output.
"""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

template <int BM, int BN, int BK, int TM, int TN>
__global__ void __launch_bounds__(256)
sgemm_register_tiled(const float* __restrict__ A, const float* __restrict__ B, float* __restrict__ C,
                     int M, int N, int K) {
    constexpr int THREADS = (BM / TM) * (BN / TN);
    static_assert(THREADS == 256, "launch bounds assume 256 threads");
    __shared__ float As[BK][BM];
    __shared__ float Bs[BK][BN];

    const int tid = threadIdx.x;
    const int tx = tid % (BN / TN);   // which group of TN columns
    const int ty = tid / (BN / TN);   // which group of TM rows
    const int row0 = blockIdx.y * BM;
    const int col0 = blockIdx.x * BN;

    float acc[TM][TN];
    #pragma unroll
    for (int i = 0; i < TM; ++i)
        #pragma unroll
        for (int j = 0; j < TN; ++j) acc[i][j] = 0.0f;

    for (int k0 = 0; k0 < K; k0 += BK) {
        for (int l = tid; l < BM * BK; l += THREADS) {
            const int m = l / BK;
            const int k = l % BK;
            const int gr = row0 + m;
            const int gk = k0 + k;
            As[k][m] = (gr < M && gk < K) ? A[(size_t)gr * K + gk] : 0.0f;
        }
        for (int l = tid; l < BK * BN; l += THREADS) {
            const int k = l / BN;
            const int n = l % BN;
            const int gk = k0 + k;
            const int gc = col0 + n;
            Bs[k][n] = (gk < K && gc < N) ? B[(size_t)gk * N + gc] : 0.0f;
        }
        __syncthreads();

        #pragma unroll
        for (int k = 0; k < BK; ++k) {
            float a[TM], b[TN];
            #pragma unroll
            for (int i = 0; i < TM; ++i) a[i] = As[k][ty * TM + i];
            #pragma unroll
            for (int j = 0; j < TN; ++j) b[j] = Bs[k][tx * TN + j];
            #pragma unroll
            for (int i = 0; i < TM; ++i)
                #pragma unroll
                for (int j = 0; j < TN; ++j) acc[i][j] += a[i] * b[j];
        }
        __syncthreads();
    }

    #pragma unroll
    for (int i = 0; i < TM; ++i) {
        const int r = row0 + ty * TM + i;
        #pragma unroll
        for (int j = 0; j < TN; ++j) {
            const int c = col0 + tx * TN + j;
            if (r < M && c < N) C[(size_t)r * N + c] = acc[i][j];
        }
    }
}

torch::Tensor sgemm(torch::Tensor A, torch::Tensor B) {
    TORCH_CHECK(A.is_cuda() && B.is_cuda(), "inputs must be CUDA tensors");
    TORCH_CHECK(A.scalar_type() == torch::kFloat32 && B.scalar_type() == torch::kFloat32, "float32 only");
    TORCH_CHECK(A.size(1) == B.size(0), "inner dimensions differ");
    const at::cuda::CUDAGuard device_guard(A.device());
    auto a = A.contiguous();
    auto b = B.contiguous();
    const int M = a.size(0), K = a.size(1), N = b.size(1);
    auto C = torch::empty({M, N}, a.options());

    constexpr int BM = 64, BN = 64, BK = 16, TM = 4, TN = 4;
    dim3 block((BM / TM) * (BN / TN));
    dim3 grid((N + BN - 1) / BN, (M + BM - 1) / BM);
    sgemm_register_tiled<BM, BN, BK, TM, TN><<<grid, block, 0, at::cuda::getCurrentCUDAStream()>>>(
        a.data_ptr<float>(), b.data_ptr<float>(), C.data_ptr<float>(), M, N, K);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return C;
}
"""

cpp_source = "torch::Tensor sgemm(torch::Tensor A, torch::Tensor B);"

sgemm_ext = load_inline(
    name="kb_matmul_register_blocked",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["sgemm"],
    extra_cuda_cflags=["-O3"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, A, B):
        return sgemm_ext.sgemm(A, B)
