"""Conservative Q-Learning (CQL, Kumar et al. 2020) and Calibrated Q-Learning (Cal-QL, Nakamoto et al. 2023).

CQL is SAC whose critic loss adds, per critic,

    penalty = T * logsumexp_j( Q(s, a_j) / T ) - Q(s, a_data)

over n uniform random actions, n policy actions at s and n policy actions at s' (all evaluated at s).
With importance sampling (CQL(H), the default) each term is divided by its proposal density,
i.e. log-densities are subtracted inside the logsumexp. The penalty is scaled by `cql_alpha`, or by
a Lagrange multiplier exp(p) or softplus(p) (`multiplier_param`) that holds the penalty near `target_action_gap`.

Cal-QL changes one thing: the Q-values of the policy actions inside the logsumexp are floored by
the Monte-Carlo return of the data, `max(Q(s, a_pi), mc_return(s, a_data))`, so the learned Q is
never pushed below the value of the behaviour policy. Batches then carry `mc_returns`.

Cost: the penalty evaluates the critic ensemble at (1 + 3n) actions per state. Here that is one
batched forward (data actions and all sampled actions together), and the actor runs once on
[s; s'] with the n samples per state drawn from that one output — policy samples need no
gradient in the critic loss.

Batch keys: observations, actions, rewards, next_observations, terminals (+ mc_returns for Cal-QL).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from embodied.agents.nets import adam, multiplier, multiplier_inverse, soft_update
from embodied.agents.sac import SAC, SACConfig
from embodied.errors import ConfigError
from policies.distributions import gaussian_log_prob_log_std, tanh_log_det


@dataclass
class CQLConfig(SACConfig):
    actor_lr: float = 1e-4              # CQL paper: 1e-4 for the policy, 3e-4 for the critic
    backup_entropy: bool = False        # CQL/Cal-QL reference code: no entropy in the TD target
    alpha_lr: float = 1e-4              # WSRL/Cal-QL reference code: temperature lr 1e-4
    cql_alpha: float = 5.0              # fixed penalty weight (unused when lagrange)
    cql_n_actions: int = 10             # samples per state for each of random / pi(s) / pi(s')
    cql_temperature: float = 1.0
    cql_importance_sample: bool = True  # CQL(H) with proposal densities; False: plain logsumexp (+ data Q)
    cql_penalty_critics: str = "all"    # "subset": only the num_min critics drawn for the target (WSRL code)
    lagrange: bool = False              # learn the weight so that the penalty ~ target_action_gap (Cal-QL AntMaze)
    lagrange_init: float = 1.0          # the multiplier's initial value
    target_action_gap: float = 0.8
    cql_alpha_lr: float = 3e-4
    calql: bool = False                 # floor policy Q-values in the penalty by batch["mc_returns"]

    def __post_init__(self):
        super().__post_init__()
        if self.cql_penalty_critics not in ("all", "subset"):
            raise ConfigError(f"cql_penalty_critics={self.cql_penalty_critics!r} must be 'all' or 'subset'")


def sample_tanh_gaussian(mean: torch.Tensor, log_std: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """n samples per row from the policy's output: ([n, B, A] actions, [n, B] log-densities)."""
    pre_tanh = mean + log_std.exp() * torch.randn((n, *mean.shape), device=mean.device, dtype=mean.dtype)
    log_prob = (gaussian_log_prob_log_std(pre_tanh, mean, log_std) - tanh_log_det(pre_tanh)).sum(-1)
    return torch.tanh(pre_tanh), log_prob


