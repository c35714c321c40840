"""Soft Actor-Critic with the RLPD options: a critic ensemble with a min over a random subset,
LayerNorm critics and bf16 autocast. The update-to-data ratio belongs to the runner, which calls
`update` that many times per environment step.

This is also the online half of WSRL, Cal-QL and naive fine-tuning: `SAC.from_agent` takes the
networks (and, unless reset, the optimizer state) of a pretrained CQL/Cal-QL/BC agent — the loss swap.
"""
from __future__ import annotations

import contextlib
import copy
from dataclasses import dataclass

import numpy as np
import torch

from embodied.agents.base import Agent
from embodied.agents.nets import (CriticEnsemble, adam, adam_zero_grad_step, mean_q, multiplier, multiplier_inverse,
                                  orthogonal_init_, soft_update, split_batch, to_torch)
from embodied.errors import ConfigError
from policies.gaussian import TanhGaussianPolicy


@dataclass
class SACConfig:
    hidden: tuple[int, ...] = (256, 256)        # actor widths
    critic_hidden: tuple[int, ...] | None = None  # None: the actor's widths (WSRL AntMaze: 4 x 256)
    num_critics: int = 2
    num_min: int = 2                   # target = min over this many randomly chosen critics (RLPD/WSRL: 2 of 10)
    critic_layernorm: bool = False
    critic_kernel_scale_final: float | None = None  # WSRL: the last hidden layer's init scaled by 1e-2
    actor_layernorm: bool = False      # WSRL: LayerNorm in the policy too
    state_dependent_std: bool = True   # False: one learned log-std per action ("uniform", WSRL AntMaze)
    log_std_range: tuple[float, float] = (-5.0, 2.0)  # WSRL: std clipped to [1e-5, 10]
    actor_q: str = "mean"              # actor maximises the "mean" or the "min" (WSRL) over all critics
    actor_lr: float = 3e-4
    critic_lr: float = 3e-4
    alpha_lr: float = 3e-4
    gamma: float = 0.99
    tau: float = 0.005
    init_temperature: float = 1.0
    multiplier_param: str = "exp"      # the temperature (and CQL's Lagrange weight) as exp(p), or softplus(p) (WSRL)
    target_entropy: float | None = None  # None: -act_dim
    backup_entropy: bool = True        # WSRL online: False
    max_target_backup: bool = False    # target = max over `max_target_actions` next actions (WSRL AntMaze)
    max_target_actions: int = 10
    init: str = "torch"                # "orthogonal": kernels orthogonal with gain sqrt 2, biases 0 (WSRL / jaxrl_m)
    temperature_entropy_obs: str = "observations"  # "next_observations": the temperature's entropy at s' (WSRL)
    zero_grad_adam_steps: bool = False  # WSRL: a split update (UTD > 1) steps every optimizer at every minibatch;
    #                                    the networks without a loss get a zero gradient and move by Adam momentum
    bf16: bool = False                 # autocast matmuls to bfloat16 (pays on AVX512-BF16 CPUs and GPUs)

    def __post_init__(self):
        if self.actor_q not in ACTOR_Q:
            raise ConfigError(f"actor_q={self.actor_q!r} must be one of {', '.join(ACTOR_Q)}")
        if self.init not in INITS:
            raise ConfigError(f"init={self.init!r} must be one of {', '.join(INITS)}")
        if self.multiplier_param not in MULTIPLIER_PARAMS:
            raise ConfigError(f"multiplier_param={self.multiplier_param!r} must be one of {', '.join(MULTIPLIER_PARAMS)}")
        if self.temperature_entropy_obs not in ENTROPY_OBS:
            raise ConfigError(f"temperature_entropy_obs={self.temperature_entropy_obs!r} must be one of "
                              f"{', '.join(ENTROPY_OBS)}")
        if self.num_critics < 1 or not 1 <= self.num_min <= self.num_critics:
            raise ConfigError(f"num_critics={self.num_critics}, num_min={self.num_min}: need 1 <= num_min <= num_critics")


ACTOR_Q = ("mean", "min")
INITS = ("torch", "orthogonal")
ENTROPY_OBS = ("observations", "next_observations")
MULTIPLIER_PARAMS = ("exp", "softplus")
LEGACY_SCALARS = {"log_alpha": "alpha_param", "log_cql_alpha": "cql_alpha_param"}


