"""Behaviour cloning of generative chunk policies (diffusion or flow) on action chunks.

    diffusion:  L = E || eps_theta(sqrt(abar_t) a + sqrt(1 - abar_t) eps, t, o) - eps ||^2
    flow:       L = E || v_theta((1 - s) z + s a, s, o) - (a - z) ||^2   (+ one-step head distillation)

Batches are `sample_chunks(B, pred_horizon)`: the chunk starts obs_horizon-1 steps in the past
(Diffusion Policy's layout), its first obs_horizon observations are the conditioning. Chunks that
reach an episode end repeat the last action (the replay's padding), as Diffusion Policy pads them.
Normalisation statistics come from the dataset (`fit_normalization`, called by the runner) and are
saved with the policy: `agent.actor.save(dir)` gives a `policies.load`-able checkpoint.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

import policies
from embodied.agents.chunking import GenerativeChunkActing, obs_sequence
from embodied.agents.base import Agent
from embodied.agents.nets import to_torch
from embodied.errors import ConfigError


@dataclass
class GenerativeBCConfig:
    policy: str = "diffusion"                 # "diffusion" | "flow" (fixed by the registry name)
    obs_horizon: int = 2
    pred_horizon: int = 16
    execute_horizon: int = 8
    denoiser: str = "unet"                    # "mlp" | "unet" | "transformer"
    denoiser_kwargs: dict = field(default_factory=dict)
    policy_kwargs: dict = field(default_factory=dict)  # sampler, num_inference_steps, num_train_steps, num_steps...
    lr: float = 1e-4
    weight_decay: float = 1e-6
    grad_clip: float = 10.0
    distill_weight: float = 1.0               # flow only: train the one-step head alongside


class GenerativeBC(GenerativeChunkActing, Agent):
    def __init__(self, obs_dim: int, act_dim: int, cfg: GenerativeBCConfig = GenerativeBCConfig(), device: str = "cpu",
                 seed: int = 0):
        if cfg.policy not in ("diffusion", "flow"):
            raise ConfigError(f"policy={cfg.policy!r} must be diffusion or flow")
        super().__init__(obs_dim, act_dim, cfg, device, seed)
        torch.manual_seed(seed)  # network init
        self.actor = policies.make(cfg.policy, obs_dim=obs_dim, act_dim=act_dim, obs_horizon=cfg.obs_horizon,
                                   pred_horizon=cfg.pred_horizon, execute_horizon=cfg.execute_horizon,
                                   denoiser=cfg.denoiser, denoiser_kwargs=dict(cfg.denoiser_kwargs),
                                   **dict(cfg.policy_kwargs)).to(self.device)
        self.optimizer = torch.optim.AdamW(self.actor.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
        self.chunk_horizon, self.obs_horizon = cfg.pred_horizon, cfg.obs_horizon
        self.execute_horizon = self.actor.execute_horizon

    def fit_normalization(self, observations: np.ndarray, actions: np.ndarray) -> None:
        self.actor.fit_normalization(observations, actions)

    def update(self, batch) -> dict[str, float]:
        batch = to_torch(batch, self.device)
        obs_seq = obs_sequence(batch, self.cfg.obs_horizon)
        loss = self.actor.loss(obs_seq, batch["actions"])
        metrics = {"bc_loss": loss.detach()}
        if self.cfg.policy == "flow" and self.actor.onestep is not None and self.cfg.distill_weight > 0:
            distill = self.actor.distill_loss(obs_seq)
            loss = loss + self.cfg.distill_weight * distill
            metrics["distill_loss"] = distill.detach()
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        metrics["grad_norm"] = torch.nn.utils.clip_grad_norm_(self.actor.parameters(), self.cfg.grad_clip)
        self.optimizer.step()
        return {k: float(v) for k, v in metrics.items()}

    def _modules(self) -> dict:
        return {"actor": self.actor}

    def _optimizers(self) -> dict:
        return {"optimizer": self.optimizer}
