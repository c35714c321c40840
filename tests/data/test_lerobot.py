"""LeRobotDataset v3 folders: our writer and reader, a hand-built foreign folder, bad inputs."""
import json

import numpy as np
import pytest

from embodied.data.dataset import Dataset
from embodied.errors import DatasetError, UserError

import av
import pyarrow as pa
import pyarrow.parquet as pq
from data_helpers import make_episodes

from embodied.data import lerobot


def _same_arrays(a: Dataset, b: Dataset):
    for key, value in a.arrays().items():
        np.testing.assert_array_equal(getattr(b, key), value, err_msg=key)


def test_round_trip_arrays_and_tasks(tmp_path):
    ds = Dataset.from_episodes(make_episodes([4, 3, 2], ["terminal", "timeout", "timeout"]))
    tasks = ["open the drawer", "push the cube left", "open the drawer"]
    root = lerobot.save_lerobot(tmp_path / "ds", ds, fps=20, tasks=tasks, robot_type="toy")
    back = lerobot.load_lerobot(root)
    _same_arrays(ds, back.dataset)
    assert back.tasks == tasks and back.dataset.metadata["tasks"] == tasks
    assert back.episode_index.tolist() == [0, 1, 2]

    info = json.loads((root / "meta/info.json").read_text())
    assert info["codebase_version"] == "v3.0" and info["fps"] == 20 and info["robot_type"] == "toy"
    assert (info["total_episodes"], info["total_frames"], info["total_tasks"]) == (3, 9, 2)
    assert info["data_path"] == "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
    assert info["features"]["observation.state"]["shape"] == [3] and info["features"]["next.done"]["dtype"] == "bool"
    frames = pq.read_table(root / "data/chunk-000/file-000.parquet")
    for col in ("observation.state", "action", "timestamp", "frame_index", "episode_index", "index", "task_index",
                "next.reward", "next.done"):
        assert col in frames.column_names
    assert frames.column("next.done").to_pylist() == [False, False, False, True] + [False] * 5
    assert frames.column("task_index").to_pylist() == [0] * 4 + [1] * 3 + [0] * 2
    tasks_table = pq.read_table(root / "meta/tasks.parquet")
    assert tasks_table.column("task").to_pylist() == ["open the drawer", "push the cube left"]
    eps = pq.read_table(root / "meta/episodes/chunk-000/file-000.parquet")
    assert eps.column("dataset_from_index").to_pylist() == [0, 4, 7]
    assert eps.column("length").to_pylist() == [4, 3, 2]
    stats = json.loads((root / "meta/stats.json").read_text())
    assert stats["action"]["count"] == [9] and len(stats["observation.state"]["mean"]) == 3


def test_round_trip_camera_frames(tmp_path):
    episodes = []
    rng = np.random.default_rng(0)
    for k, length in enumerate([3, 2]):
        ep = make_episodes([length], ["timeout"], start=10 * k)[0]
        frames = np.zeros((length + 1, 16, 16, 3), np.uint8)
        for t in range(length + 1):  # flat colour blocks survive yuv420p encoding almost exactly
            frames[t, :8] = rng.integers(0, 256, 3)
            frames[t, 8:] = (40 * t, 200, 90 + 50 * k)
        episodes.append({"observations": ep.observations, "actions": ep.actions, "rewards": ep.rewards,
                         "truncated": True, "task": f"task {k}", "images": {"front": frames}})
    root = lerobot.save_lerobot(tmp_path / "cam", episodes, fps=10)
    assert (root / "videos/observation.images.front/chunk-000/file-000.mp4").is_file()
    back = lerobot.load_lerobot(root, images=["front"])
    assert back.tasks == ["task 0", "task 1"]
    decoded = back.images["observation.images.front"]
    assert [f.shape for f in decoded] == [(3, 16, 16, 3), (2, 16, 16, 3)]
    for ep, got in zip(episodes, decoded):
        err = np.abs(got.astype(int) - ep["images"]["front"][: len(got)].astype(int))
        assert err.mean() < 4 and got.dtype == np.uint8
    info = json.loads((root / "meta/info.json").read_text())
    assert info["features"]["observation.images.front"]["dtype"] == "video"
    assert info["features"]["observation.images.front"]["shape"] == [16, 16, 3]


