"""WorldModelEnv: the gymnasium 1.x vector contract (checked by hand: gymnasium has no vector-env
checker), autoreset, horizon truncation, the disagreement penalty, seeding, dataset starts, classifier
termination, and the small models it ships with."""
from __future__ import annotations

import gymnasium
import numpy as np
import pytest
import torch
from gymnasium.vector import AutoresetMode
from torch import nn

from embodied.constants import STATE_KEY
from embodied.data.dataset import Dataset
from embodied.errors import ConfigError
from embodied.world_model_env import StateEnsembleModel, SuccessClassifier, TDMPC2LatentModel, WorldModelEnv

OBS, ACT = 3, 2


def linear_dataset(episodes=8, steps=20, seed=0) -> Dataset:
    """s' = s + 0.1 * [a0, a1, a0 - a1]; reward = -||s'||; episodes start at random states."""
    rng = np.random.default_rng(seed)
    eps = []
    for _ in range(episodes):
        s = [rng.normal(size=OBS).astype(np.float32)]
        acts = rng.uniform(-1, 1, size=(steps, ACT)).astype(np.float32)
        for a in acts:
            s.append(s[-1] + 0.1 * np.array([a[0], a[1], a[0] - a[1]], np.float32))
        obs = np.stack(s)
        eps.append({"observations": obs, "actions": acts, "rewards": -np.linalg.norm(obs[1:], axis=1)})
    return Dataset.from_episodes(eps)


class HandEnsemble(nn.Module):
    """Deterministic members: member k predicts s + pad(a) + spread * (k - (K-1)/2); reward = 1."""

    probabilistic = False

    def __init__(self, spread: float, members: int = 4):
        super().__init__()
        self.obs_dim, self.act_dim, self.num_members, self.spread = OBS, ACT, members, spread

    def encode(self, s):
        return s

    def predict(self, s, a):
        base = s + torch.cat([a, torch.zeros(len(a), OBS - ACT)], -1)
        offsets = (torch.arange(self.num_members, dtype=torch.float32) - (self.num_members - 1) / 2) * self.spread
        means = base[None] + offsets[:, None, None]
        return means, None, torch.ones(self.num_members, len(s))


def test_spaces_shapes_dtypes_and_metadata():
    ds = linear_dataset()
    env = WorldModelEnv(HandEnsemble(0.0), ds, num_envs=5, horizon=4, seed=0)
    assert isinstance(env, gymnasium.vector.VectorEnv)
    assert env.metadata["autoreset_mode"] == AutoresetMode.NEXT_STEP
    assert env.single_observation_space[STATE_KEY].shape == (OBS,)
    assert env.single_observation_space[STATE_KEY].dtype == np.float32
    assert env.single_action_space.shape == (ACT,) and env.single_action_space.dtype == np.float32
    assert env.observation_space[STATE_KEY].shape == (5, OBS)
    assert env.action_space.shape == (5, ACT)
    obs, info = env.reset(seed=1)
    assert set(obs) == {STATE_KEY} and obs[STATE_KEY].dtype == np.float32 and obs[STATE_KEY].shape == (5, OBS)
    assert env.observation_space.contains(obs) and isinstance(info, dict)
    obs, r, term, trunc, info = env.step(env.action_space.sample())
    assert env.observation_space.contains(obs)
    assert r.shape == (5,) and r.dtype == np.float32
    assert term.shape == trunc.shape == (5,) and term.dtype == trunc.dtype == np.bool_
    for key in ("penalty", "model_reward"):
        assert info[key].shape == (5,) and info[f"_{key}"].dtype == np.bool_
    with pytest.raises(ConfigError):
        env.step(np.zeros((5, ACT + 1), np.float32))


def test_gymnasium_has_no_vector_checker_so_the_tests_check_by_hand():
    from gymnasium.utils.env_checker import check_env
    env = WorldModelEnv(HandEnsemble(0.0), linear_dataset(episodes=1), num_envs=2)
    with pytest.raises(TypeError, match="gymnasium.Env"):
        check_env(env)  # single-env checker only (gymnasium 1.x)


