"""Datasets, file formats, replay and data generation. Knows nothing about networks."""
from embodied.data.catalog import load_dataset
from embodied.data.d4rl import load_hdf5, save_hdf5
from embodied.data.dataset import Dataset, Episode, concat
from embodied.data.generate import collect
from embodied.data.replay import MixedReplay, ReplayBuffer

__all__ = ["Dataset", "Episode", "concat", "load_hdf5", "save_hdf5", "load_dataset", "collect",
           "ReplayBuffer", "MixedReplay"]