def _foreign_folder(root, version="v3.0", drop_column=None, state_shape=2):
    """A LeRobot v3 folder built by hand from the format's description (not with our writer):
    2 episodes of 3 and 2 frames, the second one ending in next.done."""
    (root / "meta/episodes/chunk-000").mkdir(parents=True)
    (root / "data/chunk-000").mkdir(parents=True)
    features = {
        "observation.state": {"dtype": "float32", "shape": [state_shape], "names": ["x", "y"][:state_shape]},
        "action": {"dtype": "float32", "shape": [1], "names": ["u"]},
        "next.reward": {"dtype": "float32", "shape": [1], "names": None},
        "next.done": {"dtype": "bool", "shape": [1], "names": None},
        "timestamp": {"dtype": "float32", "shape": [1], "names": None},
        "frame_index": {"dtype": "int64", "shape": [1], "names": None},
        "episode_index": {"dtype": "int64", "shape": [1], "names": None},
        "index": {"dtype": "int64", "shape": [1], "names": None},
        "task_index": {"dtype": "int64", "shape": [1], "names": None},
    }
    info = {"codebase_version": version, "robot_type": "so100", "total_episodes": 2, "total_frames": 5,
            "total_tasks": 2, "chunks_size": 1000, "fps": 30, "splits": {"train": "0:2"},
            "data_path": "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet", "video_path": None,
            "features": features}
    (root / "meta/info.json").write_text(json.dumps(info))
    state = [[0.0, 0.5], [1.0, 1.5], [2.0, 2.5], [3.0, 3.5], [4.0, 4.5]]
    columns = {  # variable-length list columns, as HF datasets writes Sequence features
        "observation.state": pa.array(state, pa.list_(pa.float32())),
        "action": pa.array([[0.1], [0.2], [0.3], [0.4], [0.5]], pa.list_(pa.float32())),
        "timestamp": pa.array([0.0, 1 / 30, 2 / 30, 0.0, 1 / 30], pa.float32()),
        "frame_index": pa.array([0, 1, 2, 0, 1], pa.int64()),
        "episode_index": pa.array([0, 0, 0, 1, 1], pa.int64()),
        "index": pa.array([0, 1, 2, 3, 4], pa.int64()),
        "task_index": pa.array([1, 1, 1, 0, 0], pa.int64()),
        "next.reward": pa.array([0.0, 0.0, 0.0, 0.0, 1.0], pa.float32()),
        "next.done": pa.array([False, False, False, False, True]),
    }
    if drop_column:
        del columns[drop_column]
    pq.write_table(pa.table(columns), root / "data/chunk-000/file-000.parquet")
    pq.write_table(pa.table({"task_index": pa.array([0, 1], pa.int64()),
                             "__index_level_0__": ["stack the blocks", "wave"]}), root / "meta/tasks.parquet")
    pq.write_table(pa.table({
        "episode_index": pa.array([0, 1], pa.int64()), "tasks": [["wave"], ["stack the blocks"]],
        "length": pa.array([3, 2], pa.int64()), "data/chunk_index": pa.array([0, 0], pa.int64()),
        "data/file_index": pa.array([0, 0], pa.int64()), "dataset_from_index": pa.array([0, 3], pa.int64()),
        "dataset_to_index": pa.array([3, 5], pa.int64()),
    }), root / "meta/episodes/chunk-000/file-000.parquet")
    return root


def test_foreign_folder_read(tmp_path):
    root = _foreign_folder(tmp_path / "foreign")
    back = lerobot.load_lerobot(root)
    ds = back.dataset
    # episode 0 ends without next.done and has no stored final state: its last frame is dropped and
    # frame 1 becomes the timeout; episode 1 ends in a terminal and keeps every frame
    np.testing.assert_array_equal(ds.observations, [[0, 0.5], [1, 1.5], [3, 3.5], [4, 4.5]])
    np.testing.assert_array_equal(ds.next_observations, [[1, 1.5], [2, 2.5], [4, 4.5], [4, 4.5]])
    np.testing.assert_allclose(ds.actions[:, 0], [0.1, 0.2, 0.4, 0.5])
    np.testing.assert_array_equal(ds.rewards, [0, 0, 0, 1])
    assert ds.terminals.tolist() == [False, False, False, True]
    assert ds.timeouts.tolist() == [False, True, False, False]
    assert back.tasks == ["wave", "stack the blocks"] and ds.metadata["fps"] == 30

    repeat = lerobot.load_lerobot(root, last_frame="repeat").dataset
    assert len(repeat) == 5 and repeat.timeouts.tolist() == [False, False, True, False, False]
    np.testing.assert_array_equal(repeat.next_observations[2], [2, 2.5])


