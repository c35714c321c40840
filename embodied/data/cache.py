"""Where generated datasets are cached: `<root>/datasets/<env>-<quality>-<size>-s<seed>.hdf5`.

The root is the `cache_dir` argument, else $EMBODIED_CACHE, else $XDG_CACHE_HOME/embodied, else
~/.cache/embodied. `catalog` (D4RL-style qualities), `ogbench_gen` (oracle data) and `mt10_gen` (Meta-World
scripted demos) write here.
"""
from __future__ import annotations

import os
from pathlib import Path


def cache_root(cache_dir=None) -> Path:
    """cache_dir, else $EMBODIED_CACHE, else $XDG_CACHE_HOME/embodied, else ~/.cache/embodied."""
    if cache_dir is not None:
        return Path(cache_dir).expanduser()
    if os.environ.get("EMBODIED_CACHE"):
        return Path(os.environ["EMBODIED_CACHE"]).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(xdg).expanduser() / "embodied"


def dataset_path(env: str, quality: str, size: int, seed: int = 0, cache_dir=None) -> Path:
    return cache_root(cache_dir) / "datasets" / f"{env}-{quality}-{size}-s{seed}.hdf5"


def load_or_make(path: Path, version: str, make):
    """The dataset cached at `path` when its generator version is `version`, else `make()` ->
    (Dataset, extras), written there first (atomically) and returned."""
    from embodied.data.d4rl import load_hdf5, save_hdf5

    if path.is_file():
        ds = load_hdf5(path, cached=True)
        if ds.metadata.get("generator_version") == version:
            return ds
    ds, extras = make()
    save_hdf5(ds, path, extras=extras)
    return ds
