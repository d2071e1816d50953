"""SwiGLU's gate: silu(gate) * up on two 8192 x 8192 float16 tensors."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, gate, up):
        return F.silu(gate) * up


def get_inputs():
    return [torch.randn(8192, 8192, device="cuda", dtype=torch.float16),
            torch.randn(8192, 8192, device="cuda", dtype=torch.float16)]


def get_init_inputs():
    return []
