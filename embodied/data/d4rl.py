"""D4RL-layout HDF5 files: one flat array per key, episodes back to back.

Reads files written here and by D4RL-style tools (extra groups such as `infos/*` are ignored,
`metadata/*` becomes `Dataset.metadata`). Writes go to a temporary file that is renamed into
place, so a crash never leaves a half-written file at a cache path.
"""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import h5py
import numpy as np

from embodied.data.dataset import ARRAY_KEYS, FLOAT_KEYS, Dataset
from embodied.data.ogbench_npz import is_npz, load_ogbench_npz
from embodied.errors import DatasetError

REQUIRED_KEYS = ("observations", "actions", "rewards", "terminals", "timeouts")


def save_hdf5(ds: Dataset, path, compression: str | None = "gzip", extras: dict | None = None) -> Path:
    """Validate, then write atomically. Metadata values are stored JSON-encoded as attributes of
    the `metadata` group, so nested dicts and lists round-trip.

    `extras` maps HDF5 paths such as `infos/subgoals` or `images/front` to arrays with one row per
    transition; they are written chunked (about 1 MB per chunk) and compressed, and readers of the
    D4RL keys never load them (see `load_extras`)."""
    ds.validate()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        with h5py.File(tmp, "w") as f:
            for key, value in ds.arrays().items():
                f.create_dataset(key, data=value, compression=compression)
            for key, value in (extras or {}).items():
                value = np.asarray(value)
                if len(value) != len(ds):
                    raise DatasetError(f"extra '{key}' has {len(value)} rows for {len(ds)} transitions: one per row")
                row_bytes = max(1, value[:1].nbytes)
                chunks = (max(1, min(len(value), (1 << 20) // row_bytes)),) + value.shape[1:] if len(value) else None
                f.create_dataset(key, data=value, compression=compression, chunks=chunks)
            meta = f.create_group("metadata")
            for key, value in ds.metadata.items():
                meta.attrs[str(key)] = json.dumps(value, default=_json_default)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def load_hdf5(path, *, cached: bool = False) -> Dataset:
    """Read a D4RL-layout file into a validated Dataset (float32 arrays, bool flags).

    An OGBench `.npz` dataset file (a zip archive, told apart by its content) is read by
    `embodied.data.ogbench_npz`, so `dataset.path` takes either. `cached=True` marks a file this project
    wrote into its cache: an unreadable one is deleted and regenerated, while a user's own file is not
    theirs to lose, so the advice differs. Errors name rows as they are in the file.

    When `next_observations` is absent it is derived from the next row of the same episode. The
    last step of an episode has no next row: after a terminal the next state is never used for
    bootstrapping, so the step is kept with its own observation as a placeholder; after a timeout
    (or at the end of the file) the next state is unknown, so that step is dropped and the step
    before it becomes the timeout. Nothing is invented that a target would use.
    """
    path = Path(path)
    if not path.is_file():
        raise DatasetError(f"no dataset file at {path}: check the path or generate the dataset")
    if path.suffix == ".npz" or (not h5py.is_hdf5(path) and is_npz(path)):
        return load_ogbench_npz(path, cached=cached)
    try:
        with h5py.File(path, "r") as f:
            missing = [k for k in REQUIRED_KEYS if not isinstance(f.get(k), h5py.Dataset)]
            if missing:
                raise DatasetError(
                    f"{path.name} is missing {', '.join(repr(k) for k in missing)}: a D4RL file needs "
                    f"{', '.join(REQUIRED_KEYS)} at the top level"
                )
            arrays = {k: f[k][()] for k in ARRAY_KEYS if isinstance(f.get(k), h5py.Dataset)}
            metadata = _read_metadata(f["metadata"]) if isinstance(f.get("metadata"), h5py.Group) else {}
    except OSError as err:
        if cached:
            raise DatasetError(f"cannot read the cached dataset {path} ({err}): delete it and it is regenerated on "
                               "the next run") from None
        raise DatasetError(f"cannot read {path} as HDF5 ({err}): the file is damaged or not HDF5; export or "
                           "download it again (D4RL layout: observations, actions, rewards, terminals, timeouts)") from None
    arrays = {key: _coerce(key, value) for key, value in arrays.items()}
    lengths = {key: len(value) for key, value in arrays.items()}
    if len(set(lengths.values())) > 1:  # checked before deriving anything from row order
        n = lengths["observations"]
        wrong = next(key for key, length in lengths.items() if length != n)
        raise DatasetError(f"'{wrong}' has {lengths[wrong]} rows but 'observations' has {n}: every D4RL key "
                           "needs one row per transition")
    for key in FLOAT_KEYS:  # before timeout rows are dropped, so the row named is the file's
        if key in arrays and len(arrays[key]):
            finite = np.isfinite(arrays[key]).reshape(len(arrays[key]), -1).all(axis=1)
            if not finite.all():
                raise DatasetError(f"'{key}' has NaN/Inf at row {int(np.argmin(finite))} of {path.name}: drop or "
                                   "repair those transitions")
    if "next_observations" not in arrays:
        arrays = _derive_next_observations(arrays)
        metadata["next_observations"] = "derived from the following row (see embodied.data.d4rl.load_hdf5)"
    ds = Dataset(**arrays, metadata=metadata)
    ds.validate()
    return ds


def load_extras(path, keys=None) -> dict[str, np.ndarray]:
    """The non-D4RL arrays of a file (`infos/*`, `images/*`, ...) by HDF5 path; `keys` limits which."""
    path = Path(path)
    if not path.is_file():
        raise DatasetError(f"no dataset file at {path}: check the path or generate the dataset")
    out = {}
    with h5py.File(path, "r") as f:
        def visit(name, item):
            if isinstance(item, h5py.Dataset) and "/" in name and not name.startswith("metadata/"):
                if keys is None or name in keys:
                    out[name] = item[()]
        f.visititems(visit)
    missing = sorted(set(keys or ()) - set(out))
    if missing:
        raise DatasetError(f"{path.name} has no {', '.join(missing)}: regenerate it with those extras")
    return out


def _coerce(key: str, value: np.ndarray) -> np.ndarray:
    """float64/int files become float32/bool; [N, 1] rewards and flags become [N]."""
    if key in ("rewards", "terminals", "timeouts") and value.ndim == 2 and value.shape[1] == 1:
        value = value[:, 0]
    if value.dtype.kind not in "biuf":
        raise DatasetError(f"'{key}' has non-numeric dtype {value.dtype}: store it as numbers")
    return value.astype(np.float32 if key in FLOAT_KEYS else bool, copy=False)


def _derive_next_observations(arrays: dict) -> dict:
    obs, terminals, timeouts = arrays["observations"], arrays["terminals"], arrays["timeouts"].copy()
    n = len(obs)
    next_obs = np.empty_like(obs)
    next_obs[:-1] = obs[1:]
    next_obs[terminals] = obs[terminals]  # placeholder: never bootstrapped from
    is_last = np.arange(n) == n - 1
    drop = (timeouts | is_last) & ~terminals  # successor state not recorded
    ends = terminals | timeouts
    before = np.flatnonzero(drop) - 1
    before = before[(before >= 0) & ~ends[np.maximum(before, 0)]]
    timeouts[before] = True  # the cut now falls one step earlier
    keep = ~drop
    out = {k: v[keep] for k, v in arrays.items() if k != "timeouts"}
    out["timeouts"] = timeouts[keep]
    out["next_observations"] = next_obs[keep]
    return out


def _read_metadata(group: h5py.Group) -> dict:
    """Attributes (JSON-encoded by save_hdf5, plain in other files) and small scalar datasets;
    array datasets such as D4RL's stored policy weights are skipped."""
    out = {}
    for key, value in group.attrs.items():
        out[key] = _decode(value)

    def visit(name, item):
        if isinstance(item, h5py.Dataset) and item.shape == ():
            out[name] = _decode(item[()])

    group.visititems(visit)
    return out


def _decode(value):
    if isinstance(value, bytes):
        value = value.decode("utf-8", errors="replace")
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return value
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    return value


def _json_default(value):
    if isinstance(value, (np.generic, np.ndarray)):
        return value.tolist()
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"metadata value {value!r} is not JSON-serialisable")
