import torch
import torch.nn as nn


class Model(nn.Module):
    """
    Simple model that performs RMS Normalization over the last dimension (LLaMA style).
    """
    def __init__(self, hidden_size: int, eps: float = 1e-6):
        """
        Args:
            hidden_size (int): Size of the normalized (last) dimension.
            eps (float): Added to the mean square for numerical stability.
        """
        super(Model, self).__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """
        Args:
            x (torch.Tensor): Input tensor of shape (batch_size, seq_len, hidden_size).

        Returns:
            torch.Tensor: Output tensor with RMS Normalization applied, same shape as input.
        """
        variance = x.pow(2).mean(-1, keepdim=True)
        x = x * torch.rsqrt(variance + self.eps)
        return self.weight * x


batch_size = 16
seq_len = 2048
hidden_size = 4096


def get_inputs():
    x = torch.randn(batch_size, seq_len, hidden_size)
    return [x]


def get_init_inputs():
    return [hidden_size]