def test_bad_knobs_raise():
    ds = linear_dataset(episodes=1)
    for kwargs in ({"horizon": 0}, {"num_envs": 0}, {"penalty": "nope"}, {"penalty_weight": -1.0}):
        with pytest.raises(ConfigError, match=f"^{next(iter(kwargs))}="):
            WorldModelEnv(HandEnsemble(0.0), ds, **{"num_envs": 2, **kwargs})
    with pytest.raises(ConfigError, match="obs_dim"):
        WorldModelEnv(StateEnsembleModel(OBS + 1, ACT, hidden=4, layers=1), ds, num_envs=2)


def test_truncation_at_horizon_then_next_step_autoreset():
    ds = linear_dataset()
    env = WorldModelEnv(HandEnsemble(0.0), ds, num_envs=4, horizon=3, seed=0)
    obs, info = env.reset(seed=0)
    act = np.full((4, ACT), 0.5, np.float32)
    for t in range(3):
        prev = obs[STATE_KEY]
        obs, r, term, trunc, info = env.step(act)
        np.testing.assert_allclose(obs[STATE_KEY][:, :ACT], prev[:, :ACT] + 0.5, atol=1e-6)
        assert not term.any()
        assert trunc.all() == (t == 2) and trunc.any() == (t == 2)
        np.testing.assert_allclose(r, 1.0)
    # NEXT_STEP: this step ignores the action, resets every sub-env to a dataset state, reward 0
    obs, r, term, trunc, info = env.step(act)
    assert not term.any() and not trunc.any() and (r == 0).all()
    assert not info["_penalty"].any() and info["_start_index"].all()
    np.testing.assert_array_equal(obs[STATE_KEY], ds.observations[info["start_index"]])
    obs, r, term, trunc, info = env.step(act)  # the new rollouts run again
    np.testing.assert_allclose(r, 1.0)
    assert not trunc.any()


def test_rollouts_start_from_dataset_states():
    ds = linear_dataset()
    env = WorldModelEnv(HandEnsemble(0.0), ds, num_envs=64, seed=3)
    obs, info = env.reset()
    np.testing.assert_array_equal(obs[STATE_KEY], ds.observations[info["start_index"]])
    assert len(set(info["start_index"].tolist())) > 10  # spread over the dataset, not one state


def test_penalty_grows_with_disagreement():
    ds = linear_dataset()
    act = np.zeros((8, ACT), np.float32)
    means = []
    for spread in (0.0, 0.1, 0.5, 2.0):
        env = WorldModelEnv(HandEnsemble(spread), ds, num_envs=8, penalty="disagreement", penalty_weight=2.0, seed=0)
        env.reset(seed=0)
        _, r, _, _, info = env.step(act)
        offsets = (np.arange(4) - 1.5) * spread
        np.testing.assert_allclose(info["penalty"], np.sqrt(OBS) * offsets.std(), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(r, 1.0 - 2.0 * info["penalty"], rtol=1e-5, atol=1e-6)
        means.append(float(r.mean()))
    assert means[0] == pytest.approx(1.0) and all(a > b for a, b in zip(means, means[1:]))


def test_max_std_penalty_of_a_probabilistic_model():
    ds = linear_dataset(episodes=2)
    model = StateEnsembleModel(OBS, ACT, num_members=3, hidden=16, layers=1)
    env = WorldModelEnv(model, ds, num_envs=6, penalty="max_std", penalty_weight=0.5, seed=0)
    obs, _ = env.reset(seed=0)
    a = np.zeros((6, ACT), np.float32)
    _, r, _, _, info = env.step(a)
    with torch.no_grad():
        _, std, rew = model.predict(torch.as_tensor(obs[STATE_KEY]), torch.as_tensor(a))
    want = std.norm(dim=-1).max(0).values.numpy()
    np.testing.assert_allclose(info["penalty"], want, rtol=1e-5)
    np.testing.assert_allclose(r, rew.mean(0).numpy() - 0.5 * want, rtol=1e-4, atol=1e-5)


def _trace(env, seed, steps=7):
    obs, _ = env.reset(seed=seed)
    env.action_space.seed(seed)
    out = [obs[STATE_KEY]]
    for _ in range(steps):
        obs, r, *_ = env.step(env.action_space.sample())
        out += [obs[STATE_KEY], r]
    return out


def test_determinism_with_a_seed():
    ds = linear_dataset()
    model = StateEnsembleModel(OBS, ACT, num_members=3, hidden=16, layers=1)
    make = lambda: WorldModelEnv(model, ds, num_envs=8, horizon=3, seed=0)  # noqa: E731
    a, b, c = _trace(make(), 5), _trace(make(), 5), _trace(make(), 6)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)
    assert any(not np.array_equal(x, y) for x, y in zip(a, c))


