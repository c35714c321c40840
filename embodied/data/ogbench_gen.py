"""Manipulation datasets made with the scripted oracles that ship in `ogbench.manipspace.oracles`.

Qualities (OGBench's recipe, `data_gen_scripts/generate_manipspace.py` in the OGBench repository):
    play   plan oracles (non-Markovian, pre-computed keyframe plans) with temporally smoothed noise
           (noise 0.1, smoothing 0.5), the env setting a new random target whenever the oracle is done
    noisy  Markov (closed-loop) oracles, per-episode Gaussian noise xi ~ U(0, 0.1) scaled by
           [1, 1, 1, 3, 10] per action dim, plus uniform-random actions with p = 0.1 (puzzle 0.2)
    task   ours: the Markov oracles driven through the named task's own sub-goals (a small planner
           picks the next skill: unlock before opening, the lower cube before the stacked one, a
           Lights-Out solve for the puzzle), episodes end at success, noise xi ~ U(0, 0.05)
Play and noisy episodes are 1001 steps (OGBench's max_episode_steps), default size 1000 episodes.

Rewards are the named single task's (OGBench's singletask relabelling): satisfied sub-goals - all,
evaluated on the next state; `terminals` marks the steps where every sub-goal holds.
Besides the D4RL arrays each file carries, under `infos/`: per-step sub-goal truths `subgoals`
[N, n], `instruction_id` [N] indexing `metadata.instructions`, `qpos`, `qvel` (and `button_states`)
for relabelling; and under `images/<camera>` the frames when asked (uint8, chunked, gzip).
"""
from __future__ import annotations

import hashlib
import json
import numbers
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from embodied.data.dataset import Dataset
from embodied.errors import DatasetError

GENERATOR_VERSION = "ogbench-1"
QUALITIES = ("play", "noisy", "task")
PLAY_EPISODE_STEPS = 1001  # OGBench: --max_episode_steps=1001
OGBENCH_EPISODES = {"cube-single": 1000, "cube-double": 1000, "scene": 1000, "puzzle-3x3": 1000, "puzzle-4x4": 1000}
TASK_DEFAULT_SIZE = 100_000
DRAWER_OPEN = -0.16  # drawer slide position when open (OGBench)


@dataclass(frozen=True)
class GenSpec:
    """What to generate. `None` fields take OGBench's default for the env and quality."""

    env: str
    quality: str
    size: int | None = None  # transitions
    seed: int = 0
    task_id: int | None = None  # the single task whose reward/sub-goals label the data (None: OGBench default)
    noise: float | None = None
    noise_smoothing: float = 0.5
    min_norm: float = 0.4
    p_random_action: float | None = None
    episode_steps: int | None = None
    images: tuple = ()
    image_size: int = 64

    def resolved(self) -> GenSpec:
        from sims.manip import suite_of

        suite = suite_of(self.env)
        play_like = self.quality in ("play", "noisy")
        size = self.size
        if size is None:
            size = OGBENCH_EPISODES[suite.name] * PLAY_EPISODE_STEPS if play_like else TASK_DEFAULT_SIZE
        noise = self.noise if self.noise is not None else (0.1 if play_like else 0.05)
        p_random = self.p_random_action
        if p_random is None:
            p_random = (0.2 if suite.kind == "puzzle" else 0.1) if self.quality == "noisy" else 0.0
        steps = self.episode_steps or (PLAY_EPISODE_STEPS if play_like else suite.max_episode_steps)
        task_id = self.task_id or suite.default_task
        return replace(self, size=int(size), noise=float(noise), p_random_action=float(p_random),
                       episode_steps=int(steps), task_id=int(task_id), images=tuple(self.images))


