"""Vectorised envs: sync and async (forkserver; spawn when rendering) give the same rollouts."""
import numpy as np
import pytest

from embodied.errors import UserError
from sims.vector import default_context, make_vec, rollout

pytestmark = [pytest.mark.filterwarnings("ignore:.*precision lowered"),
              pytest.mark.filterwarnings("ignore:.*Box observation space m")]


def _actions(n, steps, seed=0):
    return np.random.default_rng(seed).uniform(-1, 1, size=(steps, n, 5)).astype(np.float32)


def _run(vec, actions):
    obs, _ = vec.reset(seed=0)
    states = [obs["observation.state"].copy()]
    dones = []
    for a in actions:
        obs, reward, terminated, truncated, info = vec.step(a)
        states.append(obs["observation.state"].copy())
        dones.append(terminated | truncated)
    return np.stack(states), np.stack(dones)


@pytest.mark.slow
def test_sync_and_async_agree_and_autoreset():
    actions = _actions(2, 30)
    sync = make_vec("cube-single", 2, seed=0, max_episode_steps=12)
    assert sync.observation_space["observation.state"].shape == (2, 28)
    s_states, s_dones = _run(sync, actions)
    sync.close()
    asyn = make_vec("cube-single", 2, asynchronous=True, seed=0, max_episode_steps=12)
    a_states, a_dones = _run(asyn, actions)
    asyn.close()
    np.testing.assert_allclose(s_states, a_states, rtol=1e-5, atol=1e-5)  # same physics in the workers
    np.testing.assert_array_equal(s_dones, a_dones)
    assert s_dones[11].all() and not s_dones[:11].any()  # the 12-step limit, then autoreset
    assert not np.allclose(s_states[0, 0], s_states[0, 1])  # env i is seeded seed + i


@pytest.mark.slow
def test_rollout_collects_transitions_and_episode_stats():
    vec = make_vec("cube-single", 2, seed=1, max_episode_steps=10)
    out = rollout(vec, None, 25, seed=1)
    vec.close()
    # 25 vector steps, each env: 10 + 10 + 3 real steps, two reset-only steps skipped
    assert out["observations"].shape == (46, 28) and out["actions"].shape == (46, 5)
    assert out["timeouts"].sum() == 4 and len(out["episode_returns"]) == 4
    assert np.all(out["episode_returns"] == -10.0) and not out["episode_successes"].any()


@pytest.mark.slow
def test_async_rendering_uses_spawn_and_returns_frames():
    assert default_context(renders=True) == "spawn"
    vec = make_vec("cube-single", 1, asynchronous=True, seed=0, images=("front",), image_size=32, language=True)
    obs, _ = vec.reset(seed=0)
    obs, *_ = vec.step(np.zeros((1, 5), np.float32))
    vec.close()
    frames = obs["observation.images.front"]
    assert frames.shape == (1, 32, 32, 3) and frames.dtype == np.uint8 and frames.std() > 0
    assert "red cube" in obs["task"][0]


def test_bad_requests():
    with pytest.raises(UserError, match="cube-single"):
        make_vec("cube-singel", 2)
    with pytest.raises(UserError, match="num_envs"):
        make_vec("cube-single", 0)
    with pytest.raises(UserError, match="spawn"):
        make_vec("cube-single", 2, asynchronous=True, context="fork", images=("front",))