def hand_classifier() -> SuccessClassifier:
    """P(success | s) = sigmoid(20 * (s_0 - 0.5)): success iff s_0 > 0.5."""
    clf = SuccessClassifier(OBS)
    lin = nn.Linear(OBS, 1)
    with torch.no_grad():
        lin.weight.zero_(); lin.weight[0, 0] = 20.0; lin.bias.fill_(-10.0)
    clf.net = lin
    return clf


def test_classifier_decides_reward_and_termination():
    ds = linear_dataset()
    ds.observations[:] = 0.0  # every rollout starts at the origin
    env = WorldModelEnv(HandEnsemble(0.0), ds, num_envs=4, horizon=5, classifier=hand_classifier(),
                        penalty_weight=0.0, seed=0)
    env.reset(seed=0)
    act = np.array([[1.0, 0], [-1.0, 0], [0.2, 0], [0.8, 0]], np.float32)  # s_0 -> 1, -1, 0.2, 0.8
    _, r, term, trunc, info = env.step(act)
    np.testing.assert_array_equal(term, [True, False, False, True])
    np.testing.assert_array_equal(info["success"], term)
    np.testing.assert_array_equal(r, [1.0, 0.0, 0.0, 1.0])
    assert not trunc.any()
    obs, r, term, _, _ = env.step(act)  # the two that succeeded reset; the others keep going
    np.testing.assert_array_equal(obs[STATE_KEY][[0, 3]], 0.0)
    np.testing.assert_array_equal(r, [0.0, 0.0, 0.0, 0.0])  # resetting rows, and s_0 = -2, 0.4 fail
    np.testing.assert_array_equal(term, [False, False, False, False])
    _, _, term, _, _ = env.step(act)
    np.testing.assert_array_equal(term, [True, False, True, True])  # 0.6 > 0.5 now succeeds too


def test_random_actions_through_the_project_rollout_helper():
    """What an on-policy learner does with a vector env: sims.vector.rollout drives it (NEXT_STEP)."""
    from sims.vector import rollout
    ds = linear_dataset()
    model = StateEnsembleModel(OBS, ACT, num_members=3, hidden=16, layers=1)
    env = WorldModelEnv(model, ds, num_envs=4, horizon=5, classifier=SuccessClassifier(OBS), seed=0)
    out = rollout(env, None, num_steps=23, seed=0)
    assert out["observations"].shape[1] == OBS and out["actions"].shape[1] == ACT
    assert len(out["episode_returns"]) >= 4 * 3  # every rollout ends within 5 steps
    assert np.isfinite(out["rewards"]).all()


@pytest.mark.slow  # a few seconds on 2 cores
def test_fitted_models_learn_the_dataset():
    ds = linear_dataset(episodes=20)
    model = StateEnsembleModel(OBS, ACT, num_members=3, hidden=32, layers=2)
    model.fit(ds, steps=300, batch_size=128)
    with torch.no_grad():
        mean, std, rew = model.predict(torch.as_tensor(ds.observations), torch.as_tensor(ds.actions))
    err = (mean - torch.as_tensor(ds.next_observations)).abs().mean().item()
    step = np.abs(ds.next_observations - ds.observations).mean()
    assert err < 0.3 * step, (err, step)
    labels = Dataset(**{**ds.arrays(), "terminals": ds.next_observations[:, 0] > 0.5})
    clf = SuccessClassifier(OBS)
    assert clf.fit(labels, steps=300)["accuracy"] > 0.9


