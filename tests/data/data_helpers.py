"""Small hand-made datasets whose values show where every row came from (shared by tests/data)."""
import numpy as np

from embodied.data.dataset import Episode


def make_episodes(lengths, endings, obs_dim=3, act_dim=2, start=0):
    """Episodes whose observation rows are [k, k, ...] for a global step counter k (so chains are
    easy to check) and rewards k / 10."""
    episodes, k = [], start
    for length, ending in zip(lengths, endings):
        obs = np.repeat(np.arange(k, k + length + 1, dtype=np.float32)[:, None], obs_dim, axis=1)
        actions = np.repeat(np.arange(k, k + length, dtype=np.float32)[:, None] / 100, act_dim, axis=1)
        rewards = np.arange(k, k + length, dtype=np.float32) / 10
        episodes.append(Episode(obs, actions, rewards, terminated=ending == "terminal", truncated=ending == "timeout"))
        k += length + 1
    return episodes
