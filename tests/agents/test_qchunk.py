"""Q-chunking / FQL: h-step targets at episode ends, best-of-N extraction, updates, a CLI run."""
import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from embodied import agents
from embodied.agents.chunking import chunk_td_target, obs_sequence
from embodied.data.replay import ReplayBuffer
from embodied.errors import UserError

REPO = Path(__file__).resolve().parents[2]
GAMMA = 0.9


def chain_buffer():
    """Episode A: steps 0..3 then terminal; episode B: steps 4..5 then timeout; episode C: 6..9 open."""
    buf = ReplayBuffer(obs_dim=1, act_dim=1, capacity=32, seed=0)
    k = 0
    for length, ending in ((4, "terminal"), (2, "timeout"), (4, None)):
        for i in range(length):
            last = i == length - 1
            buf.add([k], [k / 10], float(k + 1), [k + 1], last and ending == "terminal", last and ending == "timeout")
            k += 1
    return buf


def target(batch, next_q):
    t = {k: torch.as_tensor(v) for k, v in batch.items()}
    return chunk_td_target(t["rewards"], t["valid"], t["terminals"], torch.as_tensor(next_q, dtype=torch.float32), GAMMA)


def test_chunk_targets_at_episode_ends():
    buf = chain_buffer()
    batch = buf.chunks_at(np.array([0, 2, 4, 5, 6]), 3)
    next_q = np.array([100.0, 100.0, 100.0, 100.0, 100.0], np.float32)
    got = target(batch, next_q).numpy()
    # start 0: full chunk inside episode A, bootstrap from s_3 with gamma^3
    assert got[0] == pytest.approx(1 + GAMMA * 2 + GAMMA**2 * 3 + GAMMA**3 * 100)
    # start 2: steps 2, 3 then the terminal: rewards only, no bootstrap
    assert got[1] == pytest.approx(3 + GAMMA * 4)
    # start 4: steps 4, 5 then a timeout: bootstrap with gamma^2 from where it really ended
    assert got[2] == pytest.approx(5 + GAMMA * 6 + GAMMA**2 * 100)
    assert batch["next_observations"][2, -1, 0] == 6  # the padded row repeats the real end
    # start 5: one step then the timeout
    assert got[3] == pytest.approx(6 + GAMMA * 100)
    # start 6: the open episode continues
    assert got[4] == pytest.approx(7 + GAMMA * 8 + GAMMA**2 * 9 + GAMMA**3 * 100)
    # horizon 1 is plain one-step TD
    one = buf.chunks_at(np.array([3, 0]), 1)
    np.testing.assert_allclose(target(one, np.array([100.0, 100.0], np.float32)).numpy(), [4.0, 1 + GAMMA * 100])


def test_obs_sequence_uses_the_chunk_start_and_following_observations():
    batch = chain_buffer().chunks_at(np.array([0, 3]), 4)
    seq = obs_sequence(batch, 2)
    np.testing.assert_array_equal(seq[:, :, 0], [[0, 1], [3, 4]])  # a chunk at an episode end repeats the last


class PreferTarget(nn.Module):
    """A critic that likes chunks close to +0.5 everywhere: [N=2, B]."""

    def forward(self, obs, flat_actions):
        return -((flat_actions - 0.5) ** 2).sum(-1).expand(2, -1)


def test_best_of_n_returns_the_argmax_q_candidate():
    torch.manual_seed(0)
    agent = agents.make("qc", obs_dim=3, act_dim=2, overrides={"hidden": [32, 32], "num_samples": 16})
    agent.critic = PreferTarget()
    obs = torch.zeros(4, 3)
    torch.manual_seed(1)
    chosen = agent.best_of_n(obs, agent.critic)
    torch.manual_seed(1)
    candidates = agent.actor.act_tensor(obs.repeat_interleave(16, 0)).view(4, 16, 5, 2)
    scores = -((candidates - 0.5) ** 2).sum((-1, -2))
    torch.testing.assert_close(chosen, candidates[torch.arange(4), scores.argmax(1)])
    assert chosen.shape == (4, 5, 2)


