import torch
import torch.nn as nn


class Model(nn.Module):
    """
    The gating of a SwiGLU feed-forward block, in bfloat16: silu(gate) * up.
    """
    def __init__(self):
        super(Model, self).__init__()

    def forward(self, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        """
        Args:
            gate (torch.Tensor): Tensor of shape (num_tokens, intermediate_size), bfloat16.
            up (torch.Tensor): Tensor of shape (num_tokens, intermediate_size), bfloat16.

        Returns:
            torch.Tensor: silu(gate) * up, same shape and dtype.
        """
        return torch.nn.functional.silu(gate) * up


num_tokens = 8192
intermediate_size = 8192


def get_inputs():
    gate = torch.randn(num_tokens, intermediate_size, dtype=torch.bfloat16)
    up = torch.randn(num_tokens, intermediate_size, dtype=torch.bfloat16)
    return [gate, up]


def get_init_inputs():
    return []
