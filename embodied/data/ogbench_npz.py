"""OGBench's own dataset files (`cube-single-play-v0.npz`, ...): the layout `ogbench.load_dataset` reads.

So a user who has OGBench's published datasets can train on them with `dataset.path=...npz`.

The file, as OGBench's data_gen_scripts write it: one row per recorded step, trajectories back to back.
Row t holds the observation s_t, the action a_t taken in it, `terminals[t] = 1` on the last row of
each trajectory, and the simulator state of s_t in `qpos`, `qvel` (and `button_states`). The successor
of a trajectory's last row is not stored, so, as `ogbench.load_dataset` does, the transitions are the
rows with `terminals == 0`, with next_observations[t] = observations[t + 1]. A file that already has
`next_observations` is in the per-transition layout (every row is a transition, `terminals` marks each
trajectory's last one), like the dict `ogbench.load_dataset` returns.

OGBench's `terminals` say where a recorded trajectory stops, not that a task ended: they become
`timeouts` (bootstrap). The files carry no rewards: those of the named single task are computed from
`qpos`/`button_states` with OGBench's criteria (`ogbench.relabel_utils.relabel_dataset`: a cube within
4 cm of its target, buttons equal, drawer and window within 4 cm), as satisfied sub-goals - all, and a
transition is terminal when every sub-goal holds (OGBench's `masks == 0`). relabel_dataset evaluates
the state s_t; by default the state s_{t+1} the transition reaches is used instead, which is how the
sims' envs reward a step and how `embodied.data.ogbench_gen` labels its data (`reward_timing="current"`
reproduces OGBench's numbers). A file that has `rewards` (and `masks`) keeps them.
"""
from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np

from embodied.data.dataset import Dataset
from embodied.errors import DatasetError, UserError
from sims import manip, predicates

TIMINGS = ("next", "current")
QPOS_OBJECTS = 14  # OGBench: the first 14 qpos entries are the arm and gripper; each cube then has 7
CUBE_QPOS = 7


def is_npz(path) -> bool:
    """An .npz is a zip archive (HDF5 files start with their own signature)."""
    try:
        return zipfile.is_zipfile(path)
    except OSError:
        return False


def env_from_name(path: Path) -> str:
    """The embodied task an OGBench file name is about: `<env>-<kind>-v0[-val].npz` -> `<env>`."""
    stem = path.name[: -len(".npz")] if path.name.endswith(".npz") else path.stem
    if stem.startswith("visual-"):
        raise DatasetError(f"{path.name} is a visual OGBench dataset (image observations): only state datasets can "
                           f"be read; use {path.name[len('visual-'):]} instead")
    for name in sorted(manip.SUITES, key=len, reverse=True):
        if stem.startswith(name + "-"):
            return name
    raise DatasetError(f"cannot tell which env {path.name} is from: OGBench names its files <env>-<kind>-v0.npz "
                       f"(env one of {', '.join(manip.SUITES)}); rename it that way, or call "
                       "embodied.data.ogbench_npz.load_ogbench_npz(path, env=...)")


