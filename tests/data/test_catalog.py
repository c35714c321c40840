import os

import numpy as np
import pytest

import sims
from embodied.data import cache, catalog
from embodied.data.d4rl import load_hdf5, save_hdf5
from embodied.errors import DatasetError


@pytest.mark.parametrize("quality,size,message", [
    ("great", 10, "unknown dataset quality 'great': choose one of random, medium, expert, noisy, medium-replay, medium-expert"),
    ("medium", 0, "size=0 must be a positive integer"),
    ("medium", 2.5, "size=2.5 must be a positive integer"),
    ("medium", True, "size=True must be a positive integer"),
])
def test_bad_arguments_fail_before_any_work(quality, size, message, tmp_path):
    with pytest.raises(DatasetError) as info:
        catalog.load_dataset("hopper", quality, size, cache_dir=tmp_path)
    assert message in str(info.value)
    assert list(tmp_path.iterdir()) == []


def test_unknown_env_lists_valid_names(tmp_path):
    with pytest.raises(DatasetError) as info:
        catalog.load_dataset("hoppper", "random", 10, cache_dir=tmp_path)
    assert "unknown env 'hoppper'" in str(info.value) and ", ".join(sims.names()) in str(info.value)


def test_cache_location(monkeypatch, tmp_path):
    monkeypatch.delenv("EMBODIED_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert catalog.dataset_path("hopper", "medium", 100, 2) == tmp_path / "xdg/embodied/datasets/hopper-medium-100-s2.hdf5"
    monkeypatch.setenv("EMBODIED_CACHE", str(tmp_path / "mine"))
    assert cache.cache_root() == tmp_path / "mine"
    assert cache.cache_root(tmp_path / "arg") == tmp_path / "arg"


def test_generate_then_reuse_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("EMBODIED_CACHE", str(tmp_path))
    ds = catalog.load_dataset("pointmaze-umaze", "medium-replay", 61, seed=1, progress=False)
    path = tmp_path / "datasets" / "pointmaze-umaze-medium-replay-61-s1.hdf5"
    assert path.is_file() and len(ds) == 61
    spec = sims.spec("pointmaze-umaze")
    ds.validate(spec.obs_dim, spec.act_dim)
    # thirds 21/20/20, each cut at its end, in recipe order
    assert ds.episode_ends()[[20, 40, 60]].all()
    assert [p["level"] for p in ds.metadata["recipe"]] == ["early", "medium", "medium"]
    assert ds.metadata["quality"] == "medium-replay" and ds.metadata["seed"] == 1

    monkeypatch.setattr(catalog, "generate", lambda *a, **k: pytest.fail("cache was not reused"))
    again = catalog.load_dataset("pointmaze-umaze", "medium-replay", 61, seed=1)
    np.testing.assert_array_equal(again.observations, ds.observations)


def test_stale_cache_is_regenerated(tmp_path):
    first = catalog.load_dataset("pointmaze-umaze", "random", 12, cache_dir=tmp_path, progress=False)
    path = catalog.dataset_path("pointmaze-umaze", "random", 12, 0, tmp_path)
    first.metadata["generator_version"] = -1
    first.rewards[:] = 123.0
    save_hdf5(first, path)
    fresh = catalog.load_dataset("pointmaze-umaze", "random", 12, cache_dir=tmp_path, progress=False)
    assert (fresh.rewards != 123.0).all() and load_hdf5(path).metadata["generator_version"] >= 1
    assert not [p for p in os.listdir(path.parent) if p.endswith(".tmp")]
