"""Minari datasets, read and written through Minari's own API (never its download functions).

Minari stores episodes ([T+1] observations per episode), so a Dataset is split at its episode
ends and its `next_observations` must chain: row t+1 starts where row t ended. Minari finds its
root through MINARI_DATASETS_PATH; `root=` sets that variable for the duration of the call.

The writer records what Minari users rely on: an `env_spec` whenever `env_id` is given, so
`recover_environment()` rebuilds the env (an embodied task is rebuilt by `make_state_env`, which
observes the flat `observation.state` vector the dataset stores; a gymnasium id is recorded as is),
the `algorithm_name` that collected the data, and an end flag on every episode's last step (an
episode the recording cut without a flag is truncated, never left open).
"""
from __future__ import annotations

import contextlib
import json
import os
import warnings
from pathlib import Path

import gymnasium as gym
import numpy as np
from gymnasium.envs.registration import EnvSpec

import sims
from embodied.constants import STATE_KEY
from embodied.data.dataset import Dataset
from embodied.errors import DatasetError

METADATA_KEY = "embodied_metadata"


@contextlib.contextmanager
def _minari_root(root):
    """Point Minari at `root` for one call (it reads the variable each time it resolves a path)."""
    if root is None:
        yield
        return
    before = os.environ.get("MINARI_DATASETS_PATH")
    os.environ["MINARI_DATASETS_PATH"] = str(Path(root).expanduser())
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("MINARI_DATASETS_PATH", None)
        else:
            os.environ["MINARI_DATASETS_PATH"] = before


class StateObservation(gym.ObservationWrapper):
    """An embodied task seen through its flat `observation.state` vector, as datasets store it."""

    def __init__(self, env: gym.Env):
        super().__init__(env)
        self.observation_space = env.observation_space[STATE_KEY]

    def observation(self, observation):
        return observation[STATE_KEY]


def make_state_env(name: str, **kwargs) -> gym.Env:
    """gymnasium entry point recorded in Minari's env_spec: `sims.make(name)` with flat observations."""
    return StateObservation(sims.make(name, **kwargs))


def env_spec_for(env_id: str, ds: Dataset) -> gym.envs.registration.EnvSpec:
    """The EnvSpec Minari records for `env_id` (an embodied task name or a registered gymnasium id),
    after checking that the env's spaces are the dataset's."""
    if env_id in sims.names():
        task = sims.spec(env_id)
        dims = (task.obs_dim, task.act_dim)
        spec = EnvSpec(id=f"embodied-state/{env_id}-v0", entry_point=f"{__name__}:make_state_env",
                       kwargs={"name": env_id}, disable_env_checker=True)
    else:
        try:
            spec = gym.spec(env_id)
        except gym.error.Error:
            raise DatasetError(f"env_id={env_id!r} is neither an embodied task nor a registered gymnasium id: use one "
                               f"of {', '.join(sims.names())}, a gymnasium id, or env_id=None (no env recorded)") from None
        dims = None
    if dims is None:
        env = gym.make(spec)
        try:
            dims = (int(np.prod(env.observation_space.shape or (0,))), int(np.prod(env.action_space.shape or (0,))))
        finally:
            env.close()
    if (ds.obs_dim, ds.act_dim) != dims:
        raise DatasetError(f"the dataset has obs_dim {ds.obs_dim} and act_dim {ds.act_dim} but env_id {env_id!r} has "
                           f"{dims[0]} and {dims[1]}: pass the env the data was recorded in")
    return spec


