"""LeRobotDataset v3.0 folders: write our episodes as one, read one into a `Dataset`.

Layout (LeRobot's v3.0 format, written from its documentation, no LeRobot code used):

    meta/info.json                               codebase_version "v3.0", fps, features, totals, path templates
    meta/stats.json                              {feature: {min, max, mean, std, count}}
    meta/tasks.parquet                           task (the string, pandas index) -> task_index
    meta/episodes/chunk-000/file-000.parquet     one row per episode: episode_index, tasks, length,
                                                 data/chunk_index, data/file_index, dataset_from_index,
                                                 dataset_to_index, videos/<key>/{chunk_index, file_index,
                                                 from_timestamp, to_timestamp}, stats/<feature>/<stat>
    data/chunk-000/file-000.parquet              one row per frame: observation.state, action, timestamp,
                                                 frame_index, episode_index, index, task_index,
                                                 next.reward, next.done
    videos/<observation.images.cam>/chunk-000/file-000.mp4   every episode's frames back to back

A frame is (s_t, a_t, r_t, done_t): an episode of T transitions is T frames. The final observation
s_T has no frame of its own; our writer keeps it in the episodes table (`FINAL_STATE_COLUMN`) so a
round trip is exact. Reading: the next observation of frame t is frame t+1 of the same episode; the
last frame is a terminal when `next.done` is true there, else a timeout, and its next observation
is the stored final one, or (a foreign file) the frame is dropped, or kept with its own observation
as next observation when `last_frame="repeat"`. `next.done` before an episode's last frame is ignored
(the LeRobot episode stays one episode); a file without `next.reward` reads as zero rewards
(metadata["has_rewards"] False).

pyarrow (and PyAV for videos) are optional and imported where used.
"""
from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path

import numpy as np

from embodied.constants import IMAGES_PREFIX, STATE_KEY, image_key
from embodied.data.dataset import Dataset, Episode
from embodied.errors import DatasetError

CODEBASE_VERSION = "v3.0"
ACTION_KEY = "action"
REWARD_KEY = "next.reward"
DONE_KEY = "next.done"
INFO_PATH = "meta/info.json"
STATS_PATH = "meta/stats.json"
TASKS_PATH = "meta/tasks.parquet"
EPISODES_PATH = "meta/episodes/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
DATA_PATH = "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
VIDEO_PATH = "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"
FINAL_STATE_COLUMN = "embodied/final_observation.state"
INDEX_FEATURES = {
    "timestamp": "float32", "frame_index": "int64", "episode_index": "int64", "index": "int64", "task_index": "int64",
}
REQUIRED_COLUMNS = (STATE_KEY, ACTION_KEY, "episode_index", "frame_index")


def _pyarrow():
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise DatasetError("LeRobot datasets need pyarrow, which is not installed: pip install pyarrow") from None
    return pa, pq


def _av(what: str):
    try:
        import av
    except ImportError:
        raise DatasetError(
            f"{what} needs PyAV (mp4 videos), which is not installed: pip install av, or leave the cameras out"
        ) from None
    return av


def _camera_key(name: str) -> str:
    return name if name.startswith(IMAGES_PREFIX + ".") else image_key(name)


