"""ChunkedActionWrapper (real PointMaze physics) and the runner's per-env chunk actor."""
import numpy as np
import pytest

import sims
from embodied.evaluation import ChunkActor
from embodied.errors import UserError
from sims.wrappers import ChunkedActionWrapper


def test_chunk_steps_match_single_steps():
    a = ChunkedActionWrapper(sims.make("pointmaze-umaze"), execute_horizon=3)
    b = sims.make("pointmaze-umaze")
    oa, _ = a.reset(seed=3)
    ob, _ = b.reset(seed=3)
    np.testing.assert_array_equal(oa["observation.state"], ob["observation.state"])
    chunk = np.random.default_rng(0).uniform(-1, 1, (5, 2)).astype(np.float32)
    obs, reward, term, trunc, info = a.step(chunk)
    total = 0.0
    for row in chunk[:3]:  # only the execute horizon runs
        ob, r, *_ = b.step(row)
        total += r
    np.testing.assert_allclose(obs["observation.state"], ob["observation.state"])
    assert reward == pytest.approx(total) and info["executed"] == 3
    assert len(info["chunk"]["rewards"]) == 3 and a.action_space.shape == (3, 2)
    np.testing.assert_allclose(info["chunk"]["next_observations"][-1]["observation.state"], ob["observation.state"])
    with pytest.raises(UserError, match=r"\[H, 2\]"):
        a.step(np.zeros((2, 3), np.float32))


def test_chunk_stops_at_episode_end():
    env = ChunkedActionWrapper(sims.make("pointmaze-umaze"))
    env.reset(seed=0)
    steps = 0
    while True:
        _, _, term, trunc, info = env.step(np.zeros((7, 2), np.float32))
        steps += info["executed"]
        if term or trunc:
            break
    assert steps == sims.spec("pointmaze-umaze").max_episode_steps and info["executed"] <= 7


def test_chunk_actor_runs_chunks_open_loop_with_history():
    calls = []

    def chunk_fn(obs_seq):
        calls.append(obs_seq.copy())
        start = len(calls) * 10
        return np.arange(start, start + 4, dtype=np.float32)[None, :, None]

    actor = ChunkActor(chunk_fn, obs_horizon=2, execute_horizon=3)
    actions = [float(actor(np.array([s], np.float32))[0]) for s in range(7)]
    assert actions == [10, 11, 12, 20, 21, 22, 30]
    np.testing.assert_array_equal(calls[0][0, :, 0], [0, 0])  # padded history at the episode start
    np.testing.assert_array_equal(calls[1][0, :, 0], [2, 3])
    actor.reset()
    actor(np.array([9], np.float32))
    np.testing.assert_array_equal(calls[-1][0, :, 0], [9, 9])
