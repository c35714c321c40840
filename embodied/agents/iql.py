"""Implicit Q-Learning (IQL, Kostrikov et al. 2021): in-sample Q-learning, no policy actions in the critic.

    value:  L_V = E[ |tau - 1(u < 0)| u^2 ],  u = min_i Q_target_i(s, a) - V(s)     (expectile tau = 0.7)
    critic: L_Q = sum_i E[ (r + gamma (1 - d) V(s') - Q_i(s, a))^2 ]
    actor:  L_pi = -E[ min(exp(beta (min_i Q_target_i(s, a) - V(s))), 100) log pi(a | s) ]   (beta = 3)

The same update runs offline and online (IQL fine-tuning just keeps calling it on the replay).
The advantage and V(s') use the value network as it was before this update's value step.

Actor: the project's TanhGaussianPolicy with a state-independent std (`state_dependent_std=False`,
as in the IQL reference); the weighted regression uses its exact `log_prob` of dataset actions
(clamped to |a| <= 1 - 1e-5 before atanh). Being a TanhGaussianPolicy, it can be handed to SAC by
`SAC.from_agent(iql, ...)` (IQL has no temperature: SAC then creates one).
"""
from __future__ import annotations

import copy
from dataclasses import dataclass

import numpy as np
import torch

from embodied.agents.base import Agent
from embodied.agents.nets import CriticEnsemble, ValueEnsemble, adam, mean_q, soft_update, to_torch
from policies.gaussian import TanhGaussianPolicy


@dataclass
class IQLConfig:
    hidden: tuple[int, ...] = (256, 256)
    num_critics: int = 2
    critic_layernorm: bool = False
    actor_lr: float = 3e-4
    critic_lr: float = 3e-4
    value_lr: float = 3e-4
    gamma: float = 0.99
    tau: float = 0.005                 # target critic Polyak rate
    expectile: float = 0.7
    beta: float = 3.0                  # inverse temperature of the advantage weights
    max_weight: float = 100.0          # clip of exp(beta * advantage)


def expectile_loss(diff: torch.Tensor, expectile: float) -> torch.Tensor:
    """Asymmetric squared loss |tau - 1(u < 0)| u^2, averaged; diff = u = Q - V."""
    weight = torch.where(diff < 0, 1.0 - expectile, expectile)
    return (weight * diff ** 2).mean()


class IQL(Agent):
    def __init__(self, obs_dim: int, act_dim: int, cfg: IQLConfig = IQLConfig(), device: str = "cpu", seed: int = 0):
        super().__init__(obs_dim, act_dim, cfg, device, seed)
        self.actor = TanhGaussianPolicy(obs_dim, act_dim, cfg.hidden, state_dependent_std=False).to(self.device)
        self.critic = CriticEnsemble(obs_dim, act_dim, cfg.hidden, cfg.num_critics, cfg.critic_layernorm).to(self.device)
        self.target_critic = copy.deepcopy(self.critic).requires_grad_(False)
        self.value = ValueEnsemble(obs_dim, cfg.hidden, 1, cfg.critic_layernorm).to(self.device)
        self.actor_optimizer = adam(self.actor.parameters(), cfg.actor_lr)
        self.critic_optimizer = adam(self.critic.parameters(), cfg.critic_lr)
        self.value_optimizer = adam(self.value.parameters(), cfg.value_lr)

    def update(self, batch) -> dict[str, float]:
        cfg = self.cfg
        batch = to_torch(batch, self.device)
        obs, actions = batch["observations"], batch["actions"]
        with torch.no_grad():
            target_q = self.target_critic(obs, actions).min(0).values
            next_v = self.value(batch["next_observations"])[0]

        # 1. V(s) regresses to an upper expectile of Q(s, a) over dataset actions
        v = self.value(obs)[0]
        value_loss = expectile_loss(target_q - v, cfg.expectile)
        self.value_optimizer.zero_grad(set_to_none=True)
        value_loss.backward()
        self.value_optimizer.step()

        # 2. advantage-weighted regression of the actor onto dataset actions
        advantage = target_q - v.detach()
        weights = torch.exp(cfg.beta * advantage).clamp(max=cfg.max_weight)
        actor_loss = -(weights * self.actor.log_prob(obs, actions)).mean()
        self.actor_optimizer.zero_grad(set_to_none=True)
        actor_loss.backward()
        self.actor_optimizer.step()

        # 3. Q(s, a) regresses to r + gamma V(s'): no max over actions, so no out-of-data queries
        td_target = batch["rewards"] + cfg.gamma * (1.0 - batch["terminals"]) * next_v
        q = self.critic(obs, actions)
        critic_loss = ((q - td_target) ** 2).mean(1).sum()
        self.critic_optimizer.zero_grad(set_to_none=True)
        critic_loss.backward()
        self.critic_optimizer.step()
        soft_update(self.target_critic, self.critic, cfg.tau)

        metrics = {"value_loss": value_loss, "actor_loss": actor_loss, "critic_loss": critic_loss,
                   "v_mean": v.mean(), "q_mean": q.mean(), "advantage_mean": advantage.mean(),
                   "weight_mean": weights.mean()}
        return {k: float(value.detach()) for k, value in metrics.items()}

    def q_values(self, obs, action) -> np.ndarray:
        return mean_q(self.critic, obs, action, self.device)

    def act(self, obs, deterministic: bool = False) -> np.ndarray:
        return self.actor.act(obs, deterministic)[..., 0, :]

    def _modules(self) -> dict:
        return {"actor": self.actor, "critic": self.critic, "target_critic": self.target_critic, "value": self.value}

    def _optimizers(self) -> dict:
        return {"actor_optimizer": self.actor_optimizer, "critic_optimizer": self.critic_optimizer,
                "value_optimizer": self.value_optimizer}