# ============================================================================= write
def save_lerobot(root, episodes, *, fps: int = 10, tasks=None, images=None, robot_type: str | None = None,
                 state_names=None, action_names=None, vcodec: str = "libx264", crf: int = 10,
                 overwrite: bool = False) -> Path:
    """Write episodes as a LeRobotDataset v3.0 folder at `root`; returns the folder.

    episodes: a `Dataset`, or Episodes / dicts with observations [T+1, obs], actions [T, A], rewards [T],
    terminated, truncated, and optionally "task" (str) and "images" ({camera: uint8 [T or T+1, H, W, 3]}).
    tasks: one string per episode (overrides "task"); images: one {camera: frames} dict per episode.
    Cameras are written as mp4 (PyAV, `vcodec`, yuv420p), one file per camera for all episodes.
    """
    pa, pq = _pyarrow()
    raw = episodes.episodes() if isinstance(episodes, Dataset) else list(episodes)
    eps = [Episode.coerce(ep) for ep in raw]
    eps_tasks = [ep.get("task") if isinstance(ep, dict) else None for ep in raw]
    eps_images = [ep.get("images") if isinstance(ep, dict) else None for ep in raw]
    if tasks is not None:
        eps_tasks = list(tasks)
    if images is not None:
        eps_images = list(images)
    if len(eps_tasks) != len(eps) or len(eps_images) != len(eps):
        raise DatasetError(
            f"save_lerobot got {len(eps)} episodes, {len(eps_tasks)} tasks and {len(eps_images)} image dicts: "
            "pass one task and one image dict (or None) per episode"
        )
    if not eps or any(len(ep) == 0 for ep in eps):
        raise DatasetError("save_lerobot needs at least one episode and every episode needs one action")
    if not (isinstance(fps, int) and fps > 0):
        raise DatasetError(f"fps={fps!r} must be a positive integer (LeRobot stores integer fps)")
    rows = [ep.to_transitions() for ep in eps]
    obs_dim, act_dim = rows[0]["observations"].shape[1], rows[0]["actions"].shape[1]
    for k, r in enumerate(rows):
        if r["observations"].shape[1] != obs_dim or r["actions"].shape[1] != act_dim:
            raise DatasetError(f"episode {k} has obs/action dims {r['observations'].shape[1]}/{r['actions'].shape[1]} "
                               f"but episode 0 has {obs_dim}/{act_dim}: every episode needs the same dims")
    eps_tasks = ["" if t is None else str(t) for t in eps_tasks]
    cams, eps_images = _check_images(eps_images, [len(ep) for ep in eps])

    root = Path(root)
    if root.exists():
        if not overwrite and any(root.iterdir()):
            raise DatasetError(f"{root} already exists and is not empty: pick a new folder or pass overwrite=True")
        shutil.rmtree(root)
    root.mkdir(parents=True)

    task_list = list(dict.fromkeys(eps_tasks))
    task_of = {t: i for i, t in enumerate(task_list)}
    lengths = np.array([len(ep) for ep in eps])
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    n = int(lengths.sum())
    cols = {
        STATE_KEY: np.concatenate([r["observations"] for r in rows]),
        ACTION_KEY: np.concatenate([r["actions"] for r in rows]),
        "timestamp": np.concatenate([np.arange(t, dtype=np.float32) / fps for t in lengths]).astype(np.float32),
        "frame_index": np.concatenate([np.arange(t) for t in lengths]).astype(np.int64),
        "episode_index": np.repeat(np.arange(len(eps)), lengths).astype(np.int64),
        "index": np.arange(n, dtype=np.int64),
        "task_index": np.repeat([task_of[t] for t in eps_tasks], lengths).astype(np.int64),
        REWARD_KEY: np.concatenate([r["rewards"] for r in rows]).astype(np.float32),
        DONE_KEY: np.concatenate([r["terminals"] for r in rows]).astype(bool),
    }
    table = pa.table({k: _arrow_column(pa, v) for k, v in cols.items()})
    path = root / DATA_PATH.format(chunk_index=0, file_index=0)
    path.parent.mkdir(parents=True)
    pq.write_table(table, path)

    features = {
        STATE_KEY: {"dtype": "float32", "shape": [obs_dim], "names": _names(state_names, obs_dim, "state")},
        ACTION_KEY: {"dtype": "float32", "shape": [act_dim], "names": _names(action_names, act_dim, "action")},
        **{k: {"dtype": d, "shape": [1], "names": None} for k, d in INDEX_FEATURES.items()},
        REWARD_KEY: {"dtype": "float32", "shape": [1], "names": None},
        DONE_KEY: {"dtype": "bool", "shape": [1], "names": None},
    }
    for feature in features.values():
        feature["fps"] = fps
    stats = {k: _stats(v) for k, v in cols.items()}
    ep_stats = [{k: _stats(v[s:s + t]) for k, v in cols.items()} for s, t in zip(starts, lengths)]
    video_cols: dict[str, list] = {}
    for key, (height, width) in cams.items():
        frames = [np.asarray(imgs[key])[:t] for imgs, t in zip(eps_images, lengths)]
        path = root / VIDEO_PATH.format(video_key=key, chunk_index=0, file_index=0)
        codec = _write_video(path, frames, fps, vcodec, crf)
        features[key] = {
            "dtype": "video", "shape": [height, width, 3], "names": ["height", "width", "channels"],
            "info": {"video.height": height, "video.width": width, "video.codec": codec, "video.pix_fmt": "yuv420p",
                     "video.is_depth_map": False, "video.fps": fps, "video.channels": 3, "has_audio": False},
        }
        stats[key] = _image_stats(np.concatenate(frames))
        for k, f in enumerate(frames):
            ep_stats[k][key] = _image_stats(f)
        video_cols[f"videos/{key}/chunk_index"] = [0] * len(eps)
        video_cols[f"videos/{key}/file_index"] = [0] * len(eps)
        video_cols[f"videos/{key}/from_timestamp"] = [float(s) / fps for s in starts]
        video_cols[f"videos/{key}/to_timestamp"] = [float(s + t) / fps for s, t in zip(starts, lengths)]

    _write_tasks(pa, pq, root / TASKS_PATH, task_list)
    ep_table = {
        "episode_index": pa.array(np.arange(len(eps), dtype=np.int64)),
        "tasks": pa.array([[t] for t in eps_tasks], pa.list_(pa.string())),
        "length": pa.array(lengths.astype(np.int64)),
        "data/chunk_index": pa.array(np.zeros(len(eps), np.int64)),
        "data/file_index": pa.array(np.zeros(len(eps), np.int64)),
        "dataset_from_index": pa.array(starts.astype(np.int64)),
        "dataset_to_index": pa.array((starts + lengths).astype(np.int64)),
        **{k: pa.array(v) for k, v in video_cols.items()},
        "meta/episodes/chunk_index": pa.array(np.zeros(len(eps), np.int64)),
        "meta/episodes/file_index": pa.array(np.zeros(len(eps), np.int64)),
    }
    for key in stats:
        for stat in stats[key]:
            ep_table[f"stats/{key}/{stat}"] = pa.array([np.asarray(e[key][stat]).reshape(-1).tolist()
                                                        for e in ep_stats])
    finals = np.stack([np.asarray(ep.observations, np.float32)[-1] for ep in eps])
    ep_table[FINAL_STATE_COLUMN] = _arrow_column(pa, finals)
    path = root / EPISODES_PATH.format(chunk_index=0, file_index=0)
    path.parent.mkdir(parents=True)
    pq.write_table(pa.table(ep_table), path)

    info = {
        "codebase_version": CODEBASE_VERSION, "robot_type": robot_type, "total_episodes": len(eps),
        "total_frames": n, "total_tasks": len(task_list), "chunks_size": 1000, "data_files_size_in_mb": 100,
        "video_files_size_in_mb": 500, "fps": fps, "splits": {"train": f"0:{len(eps)}"},
        "data_path": DATA_PATH, "video_path": VIDEO_PATH if cams else None, "features": features,
    }
    _write_json(root / INFO_PATH, info)
    _write_json(root / STATS_PATH, {k: {s: np.asarray(v).tolist() for s, v in st.items()} for k, st in stats.items()})
    return root


