import numpy as np
import pytest

from embodied.data.dataset import Dataset, Episode, concat
from embodied.errors import DatasetError, UserError

from data_helpers import make_episodes


def test_from_episodes_layout(small_dataset):
    ds = small_dataset
    assert len(ds) == 9 and ds.num_episodes == 3
    assert ds.observations.dtype == np.float32 and ds.terminals.dtype == bool
    assert ds.terminals.tolist() == [0, 0, 0, 1, 0, 0, 0, 0, 0]
    assert ds.timeouts.tolist() == [0, 0, 0, 0, 0, 0, 1, 0, 1]
    assert ds.episode_ends().tolist() == [0, 0, 0, 1, 0, 0, 1, 0, 1]
    np.testing.assert_array_equal(ds.next_observations[:3], ds.observations[1:4])
    ds.validate(obs_dim=3, act_dim=2)


def test_from_episodes_accepts_dicts_and_marks_open_episode_as_timeout():
    ep = make_episodes([2], [None])[0]
    ds = Dataset.from_episodes([{"observations": ep.observations, "actions": ep.actions, "rewards": ep.rewards}])
    assert ds.timeouts.tolist() == [False, True] and not ds.terminals.any()


def test_episode_round_trip(small_dataset):
    episodes = small_dataset.episodes()
    assert [len(e) for e in episodes] == [4, 3, 2]
    assert [(e.terminated, e.truncated) for e in episodes] == [(True, False), (False, True), (False, True)]
    again = Dataset.from_episodes(episodes)
    for key, value in small_dataset.arrays().items():
        np.testing.assert_array_equal(getattr(again, key), value)


def test_episode_returns(small_dataset):
    # rewards are step/10 with steps 0-3, 5-7, 9-10
    np.testing.assert_allclose(small_dataset.episode_returns(), [0.6, 1.8, 1.9], rtol=1e-6)


def test_last_row_is_always_an_end(small_dataset):
    ds = small_dataset.select_episodes([0, 1])
    ds.terminals[-1] = ds.timeouts[-1] = False
    assert ds.episode_ends()[-1] and ds.num_episodes == 2


def test_split_and_concat(small_dataset):
    train, val = small_dataset.split(0.5, seed=1)
    assert train.num_episodes + val.num_episodes == 3 and len(train) + len(val) == 9
    both = concat([small_dataset, small_dataset])
    assert len(both) == 18 and both.num_episodes == 6
    open_ended = small_dataset.select_episodes([0])
    open_ended.terminals[-1] = False
    joined = Dataset.concat([open_ended, small_dataset])
    assert joined.timeouts[3] and joined.num_episodes == 4  # the unflagged end became a cut


# ------------------------------------------------------------------------------- mc_returns
def tiny(rewards, terminals, timeouts):
    n = len(rewards)
    return Dataset(np.zeros((n, 1), np.float32), np.zeros((n, 1), np.float32), np.asarray(rewards, np.float32),
                   np.zeros((n, 1), np.float32), np.asarray(terminals, bool), np.asarray(timeouts, bool))


def test_mc_returns_by_hand():
    g = 0.5
    ds = tiny([1, 2, 3, 4, 5], [0, 0, 1, 0, 0], [0, 0, 0, 0, 1])
    # episode 1 (terminal): 1+.5*2+.25*3, 2+.5*3, 3 ; episode 2 (timeout, truncated): 4+.5*5, 5
    np.testing.assert_allclose(ds.mc_returns(g), [2.75, 3.5, 3.0, 6.5, 5.0])


