"""Flow Q-learning (FQL, Park et al. 2025), over actions or over action chunks.

Networks: a flow-matching BC policy v(x, s | o), a one-step policy mu(z | o) (the flow policy's
one-step head) and a critic ensemble Q(o, a_{t:t+h}) with LayerNorm.

    critic   target = sum_{i<h} gamma^i r_{t+i} + gamma^{sum valid} (1 - terminal) Q'(o_end, a'),  a' = pi(o_end)
             (`valid` masks chunk steps past an episode end; h = 1 is plain one-step TD)
    actor    L = L_flow-BC(a_{t:t+h}) + alpha * || mu(z | o) - Euler_flow(z | o) ||^2 - Q(o, mu(z | o)) / mean|Q|
             (the Q term is normalised by its own magnitude, so alpha means the same across reward scales)

`extraction="distill"` acts with mu (FQL; QC-FQL when horizon > 1). `extraction="best_of_n"` drops the
one-step policy and acts with the argmax-Q of N flow samples (Q-chunking's "QC"): see qchunk.py.
FQL proper is horizon 1; `embodied.agents.make("fql")` fixes that.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass

import numpy as np
import torch
from torch.nn import functional as F

import policies
from embodied.agents.chunking import chunk_td_target
from embodied.agents.base import Agent
from embodied.agents.nets import CriticEnsemble, adam, soft_update, to_torch
from embodied.errors import ConfigError

EXTRACTIONS = ("distill", "best_of_n")


@dataclass
class FQLConfig:
    horizon: int = 1                          # actions per chunk (the critic's action input); FQL: 1
    extraction: str = "distill"               # "distill" (one-step policy) | "best_of_n"
    num_samples: int = 32                     # best-of-N candidates (acting and targets)
    alpha: float = 100.0                      # distillation weight (per domain in FQL: 3-300)
    hidden: tuple[int, ...] = (256, 256, 256)  # actor and critic MLPs (FQL: 4 x 512; CPU-sized here)
    num_critics: int = 2
    q_agg: str = "mean"                       # "mean" | "min" over critics, in targets and the actor loss
    critic_layernorm: bool = True
    flow_steps: int = 10
    lr: float = 3e-4
    gamma: float = 0.99
    tau: float = 0.005
    normalize_q_loss: bool = True


class FQL(Agent):
    def __init__(self, obs_dim: int, act_dim: int, cfg: FQLConfig = FQLConfig(), device: str = "cpu", seed: int = 0):
        if cfg.extraction not in EXTRACTIONS:
            raise ConfigError(f"algo extraction={cfg.extraction!r} is unknown; valid: {', '.join(EXTRACTIONS)}")
        if cfg.horizon < 1 or cfg.num_samples < 1 or cfg.q_agg not in ("mean", "min"):
            raise ConfigError("algo horizon and num_samples must be >= 1 and q_agg one of mean, min")
        super().__init__(obs_dim, act_dim, cfg, device, seed)
        torch.manual_seed(seed)  # network init
        self.chunk_horizon = self.execute_horizon = cfg.horizon
        self.obs_horizon = 1
        mlp = {"hidden": list(cfg.hidden)}
        self.actor = policies.make("flow", obs_dim=obs_dim, act_dim=act_dim, obs_horizon=1, pred_horizon=cfg.horizon,
                                   denoiser="mlp", denoiser_kwargs=mlp, onestep_head=cfg.extraction == "distill",
                                   onestep_kwargs=mlp, num_steps=cfg.flow_steps,
                                   sampler="onestep" if cfg.extraction == "distill" else "euler").to(self.device)
        self.critic = CriticEnsemble(obs_dim, cfg.horizon * act_dim, cfg.hidden, cfg.num_critics,
                                     cfg.critic_layernorm).to(self.device)
        self.target_critic = copy.deepcopy(self.critic).requires_grad_(False)
        self.actor_optimizer = adam(self.actor.parameters(), cfg.lr)
        self.critic_optimizer = adam(self.critic.parameters(), cfg.lr)

    def fit_normalization(self, observations: np.ndarray, actions: np.ndarray) -> None:
        self.actor.fit_normalization(observations, actions)

    # -- pieces ---------------------------------------------------------------------------------------
    def q(self, critic, obs: torch.Tensor, chunk: torch.Tensor) -> torch.Tensor:
        """Aggregated Q [B] of raw observations [B, obs] and raw chunks [B, h, A]."""
        values = critic(self.actor.normalize_obs(obs), chunk.flatten(1))
        return values.mean(0) if self.cfg.q_agg == "mean" else values.min(0).values

    def policy_chunks(self, obs: torch.Tensor, critic=None, generator: torch.Generator | None = None) -> torch.Tensor:
        """The extracted policy's chunks [B, h, A] for raw observations [B, obs] (no gradient)."""
        with torch.no_grad():
            if self.cfg.extraction == "distill":
                return self.actor.act_tensor(obs, generator)
            return self.best_of_n(obs, critic or self.critic, generator)

    def best_of_n(self, obs: torch.Tensor, critic, generator: torch.Generator | None = None) -> torch.Tensor:
        n, batch = self.cfg.num_samples, obs.shape[0]
        repeated = obs.repeat_interleave(n, 0)
        candidates = self.actor.act_tensor(repeated, generator)  # [B*n, h, A]
        scores = self.q(critic, repeated, candidates).view(batch, n)
        best = scores.argmax(1)
        return candidates.view(batch, n, *candidates.shape[1:])[torch.arange(batch, device=obs.device), best]

    # -- update ---------------------------------------------------------------------------------------
    def update(self, batch) -> dict[str, float]:
        batch = to_torch(batch, self.device)
        obs, actions = batch["observations"], batch["actions"]
        if actions.ndim == 2:  # a single-step batch from ReplayBuffer.sample
            actions = actions[:, None]
            batch = {**batch, "actions": actions, "rewards": batch["rewards"][:, None],
                     "terminals": batch["terminals"][:, None], "next_observations": batch["next_observations"][:, None],
                     "valid": torch.ones_like(batch["rewards"])[:, None]}
        if actions.shape[1] != self.cfg.horizon:
            raise ConfigError(f"batch chunks have {actions.shape[1]} actions but algo horizon={self.cfg.horizon}")
        metrics = self.update_critic(batch)
        metrics.update(self.update_actor(obs, actions, batch["valid"]))
        soft_update(self.target_critic, self.critic, self.cfg.tau)
        return {k: float(v) for k, v in metrics.items()}

    def update_critic(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        end_obs = batch["next_observations"][:, -1]
        with torch.no_grad():
            next_q = self.q(self.target_critic, end_obs, self.policy_chunks(end_obs, self.target_critic))
            target = chunk_td_target(batch["rewards"], batch["valid"], batch["terminals"], next_q, self.cfg.gamma)
        q = self.critic(self.actor.normalize_obs(batch["observations"]), batch["actions"].flatten(1))
        loss = ((q - target) ** 2).mean(1).sum()
        self.critic_optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.critic_optimizer.step()
        return {"critic_loss": loss.detach(), "q_mean": q.detach().mean(), "target_q_mean": target.mean()}

    def update_actor(self, obs: torch.Tensor, actions: torch.Tensor, valid: torch.Tensor) -> dict[str, torch.Tensor]:
        bc = self.actor.loss(obs, actions, valid)
        loss, metrics = bc, {"bc_flow_loss": bc.detach()}
        if self.cfg.extraction == "distill":
            cond = self.actor.condition(obs)
            z = torch.randn(obs.shape[0], self.cfg.horizon, self.act_dim, device=obs.device)
            with torch.no_grad():
                target = self.actor.euler(cond, z)
            onestep = self.actor.onestep_from(cond, z)
            distill = F.mse_loss(onestep, target)
            chunk = self.actor.unnormalize_actions(onestep.clamp(-1.0, 1.0))
            self.critic.requires_grad_(False)
            q = self.q(self.critic, obs, chunk)
            self.critic.requires_grad_(True)
            q_loss = -q.mean()
            if self.cfg.normalize_q_loss:
                q_loss = q_loss / q.abs().mean().detach().clamp(min=1e-6)
            loss = loss + self.cfg.alpha * distill + q_loss
            metrics.update(distill_loss=distill.detach(), q_loss=q_loss.detach(), actor_q=q.detach().mean())
        self.actor_optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.actor_optimizer.step()
        metrics["actor_loss"] = loss.detach()
        return metrics

    # -- acting ---------------------------------------------------------------------------------------
    @torch.no_grad()
    def act_chunk(self, obs_seq: np.ndarray, deterministic: bool = False,
                  generator: torch.Generator | None = None) -> np.ndarray:
        """[B, h, A] chunks for [B, 1, obs] (or [B, obs]) observations: the extracted policy. A given
        `generator` supplies fresh noise per call (evaluation, as FQL and QC evaluate)."""
        obs = torch.as_tensor(np.asarray(obs_seq, np.float32), device=self.device)
        obs = obs[:, -1] if obs.ndim == 3 else obs
        # fixed noise from a local generator: evaluation is a function of the observation, and no global
        # (CPU or CUDA) RNG stream is touched
        if generator is None and deterministic:
            generator = torch.Generator(device=self.device).manual_seed(0)
        return self.policy_chunks(obs, generator=generator).float().cpu().numpy()

    def act(self, obs, deterministic: bool = False) -> np.ndarray:
        state = np.asarray(obs["observation.state"] if isinstance(obs, dict) else obs, np.float32)
        single = state.ndim == 1
        chunk = self.act_chunk(state.reshape(-1, self.obs_dim), deterministic)[:, 0]
        return chunk[0] if single else chunk

    def q_chunk_values(self, obs: np.ndarray, chunks: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            return self.q(self.critic, torch.as_tensor(obs, device=self.device),
                          torch.as_tensor(chunks, device=self.device)).cpu().numpy()

    def _modules(self) -> dict:
        return {"actor": self.actor, "critic": self.critic, "target_critic": self.target_critic}

    def _optimizers(self) -> dict:
        return {"actor_optimizer": self.actor_optimizer, "critic_optimizer": self.critic_optimizer}