def cql_penalty(q_data: torch.Tensor, q_random: torch.Tensor, q_pi: torch.Tensor, q_next_pi: torch.Tensor,
                log_pi: torch.Tensor, log_next_pi: torch.Tensor, act_dim: int, temperature: float = 1.0,
                importance_sample: bool = True, mc_returns: torch.Tensor | None = None):
    """The conservative penalty per critic, a pure function of the Q-values.

    q_data [N, B]; q_random, q_pi, q_next_pi [N, n, B] (all at s; q_next_pi at actions drawn at s');
    log_pi, log_next_pi [n, B] the samples' log-densities; mc_returns [B] for Cal-QL (None: CQL).
    Returns (penalty [N] = mean_B(T logsumexp(Q/T) - Q_data), ood [N, B] the logsumexp term,
    fraction of policy Q-values raised by the Cal-QL floor).
    """
    floored = q_data.new_zeros(())
    if mc_returns is not None:  # Cal-QL: the only change vs CQL
        floor = mc_returns.to(q_pi.dtype)[None, None, :]
        floored = torch.cat([q_pi < floor, q_next_pi < floor]).float().mean()
        q_pi, q_next_pi = torch.maximum(q_pi, floor), torch.maximum(q_next_pi, floor)
    if importance_sample:
        random_log_density = act_dim * math.log(0.5)  # uniform on [-1, 1]^A
        logits = torch.cat([q_random - random_log_density, q_pi - log_pi, q_next_pi - log_next_pi], dim=1)
    else:
        logits = torch.cat([q_random, q_data[:, None], q_next_pi, q_pi], dim=1)
    ood = torch.logsumexp(logits / temperature, dim=1) * temperature
    return (ood - q_data).mean(1), ood, floored