def load_ogbench_npz(path, env: str | None = None, task_id: int | None = None, reward_timing: str = "next",
                     *, cached: bool = False) -> Dataset:
    """Read an OGBench dataset file into a validated Dataset labelled with one task's rewards.

    env: the embodied manipulation task (default: from the file name); task_id: the single task whose
    sub-goals define the reward (default: OGBench's default task for that env, as `sims.make` uses);
    reward_timing: "next" (state reached, the sims' convention) or "current" (OGBench's relabelling).
    """
    path = Path(path)
    if reward_timing not in TIMINGS:
        raise DatasetError(f"reward_timing={reward_timing!r}: choose one of {', '.join(TIMINGS)}")
    env = env or env_from_name(path)
    if env.endswith("-goal"):
        raise DatasetError(f"env={env!r}: OGBench files carry no goals for goal-conditioned observations; use "
                           f"{env[: -len('-goal')]!r}")
    try:
        suite = manip.suite_of(env)
    except UserError:
        raise DatasetError(f"env={env!r} is not a manipulation task with OGBench data: pass one of cube-single, "
                           "cube-double, scene, puzzle-3x3, puzzle-4x4") from None
    task_id = suite.default_task if task_id is None else int(task_id)
    if not 1 <= task_id <= suite.num_tasks:
        raise DatasetError(f"task_id={task_id} for {env}: choose 1..{suite.num_tasks}")
    arrays = _read(path, cached)
    n = _check(arrays, path, suite)

    ends = arrays["terminals"] > 0.5
    if "next_observations" in arrays:  # per-transition layout
        layout = "transitions"
        cur = np.arange(n)
        nxt = np.where(ends, -1, cur + 1)  # the next state's qpos row; unknown after a trajectory's last
        nxt[-1] = -1
        next_obs = arrays["next_observations"]
        last = ends.copy()
        last[-1] = True
    else:  # OGBench's file layout: one row per step, a trajectory's last row has no successor
        layout = "trajectory"
        stored_end = ends.copy()
        stored_end[-1] = True  # a file that stops mid-trajectory: its last row has no successor either
        cur = np.flatnonzero(~stored_end)
        nxt = cur + 1
        next_obs = arrays["observations"][nxt]
        last = stored_end[nxt]
    trajectory = np.concatenate([[0], np.cumsum(last[:-1])])  # trajectory index of every transition

    if "rewards" in arrays:
        rewards = arrays["rewards"].astype(np.float32)[cur]
        terminals = (arrays["masks"][cur] == 0) if "masks" in arrays else np.zeros(len(cur), bool)
        keep = np.ones(len(cur), bool)
        reward_note = f"the file's own rewards ({path.name})"
    else:
        rows = nxt if reward_timing == "next" else cur
        keep = rows >= 0  # per-transition files: the state after a trajectory's last step is unknown
        truths = subgoal_truths(arrays, rows[keep], suite, task_id, path)
        rewards = np.zeros(len(cur), np.float32)
        terminals = np.zeros(len(cur), bool)
        rewards[keep] = truths.sum(axis=1) - truths.shape[1]
        terminals[keep] = truths.all(axis=1)
        reward_note = (f"satisfied sub-goals - all of {env} task {task_id}, on the "
                       f"{'next' if reward_timing == 'next' else 'current'} state (OGBench's relabel criteria)")
    cur, next_obs, rewards, terminals, trajectory = cur[keep], next_obs[keep], rewards[keep], terminals[keep], trajectory[keep]
    if len(cur) == 0:
        raise DatasetError(f"{path.name} has no transitions (every row ends a trajectory): check 'terminals'")
    cut = np.append(trajectory[1:] != trajectory[:-1], True)  # the last kept transition of each trajectory
    ds = Dataset(observations=arrays["observations"][cur].astype(np.float32),
                 actions=arrays["actions"][cur].astype(np.float32),
                 rewards=rewards.astype(np.float32), next_observations=next_obs.astype(np.float32),
                 terminals=terminals, timeouts=cut & ~terminals,
                 metadata={"env": env, "task_id": task_id, "source": f"OGBench dataset file {path.name}",
                           "layout": layout, "reward": reward_note, "reward_timing": reward_timing,
                           "rows_in_file": n, "episodes": int(trajectory[-1] + 1) if len(trajectory) else 0,
                           "generator": "ogbench data_gen_scripts (file)", "policy": "OGBench oracle"})
    ds.validate(suite.obs_dim, 5, env=env)
    return ds


def _read(path: Path, cached: bool) -> dict[str, np.ndarray]:
    """Every array of the file (no pickle); one-line errors that say whose file it is."""
    if not path.is_file():
        raise DatasetError(f"no dataset file at {path}: check the path")
    fix = ("delete it and it is regenerated on the next run" if cached else
           "the file is damaged or not an .npz: download it again (ogbench.download_datasets) or re-save it with np.savez")
    try:
        with np.load(path, allow_pickle=False) as data:
            return {key: data[key] for key in data.files}
    except ValueError as err:
        if "allow_pickle" in str(err):
            raise DatasetError(f"{path.name} holds an object (pickled) array: store plain numeric arrays "
                               "(np.savez of observations, actions, terminals, ...)") from None
        raise DatasetError(f"cannot read {path} as .npz ({err}): {fix}") from None
    except (OSError, zipfile.BadZipFile, EOFError) as err:
        raise DatasetError(f"cannot read {path} as .npz ({type(err).__name__}: {err}): {fix}") from None


