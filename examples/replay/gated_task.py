"""A KernelBench-format task: y = sigmoid(x) * w + 1 on two 4096 x 1024 float32 tensors."""
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
