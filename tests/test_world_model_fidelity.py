"""embodied.world_model_fidelity on real MuJoCo at tiny sizes: windows stay inside episodes, a model
that is the true dynamics scores zero error and a perfect rank correlation, the statistics agree with
hand-computed values, and the benchmark's --quick run writes its JSON and plots."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from torch import nn

from embodied.errors import ConfigError
from embodied.world_model_env import StateEnsembleModel, WorldModelEnv
from embodied.world_model_fidelity import (Segments, classifier_accuracy, open_loop_error, pearson,
                                           penalty_rank_correlation, rank, real_segments, reward_accuracy,
                                           spearman, uncertainty)
from sims.experts import expert

MAZE = "pointmaze-umaze"


@pytest.fixture(scope="module")
def maze_segments():
    torch.set_num_threads(1)
    return real_segments(MAZE, expert(MAZE, "expert", seed=3), num_segments=40, horizon=6, seed=3, noise_std=0.1)


class Oracle(nn.Module):
    """The real dynamics on the recorded transitions: a lookup of s' and r by the exact (s, a) bytes.
    Members are s' + m(s) v +/- sigma(s) w, so the member mean is off by exactly m(s) and the
    "disagreement" penalty is exactly sigma(s) (v, w orthonormal); m = sigma = 0 is the true model."""

    probabilistic = False

    def __init__(self, segments: Segments, offset=None, spread=None):
        super().__init__()
        s, a, r, s_next = segments.transitions()
        self.table = {(si.tobytes(), ai.tobytes()): (sn, ri) for si, ai, ri, sn in zip(s, a, r, s_next)}
        self.obs_dim, self.act_dim, self.num_members = s.shape[1], a.shape[1], 2
        self.offset, self.spread = offset, spread

    def predict(self, obs, act):
        rows = [self.table[(o.numpy().tobytes(), x.numpy().tobytes())] for o, x in zip(obs, act)]
        nxt = torch.as_tensor(np.stack([r[0] for r in rows]))
        rew = torch.as_tensor(np.asarray([r[1] for r in rows], np.float32))
        v, w = torch.zeros(self.obs_dim), torch.zeros(self.obs_dim)
        v[0], w[1] = 1.0, 1.0
        m = self.offset(obs)[:, None] if self.offset else torch.zeros(len(obs), 1)
        sd = self.spread(obs)[:, None] if self.spread else torch.zeros(len(obs), 1)
        means = torch.stack([nxt + m * v + sd * w, nxt + m * v - sd * w])
        return means, None, torch.stack([rew, rew])


def test_segments_are_real_consecutive_windows_inside_episodes(maze_segments):
    segs = maze_segments
    N, H = 40, 6
    assert segs.states.shape == (N, H + 1, 6) and segs.actions.shape == (N, H, 2)
    assert segs.rewards.shape == segs.success.shape == (N, H) and segs.success.dtype == np.bool_
    assert np.isfinite(segs.states).all() and (np.abs(segs.actions) <= 1).all()
    # pointmaze: reward 1 exactly on success, which ends the episode, so only a window's last step may succeed
    np.testing.assert_array_equal(segs.rewards == 1.0, segs.success)
    assert segs.success.any(), "the expert should reach the umaze goal within a few episodes"
    assert not segs.success[:, :-1].any()
    # back-to-back windows of one episode share their boundary state
    for i in range(N - 1):
        if segs.episode[i] == segs.episode[i + 1]:
            assert segs.start_step[i + 1] == segs.start_step[i] + H
            np.testing.assert_array_equal(segs.states[i, -1], segs.states[i + 1, 0])
    again = real_segments(MAZE, expert(MAZE, "expert", seed=3), num_segments=40, horizon=6, seed=3, noise_std=0.1)
    np.testing.assert_array_equal(again.states, segs.states)  # deterministic given the seed
    other = real_segments(MAZE, expert(MAZE, "expert", seed=3), num_segments=40, horizon=6, seed=4, noise_std=0.1)
    assert not np.array_equal(other.states, segs.states)


def test_locomotion_windows_have_no_success_flags():
    segs = real_segments("hopper", None, num_segments=3, horizon=4, seed=0)
    assert segs.success is None and segs.states.shape == (3, 5, 11) and np.isfinite(segs.rewards).all()


def test_the_true_dynamics_has_zero_open_loop_error_and_a_static_model_does_not(maze_segments):
    std = np.ones(6)
    res = open_loop_error(Oracle(maze_segments), maze_segments, state_std=std)
    assert res["finite"] and len(res["horizon"]) == 7
    for key in ("l2", "normalised"):
        np.testing.assert_allclose(res[key]["mean"], 0.0, atol=1e-7)
        np.testing.assert_allclose(res[key]["p97_5"], 0.0, atol=1e-7)

    class Static:
        def predict(self, obs, act):
            return obs[None].clone(), None, None

    stat = open_loop_error(Static(), maze_segments, state_std=std)
    l2 = stat["l2"]["mean"]
    assert l2[0] == 0.0 and (l2[1:] > 0).all() and l2[-1] > l2[1]  # the point moves away from its start
    st = maze_segments.states.astype(np.float64)
    np.testing.assert_allclose(l2, np.linalg.norm(st - st[:, :1], axis=-1).mean(0), rtol=1e-6)
    assert (stat["l2"]["ci95_low"] <= l2 + 1e-12).all() and (l2 <= stat["l2"]["ci95_high"] + 1e-12).all()
    # normalised = RMS over dimensions in units of the given std
    half = open_loop_error(Static(), maze_segments, state_std=np.full(6, 0.5))
    np.testing.assert_allclose(half["normalised"]["mean"], 2 * stat["normalised"]["mean"], rtol=1e-6)
    np.testing.assert_allclose(stat["normalised"]["mean"],
                               np.sqrt(((st - st[:, :1]) ** 2).mean(-1)).mean(0), rtol=1e-6)


def test_an_untrained_ensemble_drifts_finitely_from_zero(maze_segments):
    torch.set_num_threads(1)
    model = StateEnsembleModel(6, 2, num_members=3, hidden=16, layers=1, seed=0)
    res = open_loop_error(model, maze_segments)  # std from the model's (unfitted: ones) normaliser
    assert res["finite"] and res["l2"]["mean"][0] == 0.0 and (res["l2"]["mean"][1:] > 0).all()
    one = open_loop_error(model, maze_segments, member=1)
    assert one["member"] == 1 and not np.allclose(one["l2"]["mean"][1:], res["l2"]["mean"][1:])


def test_reward_accuracy_of_the_oracle_and_of_a_shifted_head(maze_segments):
    res = reward_accuracy(Oracle(maze_segments), maze_segments)
    assert res["mae"] == 0.0 and res["pearson"] == pytest.approx(1.0) and res["n"] == 40 * 6

    class Shifted(Oracle):
        def predict(self, obs, act):
            means, stds, rew = super().predict(obs, act)
            return means, stds, 2 * rew + 0.5

    res = reward_accuracy(Shifted(maze_segments), maze_segments)
    r = maze_segments.rewards
    assert res["mae"] == pytest.approx(np.abs(r + 0.5).mean()) and res["pearson"] == pytest.approx(1.0)


def test_rank_and_spearman():
    x = np.array([0.3, -1.0, 2.0, 5.0, 4.0])
    np.testing.assert_array_equal(rank(x), [1, 0, 2, 4, 3])
    np.testing.assert_array_equal(rank([2.0, 1.0, 2.0, 3.0]), [1.5, 0, 1.5, 3])
    assert spearman(x, np.exp(x)) == pytest.approx(1.0)  # monotone, far from linear
    assert spearman(x, -x ** 3) == pytest.approx(-1.0)
    assert pearson(x, np.exp(x)) < 0.99
    assert np.isnan(spearman(x, np.ones(5)))
    stats = pytest.importorskip("scipy.stats")
    rng = np.random.default_rng(0)
    a, b = rng.integers(0, 5, 200).astype(float), rng.normal(size=200)  # many ties
    b = b + a
    assert spearman(a, b) == pytest.approx(stats.spearmanr(a, b).statistic, abs=1e-12)


def test_penalty_rank_correlation_sees_a_penalty_that_tracks_or_inverts_the_error(maze_segments):
    err = lambda s: 0.01 + (s[:, 0] - s[:, 0].min()).abs() + 0.1 * s[:, 1].abs()  # varies per state
    good = Oracle(maze_segments, offset=err, spread=err)
    res = penalty_rank_correlation(good, maze_segments, penalty="disagreement")
    np.testing.assert_allclose(res["uncertainty"], res["error"], rtol=1e-4)
    assert res["spearman"] == pytest.approx(1.0)
    # a deterministic model asked for "max_std" gets the disagreement penalty, as WorldModelEnv does
    assert penalty_rank_correlation(good, maze_segments, penalty="max_std")["spearman"] == pytest.approx(1.0)
    bad = Oracle(maze_segments, offset=err, spread=lambda s: 1.0 / err(s))
    assert penalty_rank_correlation(bad, maze_segments, penalty="disagreement")["spearman"] == pytest.approx(-1.0)
    flat = Oracle(maze_segments, offset=err)  # the members agree: u = 0 everywhere, rho undefined
    assert np.isnan(penalty_rank_correlation(flat, maze_segments, penalty="disagreement")["spearman"])


def test_uncertainty_is_the_envs_own(maze_segments):
    torch.set_num_threads(1)
    model = StateEnsembleModel(6, 2, num_members=3, hidden=16, layers=1, seed=1)
    s, a, _, _ = maze_segments.transitions()
    means, stds, _ = model.predict(torch.as_tensor(s), torch.as_tensor(a))
    from embodied.data.dataset import Dataset
    ds = Dataset(observations=s, actions=a, rewards=np.zeros(len(s), np.float32), next_observations=s,
                 terminals=np.zeros(len(s), bool), timeouts=np.ones(len(s), bool))
    for penalty in ("max_std", "disagreement"):
        env = WorldModelEnv(model, ds, num_envs=2, penalty=penalty)
        torch.testing.assert_close(uncertainty(means, stds, penalty), env.uncertainty(means, stds))
    assert not torch.allclose(uncertainty(means, stds, "max_std"), uncertainty(means, stds, "disagreement"))


class Probabilities:
    def __init__(self, p):
        self.p = torch.as_tensor(p, dtype=torch.float32)

    def probability(self, states):
        assert len(states) == len(self.p)
        return self.p


def test_classifier_accuracy_on_hand_made_labels():
    p = [0.9, 0.6, 0.4, 0.1, 0.2, 0.7, 0.3, 0.05]
    y = [1, 1, 1, 0, 0, 0, 0, 0]  # tp 2, fn 1, fp 1, tn 4
    res = classifier_accuracy(Probabilities(p), np.zeros((8, 3)), y)
    assert (res["tp"], res["fn"], res["fp"], res["tn"]) == (2, 1, 1, 4)
    assert res["accuracy"] == pytest.approx(6 / 8)
    assert res["precision"] == pytest.approx(2 / 3) and res["recall"] == pytest.approx(2 / 3)
    assert res["balanced_accuracy"] == pytest.approx((2 / 3 + 4 / 5) / 2)
    never = classifier_accuracy(Probabilities(np.zeros(8)), np.zeros((8, 3)), y)
    assert never["accuracy"] == pytest.approx(5 / 8) and np.isnan(never["precision"]) and never["recall"] == 0
    assert never["balanced_accuracy"] == pytest.approx(0.5)  # what "always no" is worth
    with pytest.raises(ConfigError, match="8 states but 5 labels"):
        classifier_accuracy(Probabilities(p), np.zeros((8, 3)), y[:5])


@pytest.mark.slow  # a few seconds on 2 cores
def test_benchmark_quick_writes_json_and_plots(tmp_path, run_benchmark):
    run_benchmark("world_model_fidelity.py", "--quick", "--out", str(tmp_path), timeout=240)
    (path,) = tmp_path.glob("world_model_fidelity-quick-*.json")
    out = json.loads(path.read_text())
    assert out["threads"] == 1 and "avx512_bf16" in out["cpu"] and out["arguments"]["quick"] is True
    assert "--quick" in out["command"]
    hopper, maze = out["tasks"]["hopper"], out["tasks"]["pointmaze-umaze"]
    assert hopper["classifier_accuracy"] is None and maze["classifier_accuracy"]["n"] == 8 * 5
    for task in (hopper, maze):
        ol = task["open_loop"]
        assert ol["l2"]["mean"][0] == 0.0 and len(ol["l2"]["mean"]) == 6 and ol["finite"]
        assert -1 <= task["penalty_rank_correlation"]["max_std"]["spearman"] <= 1
    pngs = sorted(p.name for p in (tmp_path / "world_model_fidelity-quick").glob("*.png"))
    assert pngs == ["open_loop_error_vs_horizon.png", "penalty_vs_true_error.png", "reward_predicted_vs_real.png"]
