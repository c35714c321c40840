"""Manipulation datasets made with the scripted oracles that ship in `ogbench.manipspace.oracles`.

The oracles (and `TaskOracle`, ours) are in `embodied.data.ogbench_oracles`; this module records
datasets with them, labels them with the named task's sub-goals (`sims.manip_scene.task_truths`, the
predicates of `sims.predicates`) and caches them.

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

import sims
from embodied.constants import STATE_KEY
from embodied.data.cache import dataset_path, load_or_make
from embodied.data.dataset import Dataset
from embodied.data.ogbench_oracles import TaskOracle, make_oracles
from embodied.errors import DatasetError
from sims import manip
from sims.manip_language import play_target_text
from sims.manip_scene import task_subgoals, task_truths

GENERATOR_VERSION = "ogbench-1"
QUALITIES = ("play", "noisy", "task")
PLAY_EPISODE_STEPS = 1001  # OGBench: --max_episode_steps=1001
OGBENCH_EPISODES = {"cube-single": 1000, "cube-double": 1000, "scene": 1000, "puzzle-3x3": 1000, "puzzle-4x4": 1000}
TASK_DEFAULT_SIZE = 100_000


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
        suite = manip.suite_of(self.env)
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
    if spec.env not in manip.MANIP_NAMES or spec.env.endswith("-goal"):
        names = [n for n in manip.MANIP_NAMES if not n.endswith("-goal")]
        raise DatasetError(f"env={spec.env!r} has no oracle datasets: choose one of {', '.join(names)}")
    if spec.quality not in QUALITIES:
        raise DatasetError(f"unknown dataset quality {spec.quality!r} for {spec.env}: choose one of {', '.join(QUALITIES)}")
    if spec.size is not None and (isinstance(spec.size, bool) or not isinstance(spec.size, numbers.Integral)
                                  or spec.size < 1):
        raise DatasetError(f"dataset size={spec.size!r} must be a positive integer number of transitions")
    if isinstance(spec.seed, bool) or not isinstance(spec.seed, numbers.Integral) or spec.seed < 0:
        raise DatasetError(f"dataset seed={spec.seed!r} must be a non-negative integer")
    suite = manip.suite_of(spec.env)
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
    bad = [c for c in spec.images if c not in manip.CAMERAS]
    if bad:
        raise DatasetError(f"unknown camera(s) {bad} in images: choose from {', '.join(manip.CAMERAS)}")
    if spec.images and not 16 <= int(spec.image_size) <= 512:
        raise DatasetError(f"image_size={spec.image_size} must be between 16 and 512 pixels")
    return spec.resolved()


def cache_path(spec: GenSpec, cache_dir=None) -> Path:
    """The cache's `<env>-<quality>-<size>-s<seed>.hdf5`, plus a short hash when options differ from the defaults."""
    spec = spec.resolved()
    default = GenSpec(spec.env, spec.quality, spec.size, spec.seed).resolved()
    path = dataset_path(spec.env, spec.quality, spec.size, spec.seed, cache_dir)
    if spec != default:
        digest = hashlib.sha1(json.dumps(asdict(spec), sort_keys=True).encode()).hexdigest()[:8]
        path = path.with_name(path.stem + f"-{digest}.hdf5")
    return path


# ------------------------------------------------------------------------------------------ noise, frames
def markov_noise(rng, xi: float) -> np.ndarray:
    return rng.normal(0.0, [xi, xi, xi, xi * 3, xi * 10])


class _Frames:
    """Offscreen frames of the live sim for the dataset (shadows and reflections off)."""

    def __init__(self, base, cameras, size):
        self.base, self.cameras = base, tuple(cameras)
        self.renderer = manip.offscreen_renderer(base, size)

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
    suite = manip.suite_of(spec.env)
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
            state = obs[STATE_KEY]
            if frames is not None:
                for cam, frame in frames.grab().items():
                    rec.frames.setdefault(cam, []).append(frame)
            action = oracle(state, info) + (markov_noise(rng, xi) if xi > 0 else 0.0)
            action = np.clip(action, -1, 1).astype(np.float32)
            obs, reward, terminated, truncated, info = env.step(action)
            rec.obs.append(state)
            rec.act.append(action)
            rec.rew.append(reward)
            rec.nxt.append(obs[STATE_KEY])
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
    suite = manip.suite_of(spec.env)
    rng = np.random.default_rng(spec.seed)
    env = manip.make_base(suite.name, mode="data_collection", max_episode_steps=spec.episode_steps)
    base = env.unwrapped
    oracles = make_oracles(base, suite.kind, spec.quality, spec)
    task_info = manip.task_info(suite.name, spec.task_id)
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
                    action = action + markov_noise(rng, xi)
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


def _play_subgoal_names(suite, task_id: int):
    env = manip.make_base(suite.name, mode="task", task_id=task_id)
    env.reset(seed=0)
    preds = task_subgoals(env.unwrapped, suite.kind)
    env.close()
    return preds


# ------------------------------------------------------------------------------------------ cache
def load_or_generate(spec: GenSpec, *, cache_dir=None, progress: bool = True, path=None) -> Dataset:
    """The cached dataset for `spec` (same generator version), else generate and cache it."""
    spec = check_spec(spec)
    path = Path(path) if path is not None else cache_path(spec, cache_dir)
    return load_or_make(path, GENERATOR_VERSION, lambda: generate(spec, progress=progress))
