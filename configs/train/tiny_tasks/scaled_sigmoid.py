"""A KernelBench-format task: sigmoid(x) * scale on a 2048 x 8192 float32 tensor."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, scale):
        super().__init__()
        self.scale = scale

    def forward(self, x):
        return torch.sigmoid(x) * self.scale


def get_inputs():
    return [torch.randn(2048, 8192, device="cuda")]


def get_init_inputs():
    return [2.5]