def test_mc_returns_sparse_failure_convention():
    g = 0.9
    ds = tiny([-1, -1, -1, -1, -1, -1, -1, 0], [0, 0, 0, 0, 0, 0, 0, 1], [0, 0, 1, 0, 0, 1, 0, 0])
    out = ds.mc_returns(g, sparse_failure_reward=-1)
    # episode 1: timeout, all -1 -> -1/(1-0.9) = -10 everywhere
    np.testing.assert_allclose(out[:3], [-10, -10, -10], rtol=1e-6)
    # episode 2: the same, and the value does not depend on where the cut fell
    np.testing.assert_allclose(out[3:6], [-10, -10, -10], rtol=1e-6)
    # episode 3: reaches the goal (terminal, reward 0): plain return-to-go
    np.testing.assert_allclose(out[6:], [-1.0, 0.0], rtol=1e-6)
    # a failing episode that ends at a terminal is not "failing forever": plain return
    term = tiny([-1, -1], [0, 1], [0, 0]).mc_returns(g, sparse_failure_reward=-1)
    np.testing.assert_allclose(term, [-1.9, -1.0], rtol=1e-6)
    # without the convention a timed-out episode is plainly truncated
    np.testing.assert_allclose(ds.mc_returns(g)[:3], [-2.71, -1.9, -1.0], rtol=1e-6)


def test_mc_returns_custom_rewards():
    ds = tiny([1, 1], [0, 1], [0, 0])
    np.testing.assert_allclose(ds.mc_returns(1.0, rewards=np.array([3.0, 4.0])), [7.0, 4.0])
    with pytest.raises(DatasetError, match="3 rewards for 2 transitions"):
        ds.mc_returns(1.0, rewards=np.ones(3))


# ------------------------------------------------------------------------------- validate
def broken(small_dataset, **changes):
    arrays = dict(small_dataset.arrays(), **changes)
    return Dataset(**arrays, metadata={})


def error_of(ds, **kwargs) -> str:
    with pytest.raises(DatasetError) as info:
        ds.validate(**kwargs)
    message = str(info.value)
    assert "\n" not in message and isinstance(info.value, UserError)
    return message


def test_validate_missing_key(small_dataset):
    msg = error_of(broken(small_dataset, next_observations=None))
    assert "missing 'next_observations'" in msg


def test_validate_length_mismatch(small_dataset):
    msg = error_of(broken(small_dataset, actions=small_dataset.actions[:-1]))
    assert "'actions' has 8 rows" in msg and "'observations' has 9" in msg


def test_validate_nan_and_inf(small_dataset):
    rewards = small_dataset.rewards.copy()
    rewards[5] = np.nan
    msg = error_of(broken(small_dataset, rewards=rewards))
    assert "'rewards'" in msg and "row 5" in msg
    obs = small_dataset.next_observations.copy()
    obs[2, 1] = np.inf
    assert "'next_observations' has NaN/Inf at row 2" in error_of(broken(small_dataset, next_observations=obs))


def test_validate_env_dimensions(small_dataset):
    msg = error_of(small_dataset, obs_dim=11, env="hopper")
    assert "dim 3" in msg and "obs_dim=11" in msg and "hopper" in msg
    msg = error_of(small_dataset, act_dim=6)
    assert "'actions' have dim 2" in msg and "act_dim=6" in msg


def test_validate_dtype_and_ndim(small_dataset):
    msg = error_of(broken(small_dataset, rewards=small_dataset.rewards.astype(np.float64)))
    assert "'rewards'" in msg and "float64" in msg and "float32" in msg
    msg = error_of(broken(small_dataset, terminals=small_dataset.terminals.astype(np.int64)))
    assert "'terminals'" in msg and "bool" in msg
    msg = error_of(broken(small_dataset, rewards=small_dataset.rewards[:, None]))
    assert "'rewards'" in msg and "1-d" in msg
    msg = error_of(broken(small_dataset, observations=small_dataset.observations.tolist()))
    assert "'observations'" in msg and "np.asarray" in msg


def test_validate_next_observation_width(small_dataset):
    msg = error_of(broken(small_dataset, next_observations=small_dataset.next_observations[:, :2].copy()))
    assert "'next_observations' has dim 2" in msg


def test_episode_length_check():
    with pytest.raises(DatasetError, match="one more row"):
        Episode(np.zeros((3, 1)), np.zeros((3, 1)), np.zeros(3)).to_transitions()
