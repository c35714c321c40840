"""Meta-World MT10 demonstrations from the scripted policies that ship in `metaworld.policies`.

One `task` dataset per MT10 task (`sims.mt10`): the task's scripted policy with per-episode Gaussian
action noise xi ~ U(0, `noise`), episodes ending at success (a terminal) or after the suite's 200 steps
(a timeout; failed episodes are kept), rewards Meta-World's own (v2 reward functions). Each episode
carries one of the task's training instructions (`infos/instruction_id` into `metadata.instructions`)
and, when asked, the camera frames (`images/<camera>`, uint8, chunked and gzip-compressed). Cached like
every other dataset, with the same reader as the OGBench suites (`embodied.data.suite.load_suite`).
"""
from __future__ import annotations

import hashlib
import json
import numbers
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

import sims
from embodied.constants import STATE_KEY, image_key
from embodied.data.cache import dataset_path, load_or_make
from embodied.data.dataset import Dataset
from embodied.errors import DatasetError
from sims import mt10

GENERATOR_VERSION = "metaworld-mt10-1"
ENV = "mt10"
QUALITIES = ("task",)   # scripted-policy demos per task


@dataclass(frozen=True)
class GenSpec:
    """What to generate: `size` transitions of task `task_id` (1..10), seeded; the same fields as the
    OGBench generator's spec where they mean the same."""

    env: str
    quality: str
    size: int = 10_000
    seed: int = 0
    task_id: int = 1
    noise: float = 0.05
    images: tuple = ()
    image_size: int = 64


def check_spec(spec: GenSpec) -> GenSpec:
    if spec.env != ENV:
        raise DatasetError(f"env={spec.env!r}: the Meta-World generator makes env=mt10 data only")
    if spec.quality not in QUALITIES:
        raise DatasetError(f"dataset quality {spec.quality!r} for mt10: only 'task' (scripted-policy demos) exists")
    if isinstance(spec.size, bool) or not isinstance(spec.size, numbers.Integral) or spec.size < 1:
        raise DatasetError(f"dataset size={spec.size!r} must be a positive integer number of transitions")
    if isinstance(spec.seed, bool) or not isinstance(spec.seed, numbers.Integral) or spec.seed < 0:
        raise DatasetError(f"dataset seed={spec.seed!r} must be a non-negative integer")
    if not (isinstance(spec.task_id, numbers.Integral) and 1 <= spec.task_id <= len(mt10.TASKS)):
        raise DatasetError(f"task_id={spec.task_id!r} for mt10: choose 1..{len(mt10.TASKS)}")
    if not (isinstance(spec.noise, numbers.Real) and spec.noise >= 0):
        raise DatasetError(f"noise={spec.noise!r} must be a number >= 0")
    bad = [c for c in spec.images if c not in mt10.CAMERAS]
    if bad:
        raise DatasetError(f"unknown camera(s) {bad} in images: choose from {', '.join(mt10.CAMERAS)}")
    return spec


def cache_path(spec: GenSpec, cache_dir=None) -> Path:
    """`mt10-task-<size>-s<seed>-<hash of the other fields>.hdf5` in the dataset cache."""
    spec = check_spec(spec)
    digest = hashlib.sha1(json.dumps(asdict(spec), sort_keys=True).encode()).hexdigest()[:8]
    path = dataset_path(spec.env, spec.quality, spec.size, spec.seed, cache_dir)
    return path.with_name(path.stem + f"-{digest}.hdf5")


def generate(spec: GenSpec, *, progress: bool = True) -> tuple[Dataset, dict]:
    """(Dataset, extras): extras maps `infos/instruction_id` and `images/<camera>` to per-step arrays."""
    spec = check_spec(spec)
    rng = np.random.default_rng([spec.seed, spec.task_id])
    env = sims.make(ENV, task_id=spec.task_id, images=tuple(spec.images), image_size=spec.image_size)
    policy = mt10.scripted_policy(spec.task_id)
    texts = list(mt10.instructions(spec.task_id))
    cols = {k: [] for k in ("obs", "act", "rew", "nxt", "term", "tout", "instr")}
    frames = {cam: [] for cam in spec.images}
    episodes = successes = 0
    start = time.perf_counter()
    bar = tqdm(total=spec.size, desc=f"mt10 {mt10.task_name(spec.task_id)}", disable=not progress, leave=False)
    while len(cols["act"]) < spec.size:
        obs, _ = env.reset(seed=int(rng.integers(2**31)))
        instruction = int(rng.integers(len(texts)))
        xi = rng.uniform(0.0, spec.noise)
        done = succeeded = False
        while not done and len(cols["act"]) < spec.size:
            state = obs[STATE_KEY]
            for cam in spec.images:
                frames[cam].append(obs[image_key(cam)])
            action = np.asarray(policy.get_action(state), np.float64)
            action = np.clip(action + (rng.normal(0.0, xi, action.shape) if xi > 0 else 0.0), -1, 1).astype(np.float32)
            obs, reward, terminated, truncated, info = env.step(action)
            for key, value in (("obs", state), ("act", action), ("rew", reward), ("nxt", obs[STATE_KEY]),
                               ("term", terminated), ("tout", truncated and not terminated), ("instr", instruction)):
                cols[key].append(value)
            succeeded |= bool(info["success"])
            done = terminated or truncated
            bar.update(1)
        episodes += 1
        successes += succeeded
    bar.close()
    env.close()
    if not (cols["term"][-1] or cols["tout"][-1]):
        cols["tout"][-1] = True   # the size cut the last episode: a timeout, not a terminal
    seconds = time.perf_counter() - start
    meta = {"env": ENV, "quality": "task", "size": spec.size, "seed": spec.seed, "task_id": spec.task_id,
            "task_name": mt10.task_name(spec.task_id), "generator": "metaworld.policies",
            "generator_version": GENERATOR_VERSION, "gen_spec": asdict(spec), "episodes": episodes,
            "success_episodes": successes, "success_rate": successes / max(episodes, 1), "instructions": texts,
            "reward": "Meta-World v2 reward functions", "transitions_per_second": spec.size / max(seconds, 1e-9)}
    ds = Dataset(observations=np.asarray(cols["obs"], np.float32), actions=np.asarray(cols["act"], np.float32),
                 rewards=np.asarray(cols["rew"], np.float32), next_observations=np.asarray(cols["nxt"], np.float32),
                 terminals=np.asarray(cols["term"], bool), timeouts=np.asarray(cols["tout"], bool), metadata=meta)
    extras = {"infos/instruction_id": np.asarray(cols["instr"], np.int32)}
    extras.update({f"images/{cam}": np.asarray(f, np.uint8) for cam, f in frames.items()})
    return ds, extras


def success_rewards(ds: Dataset) -> Dataset:
    """The same demos with `sims.make("mt10", reward="success")`'s reward: 1.0 at the step that succeeds (the
    episode's terminal), 0 elsewhere."""
    return replace(ds, rewards=ds.terminals.astype(np.float32),
                   metadata={**ds.metadata, "reward": "success: 1.0 at the step that succeeds"})


def load_or_generate(spec: GenSpec, *, cache_dir=None, progress: bool = True) -> Dataset:
    """The cached dataset for `spec` (same generator version), else generate and cache it."""
    return load_or_make(cache_path(spec, cache_dir), GENERATOR_VERSION, lambda: generate(spec, progress=progress))
