import torch
import torch.nn as nn


class Model(nn.Module):
    """
    Simple model that performs L2 normalization of each row; its input is a transposed view.
    """
    def __init__(self):
        """
        Initializes the L2Norm layer.
        """
        super(Model, self).__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """
        Applies L2 normalization to the input tensor.

        Args:
            x (torch.Tensor): Input tensor of shape (batch_size, dim). It is not contiguous:
                              its strides are (1, batch_size).

        Returns:
            torch.Tensor: Output tensor with L2 normalization applied, same shape as input.
        """
        return x / torch.norm(x, p=2, dim=1, keepdim=True)


batch_size = 8192
dim = 16384


def get_inputs():
    # A column-major (transposed) view: shape (batch_size, dim), strides (1, batch_size).
    x = torch.randn(dim, batch_size).t()
    return [x]


def get_init_inputs():
    return []