def _check(arrays: dict, path: Path, suite) -> int:
    """Keys, shapes, dtypes and finiteness, each named with its file row; returns the row count."""
    name = path.name
    missing = [k for k in ("observations", "actions", "terminals") if k not in arrays]
    if missing:
        raise DatasetError(f"{name} has no {', '.join(repr(k) for k in missing)}: an OGBench dataset needs "
                           "observations, actions and terminals (the layout ogbench.load_dataset reads)")
    obs = arrays["observations"]
    if obs.dtype == np.uint8 or obs.ndim > 2:
        raise DatasetError(f"'observations' in {name} are images {obs.dtype} {list(obs.shape)}: only state datasets "
                           "can be read; use the non-visual OGBench file")
    n = len(obs)
    if n < 2:
        raise DatasetError(f"{name} has {n} rows: a dataset needs at least one transition (two rows)")
    for key, value in arrays.items():
        if value.dtype.kind not in "biuf":
            raise DatasetError(f"'{key}' in {name} has dtype {value.dtype}: store it as numbers")
        if value.ndim >= 1 and len(value) != n and key in ("actions", "terminals", "next_observations", "qpos",
                                                            "qvel", "button_states", "rewards", "masks"):
            raise DatasetError(f"'{key}' in {name} has {len(value)} rows but 'observations' has {n}: every key "
                               "needs one row per recorded step")
    want = {"observations": (2, suite.obs_dim), "actions": (2, 5), "next_observations": (2, suite.obs_dim),
            "terminals": (1, None), "rewards": (1, None), "masks": (1, None)}
    for key, (ndim, width) in want.items():
        if key not in arrays:
            continue
        value = arrays[key]
        if value.ndim == 2 and ndim == 1 and value.shape[1] == 1:
            value = arrays[key] = value[:, 0]
        if value.ndim != ndim or (width is not None and value.shape[1] != width):
            shape = f"[N, {width}]" if ndim == 2 else "[N]"
            what = f"{suite.name} observations" if width == suite.obs_dim else "OGBench's 5-d arm actions"
            raise DatasetError(f"'{key}' in {name} has shape {list(value.shape)}, expected {shape} "
                               f"({what if ndim == 2 else 'one value per row'}): is this file from {suite.name}? "
                               "name it after its env or pass env=")
    if not np.isin(arrays["terminals"], (0, 1)).all():
        row = int(np.flatnonzero(~np.isin(arrays["terminals"], (0, 1)))[0])
        raise DatasetError(f"'terminals' in {name} has {arrays['terminals'][row].item()!r} at file row {row}: use 0/1 "
                           "(1 on the last row of each trajectory)")
    for key in ("observations", "actions", "next_observations", "qpos", "qvel", "rewards"):
        if key in arrays and arrays[key].dtype.kind == "f":
            finite = np.isfinite(arrays[key]).reshape(n, -1).all(axis=1)
            if not finite.all():
                raise DatasetError(f"'{key}' in {name} has NaN/Inf at file row {int(np.argmin(finite))}: drop or "
                                   "repair that trajectory")
    return n


def subgoal_truths(arrays: dict, rows: np.ndarray, suite, task_id: int, path: Path) -> np.ndarray:
    """bool [len(rows), n]: OGBench's single-task sub-goals (cubes, buttons, drawer, window) at those rows,
    by the predicates of `sims.predicates` (OGBench's success tests)."""
    info = manip.task_info(suite.name, task_id)
    name = path.name
    parts = []
    if suite.kind in ("cube", "scene"):
        goals = np.asarray(info["goal_xyzs"] if suite.kind == "cube" else info["goal"]["block_xyzs"], np.float64)
        extra = len(info["goal"]["button_states"]) + 2 if suite.kind == "scene" else 0  # button, drawer, window joints
        qpos = _need(arrays, "qpos", name, QPOS_OBJECTS + CUBE_QPOS * len(goals) + extra)
        for i, goal in enumerate(goals):
            start = QPOS_OBJECTS + CUBE_QPOS * i
            parts.append(predicates.at(qpos[rows, start:start + 3], goal))
    if suite.kind in ("scene", "puzzle"):
        target = np.asarray(info["goal"]["button_states"] if suite.kind == "scene" else info["goal_button_states"])
        target = target.reshape(-1)
        buttons = _need(arrays, "button_states", name, len(target))
        parts.extend(predicates.buttons_match(buttons[rows, :len(target)].astype(np.int64).T, target[:, None].astype(np.int64)))
    if suite.kind == "scene":
        drawer = QPOS_OBJECTS + CUBE_QPOS * len(info["goal"]["block_xyzs"]) + len(info["goal"]["button_states"])
        parts.append(predicates.slide_at(qpos[rows, drawer], info["goal"]["drawer_pos"]))
        parts.append(predicates.slide_at(qpos[rows, drawer + 1], info["goal"]["window_pos"]))
    return np.stack(parts, axis=1)


def _need(arrays: dict, key: str, name: str, width: int) -> np.ndarray:
    value = arrays.get(key)
    if value is None:
        raise DatasetError(f"{name} has no '{key}': the task reward is computed from it; use OGBench's state dataset "
                           "files (they carry qpos and button_states), or add 'rewards' (and 'masks') to the file")
    if value.ndim != 2 or value.shape[1] < width:
        raise DatasetError(f"'{key}' in {name} has shape {list(value.shape)}, expected [N, >= {width}] for this env: "
                           "is the file from another env? name it after its env or pass env=")
    return value
