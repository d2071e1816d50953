import torch
import torch.nn as nn


class Model(nn.Module):
    """
    Multiplies two tensors elementwise and adds a learned bias broadcast over the rows.
    """
    def __init__(self, dim: int):
        super(Model, self).__init__()
        self.bias = nn.Parameter(torch.randn(dim))

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """
        Args:
            x (torch.Tensor): Input tensor of shape (batch_size, dim).
            y (torch.Tensor): Input tensor of shape (batch_size, dim).

        Returns:
            torch.Tensor: x * y + bias, of shape (batch_size, dim).
        """
        return x * y + self.bias


batch_size = 4096
dim = 16384


def get_inputs():
    x = torch.randn(batch_size, dim)
    y = torch.randn(batch_size, dim)
    return [x, y]


def get_init_inputs():
    return [dim]