class SAC(Agent):
    scalars = ("alpha_param",)  # the temperature's raw parameter: alpha = exp(p) or softplus(p)
    splits_utd = True  # update(batch, utd) takes utd critic minibatches from one batch (the runner's critic-only UTD)

    def __init__(self, obs_dim: int, act_dim: int, cfg: SACConfig = SACConfig(), device: str = "cpu", seed: int = 0,
                 actor: TanhGaussianPolicy | None = None, critics: tuple | None = None,
                 alpha_param: torch.Tensor | None = None):
        """Fresh networks, or adopted ones (`actor`, `critics` = (critic, target), `alpha_param`): the switch."""
        super().__init__(obs_dim, act_dim, cfg, device, seed)
        self.actor = actor if actor is not None else TanhGaussianPolicy(
            obs_dim, act_dim, cfg.hidden, layernorm=cfg.actor_layernorm, state_dependent_std=cfg.state_dependent_std,
            log_std_range=cfg.log_std_range).to(self.device)
        if actor is None and cfg.init == "orthogonal":
            orthogonal_init_(self.actor)
        if alpha_param is None:
            alpha_param = torch.tensor(multiplier_inverse(cfg.init_temperature, cfg.multiplier_param),
                                       device=self.device, requires_grad=True)
        self.alpha_param = alpha_param
        self.target_entropy = -float(act_dim) if cfg.target_entropy is None else cfg.target_entropy
        if critics is None:
            self._build_critic()
        else:
            self.critic, self.target_critic = critics
            self.critic_optimizer = adam(self.critic.parameters(), cfg.critic_lr)
        self.actor_optimizer = adam(self.actor.parameters(), cfg.actor_lr)
        self.alpha_optimizer = adam([self.alpha_param], cfg.alpha_lr)

    def _build_critic(self) -> None:
        cfg = self.cfg
        self.critic = CriticEnsemble(self.obs_dim, self.act_dim, cfg.critic_hidden or cfg.hidden, cfg.num_critics,
                                     cfg.critic_layernorm, cfg.critic_kernel_scale_final)
        if cfg.init == "orthogonal":
            orthogonal_init_(self.critic, last_hidden_gain=cfg.critic_kernel_scale_final)
        self.critic.to(self.device)
        self.target_critic = copy.deepcopy(self.critic).requires_grad_(False)
        self.critic_optimizer = adam(self.critic.parameters(), cfg.critic_lr)

    @classmethod
    def from_agent(cls, other, cfg: SACConfig, reinit_critic: bool = False, reset_optimizers: bool = False,
                   seed: int = 0) -> "SAC":
        """Continue a pretrained agent's networks with the SAC loss (the switch in offline→online RL)."""
        adopt_critic = not reinit_critic and getattr(other, "critic", None) is not None
        agent = cls(other.obs_dim, other.act_dim, cfg, other.device, seed, actor=other.actor,
                    critics=(other.critic, other.target_critic) if adopt_critic else None,
                    alpha_param=getattr(other, "alpha_param", None))  # BC/IQL have no temperature: a fresh one
        if not reset_optimizers:  # Adam moments carry over; the online phase may use other learning rates
            names = ("actor_optimizer", "alpha_optimizer") + (("critic_optimizer",) if adopt_critic else ())
            for name in names:
                if hasattr(other, name):
                    setattr(agent, name, getattr(other, name))
            for optimizer, lr in ((agent.actor_optimizer, cfg.actor_lr), (agent.critic_optimizer, cfg.critic_lr),
                                  (agent.alpha_optimizer, cfg.alpha_lr)):
                for group in optimizer.param_groups:
                    group["lr"] = lr
        return agent

    def load_state_dict(self, tensors: dict[str, torch.Tensor]) -> None:
        if self.cfg.multiplier_param == "exp":  # checkpoints from before multiplier_param named the exp parameters
            tensors = {LEGACY_SCALARS.get(k, k): v for k, v in tensors.items()}
        super().load_state_dict(tensors)

    def alpha(self) -> torch.Tensor:
        """The temperature, differentiable in `alpha_param`."""
        return multiplier(self.alpha_param, self.cfg.multiplier_param)

    @torch.no_grad()
    def set_alpha(self, value: float) -> None:
        self.alpha_param.fill_(multiplier_inverse(value, self.cfg.multiplier_param))

    def autocast(self):
        if not self.cfg.bf16:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=torch.bfloat16)

    def critic_subset_min(self, q_values: torch.Tensor) -> torch.Tensor:
        """Min over `num_min` randomly chosen ensemble members: [N, B] -> [B]."""
        n = q_values.shape[0]
        if self.cfg.num_min >= n:
            return q_values.min(0).values
        subset = torch.randperm(n, generator=self.generator)[: self.cfg.num_min].to(q_values.device)
        return q_values.index_select(0, subset).min(0).values

    def td_target(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        next_obs = batch["next_observations"]
        k = self.cfg.max_target_actions if self.cfg.max_target_backup else 1
        with torch.no_grad(), self.autocast():
            repeated = next_obs.repeat(k, 1) if k > 1 else next_obs
            next_action, next_log_prob = self.actor.sample_with_log_prob(repeated)
            next_q = self.critic_subset_min(self.target_critic(repeated, next_action).float())
        return self.bootstrap(batch, next_q.view(k, -1), next_log_prob.float().view(k, -1))

    @torch.no_grad()
    def bootstrap(self, batch: dict[str, torch.Tensor], next_q: torch.Tensor, next_log_prob: torch.Tensor) -> torch.Tensor:
        """r + gamma (1 - terminal) V(s') from the subset-min Q of k next actions [k, B]: the best of them when
        k > 1 (the max-target backup), minus the entropy term when `backup_entropy`."""
        if next_q.shape[0] > 1:
            next_q, best = next_q.max(0, keepdim=True)
            next_log_prob = next_log_prob.gather(0, best)
        next_q, next_log_prob = next_q[0], next_log_prob[0]
        if self.cfg.backup_entropy:
            next_q = next_q - self.alpha() * next_log_prob
        return batch["rewards"] + self.cfg.gamma * (1.0 - batch["terminals"]) * next_q

    def update_critic(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        target_q = self.td_target(batch)  # fp32: bf16 spacing at |Q| ~ 30 is 0.25, the size of the action gaps
        with self.autocast():
            q = self.critic(batch["observations"], batch["actions"])
        q = q.float()
        td_loss = ((q - target_q) ** 2).mean(1).sum()  # sum over critics: each member's gradient is independent of N
        self.critic_optimizer.zero_grad(set_to_none=True)
        td_loss.backward()
        self.critic_optimizer.step()
        soft_update(self.target_critic, self.critic, self.cfg.tau)
        return {"critic_loss": td_loss.detach(), "q_mean": q.detach().mean(), "target_q_mean": target_q.mean()}

    def update_actor_and_alpha(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        obs = batch["observations"]
        self.critic.requires_grad_(False)  # the actor loss needs dQ/da, not critic weight gradients
        with self.autocast():
            action, log_prob = self.actor.sample_with_log_prob(obs)
            q = self.critic(obs, action).float()
        q = q.min(0).values if self.cfg.actor_q == "min" else q.mean(0)
        log_prob = log_prob.float()
        alpha = self.alpha().detach()
        actor_loss = (alpha * log_prob - q).mean()
        entropy_log_prob = log_prob.detach()
        if self.cfg.temperature_entropy_obs == "next_observations":  # WSRL's temperature_loss_fn samples at s'
            with torch.no_grad(), self.autocast():
                entropy_log_prob = self.actor.sample_with_log_prob(batch["next_observations"])[1].float()
        entropy_gap = entropy_log_prob + self.target_entropy  # > 0: entropy below its target, alpha goes up
        if self.cfg.multiplier_param == "exp":  # SAC's loss on log alpha (its gradient skips the factor alpha)
            alpha_loss = -(self.alpha_param * entropy_gap).mean()
        else:  # WSRL's GeqLagrangeMultiplier: alpha * (entropy - target)
            alpha_loss = -(self.alpha() * entropy_gap).mean()
        self.actor_optimizer.zero_grad(set_to_none=True)
        self.alpha_optimizer.zero_grad(set_to_none=True)
        (actor_loss + alpha_loss).backward()  # the two losses share no parameters: one backward pass serves both
        self.actor_optimizer.step()
        self.alpha_optimizer.step()
        self.critic.requires_grad_(True)
        return {"actor_loss": actor_loss.detach(), "alpha": alpha, "entropy": -log_prob.detach().mean()}

    def update(self, batch, utd: int = 1, actor: bool = True) -> dict[str, float]:
        """`utd` critic steps on equal slices of the batch, then one actor and temperature step on all of it
        (RLPD's and WSRL's `update_high_utd`: UTD 4 with batch 1024 is 4 critic minibatches of 256).
        actor=False: critic steps only (the runner's actor delay after the switch).
        `zero_grad_adam_steps` makes a split update (utd > 1, or critic only) take WSRL's optimizer steps: each
        critic minibatch also steps the actor's and temperature's Adam with zero gradients, and the actor step
        steps the critic's, so momentum keeps moving every network (jaxrl_m's `networks_to_update`)."""
        batch = self._check_batch(to_torch(batch, self.device))
        split = self.cfg.zero_grad_adam_steps and (utd > 1 or not actor)
        for minibatch in split_batch(batch, utd):
            metrics = self.critic_step(minibatch)
            if split:
                adam_zero_grad_step(self.actor_optimizer, self.alpha_optimizer)
        if actor:
            metrics.update(self.update_actor_and_alpha(batch))
            if split:
                adam_zero_grad_step(self.critic_optimizer)
        return {k: float(v) for k, v in metrics.items()}

    def critic_step(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """One critic update (CQL/Cal-QL swap in their conservative one)."""
        return self.update_critic(batch)

    def _check_batch(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return batch

    def q_values(self, obs, action) -> np.ndarray:
        return mean_q(self.critic, obs, action, self.device)

    def act(self, obs, deterministic: bool = False) -> np.ndarray:
        """[A] for one observation, [B, A] for a batch."""
        return self.actor.act(obs, deterministic)[..., 0, :]

    # -- checkpoints (TensorCheckpoint): one flat tensor dict, safetensors-ready -------------------
    def _modules(self) -> dict:
        return {"actor": self.actor, "critic": self.critic, "target_critic": self.target_critic}

    def _optimizers(self) -> dict:
        return {"actor_optimizer": self.actor_optimizer, "critic_optimizer": self.critic_optimizer,
                "alpha_optimizer": self.alpha_optimizer}