class CQL(SAC):
    """SAC + conservative penalty. Public attributes match SAC, so `SAC.from_agent(cql, ...)` switches losses."""
    scalars = ("alpha_param", "cql_alpha_param")

    def __init__(self, obs_dim: int, act_dim: int, cfg: CQLConfig = CQLConfig(), device: str = "cpu", seed: int = 0):
        super().__init__(obs_dim, act_dim, cfg, device, seed)
        self.cql_alpha_param = None
        if cfg.lagrange:
            self.cql_alpha_param = torch.tensor(multiplier_inverse(cfg.lagrange_init, cfg.multiplier_param),
                                                device=self.device, requires_grad=True)
            self.cql_alpha_optimizer = adam([self.cql_alpha_param], cfg.cql_alpha_lr)

    def cql_alpha_weight(self) -> torch.Tensor:
        """The Lagrange weight of the penalty (`lagrange`), differentiable in `cql_alpha_param`."""
        return multiplier(self.cql_alpha_param, self.cfg.multiplier_param)

    @torch.no_grad()
    def sample_actions(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Everything random in one update: penalty actions and the target's next actions."""
        obs, next_obs = batch["observations"], batch["next_observations"]
        n, batch_size = self.cfg.cql_n_actions, obs.shape[0]
        with self.autocast():
            mean, log_std = self.actor(torch.cat([obs, next_obs]))  # one actor pass for s and s'
        mean, log_std = mean.float(), log_std.float()
        pi, log_pi = sample_tanh_gaussian(mean[:batch_size], log_std[:batch_size], n)
        n_target = self.cfg.max_target_actions if self.cfg.max_target_backup else 1
        next_pi, log_next_pi = sample_tanh_gaussian(mean[batch_size:], log_std[batch_size:], n + n_target)
        return {
            "random": torch.rand((n, batch_size, self.act_dim), device=obs.device) * 2 - 1,
            "pi": pi, "log_pi": log_pi,
            "next_pi": next_pi[:n], "log_next_pi": log_next_pi[:n],
            "target": next_pi[n:], "log_target": log_next_pi[n:],
        }

    @torch.no_grad()
    def cql_td_target(self, batch: dict[str, torch.Tensor], samples: dict[str, torch.Tensor]) -> torch.Tensor:
        next_actions, next_log_prob = samples["target"], samples["log_target"]  # [k, B, A], [k, B]
        k, batch_size, _ = next_actions.shape
        next_obs = batch["next_observations"].expand(k, -1, -1).reshape(k * batch_size, -1)
        with self.autocast():
            next_q = self.target_critic(next_obs, next_actions.reshape(k * batch_size, -1)).float()
        return self.bootstrap(batch, self.critic_subset_min(next_q.view(-1, k, batch_size)), next_log_prob)

    def conservative_critic_loss(self, batch: dict[str, torch.Tensor], samples: dict[str, torch.Tensor]):
        """TD loss over all critics + weighted penalty over all of them, or over the `num_min` critics drawn
        for this update ("subset", as WSRL's code does: 5x fewer critic evaluations at 10 critics)."""
        cfg, n = self.cfg, self.cfg.cql_n_actions
        obs = batch["observations"]
        batch_size = obs.shape[0]
        target_q = self.cql_td_target(batch, samples)
        ood_actions = torch.cat([samples["random"], samples["pi"], samples["next_pi"]])  # [3n, B, A]
        members = None
        if cfg.cql_penalty_critics == "subset" and cfg.num_min < cfg.num_critics:
            members = torch.randperm(cfg.num_critics, generator=self.generator)[: cfg.num_min].to(obs.device)
        rows = 3 * n + (1 if members is None else 0)  # the data action rides along when every critic is penalised
        actions = ood_actions if members is not None else torch.cat([batch["actions"][None], ood_actions])
        with self.autocast():
            q = self.critic(obs.expand(rows, -1, -1).reshape(rows * batch_size, -1),
                            actions.reshape(rows * batch_size, -1), members).float().view(-1, rows, batch_size)
            if members is not None:
                q_data_all = self.critic(obs, batch["actions"]).float()
        if members is None:
            q_data_all, q_ood = q[:, 0], q[:, 1:]
        else:
            q_ood = q
        q_data = q_data_all if members is None else q_data_all.index_select(0, members)
        penalty, ood, floored = cql_penalty(
            q_data, q_ood[:, :n], q_ood[:, n:2 * n], q_ood[:, 2 * n:], samples["log_pi"], samples["log_next_pi"],
            self.act_dim, cfg.cql_temperature, cfg.cql_importance_sample,
            batch["mc_returns"] if cfg.calql else None)
        td_loss = ((q_data_all - target_q) ** 2).mean(1).sum()  # summed over critics, as in SAC
        if cfg.lagrange:  # the weight is pushed up while penalty > gap (Cal-QL's Lagrange form)
            weight = self.cql_alpha_weight().clamp(0.0, 1e6)
            penalty_loss = (weight.detach() * (penalty - cfg.target_action_gap)).sum()
            alpha_loss = -(weight * (penalty.detach() - cfg.target_action_gap)).mean()
            weight = weight.detach()
        else:
            penalty_loss, alpha_loss, weight = cfg.cql_alpha * penalty.sum(), None, cfg.cql_alpha
        metrics = {"critic_loss": td_loss.detach(), "cql_penalty": penalty.detach().mean(),
                   "q_data": q_data_all.detach().mean(), "q_ood": ood.detach().mean(),
                   "target_q_mean": target_q.mean(), "cql_alpha": weight}
        if cfg.calql:
            metrics["calql_floored_fraction"] = floored
        return td_loss + penalty_loss, alpha_loss, metrics

    def update_conservative_critic(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        loss, alpha_loss, metrics = self.conservative_critic_loss(batch, self.sample_actions(batch))
        self.critic_optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.critic_optimizer.step()
        soft_update(self.target_critic, self.critic, self.cfg.tau)
        if alpha_loss is not None:
            self.cql_alpha_optimizer.zero_grad(set_to_none=True)
            alpha_loss.backward()
            self.cql_alpha_optimizer.step()
        return metrics

    def critic_step(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return self.update_conservative_critic(batch)

    def _check_batch(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        if self.cfg.calql and "mc_returns" not in batch:
            raise KeyError("Cal-QL needs batch['mc_returns']: load the replay with Monte-Carlo returns")
        return batch

    def _optimizers(self) -> dict:
        optimizers = super()._optimizers()
        if self.cfg.lagrange:
            optimizers["cql_alpha_optimizer"] = self.cql_alpha_optimizer
        return optimizers