def _check_images(eps_images, lengths) -> tuple[dict[str, tuple[int, int]], list[dict]]:
    """({camera key: (H, W)}, per-episode {camera key: frames}); every episode must give the same
    cameras, uint8 [T or T+1, H, W, 3]."""
    given = [{_camera_key(name): np.asarray(v) for name, v in dict(imgs or {}).items()} for imgs in eps_images]
    keys = sorted(given[0])
    cams: dict[str, tuple[int, int]] = {}
    for k, (imgs, t) in enumerate(zip(given, lengths)):
        if sorted(imgs) != keys:
            raise DatasetError(f"episode {k} has cameras {sorted(imgs)} but episode 0 has {keys}: "
                               "give every episode the same cameras")
        for key, frames in imgs.items():
            if frames.dtype != np.uint8 or frames.ndim != 4 or frames.shape[-1] != 3 or len(frames) not in (t, t + 1):
                raise DatasetError(f"episode {k} camera '{key}' has {frames.dtype} {frames.shape}: give uint8 frames "
                                   f"[T or T+1, H, W, 3] with T={t} (one per action)")
            hw = (int(frames.shape[1]), int(frames.shape[2]))
            if cams.setdefault(key, hw) != hw:
                raise DatasetError(f"episode {k} camera '{key}' is {hw} but episode 0's is {cams[key]}: "
                                   "every episode needs the same frame size")
    return cams, given


