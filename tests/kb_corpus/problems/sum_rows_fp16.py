import torch
import torch.nn as nn


class Model(nn.Module):
    """
    Simple model that performs sum reduction over a specified dimension, in half precision.
    """
    def __init__(self, dim: int):
        """
        Args:
            dim (int): Dimension to reduce over.
        """
        super(Model, self).__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """
        Args:
            x (torch.Tensor): Input tensor of shape (batch_size, dim), float16.

        Returns:
            torch.Tensor: Output tensor of shape (batch_size,), float16.
        """
        return torch.sum(x, dim=self.dim)


batch_size = 8192
dim = 16384
reduce_dim = 1


def get_inputs():
    x = torch.randn(batch_size, dim, dtype=torch.float16)
    return [x]


def get_init_inputs():
    return [reduce_dim]