def check_spec(spec: GenSpec) -> GenSpec:
    """Reject an impossible request before any env is built; returns the resolved spec."""
    from sims.manip import CAMERAS, MANIP_NAMES, suite_of

    if spec.env not in MANIP_NAMES or spec.env.endswith("-goal"):
        names = [n for n in MANIP_NAMES if not n.endswith("-goal")]
        raise DatasetError(f"env={spec.env!r} has no oracle datasets: choose one of {', '.join(names)}")
    if spec.quality not in QUALITIES:
        raise DatasetError(f"unknown dataset quality {spec.quality!r} for {spec.env}: choose one of {', '.join(QUALITIES)}")
    if spec.size is not None and (isinstance(spec.size, bool) or not isinstance(spec.size, numbers.Integral)
                                  or spec.size < 1):
        raise DatasetError(f"dataset size={spec.size!r} must be a positive integer number of transitions")
    if isinstance(spec.seed, bool) or not isinstance(spec.seed, numbers.Integral) or spec.seed < 0:
        raise DatasetError(f"dataset seed={spec.seed!r} must be a non-negative integer")
    suite = suite_of(spec.env)
    if spec.task_id is not None and not (isinstance(spec.task_id, numbers.Integral) and 1 <= spec.task_id <= suite.num_tasks):
        raise DatasetError(f"task_id={spec.task_id!r} for {spec.env}: choose 1..{suite.num_tasks}")
    for name in ("noise", "p_random_action"):
        value = getattr(spec, name)
        if value is not None and not (isinstance(value, numbers.Real) and value >= 0):
            raise DatasetError(f"{name}={value!r} must be a number >= 0")
    if spec.p_random_action is not None and spec.p_random_action > 1:
        raise DatasetError(f"p_random_action={spec.p_random_action} must be a probability in [0, 1]")
    if spec.episode_steps is not None and (not isinstance(spec.episode_steps, numbers.Integral) or spec.episode_steps < 2):
        raise DatasetError(f"episode_steps={spec.episode_steps!r} must be an integer >= 2")
    bad = [c for c in spec.images if c not in CAMERAS]
    if bad:
        raise DatasetError(f"unknown camera(s) {bad} in images: choose from {', '.join(CAMERAS)}")
    if spec.images and not 16 <= int(spec.image_size) <= 512:
        raise DatasetError(f"image_size={spec.image_size} must be between 16 and 512 pixels")
    return spec.resolved()


def cache_path(spec: GenSpec, cache_dir=None) -> Path:
    """catalog's `<env>-<quality>-<size>-s<seed>.hdf5`, plus a short hash when options differ from the defaults."""
    from embodied.data.catalog import dataset_path

    spec = spec.resolved()
    default = GenSpec(spec.env, spec.quality, spec.size, spec.seed).resolved()
    path = dataset_path(spec.env, spec.quality, spec.size, spec.seed, cache_dir)
    if spec != default:
        digest = hashlib.sha1(json.dumps(asdict(spec), sort_keys=True).encode()).hexdigest()[:8]
        path = path.with_name(path.stem + f"-{digest}.hdf5")
    return path


# ------------------------------------------------------------------------------------------ oracles
def make_oracles(env, kind: str, quality: str, spec: GenSpec) -> dict:
    """OGBench's oracle set for a task family: plan oracles for play data, Markov ones otherwise."""
    from ogbench.manipspace.oracles.markov.button_markov import ButtonMarkovOracle
    from ogbench.manipspace.oracles.markov.cube_markov import CubeMarkovOracle
    from ogbench.manipspace.oracles.markov.drawer_markov import DrawerMarkovOracle
    from ogbench.manipspace.oracles.markov.window_markov import WindowMarkovOracle
    from ogbench.manipspace.oracles.plan.button_plan import ButtonPlanOracle
    from ogbench.manipspace.oracles.plan.cube_plan import CubePlanOracle
    from ogbench.manipspace.oracles.plan.drawer_plan import DrawerPlanOracle
    from ogbench.manipspace.oracles.plan.window_plan import WindowPlanOracle

    closed = kind == "puzzle"  # puzzle buttons are pressed with a closed gripper
    if quality == "play":
        kw = dict(env=env, noise=spec.noise, noise_smoothing=spec.noise_smoothing)
        return {"cube": CubePlanOracle(**kw), "button": ButtonPlanOracle(gripper_always_closed=closed, **kw),
                "drawer": DrawerPlanOracle(**kw), "window": WindowPlanOracle(**kw)}
    kw = dict(env=env, min_norm=spec.min_norm)
    return {"cube": CubeMarkovOracle(max_step=100 if kind == "scene" else 200, **kw),
            "button": ButtonMarkovOracle(gripper_always_closed=closed, **kw),
            "drawer": DrawerMarkovOracle(**kw), "window": WindowMarkovOracle(**kw)}


