"""A KernelBench-format task: relu(x + y) on two 4096 x 4096 float32 tensors."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x, y):
        return torch.relu(x + y)


def get_inputs():
    return [torch.randn(4096, 4096, device="cuda"), torch.randn(4096, 4096, device="cuda")]


def get_init_inputs():
    return []