def save_minari(ds: Dataset, dataset_id: str, env_id: str | None = None, *, root=None,
                author: str = "embodied", description: str | None = None, algorithm_name: str | None = None):
    """Write `ds` as Minari dataset `dataset_id` (form `namespace/name-v0`) and return the
    MinariDataset. With `env_id` the env spec is recorded (see `env_spec_for`); spaces are built from
    the arrays. `algorithm_name` defaults to the metadata's `algorithm_name`, `policy` or `generator`."""
    import minari
    from minari.data_collector import EpisodeBuffer
    from minari.dataset.minari_dataset import parse_dataset_id

    ds.validate()
    try:
        parse_dataset_id(dataset_id)
    except (ValueError, TypeError):
        raise DatasetError(f"Minari dataset_id '{dataset_id}' is malformed: use the form namespace/name-v0") from None
    algorithm = algorithm_name or next((str(ds.metadata[k]) for k in ("algorithm_name", "policy", "generator")
                                        if ds.metadata.get(k)), None)
    if not algorithm:
        raise DatasetError("save_minari: the dataset's metadata names no policy: pass algorithm_name= (what "
                           "collected the data, e.g. 'SAC expert + noise 0.1')")
    env_spec = env_spec_for(env_id, ds) if env_id is not None else None
    starts, stops = ds.episode_bounds()
    chained = np.ones(len(ds), dtype=bool)
    chained[:-1] = np.all(ds.next_observations[:-1] == ds.observations[1:], axis=1)
    broken = np.flatnonzero(~chained & ~ds.episode_ends())
    if len(broken):
        raise DatasetError(
            f"next_observations[{broken[0]}] differs from observations[{broken[0] + 1}] inside an episode: "
            "Minari stores chained episodes, so mark an episode end there or save as HDF5 instead"
        )
    buffers = []
    for index, (start, stop) in enumerate(zip(starts, stops)):
        truncations = ds.timeouts[start:stop].copy()
        if not (ds.terminals[stop - 1] or truncations[-1]):
            truncations[-1] = True  # the recording stopped mid-episode: cut, not finished
        buffers.append(EpisodeBuffer(
            id=index,
            observations=np.concatenate([ds.observations[start:stop], ds.next_observations[stop - 1 : stop]]),
            actions=ds.actions[start:stop],
            rewards=ds.rewards[start:stop],
            terminations=ds.terminals[start:stop],
            truncations=truncations,
        ))
    metadata = dict(ds.metadata, env_id=env_id) if env_id is not None else dict(ds.metadata)
    with _minari_root(root), warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # Minari nags about env specs and permalinks
        try:
            minari_ds = minari.create_dataset_from_buffers(
                dataset_id,
                buffers,
                env=env_spec,
                observation_space=_box(ds.observations, default_bound=np.inf),
                action_space=_box(ds.actions, default_bound=1.0),
                algorithm_name=algorithm,
                author=author,
                code_permalink="https://github.com/embodied",
                description=description or f"embodied dataset for {env_id or ds.metadata.get('env', 'unknown env')}",
            )
        except ValueError as err:  # e.g. the id already exists; Minari never overwrites
            raise DatasetError(f"Minari could not create '{dataset_id}': {err}") from None
        minari_ds.storage.update_metadata({METADATA_KEY: json.dumps(metadata, default=_json_default)})
    return minari_ds


def load_minari(dataset_id_or_path, *, root=None) -> Dataset:
    """Load a local Minari dataset by id (under `root` or MINARI_DATASETS_PATH) or by directory.
    terminations become `terminals`, truncations become `timeouts`."""
    import minari
    from minari import MinariDataset

    path = Path(str(dataset_id_or_path)).expanduser()
    try:
        if path.is_dir():
            data_dir = path / "data" if (path / "data").is_dir() else path
            minari_ds = MinariDataset(data_dir)
        else:
            with _minari_root(root):
                minari_ds = minari.load_dataset(str(dataset_id_or_path), download=False)
    except (FileNotFoundError, ValueError) as err:
        raise DatasetError(
            f"cannot load Minari dataset '{dataset_id_or_path}' ({err}): check the id and root"
        ) from None
    parts = {k: [] for k in ("observations", "actions", "rewards", "next_observations", "terminals", "timeouts")}
    for episode in minari_ds.iterate_episodes():
        obs = np.asarray(episode.observations)
        if not isinstance(episode.observations, np.ndarray) or obs.ndim != 2:
            raise DatasetError(
                f"Minari dataset '{dataset_id_or_path}' has non-vector observations: "
                "only flat Box observations are supported"
            )
        parts["observations"].append(obs[:-1])
        parts["next_observations"].append(obs[1:])
        parts["actions"].append(np.asarray(episode.actions).reshape(len(episode), -1))
        parts["rewards"].append(np.asarray(episode.rewards).reshape(-1))
        parts["terminals"].append(np.asarray(episode.terminations).reshape(-1))
        parts["timeouts"].append(np.asarray(episode.truncations).reshape(-1))
    if not parts["rewards"]:
        raise DatasetError(f"Minari dataset '{dataset_id_or_path}' has no episodes: collect some data first")
    arrays = {k: np.concatenate(v) for k, v in parts.items()}
    for key in ("observations", "next_observations", "actions", "rewards"):
        arrays[key] = arrays[key].astype(np.float32, copy=False)
    for key in ("terminals", "timeouts"):
        arrays[key] = arrays[key].astype(bool, copy=False)
    raw = minari_ds.storage.metadata.get(METADATA_KEY)
    metadata = json.loads(raw) if isinstance(raw, str) else {"minari_id": minari_ds.spec.dataset_id}
    ds = Dataset(**arrays, metadata=metadata)
    ds.validate()
    return ds


def _box(values: np.ndarray, default_bound: float) -> gym.spaces.Box:
    """A float32 Box of the arrays' width; bounds are +-default_bound unless the data exceed them."""
    bound = default_bound if np.all(np.abs(values) <= default_bound) else np.inf
    return gym.spaces.Box(-bound, bound, shape=values.shape[1:], dtype=np.float32)


def _json_default(value):
    if isinstance(value, (np.generic, np.ndarray)):
        return value.tolist()
    return str(value)