def _markov_noise(rng, xi: float) -> np.ndarray:
    return rng.normal(0.0, [xi, xi, xi, xi * 3, xi * 10])


# ------------------------------------------------------------------------------------------ task planner
def lights_out_presses(current, target, rows: int, cols: int) -> list[int]:
    """Buttons to press (each once) so `current` becomes `target`: solve A x = current ^ target over GF(2)."""
    n = rows * cols
    a = np.zeros((n, n), np.uint8)
    for i in range(n):
        r, c = divmod(i, cols)
        for dr, dc in ((0, 0), (1, 0), (-1, 0), (0, 1), (0, -1)):
            rr, cc = r + dr, c + dc
            if 0 <= rr < rows and 0 <= cc < cols:
                a[rr * cols + cc, i] = 1
    b = (np.asarray(current).reshape(-1) ^ np.asarray(target).reshape(-1)).astype(np.uint8)
    m = np.concatenate([a, b[:, None]], axis=1)
    pivots, row = [], 0
    for col in range(n):
        hit = next((r for r in range(row, n) if m[r, col]), None)
        if hit is None:
            continue
        m[[row, hit]] = m[[hit, row]]
        for r in range(n):
            if r != row and m[r, col]:
                m[r] ^= m[row]
        pivots.append(col)
        row += 1
    if any(m[r, -1] for r in range(row, n)):
        raise DatasetError("this Lights-Out target is unreachable from the current buttons")
    x = np.zeros(n, np.uint8)
    for r, col in enumerate(pivots):
        x[col] = m[r, -1]
    return [int(i) for i in np.flatnonzero(x)]


