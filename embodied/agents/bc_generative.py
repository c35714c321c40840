"""Behaviour cloning of generative chunk policies (diffusion or flow) on action chunks.

    diffusion:  L = E || eps_theta(sqrt(abar_t) a + sqrt(1 - abar_t) eps, t, o) - eps ||^2
    flow:       L = E || v_theta((1 - s) z + s a, s, o) - (a - z) ||^2   (+ one-step head distillation)

Batches are `sample_chunks(B, pred_horizon)`: the chunk starts obs_horizon-1 steps in the past
(Diffusion Policy's layout), its first obs_horizon observations are the conditioning. Chunks that
reach an episode end repeat the last action (the replay's padding), as Diffusion Policy pads them.
Normalisation statistics come from the dataset (`fit_normalization`, called by the runner) and are
saved with the policy: `agent.actor.save(dir)` gives a `policies.load`-able checkpoint.

As in Diffusion Policy, `actor` is an exponential moving average of the trained weights (`model`):
it is what acts, is saved and is handed to fine-tuning. diffusers' `EMAModel` with Diffusion Policy's
schedule (decay 1 - (1 + step)^-0.75, capped at 0.9999, warm-up from 0); `ema=False` acts with `model`.
"""
from __future__ import annotations

import copy
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
    ema: bool = True                          # Diffusion Policy's use_ema: act with the averaged weights
    ema_power: float = 0.75                   # Diffusion Policy's EMA schedule (inv_gamma 1, min 0)
    ema_max_decay: float = 0.9999


class GenerativeBC(GenerativeChunkActing, Agent):
    def __init__(self, obs_dim: int, act_dim: int, cfg: GenerativeBCConfig = GenerativeBCConfig(), device: str = "cpu",
                 seed: int = 0):
        if cfg.policy not in ("diffusion", "flow"):
            raise ConfigError(f"policy={cfg.policy!r} must be diffusion or flow")
        super().__init__(obs_dim, act_dim, cfg, device, seed)
        torch.manual_seed(seed)  # network init
        if not 0.0 <= cfg.ema_max_decay < 1.0 or cfg.ema_power <= 0:
            raise ConfigError(f"algo ema_max_decay={cfg.ema_max_decay} must be in [0, 1) and ema_power="
                              f"{cfg.ema_power} > 0 (Diffusion Policy: 0.9999, 0.75)")
        self.model = policies.make(cfg.policy, obs_dim=obs_dim, act_dim=act_dim, obs_horizon=cfg.obs_horizon,
                                   pred_horizon=cfg.pred_horizon, execute_horizon=cfg.execute_horizon,
                                   denoiser=cfg.denoiser, denoiser_kwargs=dict(cfg.denoiser_kwargs),
                                   **dict(cfg.policy_kwargs)).to(self.device)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
        self.actor, self.ema = self.model, None
        if cfg.ema:
            from diffusers.training_utils import EMAModel

            self.actor = copy.deepcopy(self.model).requires_grad_(False)
            self.ema = EMAModel(self.model.parameters(), decay=cfg.ema_max_decay, min_decay=0.0, use_ema_warmup=True,
                                inv_gamma=1.0, power=cfg.ema_power, foreach=True)
            self.ema.shadow_params = list(self.actor.parameters())  # EMAModel.step averages into the actor in place
        self.chunk_horizon, self.obs_horizon = cfg.pred_horizon, cfg.obs_horizon
        self.execute_horizon = self.actor.execute_horizon

    def fit_normalization(self, observations: np.ndarray, actions: np.ndarray) -> None:
        self.model.fit_normalization(observations, actions)
        if self.actor is not self.model:  # the statistics are buffers, which the EMA does not average
            for averaged, trained in zip(self.actor.buffers(), self.model.buffers()):
                averaged.copy_(trained)

    def update(self, batch) -> dict[str, float]:
        batch = to_torch(batch, self.device)
        obs_seq = obs_sequence(batch, self.cfg.obs_horizon)
        loss = self.model.loss(obs_seq, batch["actions"])
        metrics = {"bc_loss": loss.detach()}
        if self.cfg.policy == "flow" and self.model.onestep is not None and self.cfg.distill_weight > 0:
            distill = self.model.distill_loss(obs_seq)
            loss = loss + self.cfg.distill_weight * distill
            metrics["distill_loss"] = distill.detach()
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        clip = self.cfg.grad_clip if self.cfg.grad_clip > 0 else float("inf")   # 0: measure the norm, no clip
        metrics["grad_norm"] = torch.nn.utils.clip_grad_norm_(self.model.parameters(), clip)
        self.optimizer.step()
        if self.ema is not None:
            self.ema.step(self.model.parameters())
            metrics["ema_decay"] = self.ema.cur_decay_value
        return {k: float(v) for k, v in metrics.items()}

    def _modules(self) -> dict:
        return {"actor": self.actor} if self.ema is None else {"actor": self.actor, "model": self.model}

    def state_dict(self) -> dict[str, torch.Tensor]:
        tensors = super().state_dict()
        if self.ema is not None:
            tensors["ema_step"] = torch.tensor(self.ema.optimization_step)
        return tensors

    def load_state_dict(self, tensors: dict[str, torch.Tensor]) -> None:
        if self.ema is not None and not any(k.startswith("model.") for k in tensors):
            # a checkpoint written with ema=False: the trained weights are the actor's
            tensors = {**tensors, **{"model." + k[6:]: v for k, v in tensors.items() if k.startswith("actor.")}}
        super().load_state_dict(tensors)
        if self.ema is not None:
            self.ema.shadow_params = list(self.actor.parameters())
            self.ema.optimization_step = int(tensors.get("ema_step", torch.tensor(0)))

    def _optimizers(self) -> dict:
        return {"optimizer": self.optimizer}
