"""OGBench's own dataset files: written here the way OGBench's data_gen_scripts write them (the oracles
in data-collection mode, `prev_qpos` per row), read by our loader, and checked against OGBench's own
`load_dataset` and `relabel_dataset`; bad files give one-line errors; `dataset.path=...npz` trains."""
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from embodied.data.d4rl import load_hdf5
from embodied.data.ogbench_npz import load_ogbench_npz
from embodied.errors import DatasetError

REPO = Path(__file__).resolve().parents[2]


def record_ogbench_file(path, suite, episodes=2, steps=120, seed=0) -> dict:
    """OGBench's collection loop: row = (ob, action, done, prev_qpos, prev_qvel[, prev_button_states])."""
    from embodied.data import ogbench_gen
    from sims.manip import make_base, suite_of

    env = make_base(suite, mode="data_collection", max_episode_steps=steps)
    base = env.unwrapped
    oracles = ogbench_gen.make_oracles(base, suite_of(suite).kind, "noisy", ogbench_gen.GenSpec(suite, "noisy").resolved())
    cols = {k: [] for k in ("observations", "actions", "terminals", "qpos", "qvel", "button_states")}
    rng = np.random.default_rng(seed)
    np.random.seed(seed)  # the oracles draw from numpy's global stream
    for episode in range(episodes):
        ob, info = env.reset(seed=seed + episode)
        agent = oracles[info["privileged/target_task"]]
        agent.reset(ob, info)
        done = False
        while not done:
            action = np.clip(np.asarray(agent.select_action(ob, info)) + rng.normal(0, 0.05, 5), -1, 1)
            next_ob, _, terminated, truncated, info = env.step(action)
            done = terminated or truncated
            if agent.done and not done:
                agent_ob, agent_info = base.set_new_target()
                agent = oracles[agent_info["privileged/target_task"]]
                agent.reset(agent_ob, agent_info)
                info = {**info, **agent_info}
            for key, value in (("observations", ob), ("actions", action), ("terminals", done),
                               ("qpos", info["prev_qpos"]), ("qvel", info["prev_qvel"])):
                cols[key].append(value)
            if "prev_button_states" in info:
                cols["button_states"].append(info["prev_button_states"])
            ob = next_ob
    env.close()
    out = {k: np.asarray(v, np.int64 if k == "button_states" else np.float32) for k, v in cols.items() if v}
    np.savez(path, **out)
    return out


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("ogbench")
    return {suite: (root / f"{suite}-play-v0.npz", record_ogbench_file(root / f"{suite}-play-v0.npz", suite))
            for suite in ("scene", "cube-single")}


def ogbench_relabelled(path, suite, task_id):
    """What OGBench itself makes of the file for the single task: load_dataset + relabel_dataset."""
    from ogbench.relabel_utils import relabel_dataset
    from ogbench.utils import load_dataset
    from sims.manip import make_base

    data = load_dataset(str(path), add_info=True)
    env = make_base(suite, mode="task", task_id=task_id)
    relabel_dataset(suite, env, data)
    env.close()
    return data


@pytest.mark.slow
@pytest.mark.parametrize("suite", ["scene", "cube-single"])
def test_transitions_and_rewards_match_ogbench_own_loader_and_relabelling(files, suite):
    path, raw = files[suite]
    ours = load_ogbench_npz(path, reward_timing="current")
    theirs = ogbench_relabelled(path, suite, ours.metadata["task_id"])
    assert ours.metadata["env"] == suite and ours.metadata["task_id"] == 2  # inferred from the name; default task
    for key in ("observations", "next_observations", "actions"):
        np.testing.assert_array_equal(getattr(ours, key), theirs[key], err_msg=key)
    np.testing.assert_array_equal(ours.rewards, theirs["rewards"])
    np.testing.assert_array_equal(ours.terminals, theirs["masks"] == 0)
    ends = theirs["terminals"] > 0  # OGBench: the last transition of each trajectory
    np.testing.assert_array_equal(ours.timeouts, ends & ~ours.terminals)
    assert len(np.unique(ours.rewards)) > 1  # the oracles' play changed some sub-goals: a real comparison
    assert len(ours) == len(raw["observations"]) - 2  # two trajectories, each loses its last stored row

    # default timing: the state the transition reaches (OGBench's label of the next row)
    nxt = load_ogbench_npz(path)
    inside = ~ends  # the next row is inside the trajectory, so OGBench labelled it too
    np.testing.assert_array_equal(nxt.rewards[:-1][inside[:-1]], theirs["rewards"][1:][inside[:-1]])
    np.testing.assert_array_equal(nxt.terminals[:-1][inside[:-1]], (theirs["masks"] == 0)[1:][inside[:-1]])
    assert nxt.metadata["reward_timing"] == "next"


@pytest.mark.slow
def test_per_transition_files_with_their_own_rewards(files, tmp_path):
    """The dict ogbench.load_dataset + relabel_dataset return, saved with np.savez, reads back as is."""
    path, _ = files["scene"]
    theirs = ogbench_relabelled(path, "scene", 2)
    saved = tmp_path / "scene-play-singletask-v0.npz"
    np.savez(saved, **theirs)
    ds = load_ogbench_npz(saved)
    assert ds.metadata["layout"] == "transitions" and "own rewards" in ds.metadata["reward"]
    np.testing.assert_array_equal(ds.rewards, theirs["rewards"])
    np.testing.assert_array_equal(ds.next_observations, theirs["next_observations"])
    np.testing.assert_array_equal(ds.terminals, theirs["masks"] == 0)


