"""CQL / Cal-QL: the conservative penalty by hand, the Monte-Carlo floor, and learning on a bandit."""
import math

import pytest
import torch

from embodied.agents.cql import CQL, CQLConfig, cql_penalty
from embodied.agents.sac import SAC, SACConfig

ACT_DIM = 1


def _lse(values):
    top = max(values)
    return top + math.log(sum(math.exp(v - top) for v in values))


def _hand_penalty(q_data, q_random, q_pi, q_next, log_pi, log_next, temperature=1.0, importance_sample=True,
                  mc=None, act_dim=ACT_DIM):
    """Plain-Python CQL(H) penalty for one critic: lists over the batch of lists over samples."""
    out = []
    for b in range(len(q_data)):
        pi, nxt = list(q_pi[b]), list(q_next[b])
        if mc is not None:
            pi, nxt = [max(v, mc[b]) for v in pi], [max(v, mc[b]) for v in nxt]
        if importance_sample:
            terms = ([v - act_dim * math.log(0.5) for v in q_random[b]] + [v - lp for v, lp in zip(pi, log_pi[b])]
                     + [v - lp for v, lp in zip(nxt, log_next[b])])
        else:
            terms = list(q_random[b]) + [q_data[b]] + nxt + pi
        out.append(temperature * _lse([t / temperature for t in terms]) - q_data[b])
    return sum(out) / len(out)


def _tiny_case():
    """One critic, B=2 states, n=2 samples. Tensors in the [N, n, B] / [n, B] layout."""
    q_data = [0.3, -0.2]
    q_random = [[0.0, 1.0], [0.5, -1.0]]
    q_pi = [[-3.0, 0.5], [-2.0, 0.1]]
    q_next = [[-2.0, -1.0], [0.4, -4.0]]
    log_pi = [[-1.0, -0.5], [0.3, -0.2]]
    log_next = [[0.2, -0.3], [-0.7, 0.1]]
    mc = [-0.5, 0.2]
    lay = lambda rows: torch.tensor(rows).T  # [B][n] -> [n, B]
    tensors = dict(q_data=torch.tensor([q_data]), q_random=lay(q_random)[None], q_pi=lay(q_pi)[None],
                   q_next_pi=lay(q_next)[None], log_pi=lay(log_pi), log_next_pi=lay(log_next))
    lists = (q_data, q_random, q_pi, q_next, log_pi, log_next)
    return tensors, lists, mc


@pytest.mark.parametrize("temperature,importance_sample", [(1.0, True), (0.5, True), (1.0, False), (2.0, False)])
def test_cql_penalty_matches_hand_computation(temperature, importance_sample):
    tensors, lists, _ = _tiny_case()
    penalty, _, floored = cql_penalty(**tensors, act_dim=ACT_DIM, temperature=temperature,
                                      importance_sample=importance_sample)
    assert penalty.shape == (1,)
    assert penalty.item() == pytest.approx(_hand_penalty(*lists, temperature, importance_sample), abs=1e-5)
    assert floored.item() == 0.0


def test_calql_floor_matches_hand_computation():
    tensors, lists, mc = _tiny_case()
    penalty, _, floored = cql_penalty(**tensors, act_dim=ACT_DIM, mc_returns=torch.tensor(mc))
    expected = _hand_penalty(*lists, mc=mc)
    assert penalty.item() == pytest.approx(expected, abs=1e-5)
    assert expected != pytest.approx(_hand_penalty(*lists), abs=1e-3)  # the floor is active in this case
    # values below the floor: state 0 (mc -0.5): -3, -2, -1; state 1 (mc 0.2): -2, 0.1, -4  -> 6 of 8
    assert floored.item() == pytest.approx(6 / 8)


def test_calql_with_minus_infinite_returns_is_cql():
    tensors, _, _ = _tiny_case()
    cql, _, _ = cql_penalty(**tensors, act_dim=ACT_DIM)
    calql, _, floored = cql_penalty(**tensors, act_dim=ACT_DIM, mc_returns=torch.full((2,), -math.inf))
    assert torch.equal(cql, calql) and floored.item() == 0.0