def test_tdmpc2_latent_option():
    from policies.tdmpc2 import TDMPC2Policy
    ds = linear_dataset(episodes=2)
    policy = TDMPC2Policy(OBS, ACT, latent_dim=16, enc_dim=16, mlp_dim=16, num_q=2, simnorm_dim=8, num_bins=11,
                          episodic=True)
    env = WorldModelEnv(TDMPC2LatentModel(policy), ds, num_envs=3, horizon=2, seed=0)
    obs, info = env.reset(seed=0)
    assert obs[STATE_KEY].shape == (3, 16)  # observations are latents
    with torch.no_grad():
        z = policy.encode(torch.as_tensor(ds.observations[info["start_index"]])).numpy()
    np.testing.assert_allclose(obs[STATE_KEY], z, rtol=1e-5, atol=1e-6)
    obs, r, term, trunc, info = env.step(env.action_space.sample())
    assert obs[STATE_KEY].dtype == np.float32 and (info["penalty"] == 0).all() and r.dtype == np.float32


@pytest.mark.slow
@pytest.mark.parametrize("env", ["pointmaze-umaze", "hopper"])   # sparse (a success classifier) and dense
def test_throughput_benchmark_smoke(tmp_path, env):
    import importlib.util
    from pathlib import Path
    path = Path(__file__).resolve().parents[1] / "benchmarks" / "world_model_throughput.py"
    spec = importlib.util.spec_from_file_location("world_model_throughput", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    threads = torch.get_num_threads()
    try:
        result = bench.main(["--env", env, "--real-steps", "200", "--imagined-steps", "3", "--rounds", "1",
                             "--batch", "16", "--out", str(tmp_path)])
    finally:
        torch.set_num_threads(threads)  # the script pins one thread for its own process
    assert result["real_steps_per_s"] > 0 and all(v["ratio"] > 0 for v in result["imagined"].values())
    assert result["env"] == env and result["success_classifier"] == (env == "pointmaze-umaze")
    assert list(tmp_path.glob(f"world_model_throughput-{env}-*.json"))


def test_chunked_env_runs_rows_open_loop_to_the_horizon_and_restarts_in_the_same_step():
    """The contract DPPO rolls out against (sims' make_vec with autoreset="same_step" and chunks)."""
    from embodied.world_model_env import ChunkedWorldModelEnv

    ds = linear_dataset()
    env = ChunkedWorldModelEnv(WorldModelEnv(HandEnsemble(0.0), ds, num_envs=3, horizon=3, seed=0), execute_horizon=2)
    pad = lambda x: np.array([x, x, 0.0], np.float32)  # HandEnsemble: s' = s + [a0, a1, 0], reward 1
    obs, _ = env.reset(seed=0)
    s0 = obs[STATE_KEY]
    chunk = np.full((3, 2, ACT), 0.5, np.float32)
    obs, reward, term, trunc, info = env.step(chunk)
    np.testing.assert_allclose(obs[STATE_KEY], s0 + pad(1.0), atol=1e-6)  # both rows ran
    assert (info["executed"] == 2).all() and np.allclose(reward, 2.0) and not (term | trunc).any()
    assert not info["_final_obs"].any()
    s1 = obs[STATE_KEY]
    obs, reward, term, trunc, info = env.step(chunk)
    # the third imagined step reaches the horizon: one row runs, the rollout is cut, its last state is kept
    assert (info["executed"] == 1).all() and trunc.all() and not term.any() and np.allclose(reward, 1.0)
    final = np.stack([f[STATE_KEY] for f in info["final_obs"]])
    np.testing.assert_allclose(final, s1 + pad(0.5), atol=1e-6)
    # same-step autoreset: what comes back is already a fresh start state from the dataset
    assert all(np.isclose(ds.observations, o, atol=1e-6).all(1).any() for o in obs[STATE_KEY])
    obs, reward, term, trunc, info = env.step(chunk)
    assert (info["executed"] == 2).all() and not (term | trunc).any()  # the new rollouts run whole chunks again


def test_imagination_config_names_the_bad_key_and_the_fix():
    from embodied.world_model_env import ImaginationConfig

    with pytest.raises(ConfigError, match=r"algo.world_model.horizn is not an option; valid: .*horizon"):
        ImaginationConfig.from_dict({"horizn": 5})
    with pytest.raises(ConfigError, match=r"algo.world_model.penalty_weight=-1 must be >= 0"):
        ImaginationConfig.from_dict({"penalty_weight": -1})
    with pytest.raises(ConfigError, match=r"algo.world_model.starts='demos': choose model .* or policy"):
        ImaginationConfig.from_dict({"starts": "demos"})
    assert ImaginationConfig.from_dict({"horizon": 5}).horizon == 5
