"""Tanh-squashed Gaussian MLP: the actor of SAC, CQL/Cal-QL, IQL and BC."""
from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn

from policies.base import Policy, state_of
from policies.distributions import gaussian_log_prob_log_std, tanh_log_det
from policies.mlp import mlp
from policies.registry import register

LOG_STD_MIN, LOG_STD_MAX = -5.0, 2.0


@register("gaussian")
class TanhGaussianPolicy(Policy):
    def __init__(self, obs_dim: int, act_dim: int, hidden: tuple[int, ...] | list[int] = (256, 256),
                 layernorm: bool = False, state_dependent_std: bool = True,
                 log_std_range: tuple[float, float] | list[float] = (LOG_STD_MIN, LOG_STD_MAX)):
        super().__init__()
        self.obs_dim, self.act_dim = int(obs_dim), int(act_dim)
        self.hidden, self.layernorm = tuple(int(h) for h in hidden), bool(layernorm)
        self.state_dependent_std = bool(state_dependent_std)
        self.log_std_range = (float(log_std_range[0]), float(log_std_range[1]))
        out = 2 * act_dim if state_dependent_std else act_dim
        self.net = mlp(obs_dim, self.hidden, out, layernorm)
        if not state_dependent_std:  # IQL/BC style: one learned std per action dimension
            self.log_std = nn.Parameter(torch.zeros(act_dim))

    def config(self) -> dict:
        return dict(obs_dim=self.obs_dim, act_dim=self.act_dim, hidden=list(self.hidden),
                    layernorm=self.layernorm, state_dependent_std=self.state_dependent_std,
                    log_std_range=list(self.log_std_range))

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Pre-tanh mean and log-std."""
        out = self.net(obs)
        if self.state_dependent_std:
            mean, log_std = out.chunk(2, dim=-1)
        else:
            mean, log_std = out, self.log_std.expand_as(out)
        return mean, log_std.clamp(*self.log_std_range)

    def sample_with_log_prob(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Reparameterised tanh-Gaussian sample and its log-density (with the tanh Jacobian)."""
        mean, log_std = self(obs)
        noise = torch.randn_like(mean)
        pre_tanh = mean + log_std.exp() * noise
        # the Gaussian term from the noise itself: (pre_tanh - mean) / std is the noise, exactly
        log_prob = -0.5 * noise.square() - log_std - (0.5 * math.log(2 * math.pi)) - tanh_log_det(pre_tanh)
        return torch.tanh(pre_tanh), log_prob.sum(-1)

    def log_prob(self, obs: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        """Log-density of dataset actions (BC, IQL's weighted regression)."""
        mean, log_std = self(obs)
        action = action.clamp(-1 + 1e-5, 1 - 1e-5)
        pre_tanh = torch.atanh(action)
        return (gaussian_log_prob_log_std(pre_tanh, mean, log_std) - tanh_log_det(pre_tanh)).sum(-1)

    def mode(self, obs: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self(obs)[0])

    @torch.no_grad()
    def act(self, obs, deterministic: bool = True, generator: torch.Generator | None = None) -> np.ndarray:
        """The mean when deterministic (no noise, so `generator` is unused), else a tanh-Gaussian sample."""
        state = torch.as_tensor(state_of(obs, self.obs_dim), device=self.device)
        single = state.ndim == 1
        state = state.reshape(-1, self.obs_dim)
        action = self.mode(state) if deterministic else self.sample_with_log_prob(state)[0]
        action = action.float().cpu().numpy()
        return action[:, None, :][0] if single else action[:, None, :]  # [H=1, A] or [B, 1, A]

    @torch.no_grad()
    def sample(self, obs, n: int) -> np.ndarray:
        state = torch.as_tensor(state_of(obs, self.obs_dim), device=self.device).reshape(1, self.obs_dim)
        action, _ = self.sample_with_log_prob(state.expand(n, -1))
        return action.float().cpu().numpy()[:, None, :]
