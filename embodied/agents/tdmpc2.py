"""TD-MPC2 (Hansen, Su & Wang 2024): a decoder-free latent world model trained on H-step sequences,
acting by MPPI planning in its latent space with a learned policy prior and value.

The networks and the planner are `policies.tdmpc2.TDMPC2Policy`, the agent's `actor` (deployable as is:
`actor.act` plans). An update takes a chunk batch (`chunk_horizon` = H): s_0, a_t, r_t, s_{t+1}, done_t,
valid_t for t < H, and does one model step and one policy step:

    z_0 = h(s_0),  z_{t+1} = d(z_t, a_t)                  latent rollout from the first state only
    zbar_t = h(s_{t+1})                                     the encoder's own targets (no gradient)
    q_t = r_t + gamma (1 - done_t) min_{two random i} Qbar_i(zbar_t, a'),  a' ~ pi(zbar_t)

    L_model = 1/H sum_t rho^t [ c_cons mean_k (z_{t+1} - zbar_t)_k^2
                                + c_rew CE(R(z_t, a_t), r_t)
                                + c_val 1/N sum_i CE(Q_i(z_t, a_t), q_t) ]
              + c_term 1/H sum_t BCE(p_end(z_{t+1}), done_t)            (episodic only)

CE is the cross-entropy against the two-hot encoding of symlog(target) over `num_bins` bins in
[vmin, vmax]. The policy prior then learns on the rollout's latents (detached) against the mean of two
random Q heads (their weights frozen):

    L_pi = 1/(H+1) sum_{t=0..H} rho^t mean_b [ c_ent A log pi(a_t|z_t) - Q(z_t, a_t) / S ],  a_t ~ pi(z_t)

S is a Polyak (tau) average of max(1, p95 - p5) of Q at t = 0 over the batch, so the entropy bonus
weighs the same at any reward scale. Then Qbar <- (1 - tau) Qbar + tau Q. Steps past an episode end
(valid 0) are masked out of every term (sums over the batch divided by B, as unmasked means are).
Both steps clip gradients at norm `grad_clip`; the encoder learns at lr * enc_lr_scale.

Defaults are the official single-task ones (nicklashansen/tdmpc2 `config.yaml`, model_size=5). Not taken:
the discount heuristic from the episode length (the run's `env.gamma` is used) and the burst of
seed-step updates when learning starts (the runner takes `utd` updates per env step from the start).
A transition batch (no `valid`) is read as a chunk of H = 1.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from embodied.agents.base import Agent
from embodied.agents.nets import soft_update, to_torch
from embodied.errors import ConfigError
from policies.tdmpc2 import TDMPC2Policy, check_settings, soft_ce, two_hot_inv


@dataclass
class TDMPC2Config:
    # architecture (official model_size=5: 5M parameters)
    latent_dim: int = 512
    enc_dim: int = 256
    num_enc_layers: int = 2
    mlp_dim: int = 512
    num_q: int = 5
    dropout: float = 0.01            # on the first layer of each Q head
    simnorm_dim: int = 8
    num_bins: int = 101
    vmin: float = -10.0              # bin range, in symlog space
    vmax: float = 10.0
    log_std_min: float = -10.0
    log_std_max: float = 2.0
    episodic: bool = False           # a termination head; needed on tasks that terminate (official default off)
    obs_type: str = "state"          # "rgb": flattened CHW 64x64 frames through the conv encoder
    image_shape: tuple[int, ...] = (3, 64, 64)
    num_channels: int = 32
    # training
    horizon: int = 3
    rho: float = 0.5
    lr: float = 3e-4
    enc_lr_scale: float = 0.3
    grad_clip: float = 20.0
    tau: float = 0.01
    gamma: float = 0.99              # the run's env.gamma (official: from the episode length, 0.95..0.995)
    consistency_coef: float = 20.0
    reward_coef: float = 0.1
    value_coef: float = 0.1
    termination_coef: float = 1.0
    entropy_coef: float = 1e-4
    # planning (num_elites and num_pi_trajs are capped at num_samples and num_samples - 1)
    mpc: bool = True                 # False: act with the policy prior alone
    iterations: int = 6
    num_samples: int = 512
    num_elites: int = 64
    num_pi_trajs: int = 24
    min_std: float = 0.05
    max_std: float = 2.0
    temperature: float = 0.5
    plan_seed: int = 0               # planning noise of deterministic acting

    def __post_init__(self):
        if self.horizon < 1 or not 0 < self.rho <= 1:
            raise ConfigError(f"horizon={self.horizon} must be >= 1 and rho={self.rho} in (0, 1]")
        if not 0 < self.enc_lr_scale or self.grad_clip <= 0:
            raise ConfigError(f"enc_lr_scale={self.enc_lr_scale} and grad_clip={self.grad_clip} must be > 0")
        check_settings({k: getattr(self, k) for k in POLICY_KEYS})


# the policy's constructor arguments that come straight from the config (the rest: obs/act dims, plan_horizon)
POLICY_KEYS = ("latent_dim", "enc_dim", "num_enc_layers", "mlp_dim", "num_q", "dropout", "simnorm_dim", "num_bins",
               "vmin", "vmax", "log_std_min", "log_std_max", "episodic", "obs_type", "image_shape", "num_channels",
               "mpc", "iterations", "num_samples", "num_elites", "num_pi_trajs", "min_std", "max_std", "temperature",
               "gamma", "plan_seed")


class RunningScale(nn.Module):
    """Polyak average of the 5-95 percentile range of Q (at least 1): the policy loss's Q normaliser."""

    def __init__(self):
        super().__init__()
        self.register_buffer("value", torch.ones(()))

    @torch.no_grad()
    def update(self, q: torch.Tensor, tau: float) -> None:
        low, high = torch.quantile(q.detach().float().flatten(), torch.tensor([0.05, 0.95], device=q.device))
        self.value.lerp_((high - low).clamp(min=1.0), tau)


