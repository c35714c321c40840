"""IQL's expectile loss and learning on a bandit; behaviour cloning of a linear expert."""
import pytest
import torch

from embodied.agents.bc import BC, BCConfig
from embodied.agents.iql import IQL, IQLConfig, expectile_loss


def test_expectile_loss_by_hand():
    diff = torch.tensor([-2.0, 1.0, 0.5, 0.0])
    expected = (0.3 * 4.0 + 0.7 * 1.0 + 0.7 * 0.25 + 0.0) / 4
    assert expectile_loss(diff, 0.7).item() == pytest.approx(expected)
    assert expectile_loss(diff, 0.5).item() == pytest.approx(0.5 * (diff ** 2).mean().item())


@pytest.mark.slow
def test_iql_values_approach_reward_on_one_step_bandit():
    torch.manual_seed(0)
    agent = IQL(3, 2, IQLConfig(hidden=(32, 32), critic_lr=3e-3, value_lr=3e-3, tau=0.05))
    size = 64
    for _ in range(300):
        obs = torch.randn(size, 3)
        metrics = agent.update(dict(observations=obs, actions=torch.rand(size, 2) * 2 - 1, rewards=torch.ones(size),
                                    next_observations=obs, terminals=torch.ones(size)))
    assert metrics["q_mean"] == pytest.approx(1.0, abs=0.1)
    assert metrics["v_mean"] == pytest.approx(1.0, abs=0.15)


@pytest.mark.slow
def test_iql_actor_prefers_high_advantage_actions():
    """Rewards favour a > 0 in the data: the advantage-weighted actor's mode moves to a > 0."""
    torch.manual_seed(0)
    agent = IQL(2, 1, IQLConfig(hidden=(32, 32), critic_lr=3e-3, value_lr=3e-3, actor_lr=3e-3, tau=0.05))
    size = 128
    for _ in range(300):
        obs = torch.randn(size, 2)
        actions = torch.rand(size, 1) * 1.8 - 0.9
        agent.update(dict(observations=obs, actions=actions, rewards=actions[:, 0], next_observations=obs,
                          terminals=torch.ones(size)))
    assert agent.act(torch.randn(64, 2).numpy(), deterministic=True).mean() > 0.2


def test_bc_loss_drops_on_linear_expert():
    torch.manual_seed(0)
    weights = torch.randn(4, 2) * 0.4
    agent = BC(4, 2, BCConfig(hidden=(64, 64), lr=1e-3))
    losses = []
    for _ in range(300):
        obs = torch.randn(128, 4)
        losses.append(agent.update(dict(observations=obs, actions=(obs @ weights).clamp(-0.9, 0.9))))
    assert losses[-1]["bc_loss"] < losses[0]["bc_loss"] - 2.0
    assert losses[-1]["mode_mse"] < 0.01
    obs = torch.randn(5, 4)
    torch.testing.assert_close(torch.as_tensor(agent.act(obs.numpy(), deterministic=True)),
                               (obs @ weights).clamp(-0.9, 0.9), atol=0.15, rtol=0)
