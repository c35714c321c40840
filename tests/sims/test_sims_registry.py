"""Registry, contract-shaped observations, seeding and score normalisation for every task."""
import gymnasium
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import sims
from embodied.errors import UserError
from sims import wrappers

ALL = sims.names()
LIGHT = {"hopper", "halfcheetah", "walker2d", "ant", "inverted-pendulum", "pendulum", "pointmaze-umaze", "pointmaze-medium", "pointmaze-large",
         "pointmaze-medium-anystart", "pointmaze-large-anystart"}
# every task, the manipulation scenes (seconds each to build and check) in the slow tier
ALL_BY_COST = [name if name in LIGHT else pytest.param(name, marks=pytest.mark.slow) for name in ALL]


def test_names_cover_the_contract():
    assert set(ALL) >= LIGHT


@pytest.mark.filterwarnings("ignore:.*different from the unwrapped version")  # ours, on purpose
@pytest.mark.filterwarnings("ignore:.*Box observation space m")  # unbounded states, as upstream
@pytest.mark.parametrize("name", ALL_BY_COST)
def test_env_checker_passes(name):
    env = sims.make(name)
    check_env(env, skip_render_check=True)  # raises on any contract breach
    env.close()


@pytest.mark.parametrize("name", ALL_BY_COST)
def test_dict_observation_matches_spec(name):
    spec = sims.spec(name)
    env = sims.make(name, seed=0)
    obs, info = env.reset()
    assert list(obs) == ["observation.state"]
    assert obs["observation.state"].dtype == np.float32
    assert obs["observation.state"].shape == (spec.obs_dim,)
    assert env.action_space.shape == (spec.act_dim,)
    assert env.action_space.dtype == np.float32
    assert np.all(env.action_space.low == -1) and np.all(env.action_space.high == 1)
    assert env.spec.max_episode_steps == spec.max_episode_steps
    obs, reward, terminated, truncated, info = env.step(env.action_space.sample())
    assert obs["observation.state"].dtype == np.float32
    assert isinstance(reward, float)
    assert ("success" in info) == spec.has_success
    env.close()


def _rollout(name, seed, steps=20):
    env = sims.make(name, seed=seed)
    states = [env.reset()[0]["observation.state"]]
    for _ in range(steps):
        states.append(env.step(env.action_space.sample())[0]["observation.state"])
    env.close()
    return np.stack(states)


@pytest.mark.parametrize("name", ["hopper", "pointmaze-umaze"])
def test_seed_makes_rollouts_reproducible(name):
    np.testing.assert_array_equal(_rollout(name, 7), _rollout(name, 7))
    assert not np.array_equal(_rollout(name, 7), _rollout(name, 8))


def test_unknown_name_lists_valid_names():
    with pytest.raises(UserError) as err:
        sims.make("hoppper")
    message = str(err.value)
    assert "\n" not in message and "hoppper" in message
    assert all(name in message for name in ALL)
    with pytest.raises(UserError) as err:
        sims.spec("nope")
    assert "nope" in str(err.value) and all(name in str(err.value) for name in ALL)


def test_normalized_score_math():
    spec = sims.spec("hopper")
    assert sims.normalized_score("hopper", spec.ref_min_score) == pytest.approx(0.0)
    assert sims.normalized_score("hopper", spec.ref_max_score) == pytest.approx(100.0)
    midpoint = (spec.ref_min_score + spec.ref_max_score) / 2
    assert sims.normalized_score("hopper", midpoint) == pytest.approx(50.0)
    assert sims.normalized_score("pointmaze-large", 1.0) == pytest.approx(100.0)
    assert sims.normalized_score("pointmaze-large", 0.0) == pytest.approx(0.0)
    locomotion = ("hopper", "halfcheetah", "walker2d", "ant")
    assert all(sims.spec(name).approximate_normalization for name in locomotion)


def test_normalized_score_is_none_without_reference():
    spec = sims.TaskSpec("scratch", "X-v0", 1, 1, 10, None, None, False, False, False)
    sims.register_task(spec)(lambda *a, **k: None)
    try:
        assert sims.normalized_score("scratch", 3.0) is None
    finally:
        sims.registry._TASKS.pop("scratch")


class _WideActions(gymnasium.Env):
    """An env whose actions live in [0, 4]: records what it received."""

    observation_space = gymnasium.spaces.Box(-1.0, 1.0, (1,), np.float32)
    action_space = gymnasium.spaces.Box(0.0, 4.0, (2,), np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(1, np.float32), {}

    def step(self, action):
        self.received = action
        return np.zeros(1, np.float32), 0.0, False, False, {}


def test_actions_rescaled_only_when_bounds_differ():
    env = wrappers.unit_actions(_WideActions())
    assert np.all(env.action_space.low == -1) and np.all(env.action_space.high == 1)
    env.reset(seed=0)
    env.step(np.array([-1.0, 1.0], np.float32))
    np.testing.assert_allclose(env.unwrapped.received, [0.0, 4.0])
    hopper = sims.make("hopper")
    assert not any(isinstance(w, gymnasium.wrappers.RescaleAction)
                   for w in _wrapper_chain(hopper))
    maze = sims.make("pointmaze-umaze")  # PointMaze's bounds are [-1, 1] already
    assert not any(isinstance(w, gymnasium.wrappers.RescaleAction) for w in _wrapper_chain(maze))


def _wrapper_chain(env):
    while isinstance(env, gymnasium.Wrapper):
        yield env
        env = env.env


def test_pendulum_renders_at_the_requested_size():
    """Pendulum-v1 draws with pygame, off-screen, at its own 500 px unless told: the contract's render_size holds."""
    env = sims.make("pendulum", seed=0, render=True, render_size=48)
    env.reset(seed=0)
    frame = env.render()
    assert frame.shape == (48, 48, 3) and frame.dtype == np.uint8
    assert frame.min() < 128 < frame.max()  # the rod is drawn on the white background
    env.close()