def test_missing_info_json(tmp_path):
    with pytest.raises(UserError, match=r"meta/info.json not found") as err:
        lerobot.load_lerobot(tmp_path)
    assert "\n" not in str(err.value)


def test_unsupported_version(tmp_path):
    root = _foreign_folder(tmp_path / "old", version="v2.1")
    with pytest.raises(DatasetError, match=r"codebase_version 'v2.1'.*convert_dataset_v21_to_v30"):
        lerobot.load_lerobot(root)


def test_missing_column(tmp_path):
    root = _foreign_folder(tmp_path / "nocol", drop_column="action")
    with pytest.raises(DatasetError, match=r"file-000.parquet has no column\(s\) \['action'\]"):
        lerobot.load_lerobot(root)


def test_shape_mismatch(tmp_path):
    root = _foreign_folder(tmp_path / "shape", state_shape=1)
    with pytest.raises(DatasetError, match=r"column 'observation.state' has 2 values per row.*shape \[1\]"):
        lerobot.load_lerobot(root)


def test_writer_rejects_bad_frames(tmp_path):
    ep = make_episodes([3], ["timeout"])[0]
    bad = {"observations": ep.observations, "actions": ep.actions, "rewards": ep.rewards,
           "images": {"front": np.zeros((4, 16, 16, 3), np.float32)}}
    with pytest.raises(DatasetError, match=r"camera 'observation.images.front' has float32"):
        lerobot.save_lerobot(tmp_path / "bad", [bad])


def test_foreign_folder_with_video(tmp_path):
    """Hand-built mp4 (PyAV directly) holding both episodes back to back, located by the episodes
    table's videos/<key>/from_timestamp."""
    from fractions import Fraction

    root = _foreign_folder(tmp_path / "video")
    key = "observation.images.top"
    info = json.loads((root / "meta/info.json").read_text())
    info["features"][key] = {"dtype": "video", "shape": [16, 16, 3], "names": ["height", "width", "channels"]}
    info["video_path"] = "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"
    (root / "meta/info.json").write_text(json.dumps(info))
    frames = np.stack([np.full((16, 16, 3), 40 * i, np.uint8) for i in range(5)])  # grey level = global index
    path = root / f"videos/{key}/chunk-000/file-000.mp4"
    path.parent.mkdir(parents=True)
    with av.open(str(path), "w") as container:
        stream = container.add_stream("libx264", rate=30)
        stream.width, stream.height, stream.pix_fmt = 16, 16, "yuv420p"
        for i, frame in enumerate(frames):
            vf = av.VideoFrame.from_ndarray(frame, format="rgb24")
            vf.pts, vf.time_base = i, Fraction(1, 30)
            for packet in stream.encode(vf):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    eps_path = root / "meta/episodes/chunk-000/file-000.parquet"
    eps = pq.read_table(eps_path)
    for name, values in (("chunk_index", [0, 0]), ("file_index", [0, 0]),
                         ("from_timestamp", [0.0, 3 / 30]), ("to_timestamp", [3 / 30, 5 / 30])):
        eps = eps.append_column(f"videos/{key}/{name}", pa.array(values))
    pq.write_table(eps, eps_path)

    back = lerobot.load_lerobot(root, images=True)
    got = back.images[key]
    assert [len(f) for f in got] == [2, 2]  # episode 0 lost its last (timeout) frame
    levels = [int(round(f.mean())) for ep in got for f in ep]
    assert np.allclose(levels, [0, 40, 120, 160], atol=3)
    with pytest.raises(DatasetError, match=r"no video feature 'observation.images.wrist'"):
        lerobot.load_lerobot(root, images=["wrist"])


def test_the_train_job_reads_a_lerobot_folder_as_dataset_path(tmp_path):
    """`dataset.path=<LeRobot v3 folder>`: the config check accepts the folder and load_dataset reads it."""
    from hydra import compose, initialize_config_dir

    from embodied.config_check import check_config
    from embodied.errors import ConfigError
    from embodied.train import CONF_DIR, load_dataset

    ds = Dataset.from_episodes(make_episodes([4, 3], ["terminal", "timeout"]))
    root = lerobot.save_lerobot(tmp_path / "ds", ds, fps=20, tasks=["a", "b"])
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="train", overrides=["experiment=smoke", f"dataset.path={root}"])
        empty = compose(config_name="train", overrides=["experiment=smoke", f"dataset.path={tmp_path}"])
    check_config(cfg)
    _same_arrays(ds, load_dataset(cfg))
    with pytest.raises(ConfigError, match="neither a file nor a LeRobotDataset folder"):
        check_config(empty)
