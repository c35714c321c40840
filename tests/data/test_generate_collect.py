import gymnasium as gym
import numpy as np
import pytest

import sims
from embodied.data.generate import collect


class Line(gym.Env):
    """A point on a line: reaches x >= 1 -> terminated (success); 6 steps -> truncated."""

    observation_space = gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)
    action_space = gym.spaces.Box(-0.5, 0.5, (1,), np.float32)

    def __init__(self, dict_obs=True):
        self.dict_obs = dict_obs

    def _obs(self):
        state = np.array([self.x, self.t], np.float32)
        return {"observation.state": state} if self.dict_obs else state

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.x, self.t = 0.0, 0
        return self._obs(), {}

    def step(self, action):
        self.x += float(action[0])
        self.t += 1
        done = self.x >= 1.0
        return self._obs(), float(done), done, self.t >= 6 and not done, {"success": done}


class Pusher:
    def __init__(self):
        self.resets = 0

    def reset(self):
        self.resets += 1

    def __call__(self, state):
        return np.array([0.5], np.float32)


def test_collect_records_terminals_timeouts_and_cut():
    policy = Pusher()
    ds = collect(Line(), policy, 7, progress=False)
    ds.validate(obs_dim=2, act_dim=1)
    # x: 0.5, 1.0 -> terminated at step 2; 3 episodes of 2 steps; the 7th step is cut
    assert ds.terminals.tolist() == [0, 1, 0, 1, 0, 1, 0]
    assert ds.timeouts.tolist() == [0, 0, 0, 0, 0, 0, 1]
    np.testing.assert_array_equal(ds.next_observations[0], [0.5, 1])
    assert ds.metadata["episodes"] == 4 and ds.metadata["success_episodes"] == 3
    assert policy.resets == 4  # before each episode


def test_collect_random_and_noise_stay_in_bounds_and_are_seeded():
    ds = collect(Line(dict_obs=False), None, 30, seed=3, progress=False)
    assert ds.actions.min() >= -0.5 and ds.actions.max() <= 0.5
    assert ds.timeouts.any() and ds.metadata["policy"] == "uniform-random"
    noisy = collect(Line(), Pusher(), 30, noise_std=2.0, seed=3, progress=False)
    assert np.abs(noisy.actions).max() == pytest.approx(0.5)  # clipped
    again = collect(Line(), Pusher(), 30, noise_std=2.0, seed=3, progress=False)
    np.testing.assert_array_equal(noisy.actions, again.actions)


def test_collect_with_real_sims():
    env = sims.make("pointmaze-umaze", seed=0)
    ds = collect(env, sims.expert("pointmaze-umaze", "expert"), 40, noise_std=0.1, progress=False)
    env.close()
    spec = sims.spec("pointmaze-umaze")
    ds.validate(spec.obs_dim, spec.act_dim)
    assert len(ds) == 40 and ds.episode_ends()[-1]
