import h5py
import numpy as np
import pytest

from embodied.data.d4rl import load_hdf5, save_hdf5
from embodied.errors import DatasetError


def test_round_trip_preserves_arrays_and_metadata(small_dataset, tmp_path):
    small_dataset.metadata.update(recipe=[{"level": "medium", "noise_std": 0.1}], seed=3, note="hi")
    path = save_hdf5(small_dataset, tmp_path / "sub" / "toy.hdf5")
    loaded = load_hdf5(path)
    for key, value in small_dataset.arrays().items():
        assert getattr(loaded, key).dtype == value.dtype
        np.testing.assert_array_equal(getattr(loaded, key), value)
    assert loaded.metadata == small_dataset.metadata
    assert [p.name for p in path.parent.iterdir()] == ["toy.hdf5"]  # no temporary left behind


def test_failed_write_leaves_no_file(small_dataset, tmp_path):
    small_dataset.metadata["bad"] = object()  # not JSON-serialisable: fails mid-write
    with pytest.raises(TypeError):
        save_hdf5(small_dataset, tmp_path / "x.hdf5")
    assert list(tmp_path.iterdir()) == []


def write_d4rl_style(path, obs, terminals, timeouts, extra=True):
    """A file as D4RL ships them: no next_observations, float64 rewards, infos/ and metadata/ groups."""
    n = len(obs)
    with h5py.File(path, "w") as f:
        f["observations"] = obs
        f["actions"] = np.arange(n, dtype=np.float32)[:, None]
        f["rewards"] = np.arange(n, dtype=np.float64)
        f["terminals"] = np.asarray(terminals, bool)
        f["timeouts"] = np.asarray(timeouts, bool)
        if extra:
            f["infos/qpos"] = np.zeros((n, 4))
            f["infos/goal"] = np.zeros((n, 2))
            f["metadata/algorithm"] = b"SAC"
            f["metadata/policy/fc0/weight"] = np.zeros((4, 4))
            f["metadata"].attrs["dataset_version"] = 2


def test_d4rl_file_without_next_observations(tmp_path):
    obs = np.arange(8, dtype=np.float32)[:, None] * np.ones((1, 2), np.float32)
    # episodes: rows 0-2 terminal, rows 3-5 timeout, rows 6-7 unflagged end of file
    terminals = [0, 0, 1, 0, 0, 0, 0, 0]
    timeouts = [0, 0, 0, 0, 0, 1, 0, 0]
    write_d4rl_style(tmp_path / "d4rl.hdf5", obs, terminals, timeouts)
    ds = load_hdf5(tmp_path / "d4rl.hdf5")
    # the timeout row (5) and the last row (7) have no recorded successor: dropped
    np.testing.assert_array_equal(ds.actions[:, 0], [0, 1, 2, 3, 4, 6])
    np.testing.assert_array_equal(ds.next_observations[:, 0], [1, 2, 2, 4, 5, 7])  # terminal keeps own obs
    assert ds.terminals.tolist() == [0, 0, 1, 0, 0, 0]
    assert ds.timeouts.tolist() == [0, 0, 0, 0, 1, 1]  # the cut moved one step earlier
    assert ds.rewards.dtype == np.float32
    assert ds.metadata["algorithm"] == "SAC" and ds.metadata["dataset_version"] == 2
    assert "policy/fc0/weight" not in ds.metadata and "next_observations" in ds.metadata
    # the derived transitions chain inside every episode
    ends = ds.episode_ends()
    np.testing.assert_array_equal(ds.next_observations[:-1][~ends[:-1]], ds.observations[1:][~ends[:-1]])


def test_missing_key_is_named(tmp_path):
    with h5py.File(tmp_path / "bad.hdf5", "w") as f:
        f["observations"] = np.zeros((3, 2), np.float32)
        f["actions"] = np.zeros((3, 1), np.float32)
        f["rewards"] = np.zeros(3, np.float32)
        f["terminals"] = np.zeros(3, bool)
    with pytest.raises(DatasetError, match="missing 'timeouts'"):
        load_hdf5(tmp_path / "bad.hdf5")


def test_bad_contents_are_reported(tmp_path):
    with h5py.File(tmp_path / "nan.hdf5", "w") as f:
        for key, value in {"observations": np.zeros((3, 2)), "next_observations": np.zeros((3, 2)),
                           "actions": np.zeros((2, 1)), "rewards": np.zeros(3), "terminals": np.zeros(3),
                           "timeouts": np.zeros(3)}.items():
            f[key] = value
    with pytest.raises(DatasetError, match="'actions' has 2 rows"):
        load_hdf5(tmp_path / "nan.hdf5")


def test_missing_or_corrupt_file(tmp_path):
    with pytest.raises(DatasetError, match="no dataset file"):
        load_hdf5(tmp_path / "nope.hdf5")
    (tmp_path / "junk.hdf5").write_bytes(b"not hdf5 at all")
    with pytest.raises(DatasetError, match="cannot read") as err:
        load_hdf5(tmp_path / "junk.hdf5")
    # a user's own file (dataset.path): never advise deleting it
    assert "damaged or not HDF5" in str(err.value) and "delete" not in str(err.value)


def test_an_unreadable_cache_file_is_advised_differently(tmp_path):
    from embodied.data import catalog

    path = catalog.dataset_path("pointmaze-umaze", "random", 12, 0, tmp_path)
    path.parent.mkdir(parents=True)
    path.write_bytes(b"\x89HDF\r\n\x1a\n truncated")  # the HDF5 signature, then nothing usable
    with pytest.raises(DatasetError, match="cannot read the cached dataset .*: delete it and it is regenerated"):
        catalog.load_dataset("pointmaze-umaze", "random", 12, cache_dir=tmp_path, progress=False)


def test_nan_is_reported_at_its_row_in_the_file(tmp_path):
    """Timeout rows are dropped when next_observations are derived; the error still names the file's row."""
    n = 20_000
    obs = np.zeros((n, 2), np.float32)
    obs[12345, 1] = np.nan
    timeouts = (np.arange(n) % 100) == 99  # 123 timeout rows come before row 12345
    write_d4rl_style(tmp_path / "nan.hdf5", obs, np.zeros(n, bool), timeouts, extra=False)
    with pytest.raises(DatasetError, match=r"'observations' has NaN/Inf at row 12345 of nan\.hdf5"):
        load_hdf5(tmp_path / "nan.hdf5")


def test_mismatched_lengths_are_named_before_next_observations_are_derived(tmp_path):
    import h5py

    from embodied.data.d4rl import load_hdf5
    from embodied.errors import DatasetError

    path = tmp_path / "short_terminals.hdf5"
    with h5py.File(path, "w") as f:
        f["observations"] = np.zeros((10, 3), np.float32)
        f["actions"] = np.zeros((10, 2), np.float32)
        f["rewards"] = np.zeros(10, np.float32)
        f["terminals"] = np.zeros(9, bool)
        f["timeouts"] = np.zeros(10, bool)
    with pytest.raises(DatasetError, match="'terminals' has 9 rows but 'observations' has 10"):
        load_hdf5(path)
