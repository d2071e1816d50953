"""A KernelBench-format task: the sum of each row of a 8192 x 1024 float32 tensor."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return x.sum(dim=1)


def get_inputs():
    return [torch.randn(8192, 1024, device="cuda")]


def get_init_inputs():
    return []
