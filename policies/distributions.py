"""Log-densities shared by the policies and the losses that train them (SAC/CQL/BC actors, DPPO)."""
from __future__ import annotations

import math

import torch
from torch.nn import functional as F

def gaussian_log_prob(x: torch.Tensor, mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    """Elementwise log N(x; mean, std^2)."""
    return -0.5 * ((x - mean) / std) ** 2 - std.log() - 0.5 * math.log(2 * math.pi)


def gaussian_log_prob_log_std(x: torch.Tensor, mean: torch.Tensor, log_std: torch.Tensor) -> torch.Tensor:
    """Elementwise log N(x; mean, exp(log_std)^2), from the log-std (no log of the std taken)."""
    return -0.5 * ((x - mean) / log_std.exp()) ** 2 - log_std - 0.5 * math.log(2 * math.pi)


def tanh_log_det(pre_tanh: torch.Tensor) -> torch.Tensor:
    """log(1 - tanh(u)^2), the log-Jacobian of the tanh squash, written stably."""
    return 2.0 * (math.log(2.0) - pre_tanh - F.softplus(-2.0 * pre_tanh))