def _names(names, dim: int, prefix: str) -> list[str]:
    names = list(names) if names is not None else [f"{prefix}_{i}" for i in range(dim)]
    if len(names) != dim:
        raise DatasetError(f"{prefix}_names has {len(names)} names for dim {dim}: give one name per dimension")
    return names


def _arrow_column(pa, values: np.ndarray):
    values = np.asarray(values)
    if values.ndim == 2:
        return pa.FixedSizeListArray.from_arrays(pa.array(values.reshape(-1)), int(values.shape[1]))
    return pa.array(values)


def _stats(values: np.ndarray) -> dict[str, np.ndarray]:
    v = np.asarray(values, np.float64)
    v = v.reshape(len(v), -1) if v.ndim > 1 else v.reshape(-1, 1)
    return {"min": v.min(0), "max": v.max(0), "mean": v.mean(0), "std": v.std(0), "count": np.array([len(v)])}


def _image_stats(frames: np.ndarray) -> dict[str, np.ndarray]:
    """Per-channel stats in [0, 1], shape [3, 1, 1], as LeRobot keeps them for images."""
    v = frames.reshape(-1, 3).astype(np.float64) / 255.0
    out = {s: f(v, axis=0).reshape(3, 1, 1) for s, f in (("min", np.min), ("max", np.max), ("mean", np.mean),
                                                        ("std", np.std))}
    out["count"] = np.array([len(frames)])
    return out


def _write_tasks(pa, pq, path: Path, task_list: list[str]) -> None:
    """tasks.parquet as pandas writes a frame indexed by task: column task_index, index column task."""
    table = pa.table({"task_index": pa.array(np.arange(len(task_list), dtype=np.int64)),
                      "task": pa.array(task_list, pa.string())})
    pandas_meta = {
        "index_columns": ["task"],
        "column_indexes": [{"name": None, "field_name": None, "pandas_type": "unicode", "numpy_type": "object",
                            "metadata": {"encoding": "UTF-8"}}],
        "columns": [
            {"name": "task_index", "field_name": "task_index", "pandas_type": "int64", "numpy_type": "int64",
             "metadata": None},
            {"name": "task", "field_name": "task", "pandas_type": "unicode", "numpy_type": "object", "metadata": None},
        ],
        "creator": {"library": "pyarrow", "version": pa.__version__},
        "pandas_version": "2.2.3",
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table.replace_schema_metadata({b"pandas": json.dumps(pandas_meta).encode()}), path)


def _write_json(path: Path, value) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(value, indent=4, ensure_ascii=False))


def _write_video(path: Path, episodes_frames, fps: int, vcodec: str, crf: int) -> str:
    av = _av("writing camera frames")
    path.parent.mkdir(parents=True, exist_ok=True)
    frames = np.concatenate(episodes_frames)
    height, width = frames.shape[1:3]
    if height % 2 or width % 2:
        raise DatasetError(f"camera frames are {height}x{width}: yuv420p video needs even height and width")
    with av.open(str(path), mode="w") as container:
        stream = container.add_stream(vcodec, rate=fps)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        stream.thread_count = 1
        stream.options = {"crf": str(crf), "g": "2"}
        for i, frame in enumerate(frames):
            vf = av.VideoFrame.from_ndarray(np.ascontiguousarray(frame), format="rgb24")
            vf.pts, vf.time_base = i, Fraction(1, fps)
            for packet in stream.encode(vf):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
        return stream.codec_context.name


# ============================================================================= read
@dataclass
class LeRobotData:
    dataset: Dataset                         # transitions; metadata has fps, robot_type, tasks, source
    tasks: list[str]                         # one per episode of `dataset` ("" when the file has none)
    episode_index: np.ndarray                # LeRobot episode_index of each episode of `dataset`
    images: dict[str, list[np.ndarray]] = field(default_factory=dict)  # camera key -> per episode uint8 [T,H,W,3]
    info: dict = field(default_factory=dict)


def load_lerobot_dataset(root, **kwargs) -> Dataset:
    """Just the transitions (what `train.load_dataset` needs); tasks are in metadata["tasks"]."""
    return load_lerobot(root, **kwargs).dataset


