"""nn.LayerNorm(4096) on a 16384 x 4096 bfloat16 tensor (weight and bias in bfloat16)."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.norm = nn.LayerNorm(dim, dtype=torch.bfloat16)
        with torch.no_grad():  # not the identity: weight and bias away from 1 and 0
            self.norm.weight.uniform_(0.5, 1.5)
            self.norm.bias.uniform_(-0.5, 0.5)

    def forward(self, x):
        return self.norm(x)


def get_inputs():
    return [torch.randn(16384, 4096, device="cuda", dtype=torch.bfloat16)]


def get_init_inputs():
    return [4096]