class TaskOracle:
    """Closed-loop expert for the single task of a `sims.make(<manip task>)` env: picks the next skill
    from the live state, feeds OGBench's Markov oracle for it the privileged target it needs."""

    def __init__(self, env, kind: str, spec: GenSpec):
        self.env, self.base, self.kind = env, env.unwrapped, kind
        self.oracles = make_oracles(self.base, kind, "task", spec)
        self.skill = None
        self.target: dict = {}

    def reset(self) -> None:
        self.skill, self.target = None, {}

    def _next_skill(self):
        base, data = self.base, self.base._data
        truths = self.env.get_wrapper_attr("subgoal_truths")()
        if self.kind == "puzzle":
            presses = lights_out_presses(np.asarray(base._cur_button_states).reshape(-1),
                                         np.asarray(base._target_button_states).reshape(-1), base._num_rows, base._num_cols)
            return ("button", presses[0]) if presses else None
        cubes = int(getattr(base, "_num_cubes", 0))
        pos = [np.asarray(data.joint(f"object_joint_{i}").qpos[:3]) for i in range(cubes)]
        goal = [np.asarray(data.mocap_pos[base._cube_target_mocap_ids[i]]) for i in range(cubes)]
        if self.kind == "scene":
            buttons = np.asarray(base._cur_button_states).reshape(-1)
            target_buttons = np.asarray(base._target_button_states).reshape(-1)
            drawer = float(data.joint("drawer_slide").qpos[0])
            # a cube goal inside the drawer is given for the closed drawer: put the cube into the open
            # drawer, then closing the drawer carries it to the goal
            goal_in_drawer = goal[0][2] > 0.04 and goal[0][1] < -0.2
            cube_in_drawer = bool(base._is_in_drawer(pos[0]))
            unlock_and_open = ("button", 0) if buttons[0] == 0 else ("drawer", DRAWER_OPEN)
            if not truths[0]:
                if goal_in_drawer and not cube_in_drawer:
                    return unlock_and_open if drawer > -0.12 else ("cube", (0, np.asarray(base._drawer_center, float)))
                if not goal_in_drawer:
                    return unlock_and_open if cube_in_drawer and drawer > -0.12 else ("cube", (0, goal[0]))
            if not truths[3] or (goal_in_drawer and not truths[0]):
                return ("button", 0) if buttons[0] == 0 else ("drawer", base._target_drawer_pos)
            if not truths[4]:
                return ("button", 1) if buttons[1] == 0 else ("window", base._target_window_pos)
            for i in range(2):
                if buttons[i] != target_buttons[i]:
                    return ("button", i)
            return None
        pending = [i for i in range(cubes) if not truths[i]]
        if not pending:
            return None
        free = []
        for i in sorted(pending, key=lambda k: goal[k][2]):  # lower targets first (stacks)
            blocked = any(j != i and np.linalg.norm(pos[j][:2] - goal[i][:2]) < 0.045
                          and abs(pos[j][2] - goal[i][2]) < 0.02 for j in range(cubes))  # another cube sits there
            below_ok = goal[i][2] < 0.04 or any(truths[j] for j in range(cubes) if j != i)
            if not blocked and below_ok:
                return ("cube", (i, goal[i]))
            free.append(i)
        i = free[0]  # every pending cube is blocked (a swap): park the blocker somewhere free
        blocker = next((j for j in range(cubes) if j != i and np.linalg.norm(pos[j][:2] - goal[i][:2]) < 0.045
                        and abs(pos[j][2] - goal[i][2]) < 0.02), i)
        spot = self._free_spot([p for p in pos] + goal)
        return ("cube", (blocker, spot))

    def _free_spot(self, occupied) -> np.ndarray:
        candidates = [np.array([x, y, 0.02]) for x in (0.35, 0.425, 0.5) for y in (-0.25, -0.15, 0.0, 0.15, 0.25)]
        best = max(candidates, key=lambda c: min(np.linalg.norm(c[:2] - o[:2]) for o in occupied))
        return best

    def _privileged(self, info: dict) -> dict:
        base, data = self.base, self.base._data
        info = dict(info)
        skill, arg = self.skill
        if skill == "cube":
            i, goal = arg
            info.update({"privileged/target_task": "cube", "privileged/target_block": i,
                         "privileged/target_block_pos": np.asarray(goal, float),
                         "privileged/target_block_yaw": np.zeros(1)})
        elif skill == "button":
            state = np.asarray(base._cur_button_states).reshape(-1)
            if "button_state" not in self.target:  # fixed when the skill starts: one press
                self.target["button_state"] = (int(state[arg]) + 1) % 2
            info.update({"privileged/target_task": "button", "privileged/target_button": arg,
                         "privileged/target_button_top_pos": data.site_xpos[base._button_site_ids[arg]].copy(),
                         "privileged/target_button_state": self.target["button_state"],
                         f"privileged/button_{arg}_state": int(state[arg])})
        else:
            joint = "drawer_slide" if skill == "drawer" else "window_slide"
            handle = base._drawer_site_id if skill == "drawer" else base._window_site_id
            jid = base._model.joint(joint).id
            cur = float(data.joint(joint).qpos[0])
            target = data.site_xpos[handle] + (arg - cur) * data.xaxis[jid]
            info[f"privileged/target_{skill}_handle_pos"] = target
            info[f"privileged/target_{skill}_pos"] = np.array([arg])
        return info

    def __call__(self, ob, info) -> np.ndarray:
        if self.skill is None or self.oracles[self.skill[0]].done:
            nxt = self._next_skill()
            if nxt is None:  # everything holds: hover in place
                return np.zeros(5)
            self.skill, self.target = nxt, {}
            self.oracles[nxt[0]].reset(ob, self._privileged(info))
        return np.asarray(self.oracles[self.skill[0]].select_action(ob, self._privileged(info)), float)


# ------------------------------------------------------------------------------------------ labels
def task_truths(base, kind: str, task_info: dict) -> np.ndarray:
    """Sub-goal truths of a fixed task (OGBench's relabel_dataset criteria) in any env mode."""
    data = base._data
    if kind == "cube":
        goals = task_info["goal_xyzs"]
        return np.array([np.linalg.norm(data.joint(f"object_joint_{i}").qpos[:3] - goals[i]) <= 0.04
                         for i in range(len(goals))])
    buttons = np.asarray(base._cur_button_states).reshape(-1)
    if kind == "puzzle":
        return buttons == np.asarray(task_info["goal_button_states"]).reshape(-1)
    goal = task_info["goal"]
    cubes = [np.linalg.norm(data.joint(f"object_joint_{i}").qpos[:3] - goal["block_xyzs"][i]) <= 0.04
             for i in range(len(goal["block_xyzs"]))]
    return np.array(cubes + list(buttons == np.asarray(goal["button_states"]))
                    + [abs(data.joint("drawer_slide").qpos[0] - goal["drawer_pos"]) <= 0.04,
                       abs(data.joint("window_slide").qpos[0] - goal["window_pos"]) <= 0.04])