@pytest.mark.slow
def test_load_hdf5_and_dataset_path_take_an_npz(files, tmp_path):
    path, _ = files["cube-single"]
    ds = load_hdf5(path)  # what the train job calls for dataset.path
    assert ds.metadata["source"].endswith(path.name) and ds.obs_dim == 28 and ds.act_dim == 5
    env = {**os.environ, "EMBODIED_CACHE": str(tmp_path / "cache"), "WANDB_MODE": "disabled", "MUJOCO_GL": "egl"}
    result = subprocess.run([sys.executable, "-m", "embodied.train", "experiment=smoke", "env=cube-single",
                             f"dataset.path={path}", f"hydra.run.dir={tmp_path / 'run'}", "budget.online_steps=0"],
                            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "run directory:" in result.stdout
    wrong = subprocess.run([sys.executable, "-m", "embodied.train", "experiment=smoke", "env=scene",
                            f"dataset.path={path}", f"hydra.run.dir={tmp_path / 'run2'}"],
                           cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    errors = [line for line in wrong.stderr.splitlines() if line.startswith("error:")]
    assert wrong.returncode == 2 and len(errors) == 1 and "obs_dim=40" in errors[0], wrong.stderr[-2000:]


def save(path, arrays):
    np.savez(path, **arrays)
    return path


def good(n=12, obs_dim=28):
    terminals = np.zeros(n, np.float32)
    terminals[n // 2 - 1] = terminals[-1] = 1
    qpos = np.zeros((n, 21), np.float32)
    return {"observations": np.zeros((n, obs_dim), np.float32), "actions": np.zeros((n, 5), np.float32),
            "terminals": terminals, "qpos": qpos}


BAD = {  # name -> (arrays or bytes, file name, the words the one-line error must contain)
    "missing actions": ({k: v for k, v in good().items() if k != "actions"}, "cube-single-play-v0.npz",
                        "has no 'actions'"),
    "another env's width": (good(obs_dim=40), "cube-single-play-v0.npz", "'observations' in cube-single-play-v0.npz has shape [12, 40]"),
    "nan at a file row": ({**good(), "observations": np.where(np.arange(12)[:, None] == 9, np.nan, 0).astype(np.float32)
                           * np.ones((1, 28), np.float32)}, "cube-single-play-v0.npz", "NaN/Inf at file row 9"),
    "terminals not 0/1": ({**good(), "terminals": np.full(12, 2.0, np.float32)}, "cube-single-play-v0.npz",
                          "'terminals' in cube-single-play-v0.npz has 2.0 at file row 0"),
    "no qpos for the reward": ({k: v for k, v in good().items() if k != "qpos"}, "cube-single-play-v0.npz",
                               "has no 'qpos': the task reward is computed from it"),
    "short actions": ({**good(), "actions": np.zeros((11, 5), np.float32)}, "cube-single-play-v0.npz",
                      "'actions' in cube-single-play-v0.npz has 11 rows but 'observations' has 12"),
    "pickled array": ({**good(), "meta": np.array([{"a": 1}], dtype=object)}, "cube-single-play-v0.npz",
                      "object (pickled) array"),
    "images": ({**good(), "observations": np.zeros((12, 8, 8, 3), np.uint8)}, "cube-single-play-v0.npz",
               "are images uint8"),
    "unknown name": (good(), "mydata.npz", "cannot tell which env mydata.npz is from"),
    "visual name": (good(), "visual-cube-single-play-v0.npz", "use cube-single-play-v0.npz instead"),
    "truncated": (b"PK\x03\x04 not really a zip archive", "cube-single-play-v0.npz", "download it again"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_files_are_one_line_errors_naming_the_field_and_the_fix(case, tmp_path):
    arrays, name, words = BAD[case]
    path = tmp_path / name
    if isinstance(arrays, bytes):
        path.write_bytes(arrays)
    else:
        save(path, arrays)
    with pytest.raises(DatasetError) as err:
        load_hdf5(path)
    message = str(err.value)
    assert words in message and "\n" not in message, message
    assert "delete" not in message  # it is the user's own file


@pytest.mark.slow
def test_a_good_hand_made_file_and_explicit_env(tmp_path):
    path = save(tmp_path / "whatever.npz", good())
    ds = load_ogbench_npz(path, env="cube-single", task_id=1)
    assert len(ds) == 10 and ds.timeouts.tolist() == [0, 0, 0, 0, 1, 0, 0, 0, 0, 1]
    assert ds.metadata["episodes"] == 2 and ds.metadata["task_id"] == 1
    with pytest.raises(DatasetError, match="task_id=9 for cube-single: choose 1..5"):
        load_ogbench_npz(path, env="cube-single", task_id=9)
    with pytest.raises(DatasetError, match="OGBench files carry no goals"):
        load_ogbench_npz(path, env="cube-single-goal")
    with pytest.raises(DatasetError, match="reward_timing='later': choose one of next, current"):
        load_ogbench_npz(path, env="cube-single", reward_timing="later")
