import numpy as np
import pytest

from embodied.data.minari_io import load_minari, save_minari
from embodied.errors import DatasetError


def test_round_trip_through_minari(small_dataset, tmp_path, monkeypatch):
    monkeypatch.delenv("MINARI_DATASETS_PATH", raising=False)
    minari_ds = save_minari(small_dataset, "embodied/toy-v0", env_id="toy", root=tmp_path)
    assert minari_ds.total_episodes == 3 and minari_ds.total_steps == 9
    assert (tmp_path / "embodied" / "toy-v0" / "data").is_dir()

    for source in ("embodied/toy-v0", tmp_path / "embodied" / "toy-v0"):  # by id under root, or by path
        loaded = load_minari(source, root=tmp_path)
        for key, value in small_dataset.arrays().items():
            assert getattr(loaded, key).dtype == value.dtype, key
            np.testing.assert_array_equal(getattr(loaded, key), value, err_msg=key)
        assert loaded.metadata == dict(small_dataset.metadata, env_id="toy")


def test_minari_env_variable_is_respected(small_dataset, tmp_path, monkeypatch):
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path))
    save_minari(small_dataset, "toy-v1")
    assert len(load_minari("toy-v1")) == len(small_dataset)
    with pytest.raises(DatasetError, match="already exists"):
        save_minari(small_dataset, "toy-v1")


def test_minari_errors(small_dataset, tmp_path):
    with pytest.raises(DatasetError, match="not found locally"):
        load_minari("missing-v0", root=tmp_path)
    with pytest.raises(DatasetError, match="malformed"):
        save_minari(small_dataset, "no version here!", root=tmp_path)
    unchained = small_dataset.select_episodes([0])
    unchained.next_observations[1] += 1
    with pytest.raises(DatasetError, match=r"next_observations\[1\]"):
        save_minari(unchained, "unchained-v0", root=tmp_path)