def _adam(groups, lr: float, eps: float = 1e-8) -> torch.optim.Adam:
    try:
        return torch.optim.Adam(groups, lr=lr, eps=eps, fused=True)
    except (RuntimeError, TypeError):
        return torch.optim.Adam(groups, lr=lr, eps=eps, foreach=True)


def _masked_mean(loss: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """[B, T] losses -> [T]: sum over the batch of weight * loss, divided by B."""
    return (loss * weight).sum(0) / loss.shape[0]


class TDMPC2(Agent):
    def __init__(self, obs_dim: int, act_dim: int, cfg: TDMPC2Config = TDMPC2Config(), device: str = "cpu",
                 seed: int = 0):
        super().__init__(obs_dim, act_dim, cfg, device, seed)
        self.chunk_horizon = cfg.horizon  # the runner then samples H-step chunks (valid-masked)
        settings = {k: getattr(cfg, k) for k in POLICY_KEYS}
        self.actor = TDMPC2Policy(obs_dim, act_dim, plan_horizon=cfg.horizon, **settings).to(self.device).eval()
        self.target_q = copy.deepcopy(self.actor.q).requires_grad_(False).eval()
        self.scale = RunningScale().to(self.device)
        self.critic = self.actor.q  # the runner's calibration diagnostic looks for a critic (and q_values)
        model = self.actor
        self.model_optimizer = _adam([
            {"params": list(model.encoder.parameters()), "lr": cfg.lr * cfg.enc_lr_scale},
            {"params": [*model.dynamics.parameters(), *model.reward.parameters(), *model.q.parameters(),
                        *(model.termination.parameters() if model.termination is not None else [])]},
        ], cfg.lr)
        self.pi_optimizer = _adam(model.pi_net.parameters(), cfg.lr, eps=1e-5)

    # -- learning ----------------------------------------------------------------------------------
    def _as_chunks(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """A transition batch is a chunk of one step."""
        if batch["actions"].ndim == 3:
            return batch
        out = {k: batch[k].unsqueeze(1) for k in ("actions", "rewards", "next_observations", "terminals")}
        out["observations"] = batch["observations"]
        out["valid"] = torch.ones_like(out["rewards"])
        return out

    def update(self, batch) -> dict[str, float]:
        cfg, model = self.cfg, self.actor
        batch = self._as_chunks(to_torch(batch, self.device))
        obs, actions, rewards = batch["observations"], batch["actions"], batch["rewards"]
        done, valid = batch["terminals"], batch.get("valid", torch.ones_like(rewards))
        B, T = rewards.shape
        rho = cfg.rho ** torch.arange(T, device=self.device, dtype=torch.float32)
        model.train()

        with torch.no_grad():
            next_z = model.encode(batch["next_observations"])                        # [B, T, L]
            next_action, _, _ = model.pi(next_z)
            heads = torch.randperm(cfg.num_q, device=self.device)[:2]
            next_q = two_hot_inv(self.target_q(torch.cat([next_z, next_action], -1).reshape(B * T, -1), heads),
                                 cfg.vmin, cfg.vmax).min(0).values.view(B, T)
            td_target = rewards + cfg.gamma * (1.0 - done) * next_q

        z = model.encode(obs)
        zs, consistency = [z], []
        for t in range(T):
            z = model.next(z, actions[:, t])
            consistency.append((z - next_z[:, t]).square().mean(-1))
            zs.append(z)
        zs = torch.stack(zs, 1)                                                      # [B, T+1, L]
        consistency = torch.stack(consistency, 1)                                    # [B, T]
        q_logits = model.q_logits(zs[:, :-1], actions)                               # [N, B, T, bins]
        reward_ce = soft_ce(model.reward_logits(zs[:, :-1], actions), rewards, cfg.vmin, cfg.vmax)
        value_ce = soft_ce(q_logits, td_target.expand(cfg.num_q, B, T), cfg.vmin, cfg.vmax).mean(0)
        consistency_loss = (rho * _masked_mean(consistency, valid)).sum() / T
        reward_loss = (rho * _masked_mean(reward_ce, valid)).sum() / T
        value_loss = (rho * _masked_mean(value_ce, valid)).sum() / T
        total = cfg.consistency_coef * consistency_loss + cfg.reward_coef * reward_loss + cfg.value_coef * value_loss
        metrics = {}
        if model.termination is not None:
            logits = model.termination(zs[:, 1:]).squeeze(-1)
            bce = F.binary_cross_entropy_with_logits(logits, done, reduction="none")
            termination_loss = _masked_mean(bce, valid).sum() / T
            total = total + cfg.termination_coef * termination_loss
            metrics["termination_loss"] = termination_loss.detach()
        self.model_optimizer.zero_grad(set_to_none=True)
        total.backward()
        grad_norm = nn.utils.clip_grad_norm_([p for g in self.model_optimizer.param_groups for p in g["params"]],
                                             cfg.grad_clip)
        self.model_optimizer.step()

        metrics.update(self.update_pi(zs.detach(), torch.cat([torch.ones_like(valid[:, :1]), valid], 1)))
        soft_update(self.target_q, model.q, cfg.tau)
        model.eval()
        metrics.update(consistency_loss=consistency_loss.detach(), reward_loss=reward_loss.detach(),
                       value_loss=value_loss.detach(), total_loss=total.detach(), grad_norm=grad_norm,
                       q_mean=two_hot_inv(q_logits.detach(), cfg.vmin, cfg.vmax)[:, :, 0].mean(),
                       td_target_mean=td_target[:, 0].mean())
        return {k: float(v) for k, v in metrics.items()}

    def update_pi(self, zs: torch.Tensor, weight: torch.Tensor) -> dict[str, torch.Tensor]:
        """The policy prior's step on [B, T+1, L] latents, rows weighted by `weight` [B, T+1]."""
        cfg, model = self.cfg, self.actor
        action, log_prob, _ = model.pi(zs)
        model.q.requires_grad_(False)  # dQ/da only
        q = model.q_value(zs, action, "avg")                                       # [B, T+1]
        model.q.requires_grad_(True)
        self.scale.update(q[:, 0], cfg.tau)
        rho = cfg.rho ** torch.arange(zs.shape[1], device=self.device, dtype=torch.float32)
        per_step = cfg.entropy_coef * self.act_dim * log_prob - q / self.scale.value
        pi_loss = (rho * _masked_mean(per_step, weight)).sum() / zs.shape[1]
        self.pi_optimizer.zero_grad(set_to_none=True)
        pi_loss.backward()
        grad_norm = nn.utils.clip_grad_norm_(model.pi_net.parameters(), cfg.grad_clip)
        self.pi_optimizer.step()
        return {"pi_loss": pi_loss.detach(), "pi_grad_norm": grad_norm, "pi_entropy": -log_prob.detach().mean(),
                "pi_scale": self.scale.value.clone()}

    # -- acting ------------------------------------------------------------------------------------
    def act(self, obs, deterministic: bool = False) -> np.ndarray:
        """[A] for one observation, [B, A] for a batch: an MPPI plan's first action."""
        return self.actor.act(obs, deterministic)[..., 0, :]

    @torch.no_grad()
    def q_values(self, obs, action) -> np.ndarray:
        """Mean over the Q heads of Q(h(s), a) for numpy rows (the runner's calibration diagnostic)."""
        obs = torch.as_tensor(np.asarray(obs, np.float32), device=self.device)
        action = torch.as_tensor(np.asarray(action, np.float32), device=self.device)
        out = [two_hot_inv(self.actor.q_logits(self.actor.encode(o), a), self.cfg.vmin, self.cfg.vmax).mean(0)
               for o, a in zip(obs.split(4096), action.split(4096))]
        return torch.cat(out).cpu().numpy()

    # -- checkpoints (embodied.agents.base.Agent) ------------------------------------------------------------
    def _modules(self) -> dict:
        return {"actor": self.actor, "target_q": self.target_q, "scale": self.scale}

    def _optimizers(self) -> dict:
        return {"model_optimizer": self.model_optimizer, "pi_optimizer": self.pi_optimizer}