def play_target_text(base, kind: str, info: dict, rng) -> str:
    """Language for the random target OGBench's data-collection mode just set."""
    from sims.manip import _grid_words, describe_predicate
    from sims.scene import Predicate

    task = info["privileged/target_task"]
    if task == "cube":
        return describe_predicate(base, "scene" if kind == "scene" else "cube",
                                  Predicate("at", (f"cube_{int(info['privileged/target_block'])}",
                                                   f"target_{int(info['privileged/target_block'])}")), rng)
    if task == "button":
        i = int(info["privileged/target_button"])
        if kind == "puzzle":
            return ("press the {} button", "push the {} button", "tap the {} button")[int(rng.integers(3))].format(
                _grid_words(i, base._num_rows, base._num_cols))
        what = ("drawer", "window")[i]
        word = "unlocked" if int(info["privileged/target_button_state"]) == 1 else "locked"
        return describe_predicate(base, kind, Predicate(word, (what,)), rng)
    target = float(np.asarray(info[f"privileged/target_{task}_pos"]).reshape(-1)[0])
    word = "open" if (target < -0.08 if task == "drawer" else target > 0.1) else "closed"
    return describe_predicate(base, kind, Predicate(word, (task,)), rng)


class _Frames:
    """Offscreen frames of the live sim for the dataset (shadows and reflections off)."""

    def __init__(self, base, cameras, size):
        from sims.manip import _mujoco, check_gl

        mujoco = _mujoco()

        base.model.vis.quality.shadowsize = 0
        base.model.mat_reflectance[:] = 0.0
        check_gl(base.model)
        self.base, self.cameras = base, tuple(cameras)
        self.renderer = mujoco.Renderer(base.model, height=size, width=size)

    def grab(self) -> dict:
        out = {}
        for cam in self.cameras:
            self.renderer.update_scene(self.base._data, camera=cam)
            out[cam] = self.renderer.render()
        return out

    def close(self):
        self.renderer.close()


# ------------------------------------------------------------------------------------------ generation
@dataclass
class _Recorder:
    obs: list = field(default_factory=list)
    act: list = field(default_factory=list)
    rew: list = field(default_factory=list)
    nxt: list = field(default_factory=list)
    term: list = field(default_factory=list)
    tout: list = field(default_factory=list)
    subgoals: list = field(default_factory=list)
    instr: list = field(default_factory=list)
    qpos: list = field(default_factory=list)
    qvel: list = field(default_factory=list)
    buttons: list = field(default_factory=list)
    frames: dict = field(default_factory=dict)


def generate(spec: GenSpec, *, progress: bool = True) -> tuple[Dataset, dict]:
    """(Dataset, extras) where extras maps HDF5 paths (`infos/...`, `images/...`) to arrays."""
    spec = check_spec(spec)
    state = np.random.get_state()  # OGBench's oracles draw from the global numpy stream
    np.random.seed(spec.seed)
    try:
        if spec.quality == "task":
            return _generate_task(spec, progress)
        return _generate_play(spec, progress)
    finally:
        np.random.set_state(state)


def _finish(rec: _Recorder, spec: GenSpec, meta: dict) -> tuple[Dataset, dict]:
    n = len(rec.act)
    if not (rec.term[-1] or rec.tout[-1]):
        rec.tout[-1] = True
    ds = Dataset(observations=np.asarray(rec.obs, np.float32), actions=np.asarray(rec.act, np.float32),
                 rewards=np.asarray(rec.rew, np.float32), next_observations=np.asarray(rec.nxt, np.float32),
                 terminals=np.asarray(rec.term, bool), timeouts=np.asarray(rec.tout, bool), metadata=meta)
    extras = {"infos/subgoals": np.asarray(rec.subgoals, bool).reshape(n, -1),
              "infos/instruction_id": np.asarray(rec.instr, np.int32),
              "infos/qpos": np.asarray(rec.qpos, np.float32), "infos/qvel": np.asarray(rec.qvel, np.float32)}
    if rec.buttons:
        extras["infos/button_states"] = np.asarray(rec.buttons, np.int8)
    for cam, frames in rec.frames.items():
        extras[f"images/{cam}"] = np.asarray(frames, np.uint8)
    return ds, extras


