"""The faithful WSRL/Cal-QL recipe's agent knobs, each checked against a hand computation."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from embodied.agents.cql import CQL, CQLConfig
from embodied.agents.nets import CriticEnsemble, split_batch
from embodied.agents.sac import SAC, SACConfig
from embodied.errors import ConfigError

OBS, ACT = 3, 2


def batch(size: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"observations": rng.normal(size=(size, OBS)).astype(np.float32),
            "actions": rng.uniform(-1, 1, (size, ACT)).astype(np.float32),
            "rewards": rng.normal(size=size).astype(np.float32),
            "next_observations": rng.normal(size=(size, OBS)).astype(np.float32),
            "terminals": np.zeros(size, np.float32), "mc_returns": rng.normal(size=size).astype(np.float32)}


def test_critic_only_utd_takes_utd_critic_steps_and_one_actor_step():
    agent = SAC(OBS, ACT, SACConfig(hidden=(8,), num_critics=2))
    steps = {"critic": 0, "actor": 0}
    for name, optimizer in (("critic", agent.critic_optimizer), ("actor", agent.actor_optimizer)):
        original = optimizer.step
        optimizer.step = lambda *a, _o=original, _n=name, **k: (steps.__setitem__(_n, steps[_n] + 1), _o(*a, **k))[1]
    seen = []
    original_critic = agent.update_critic
    agent.update_critic = lambda mb: (seen.append(len(mb["rewards"])), original_critic(mb))[1]
    agent.update(batch(64), utd=4)
    assert steps == {"critic": 4, "actor": 1} and seen == [16, 16, 16, 16]
    with pytest.raises(ValueError, match="equal minibatches"):
        split_batch({"x": torch.zeros(10)}, 4)


def test_actor_maximises_min_or_mean_of_the_critics():
    torch.manual_seed(0)
    for reduction in ("min", "mean"):
        agent = SAC(OBS, ACT, SACConfig(hidden=(8,), num_critics=3, num_min=2, actor_q=reduction, init_temperature=1e-8))
        obs = torch.as_tensor(batch(32)["observations"])
        torch.manual_seed(1)
        with torch.no_grad():
            action, _ = agent.actor.sample_with_log_prob(obs)
            q = agent.critic(obs, action)
        expected = q.min(0).values if reduction == "min" else q.mean(0)
        torch.manual_seed(1)  # the same noise inside the update
        metrics = agent.update_actor_and_alpha({"observations": obs})
        # the actor loss is (alpha * log_pi - Q).mean() with alpha ~ 0
        assert metrics["actor_loss"].item() == pytest.approx(-expected.mean().item(), abs=1e-4)
    with pytest.raises(ConfigError, match="actor_q"):
        SACConfig(actor_q="max")


def test_sac_max_target_backup_takes_the_best_of_k_next_actions():
    torch.manual_seed(0)
    agent = SAC(OBS, ACT, SACConfig(hidden=(8,), num_critics=1, num_min=1, max_target_backup=True, max_target_actions=6,
                                    backup_entropy=False))
    b = {k: torch.as_tensor(v) for k, v in batch(4).items()}
    torch.manual_seed(5)
    target = agent.td_target(b)
    torch.manual_seed(5)
    actions, _ = agent.actor.sample_with_log_prob(b["next_observations"].repeat(6, 1))
    with torch.no_grad():
        q = agent.target_critic(b["next_observations"].repeat(6, 1), actions).view(1, 6, 4)[0].max(0).values
    assert torch.allclose(target, b["rewards"] + 0.99 * q, atol=1e-5)


def test_td_targets_and_critic_values_stay_fp32_under_bf16():
    agent = SAC(OBS, ACT, SACConfig(hidden=(8,), num_critics=2, bf16=True))
    b = {k: torch.as_tensor(v) for k, v in batch(8).items()}
    assert agent.td_target(b).dtype == torch.float32
    cql = CQL(OBS, ACT, CQLConfig(hidden=(8,), num_critics=2, cql_n_actions=2, bf16=True))
    loss, _, metrics = cql.conservative_critic_loss(b, cql.sample_actions(b))
    assert loss.dtype == torch.float32 and metrics["target_q_mean"].dtype == torch.float32


def test_subset_penalty_uses_only_the_drawn_critics():
    torch.manual_seed(0)
    cfg = CQLConfig(hidden=(8,), num_critics=4, num_min=2, cql_n_actions=3, cql_penalty_critics="subset")
    agent = CQL(OBS, ACT, cfg)
    b = {k: torch.as_tensor(v) for k, v in batch(6).items()}
    samples = agent.sample_actions(b)
    generator_state = agent.generator.get_state()
    _, _, metrics = agent.conservative_critic_loss(b, samples)
    agent.generator.set_state(generator_state)
    agent.critic_subset_min(torch.zeros(4, 1))  # the target's draw comes first, as in the loss
    members = torch.randperm(4, generator=agent.generator)[:2]
    from embodied.agents.cql import cql_penalty
    with torch.no_grad():
        ood = torch.cat([samples["random"], samples["pi"], samples["next_pi"]])
        rows = ood.shape[0]
        q = agent.critic(b["observations"].expand(rows, -1, -1).reshape(-1, OBS), ood.reshape(-1, ACT)).view(4, rows, -1)
        q_data = agent.critic(b["observations"], b["actions"])
        penalty, _, _ = cql_penalty(q_data[members], q[members, :3], q[members, 3:6], q[members, 6:],
                                    samples["log_pi"], samples["log_next_pi"], ACT)
    assert metrics["cql_penalty"].item() == pytest.approx(penalty.mean().item(), abs=1e-5)


@pytest.mark.parametrize("param", ["exp", "softplus"])
def test_multipliers_start_at_their_init_and_move_the_right_way(param):
    """Temperature and Lagrange weight, as exp(p) or as WSRL's softplus(p): each starts at its init, a
    reset lands exactly, and the Lagrange weight shrinks while the penalty sits below the target gap."""
    agent = CQL(OBS, ACT, CQLConfig(hidden=(8,), lagrange=True, lagrange_init=2.0, init_temperature=0.7,
                                    multiplier_param=param, target_action_gap=1e4))
    assert float(agent.cql_alpha_weight()) == pytest.approx(2.0)
    assert float(agent.alpha()) == pytest.approx(0.7)
    agent.set_alpha(0.05)
    assert float(agent.alpha()) == pytest.approx(0.05)
    before = float(agent.cql_alpha_weight())
    agent.update(batch(64))
    assert float(agent.cql_alpha_weight()) < before


def test_lagrange_weight_starts_at_its_init_and_kernel_scale_shrinks_the_last_hidden_layer():
    agent = CQL(OBS, ACT, CQLConfig(hidden=(8,), lagrange=True, lagrange_init=2.0))
    assert float(agent.cql_alpha_weight()) == pytest.approx(2.0)
    torch.manual_seed(0)
    plain = CriticEnsemble(OBS, ACT, (16, 16, 16), 2)
    torch.manual_seed(0)
    scaled = CriticEnsemble(OBS, ACT, (16, 16, 16), 2, kernel_scale_final=1e-2)
    weights = lambda c: [w.detach() for w in c.net.weights]
    for i, (a, b) in enumerate(zip(weights(plain), weights(scaled))):
        assert torch.allclose(b, a * (1e-2 if i == 2 else 1.0))


def test_uniform_std_policy_and_std_clip_round_trip(tmp_path):
    import policies

    agent = SAC(OBS, ACT, SACConfig(hidden=(8,), state_dependent_std=False, actor_layernorm=True,
                                    log_std_range=(-11.5, 2.3)))
    with torch.no_grad():
        agent.actor.log_std.fill_(-20.0)
    _, log_std = agent.actor(torch.zeros(1, OBS))
    assert torch.allclose(log_std, torch.full_like(log_std, -11.5))
    agent.actor.save(tmp_path / "p")
    loaded = policies.load(tmp_path / "p")
    assert loaded.log_std_range == (-11.5, 2.3) and loaded.layernorm and not loaded.state_dependent_std
    obs = np.zeros(OBS, np.float32)
    assert np.allclose(loaded.act(obs), agent.actor.act(obs))


def test_scratch_is_wsrls_online_agent_without_a_pretraining():
    """algo=scratch is the o2o comparison's control: WSRL's online agent learning from random steps. Its
    online agent listed its own fields and missed the four optimiser details stop 41 gave wsrl, so the
    scratch rows ran a different SAC from the wsrl rows."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from embodied.train import CONF_DIR

    def online_agent(algo):
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            cfg = compose(config_name="train", overrides=[f"algo={algo}"])
        return OmegaConf.to_container(cfg.algo.online_agent, resolve=True)

    wsrl, scratch = online_agent("wsrl"), online_agent("scratch")
    assert scratch == wsrl
