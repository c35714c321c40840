"""What diffusion and flow policies share: normalisation stored with the weights, observation history,
and the act/sample plumbing of the policy contract.

Horizons follow Diffusion Policy: the network sees `obs_horizon` observations (t-To+1 .. t) and predicts
`pred_horizon` actions starting at t-To+1; `act` returns the rows from step t on (`pred_horizon - To + 1`
of them) and `execute_horizon` says how many of those a deploy loop should run open-loop. With
`obs_horizon=1` the chunk starts at t (Q-chunking).

Normalisation (fitted once from the dataset, saved as buffers in model.safetensors): observations to
zero mean, unit std; actions min-max to [-1, 1] per dimension, so a clipped sampler stays in the data's
range.
"""
from __future__ import annotations

from collections import deque

import numpy as np
import torch

from embodied.errors import ConfigError, UserError
from policies.base import Policy, state_of


class GenerativeChunkPolicy(Policy):
    def __init__(self, obs_dim: int, act_dim: int, obs_horizon: int = 1, pred_horizon: int = 1,
                 execute_horizon: int | None = None):
        super().__init__()
        self.obs_dim, self.act_dim = int(obs_dim), int(act_dim)
        self.obs_horizon, self.pred_horizon = int(obs_horizon), int(pred_horizon)
        if self.obs_horizon < 1 or self.pred_horizon < self.obs_horizon:
            raise ConfigError(f"horizons obs={obs_horizon}, pred={pred_horizon}: need 1 <= obs_horizon <= pred_horizon")
        self.future = self.pred_horizon - self.obs_horizon + 1  # rows returned by act()
        self.execute_horizon = self.future if execute_horizon is None else int(execute_horizon)
        if not 1 <= self.execute_horizon <= self.future:
            raise ConfigError(f"execute_horizon={execute_horizon} must be in [1, {self.future}] "
                              f"(pred_horizon - obs_horizon + 1)")
        self.register_buffer("obs_mean", torch.zeros(self.obs_dim))
        self.register_buffer("obs_std", torch.ones(self.obs_dim))
        self.register_buffer("act_low", -torch.ones(self.act_dim))
        self.register_buffer("act_high", torch.ones(self.act_dim))
        self._history: deque = deque(maxlen=self.obs_horizon)

    @property
    def cond_dim(self) -> int:
        return self.obs_horizon * self.obs_dim

    # -- normalisation ------------------------------------------------------------------------------
    @torch.no_grad()
    def fit_normalization(self, observations: np.ndarray, actions: np.ndarray) -> None:
        obs = torch.as_tensor(np.asarray(observations, np.float32)).reshape(-1, self.obs_dim)
        act = torch.as_tensor(np.asarray(actions, np.float32)).reshape(-1, self.act_dim)
        if len(obs) == 0 or len(act) == 0:
            raise UserError("fit_normalization got an empty dataset; pass the training observations and actions")
        std = obs.std(0)
        self.obs_mean.copy_(obs.mean(0))
        self.obs_std.copy_(torch.where(std < 1e-6, torch.ones_like(std), std))
        low, high = act.min(0).values, act.max(0).values
        flat = (high - low) < 1e-6
        self.act_low.copy_(torch.where(flat, low - 1.0, low))  # a constant dimension maps to 0
        self.act_high.copy_(torch.where(flat, low + 1.0, high))

    def normalize_obs(self, obs: torch.Tensor) -> torch.Tensor:
        return (obs - self.obs_mean) / self.obs_std

    def normalize_actions(self, actions: torch.Tensor) -> torch.Tensor:
        return 2.0 * (actions - self.act_low) / (self.act_high - self.act_low) - 1.0

    def unnormalize_actions(self, actions: torch.Tensor) -> torch.Tensor:
        return (actions + 1.0) * 0.5 * (self.act_high - self.act_low) + self.act_low

    def condition(self, obs_seq: torch.Tensor) -> torch.Tensor:
        """[B, To, obs] (or [B, obs] when To == 1) raw observations -> flat normalised conditioning [B, To*obs]."""
        if obs_seq.ndim == 2:
            obs_seq = obs_seq[:, None].expand(-1, self.obs_horizon, -1)
        return self.normalize_obs(obs_seq).flatten(1)

    # -- the generative part (subclasses) ----------------------------------------------------------
    def generate(self, cond: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """Normalised chunks [B, pred_horizon, A] for flat normalised conditioning [B, C]."""
        raise NotImplementedError

    def loss(self, obs_seq: torch.Tensor, actions: torch.Tensor, valid: torch.Tensor | None = None) -> torch.Tensor:
        raise NotImplementedError

    # -- the policy contract ---------------------------------------------------------------------------
    def reset(self) -> None:
        """Forget the observation history (call at every episode start when acting on single observations)."""
        self._history.clear()

    def _obs_batch(self, obs, remember: bool = True) -> tuple[torch.Tensor, bool]:
        """Single observation (history kept here), [B, obs] batch (history = the observation repeated),
        or explicit [B, To, obs] history."""
        state = state_of(obs, self.obs_dim)
        if state.ndim == 1:
            history = self._history if remember else deque(self._history, maxlen=self.obs_horizon)
            if not history:
                history.extend([state] * self.obs_horizon)  # pad the episode start, as Diffusion Policy does
            history.append(state)
            state = np.stack(history)[None]
            single = True
        else:
            single = False
            if state.shape[-1] != self.obs_dim or state.ndim not in (2, 3):
                raise UserError(f"observations of shape {state.shape}; pass [obs_dim={self.obs_dim}], [B, obs_dim] "
                                f"or [B, obs_horizon, obs_dim]")
        return torch.as_tensor(state, device=self.device), single

    def _generator(self, deterministic: bool, generator: torch.Generator | None = None) -> torch.Generator | None:
        if generator is not None or not deterministic:
            return generator
        gen = torch.Generator(device=self.device)
        gen.manual_seed(0)  # deterministic acting: the same noise every call, so act() is a function of obs
        return gen

    @torch.no_grad()
    def act(self, obs, deterministic: bool = True, generator: torch.Generator | None = None) -> np.ndarray:
        """[H, A] for one observation (H = pred_horizon - obs_horizon + 1), [B, H, A] for a batch.

        The noise: with `generator`, fresh draws from that stream (evaluation: Diffusion Policy samples
        fresh noise per chunk, and a seeded stream keeps evals paired); else a fixed draw when
        deterministic (act() is then a function of obs, for probes and tests), else the global RNG."""
        states, single = self._obs_batch(obs)
        chunk = self.act_tensor(states, self._generator(deterministic, generator))
        chunk = chunk.float().cpu().numpy()
        return chunk[0] if single else chunk

    def act_tensor(self, obs_seq: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """Raw observations -> unnormalised future rows [B, H, A] (differentiable when the sampler is)."""
        normalized = self.generate(self.condition(obs_seq), generator)
        return self.unnormalize_actions(normalized.clamp(-1.0, 1.0))[:, self.obs_horizon - 1:]

    @torch.no_grad()
    def sample(self, obs, n: int) -> np.ndarray:
        """n independent chunks [n, H, A] for one observation (best-of-N)."""
        states, single = self._obs_batch(obs, remember=False)
        if not single and states.shape[0] != 1:
            raise UserError("sample(obs, n) takes one observation; call it per observation")
        states = states.expand(n, *states.shape[1:])
        return self.act_tensor(states).float().cpu().numpy()