def _metadata(spec: GenSpec, base, kind: str, preds, episodes: int, successes: int, instructions, seconds: float,
              n: int) -> dict:
    return {"env": spec.env, "quality": spec.quality, "size": spec.size, "seed": spec.seed, "task_id": spec.task_id,
            "generator": "ogbench.manipspace.oracles", "generator_version": GENERATOR_VERSION,
            "gen_spec": asdict(spec), "episodes": episodes, "success_episodes": successes,
            "success_rate": successes / max(episodes, 1), "subgoal_names": [str(p) for p in preds],
            "instructions": instructions, "reward": "satisfied sub-goals - all sub-goals (next state)",
            "transitions_per_second": n / max(seconds, 1e-9)}


def _generate_task(spec: GenSpec, progress: bool) -> tuple[Dataset, dict]:
    import sims
    from sims.manip import suite_of

    suite = suite_of(spec.env)
    rng = np.random.default_rng(spec.seed)
    env = sims.make(spec.env, task_id=spec.task_id, max_episode_steps=spec.episode_steps)
    base = env.unwrapped
    oracle = TaskOracle(env, suite.kind, spec)
    rec, instructions = _Recorder(), []
    frames = _Frames(base, spec.images, spec.image_size) if spec.images else None
    episodes = successes = 0
    start = time.perf_counter()
    bar = tqdm(total=spec.size, desc=f"{spec.env} task", disable=not progress, leave=False)
    obs, info = env.reset(seed=int(rng.integers(2**31)))
    while len(rec.act) < spec.size:
        oracle.reset()
        instructions.append(env.get_wrapper_attr("instruction")(rng))
        xi = rng.uniform(0.0, spec.noise)
        succeeded, done = False, False
        while not done and len(rec.act) < spec.size:
            state = obs["observation.state"]
            if frames is not None:
                for cam, frame in frames.grab().items():
                    rec.frames.setdefault(cam, []).append(frame)
            action = oracle(state, info) + (_markov_noise(rng, xi) if xi > 0 else 0.0)
            action = np.clip(action, -1, 1).astype(np.float32)
            obs, reward, terminated, truncated, info = env.step(action)
            rec.obs.append(state)
            rec.act.append(action)
            rec.rew.append(reward)
            rec.nxt.append(obs["observation.state"])
            rec.term.append(terminated)
            rec.tout.append(truncated and not terminated)
            rec.subgoals.append(info["subgoals"])
            rec.instr.append(len(instructions) - 1)
            rec.qpos.append(info["qpos"])
            rec.qvel.append(info["qvel"])
            if "button_states" in info:
                rec.buttons.append(info["button_states"])
            succeeded |= bool(info["success"])
            done = terminated or truncated
            bar.update(1)
        episodes += 1
        successes += succeeded
        if done:
            obs, info = env.reset()
    bar.close()
    seconds = time.perf_counter() - start
    preds = env.get_wrapper_attr("subgoals")()
    meta = _metadata(spec, base, suite.kind, preds, episodes, successes, instructions, seconds, len(rec.act))
    if frames is not None:
        frames.close()
    env.close()
    return _finish(rec, spec, meta)