def load_lerobot(root, *, images=False, state_keys=(STATE_KEY,), last_frame: str = "drop") -> LeRobotData:
    """Read a LeRobotDataset v3 folder. images: False, True (every video feature) or camera names.

    last_frame: what to do with an episode's last frame when it is a timeout and the file does not
    store the final observation (foreign files): "drop" it (the frame before becomes the timeout) or
    "repeat" its own observation as the next one. Terminal last frames are always kept.
    """
    if last_frame not in ("drop", "repeat"):
        raise DatasetError(f"last_frame={last_frame!r} is not valid: use 'drop' or 'repeat'")
    pa, pq = _pyarrow()
    root = Path(root)
    info_path = root / INFO_PATH
    if not info_path.is_file():
        raise DatasetError(f"{info_path} not found: point at a LeRobotDataset v3 folder "
                           "(the one holding meta/ and data/)")
    try:
        info = json.loads(info_path.read_text())
    except json.JSONDecodeError as err:
        raise DatasetError(f"{info_path} is not valid JSON ({err.msg}, line {err.lineno}): "
                           "repair or re-export it") from None
    version = str(info.get("codebase_version", "missing"))
    if not version.startswith("v3."):
        raise DatasetError(
            f"{info_path} has codebase_version '{version}' but only LeRobotDataset v3.x is read: convert it with "
            "LeRobot's `python -m lerobot.datasets.v30.convert_dataset_v21_to_v30`"
        )
    features = info.get("features")
    if not isinstance(features, dict):
        raise DatasetError(f"{info_path} has no 'features' dict: every LeRobot v3 info.json lists its features")
    for key in (*state_keys, ACTION_KEY):
        if key not in features:
            raise DatasetError(f"{info_path} has no feature '{key}' (features: {', '.join(features)}): "
                               "this reader needs observation.state and action")
    fps = info.get("fps")
    if not isinstance(fps, (int, float)) or fps <= 0:
        raise DatasetError(f"{info_path} has fps={fps!r}: it must be a positive number")

    episodes = _read_episodes(pq, root)
    frames = _read_frames(pq, root, info, episodes, state_keys)
    order = np.lexsort((frames["frame_index"], frames["episode_index"]))
    frames = {k: v[order] for k, v in frames.items()}
    ep_ids, ep_starts = np.unique(frames["episode_index"], return_index=True)
    ep_stops = np.append(ep_starts[1:], len(order))
    total = info.get("total_frames")
    if isinstance(total, int) and total != len(order):
        raise DatasetError(f"{info_path} says total_frames={total} but the data files hold {len(order)} frames: "
                           "the folder is incomplete, fetch the missing data files")
    tasks_by_index = _read_tasks(pq, root)

    obs, act = frames["state"], frames[ACTION_KEY]
    rewards = frames.get(REWARD_KEY, np.zeros(len(order), np.float32))
    done = frames.get(DONE_KEY, np.zeros(len(order), bool))
    final_states = episodes.get(FINAL_STATE_COLUMN) if len(state_keys) == 1 else None
    keep_rows, next_obs, terminals, timeouts = [], [], [], []
    kept_eps, kept_slices, ep_tasks = [], [], []
    for ep, start, stop in zip(ep_ids.tolist(), ep_starts.tolist(), ep_stops.tolist()):
        rows = np.arange(start, stop)
        nxt = np.concatenate([obs[start + 1:stop], obs[stop - 1:stop]])
        terminal = bool(done[stop - 1])
        final = final_states.get(ep) if final_states is not None else None
        if final is not None and len(final) == obs.shape[1]:
            nxt[-1] = final
        elif not terminal and last_frame == "drop":
            rows, nxt = rows[:-1], nxt[:-1]
        if len(rows) == 0:
            continue
        term = np.zeros(len(rows), bool)
        tout = np.zeros(len(rows), bool)
        term[-1], tout[-1] = terminal, not terminal
        keep_rows.append(rows), next_obs.append(nxt), terminals.append(term), timeouts.append(tout)
        kept_eps.append(ep), kept_slices.append((start, start + len(rows)))
        ep_tasks.append(_episode_task(ep, frames.get("task_index"), start, tasks_by_index, episodes))
    if not keep_rows:
        raise DatasetError(f"{root} has no usable transitions (every episode is one frame long): "
                           "read it with last_frame='repeat'")
    rows = np.concatenate(keep_rows)
    dataset = Dataset(
        observations=obs[rows], actions=act[rows], rewards=rewards[rows].astype(np.float32),
        next_observations=np.concatenate(next_obs).astype(np.float32), terminals=np.concatenate(terminals),
        timeouts=np.concatenate(timeouts),
        metadata={"source": "lerobot", "path": str(root), "codebase_version": version, "fps": fps,
                  "robot_type": info.get("robot_type"), "tasks": ep_tasks, "has_rewards": REWARD_KEY in frames},
    )
    dataset.validate()
    out = LeRobotData(dataset, ep_tasks, np.array(kept_eps, np.int64), info=info)
    if images:
        video_keys = [k for k, f in features.items() if f.get("dtype") == "video"]
        wanted = video_keys if images is True else [_camera_key(c) for c in images]
        for key in wanted:
            if key not in video_keys:
                raise DatasetError(f"{info_path} has no video feature '{key}': its cameras are {video_keys or 'none'}")
            out.images[key] = _read_camera(root, info, key, episodes, frames, kept_eps, kept_slices, ep_starts, ep_ids)
    return out


