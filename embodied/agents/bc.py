"""Behaviour cloning: maximum likelihood of dataset actions under a TanhGaussianPolicy.

    L = -E[ log pi(a | s) ]

The actor is the same class SAC uses, so `SAC.from_agent(bc, cfg, reinit_critic=True)` starts SAC
from the cloned policy (BC has no critic or temperature: SAC builds fresh ones).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from embodied.agents.base import Agent
from embodied.agents.nets import adam, to_torch
from policies.gaussian import TanhGaussianPolicy


@dataclass
class BCConfig:
    hidden: tuple[int, ...] = (256, 256)
    lr: float = 3e-4
    state_dependent_std: bool = True   # like SAC's actor, so the policy can be fine-tuned by SAC as is


class BC(Agent):
    def __init__(self, obs_dim: int, act_dim: int, cfg: BCConfig = BCConfig(), device: str = "cpu", seed: int = 0):
        super().__init__(obs_dim, act_dim, cfg, device, seed)
        self.actor = TanhGaussianPolicy(obs_dim, act_dim, cfg.hidden, state_dependent_std=cfg.state_dependent_std)
        self.actor.to(self.device)
        self.actor_optimizer = adam(self.actor.parameters(), cfg.lr)

    def update(self, batch) -> dict[str, float]:
        batch = to_torch(batch, self.device)
        obs, actions = batch["observations"], batch["actions"]
        loss = -self.actor.log_prob(obs, actions).mean()
        self.actor_optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.actor_optimizer.step()
        with torch.no_grad():
            mse = ((self.actor.mode(obs) - actions) ** 2).mean()
        return {"bc_loss": float(loss.detach()), "mode_mse": float(mse)}

    def act(self, obs, deterministic: bool = False) -> np.ndarray:
        return self.actor.act(obs, deterministic)[..., 0, :]

    def _modules(self) -> dict:
        return {"actor": self.actor}

    def _optimizers(self) -> dict:
        return {"actor_optimizer": self.actor_optimizer}
