import torch
import torch.nn as nn


class Model(nn.Module):
    """
    Adds a broadcast row to a matrix and applies ReLU.
    """
    def __init__(self):
        super(Model, self).__init__()

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """
        Args:
            x (torch.Tensor): Input tensor of shape (batch_size, dim).
            y (torch.Tensor): Tensor of shape (batch_size, dim) that is one row broadcast over
                              the batch: its strides are (0, 1).

        Returns:
            torch.Tensor: relu(x + y), of shape (batch_size, dim).
        """
        return torch.relu(x + y)


batch_size = 4096
dim = 16384


def get_inputs():
    x = torch.randn(batch_size, dim)
    # A stride-0 broadcast: one row of memory seen as batch_size rows.
    y = torch.randn(dim).expand(batch_size, dim)
    return [x, y]


def get_init_inputs():
    return []
