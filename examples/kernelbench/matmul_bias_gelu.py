"""gelu(x @ W^T + b): nn.Linear(4096, 4096) then GELU on a 8192 x 4096 float32 batch."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self, dim_in, dim_out):
        super().__init__()
        self.linear = nn.Linear(dim_in, dim_out)

    def forward(self, x):
        return F.gelu(self.linear(x))


def get_inputs():
    return [torch.randn(8192, 4096, device="cuda")]


def get_init_inputs():
    return [4096, 4096]