def _read_episodes(pq, root: Path) -> dict[str, dict]:
    """Episode table columns as {column: {episode_index: value}} (empty when there is no table)."""
    paths = sorted((root / "meta" / "episodes").glob("chunk-*/file-*.parquet"))
    out: dict[str, dict] = {}
    for path in paths:
        table = pq.read_table(path)
        if "episode_index" not in table.column_names:
            raise DatasetError(f"{path} has no 'episode_index' column: it is not a LeRobot v3 episodes table")
        ids = table.column("episode_index").to_pylist()
        for name in table.column_names:
            if name.startswith("stats/"):
                continue
            out.setdefault(name, {}).update(zip(ids, table.column(name).to_pylist()))
    return out


def _read_frames(pq, root: Path, info: dict, episodes: dict, state_keys) -> dict[str, np.ndarray]:
    template = info.get("data_path") or DATA_PATH
    if "data/chunk_index" in episodes and "data/file_index" in episodes:
        pairs = sorted({(c, episodes["data/file_index"][e]) for e, c in episodes["data/chunk_index"].items()})
        paths = [root / template.format(chunk_index=c, file_index=f) for c, f in pairs]
    else:
        paths = sorted((root / "data").glob("chunk-*/*.parquet"))
    if not paths:
        raise DatasetError(f"{root / 'data'} holds no parquet files: the folder has no frames")
    features = info["features"]
    parts = []
    for path in paths:
        if not path.is_file():
            raise DatasetError(f"{path} is missing (named by meta/episodes): fetch the dataset's data files")
        names = pq.read_schema(path).names
        need = [*dict.fromkeys((*state_keys, *REQUIRED_COLUMNS))]
        missing = [c for c in need if c not in names]
        if missing:
            raise DatasetError(f"{path} has no column(s) {missing}: a LeRobot v3 data file needs {', '.join(need)}")
        table = pq.read_table(path, columns=[c for c in (*need, "task_index", REWARD_KEY, DONE_KEY) if c in names])
        part = {}
        for name in table.column_names:
            shape = features.get(name, {}).get("shape")
            part[name] = _to_numpy(table.column(name), path, name, shape)
        part["state"] = np.concatenate([part[k].reshape(len(part[k]), -1) for k in state_keys], axis=1)
        parts.append(part)
    keys = set.intersection(*(set(p) for p in parts))
    out = {k: np.concatenate([p[k] for p in parts]) for k in keys}
    out["state"] = out["state"].astype(np.float32)
    out[ACTION_KEY] = out[ACTION_KEY].reshape(len(out[ACTION_KEY]), -1).astype(np.float32)
    for k in (REWARD_KEY, DONE_KEY, "task_index", "episode_index", "frame_index"):
        if k in out:
            out[k] = out[k].reshape(len(out[k]), -1)[:, 0]
    if DONE_KEY in out:
        out[DONE_KEY] = out[DONE_KEY].astype(bool)
    return out


