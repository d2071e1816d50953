"""A residual add then RMSNorm, as in Llama blocks: h = x + r; h * rsqrt(mean(h^2) + eps) * w,
on 16384 x 4096 bfloat16 tensors (statistics in float32); returns the norm and h."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.rand(dim, dtype=torch.bfloat16) + 0.5)
        self.eps = eps

    def forward(self, x, residual):
        h = x + residual
        hf = h.float()
        normed = hf * torch.rsqrt(hf.pow(2).mean(dim=-1, keepdim=True) + self.eps)
        return normed.to(torch.bfloat16) * self.weight, h


def get_inputs():
    return [torch.randn(16384, 4096, device="cuda", dtype=torch.bfloat16),
            torch.randn(16384, 4096, device="cuda", dtype=torch.bfloat16)]


def get_init_inputs():
    return [4096, 1e-6]