def _generate_play(spec: GenSpec, progress: bool) -> tuple[Dataset, dict]:
    from sims.manip import make_base, suite_of

    suite = suite_of(spec.env)
    rng = np.random.default_rng(spec.seed)
    env = make_base(suite.name, mode="data_collection", max_episode_steps=spec.episode_steps)
    base = env.unwrapped
    oracles = make_oracles(base, suite.kind, spec.quality, spec)
    task_info = _task_info(suite, spec.task_id)
    frames = None
    rec, instructions = _Recorder(), []
    episodes = successes = 0
    start = time.perf_counter()
    bar = tqdm(total=spec.size, desc=f"{spec.env} {spec.quality}", disable=not progress, leave=False)
    p_stack = {"single": 0.0, "double": None}.get(suite.env_type, 0.5)
    while len(rec.act) < spec.size:
        ob, info = env.reset(seed=int(rng.integers(2**31)))
        if frames is None and spec.images:
            frames = _Frames(base, spec.images, spec.image_size)
        stack = rng.uniform(0.0, 0.25) if p_stack is None else p_stack  # OGBench: double draws it per episode
        xi = rng.uniform(0.0, spec.noise)
        agent = oracles[info["privileged/target_task"]]
        agent.reset(ob, info)
        instructions.append(play_target_text(base, suite.kind, info, rng))
        done, succeeded = False, False
        while not done and len(rec.act) < spec.size:
            if frames is not None:
                for cam, frame in frames.grab().items():
                    rec.frames.setdefault(cam, []).append(frame)
            if rng.random() < spec.p_random_action:
                action = rng.uniform(-1, 1, 5)
            else:
                action = np.asarray(agent.select_action(ob, info), float)
                if spec.quality == "noisy":
                    action = action + _markov_noise(rng, xi)
            action = np.clip(action, -1, 1).astype(np.float32)
            next_ob, _, terminated, truncated, info = env.step(action)
            truths = task_truths(base, suite.kind, task_info)
            success = bool(truths.all())
            rec.obs.append(np.asarray(ob, np.float32))
            rec.act.append(action)
            rec.rew.append(float(truths.sum() - len(truths)))
            rec.nxt.append(np.asarray(next_ob, np.float32))
            rec.term.append(success)
            rec.tout.append(bool(truncated) and not success)
            rec.subgoals.append(truths)
            rec.instr.append(len(instructions) - 1)
            rec.qpos.append(info["qpos"])
            rec.qvel.append(info["qvel"])
            if "button_states" in info:
                rec.buttons.append(info["button_states"])
            succeeded |= success
            done = terminated or truncated
            if agent.done and not done:  # OGBench: a new random target once the oracle is done
                ob_new, agent_info = base.set_new_target(p_stack=stack)
                agent = oracles[agent_info["privileged/target_task"]]
                agent.reset(ob_new, agent_info)
                info = {**info, **agent_info}
                instructions.append(play_target_text(base, suite.kind, agent_info, rng))
            ob = next_ob
            bar.update(1)
        episodes += 1
        successes += succeeded
    bar.close()
    seconds = time.perf_counter() - start
    preds = _play_subgoal_names(suite, spec.task_id)
    meta = _metadata(spec, base, suite.kind, preds, episodes, successes, instructions, seconds, len(rec.act))
    meta["success_note"] = "play/noisy data: success = the named task's sub-goals all held at some step"
    if frames is not None:
        frames.close()
    env.close()
    return _finish(rec, spec, meta)


def _task_info(suite, task_id: int) -> dict:
    from sims.manip import make_base

    env = make_base(suite.name, mode="task", task_id=task_id)
    info = env.unwrapped.task_infos[task_id - 1]
    env.close()
    return info


def _play_subgoal_names(suite, task_id: int):
    from sims.manip import make_base, task_subgoals

    env = make_base(suite.name, mode="task", task_id=task_id)
    env.reset(seed=0)
    preds = task_subgoals(env.unwrapped, suite.kind)
    env.close()
    return preds


# ------------------------------------------------------------------------------------------ cache
def load_or_generate(spec: GenSpec, *, cache_dir=None, progress: bool = True, path=None) -> Dataset:
    """The cached dataset for `spec` (same generator version), else generate and cache it."""
    from embodied.data.d4rl import load_hdf5, save_hdf5

    spec = check_spec(spec)
    path = Path(path) if path is not None else cache_path(spec, cache_dir)
    if path.is_file():
        ds = load_hdf5(path, cached=True)
        if ds.metadata.get("generator_version") == GENERATOR_VERSION:
            return ds
    ds, extras = generate(spec, progress=progress)
    save_hdf5(ds, path, extras=extras)
    return ds