def _to_numpy(column, path: Path, name: str, shape) -> np.ndarray:
    """A parquet column as a numpy array [N, *shape]; the shape must match info.json's feature."""
    import pyarrow as pa

    column = column.combine_chunks() if hasattr(column, "combine_chunks") else column
    if pa.types.is_fixed_size_list(column.type) or pa.types.is_list(column.type) or pa.types.is_large_list(column.type):
        lengths = column.value_lengths().to_numpy(zero_copy_only=False) if len(column) else np.zeros(0, int)
        width = int(lengths[0]) if len(lengths) else 0
        if len(lengths) and (lengths != width).any():
            raise DatasetError(f"{path} column '{name}' has rows of different lengths "
                               f"({lengths.min()}..{lengths.max()}): "
                               "every row of a feature needs its declared shape")
        values = column.flatten().to_numpy(zero_copy_only=False).reshape(len(column), width)
    else:
        values = column.to_numpy(zero_copy_only=False).reshape(len(column), 1)
    if shape is not None:
        want = int(np.prod(shape))
        if values.shape[1] != want:
            raise DatasetError(f"{path} column '{name}' has {values.shape[1]} values per row but meta/info.json "
                               f"declares shape {list(shape)}: fix the feature's shape in info.json or the data")
    return values


def _read_tasks(pq, root: Path) -> dict[int, str]:
    path = root / TASKS_PATH
    if not path.is_file():
        return {}
    table = pq.read_table(path)
    names = table.column_names
    if "task_index" not in names:
        raise DatasetError(f"{path} has no 'task_index' column: LeRobot v3 tasks map task -> task_index")
    text_col = next((c for c in ("task", "__index_level_0__") if c in names), None)
    if text_col is None:
        others = [c for c in names if c != "task_index" and table.schema.field(c).type == "string"]
        if not others:
            raise DatasetError(f"{path} has no task text column ('task'): write the task strings as the index")
        text_col = others[0]
    return dict(zip(table.column("task_index").to_pylist(), table.column(text_col).to_pylist()))


def _episode_task(ep, task_index, start, tasks_by_index, episodes) -> str:
    if task_index is not None and int(task_index[start]) in tasks_by_index:
        return str(tasks_by_index[int(task_index[start])])
    listed = episodes.get("tasks", {}).get(ep)
    if listed:
        return str(listed[0] if isinstance(listed, list) else listed)
    return ""


def _read_camera(root, info, key, episodes, frames, kept_eps, kept_slices, ep_starts, ep_ids) -> list[np.ndarray]:
    """Decode one camera and cut it into the kept frames of every kept episode."""
    template = info.get("video_path") or VIDEO_PATH
    fps = float(info["fps"])
    decoded: dict[Path, tuple[np.ndarray, np.ndarray]] = {}
    start_of = dict(zip(ep_ids.tolist(), ep_starts.tolist()))
    out = []
    for ep, (start, stop) in zip(kept_eps, kept_slices):
        chunk = episodes.get(f"videos/{key}/chunk_index", {}).get(ep, 0)
        file = episodes.get(f"videos/{key}/file_index", {}).get(ep, 0)
        offset = episodes.get(f"videos/{key}/from_timestamp", {}).get(ep, 0.0)
        path = root / template.format(video_key=key, chunk_index=chunk, file_index=file)
        if path not in decoded:
            decoded[path] = _decode_video(path)
        times, images = decoded[path]
        frame_index = frames["frame_index"][start:stop]
        want = float(offset) + frame_index / fps
        nearest = np.clip(np.searchsorted(times, want), 0, len(times) - 1)
        prev = np.clip(nearest - 1, 0, len(times) - 1)
        nearest = np.where(np.abs(times[prev] - want) < np.abs(times[nearest] - want), prev, nearest)
        gap = np.abs(times[nearest] - want)
        if len(want) and gap.max() > 0.5 / fps:
            raise DatasetError(f"{path} has no frame within half a frame of t={float(want[np.argmax(gap)]):.3f}s "
                               f"(episode {ep}, start row {start_of[ep]}): the video is shorter than the data")
        out.append(images[nearest])
    return out


def _decode_video(path: Path) -> tuple[np.ndarray, np.ndarray]:
    av = _av("reading camera frames")
    if not path.is_file():
        raise DatasetError(f"{path} is missing: fetch the dataset's videos or read it with images=False")
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        stream.thread_count = 1
        pairs = [(float(f.time), f.to_ndarray(format="rgb24")) for f in container.decode(stream)]
    if not pairs:
        raise DatasetError(f"{path} holds no video frames: re-encode or re-fetch it")
    pairs.sort(key=lambda p: p[0])
    return np.array([t for t, _ in pairs]), np.stack([a for _, a in pairs])