def _batch(obs_dim=2, act_dim=ACT_DIM, size=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    return dict(observations=torch.randn(size, obs_dim, generator=g),
                actions=torch.rand(size, act_dim, generator=g) * 2 - 1,
                rewards=torch.randn(size, generator=g), next_observations=torch.randn(size, obs_dim, generator=g),
                terminals=torch.tensor([0.0, 1.0] * (size // 2)), mc_returns=torch.tensor([0.5, -0.1] * (size // 2)))


def _fixed_samples(n=2, size=2, seed=1):
    g = torch.Generator().manual_seed(seed)
    act = lambda k: torch.rand(k, size, ACT_DIM, generator=g) * 2 - 1
    return dict(random=act(n), pi=act(n), log_pi=torch.randn(n, size, generator=g), next_pi=act(n),
                log_next_pi=torch.randn(n, size, generator=g), target=act(1), log_target=torch.randn(1, size, generator=g))


@pytest.mark.parametrize("calql", [False, True])
def test_agent_penalty_on_one_critic_network_by_hand(calql):
    """The agent's batched (1 + 3n)-action critic pass gives the penalty computed one (s, a) at a time."""
    torch.manual_seed(0)
    cfg = CQLConfig(hidden=(4,), num_critics=1, num_min=1, cql_n_actions=2, calql=calql)
    agent = CQL(2, ACT_DIM, cfg)
    batch, samples = _batch(), _fixed_samples()
    loss, alpha_loss, metrics = agent.conservative_critic_loss(batch, samples)
    assert alpha_loss is None

    def q(b, action):
        with torch.no_grad():
            return agent.critic(batch["observations"][b:b + 1], action.reshape(1, ACT_DIM)).item()

    per_state = lambda key: [[q(b, samples[key][j, b]) for j in range(2)] for b in range(2)]
    log = lambda key: samples[key].T.tolist()
    q_data = [q(b, batch["actions"][b]) for b in range(2)]
    expected = _hand_penalty(q_data, per_state("random"), per_state("pi"), per_state("next_pi"), log("log_pi"),
                             log("log_next_pi"), mc=batch["mc_returns"].tolist() if calql else None)
    assert metrics["cql_penalty"].item() == pytest.approx(expected, abs=1e-5)
    assert metrics["q_data"].item() == pytest.approx(sum(q_data) / 2, abs=1e-6)
    # TD target: reward + gamma * Q'(s', a') on the first state, no bootstrap on the terminal second state
    next_q = agent.target_critic(batch["next_observations"][:1], samples["target"][0, :1]).item()
    target = [batch["rewards"][0].item() + cfg.gamma * next_q, batch["rewards"][1].item()]
    td = sum((qd - t) ** 2 for qd, t in zip(q_data, target)) / 2
    assert metrics["critic_loss"].item() == pytest.approx(td, abs=1e-5)
    assert loss.item() == pytest.approx(td + cfg.cql_alpha * expected, abs=1e-4)


def test_max_target_backup_takes_best_sample():
    torch.manual_seed(0)
    agent = CQL(2, ACT_DIM, CQLConfig(hidden=(4,), num_critics=1, num_min=1, cql_n_actions=3, max_target_backup=True))
    batch = _batch()
    samples = _fixed_samples(n=3)
    samples["target"] = torch.rand(3, 2, ACT_DIM) * 2 - 1
    samples["log_target"] = torch.zeros(3, 2)
    target = agent.cql_td_target(batch, samples)
    with torch.no_grad():
        best = max(agent.target_critic(batch["next_observations"][:1], samples["target"][j, :1]).item() for j in range(3))
    assert target[0].item() == pytest.approx(batch["rewards"][0].item() + agent.cfg.gamma * best, abs=1e-5)
    assert target[1].item() == pytest.approx(batch["rewards"][1].item(), abs=1e-6)


def test_calql_agent_with_minus_infinite_returns_equals_cql_agent():
    torch.manual_seed(0)
    cfg = CQLConfig(hidden=(8,), num_critics=2, cql_n_actions=2)
    cql = CQL(2, ACT_DIM, cfg)
    calql = CQL(2, ACT_DIM, CQLConfig(hidden=(8,), num_critics=2, cql_n_actions=2, calql=True))
    calql.critic.load_state_dict(cql.critic.state_dict())
    calql.target_critic.load_state_dict(cql.target_critic.state_dict())
    batch, samples = _batch(), _fixed_samples()
    batch["mc_returns"] = torch.full((2,), -math.inf)
    loss_a, _, _ = cql.conservative_critic_loss(batch, samples)
    loss_b, _, metrics = calql.conservative_critic_loss(batch, samples)
    assert loss_a.item() == loss_b.item() and metrics["calql_floored_fraction"].item() == 0.0


def test_lagrange_multiplier_moves_and_checkpoints():
    torch.manual_seed(0)
    cfg = CQLConfig(hidden=(16,), cql_n_actions=2, lagrange=True, target_action_gap=100.0)
    agent = CQL(2, ACT_DIM, cfg)
    batch = _batch(size=8)
    for _ in range(3):
        before = agent.cql_alpha_param.item()
        metrics = agent.update(batch)
    assert agent.cql_alpha_param.item() < before < 0  # penalty far below the gap: the multiplier shrinks
    assert metrics["cql_alpha"] == pytest.approx(math.exp(before), rel=1e-5)  # the weight is the multiplier (Cal-QL)
    state = agent.state_dict()
    assert "cql_alpha_param" in state and any(k.startswith("cql_alpha_optimizer.") for k in state)
    other = CQL(2, ACT_DIM, cfg)
    other.load_state_dict(state)
    assert other.cql_alpha_param.item() == agent.cql_alpha_param.item()
    assert all(torch.equal(v, other.state_dict()[k]) for k, v in state.items())


def test_calql_requires_mc_returns():
    agent = CQL(2, ACT_DIM, CQLConfig(hidden=(8,), cql_n_actions=2, calql=True))
    batch = _batch()
    del batch["mc_returns"]
    with pytest.raises(KeyError, match="mc_returns"):
        agent.update(batch)


@pytest.mark.slow
@pytest.mark.parametrize("calql", [False, True])
def test_cql_q_approaches_reward_on_one_step_bandit(calql):
    """Reward 1 for every action, episode ends after one step: Q at dataset actions -> 1."""
    torch.manual_seed(0)
    cfg = CQLConfig(hidden=(32, 32), critic_lr=3e-3, actor_lr=1e-3, cql_alpha=1.0, cql_n_actions=4, calql=calql)
    agent = CQL(3, 2, cfg)
    size = 64
    for _ in range(300):
        obs = torch.randn(size, 3)
        metrics = agent.update(dict(observations=obs, actions=torch.rand(size, 2) * 2 - 1, rewards=torch.ones(size),
                                    next_observations=obs, terminals=torch.ones(size), mc_returns=torch.ones(size)))
    assert metrics["q_data"] == pytest.approx(1.0, abs=0.1)
    sac = SAC.from_agent(agent, SACConfig(hidden=(32, 32)))  # the switch: same networks, SAC loss
    assert sac.critic is agent.critic and sac.actor is agent.actor
    sac.update(dict(observations=obs, actions=torch.rand(size, 2) * 2 - 1, rewards=torch.ones(size),
                    next_observations=obs, terminals=torch.ones(size)))