@pytest.mark.parametrize("name,horizon", [("qc", 5), ("qc_fql", 5), ("fql", 1)])
def test_updates_on_chunk_batches(name, horizon):
    torch.manual_seed(0)
    agent = agents.make(name, obs_dim=1, act_dim=1, overrides={"hidden": [32, 32], "num_samples": 4, "flow_steps": 3})
    assert agent.chunk_horizon == horizon and agent.execute_horizon == horizon
    buf = chain_buffer()
    agent.fit_normalization(buf.observations[: len(buf)], buf.actions[: len(buf)])
    before = [p.detach().clone() for p in agent.critic.parameters()]
    metrics = agent.update(buf.sample_chunks(16, horizon))
    assert np.isfinite(list(metrics.values())).all() and "critic_loss" in metrics
    assert ("distill_loss" in metrics) == (name != "qc")
    assert any(not torch.equal(b, p) for b, p in zip(before, agent.critic.parameters()))
    chunk = agent.act_chunk(np.zeros((2, 1, 1), np.float32), deterministic=True)
    assert chunk.shape == (2, horizon, 1)
    np.testing.assert_array_equal(chunk, agent.act_chunk(np.zeros((2, 1, 1), np.float32), deterministic=True))
    with pytest.raises(UserError, match="horizon"):
        agent.update(buf.sample_chunks(4, horizon + 1))


@pytest.mark.slow
def test_qc_learns_the_better_chunk_offline():
    """Two actions from the same state, rewards 1 (a=+0.5) and 0 (a=-0.5), episodes of one chunk: after
    a few hundred updates best-of-N must pick the rewarded one and the critic must rank them."""
    torch.manual_seed(0)
    agent = agents.make("qc", obs_dim=1, act_dim=1, overrides={"hidden": [64, 64], "horizon": 2, "num_samples": 16,
                                                               "flow_steps": 5, "lr": 1e-3})
    buf = ReplayBuffer(1, 1, capacity=400, seed=0)
    rng = np.random.default_rng(0)
    for _ in range(100):
        a = 0.5 if rng.random() < 0.5 else -0.5
        buf.add([0.0], [a], float(a > 0), [0.0], False, False)
        buf.add([0.0], [a], float(a > 0), [0.0], True, False)
    agent.fit_normalization(buf.observations[: len(buf)], buf.actions[: len(buf)])
    for _ in range(300):
        agent.update(buf.sample_chunks(64, 2))
    q = agent.q_chunk_values(np.zeros((2, 1), np.float32), np.array([[[0.5], [0.5]], [[-0.5], [-0.5]]], np.float32))
    assert q[0] > q[1] + 0.5
    assert agent.act_chunk(np.zeros((1, 1), np.float32))[0].mean() > 0.2


@pytest.mark.slow
def test_cli_tiny_run(tmp_path):
    """`python -m embodied.train algo=qc_fql` end to end (chunks executed open-loop online)."""
    cmd = [sys.executable, "-m", "embodied.train", "algo=qc_fql", "experiment=smoke", "env=pointmaze-umaze",
           "budget.offline_steps=20", "budget.online_steps=120", "eval.every_online=60", "eval.every_offline=20",
           f"hydra.run.dir={tmp_path}", "eval.episodes=1",
           "algo.warmup_steps=20"]  # the warmup knob: chunks from the frozen pretrained policy first
    out = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300,
                         env={**__import__("os").environ, "EMBODIED_CACHE": str(tmp_path / "cache")})
    assert out.returncode == 0, out.stderr[-2000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["algo"] == "qc_fql" and summary["online_steps"] == 120 and math.isfinite(summary["offline_score"])
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    online_evals = [x for x in lines if x["phase"] == "online" and x["kind"] == "eval"]
    assert online_evals[-1]["step"] == 120 and "eval/success" in online_evals[-1]
    import policies

    policy = policies.load(summary["policy_dir"])  # the run's policy deploys without knowing its class
    assert policy.act(np.zeros(6, np.float32)).shape == (5, 2)
