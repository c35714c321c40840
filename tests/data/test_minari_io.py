import numpy as np
import pytest

from embodied.data.minari_io import load_minari, save_minari
from embodied.errors import DatasetError


def test_round_trip_through_minari(small_dataset, tmp_path, monkeypatch):
    monkeypatch.delenv("MINARI_DATASETS_PATH", raising=False)
    minari_ds = save_minari(small_dataset, "embodied/toy-v0", root=tmp_path, algorithm_name="hand-made")
    assert minari_ds.total_episodes == 3 and minari_ds.total_steps == 9
    assert (tmp_path / "embodied" / "toy-v0" / "data").is_dir()
    assert minari_ds.storage.metadata["algorithm_name"] == "hand-made"

    for source in ("embodied/toy-v0", tmp_path / "embodied" / "toy-v0"):  # by id under root, or by path
        loaded = load_minari(source, root=tmp_path)
        for key, value in small_dataset.arrays().items():
            assert getattr(loaded, key).dtype == value.dtype, key
            np.testing.assert_array_equal(getattr(loaded, key), value, err_msg=key)
        assert loaded.metadata == small_dataset.metadata


def test_minari_env_variable_is_respected(small_dataset, tmp_path, monkeypatch):
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path))
    save_minari(small_dataset, "toy-v1", algorithm_name="hand-made")
    assert len(load_minari("toy-v1")) == len(small_dataset)
    with pytest.raises(DatasetError, match="already exists"):
        save_minari(small_dataset, "toy-v1", algorithm_name="hand-made")


def test_minari_errors(small_dataset, tmp_path):
    with pytest.raises(DatasetError, match="not found locally"):
        load_minari("missing-v0", root=tmp_path)
    with pytest.raises(DatasetError, match="malformed"):
        save_minari(small_dataset, "no version here!", root=tmp_path, algorithm_name="x")
    unchained = small_dataset.select_episodes([0])
    unchained.next_observations[1] += 1
    with pytest.raises(DatasetError, match=r"next_observations\[1\]"):
        save_minari(unchained, "unchained-v0", root=tmp_path, algorithm_name="x")
    with pytest.raises(DatasetError, match="names no policy: pass algorithm_name="):
        save_minari(small_dataset, "anon-v0", root=tmp_path)
    with pytest.raises(DatasetError, match="env_id='toy' is neither an embodied task nor a registered gymnasium id"):
        save_minari(small_dataset, "toy-v2", env_id="toy", root=tmp_path, algorithm_name="x")
    with pytest.raises(DatasetError, match="obs_dim 3 and act_dim 2 but env_id 'hopper' has 11 and 3"):
        save_minari(small_dataset, "toy-v3", env_id="hopper", root=tmp_path, algorithm_name="x")


@pytest.fixture(scope="module")
def hopper_data():
    import sims
    from embodied.data.generate import collect

    env = sims.make("hopper", seed=0)
    ds = collect(env, None, 60, seed=0, progress=False)  # uniform-random actions: a terminal, then a cut
    env.close()
    return ds


def test_env_spec_and_algorithm_are_recorded_so_the_env_can_be_recovered(hopper_data, tmp_path, monkeypatch):
    import minari

    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path))
    save_minari(hopper_data, "embodied/hopper-random-v0", env_id="hopper")
    stored = minari.load_dataset("embodied/hopper-random-v0")
    assert stored.storage.metadata["algorithm_name"] == "uniform-random"  # from the data's own metadata
    assert stored.env_spec is not None and stored.env_spec.kwargs == {"name": "hopper"}
    env = stored.recover_environment()
    try:
        obs, _ = env.reset(seed=0)
        assert obs.shape == (hopper_data.obs_dim,) and env.action_space.shape == (hopper_data.act_dim,)
        obs, reward, *_ = env.step(env.action_space.sample())
        assert np.isfinite(reward) and obs.shape == (11,)
    finally:
        env.close()
    assert load_minari("embodied/hopper-random-v0").metadata["env_id"] == "hopper"

    save_minari(hopper_data, "embodied/hopper-gym-v0", env_id="Hopper-v5")  # a gymnasium id is recorded as is
    assert minari.load_dataset("embodied/hopper-gym-v0").env_spec.id == "Hopper-v5"


def test_every_episode_ends_with_a_flag_even_when_the_recording_stopped(hopper_data, tmp_path):
    open_end = hopper_data.select_episodes(range(hopper_data.num_episodes))
    open_end.timeouts[-1] = False  # the last episode was neither finished nor marked cut
    assert not open_end.terminals[-1]
    stored = save_minari(open_end, "embodied/open-end-v0", root=tmp_path)
    episodes = list(stored.iterate_episodes())
    assert all(bool(ep.terminations[-1]) != bool(ep.truncations[-1]) for ep in episodes)  # exactly one flag
    assert bool(episodes[-1].truncations[-1]) and not episodes[-1].terminations[-1]
    loaded = load_minari(tmp_path / "embodied" / "open-end-v0")
    assert loaded.timeouts[-1] and not loaded.terminals[-1]
