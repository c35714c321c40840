"""Where generated datasets are cached: `<root>/datasets/<env>-<quality>-<size>-s<seed>.hdf5`.

The root is the `cache_dir` argument, else $EMBODIED_CACHE, else $XDG_CACHE_HOME/embodied, else
~/.cache/embodied. `catalog` (D4RL-style qualities) and `ogbench_gen` (oracle data) both write here.
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
