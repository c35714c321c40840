"""Multi-task, language-annotated image demonstrations of a suite, for VLA-style pretraining.

One `task` dataset per task id (the oracles of `embodied.data.ogbench_gen` driven through that task's
sub-goals, or Meta-World's scripted policies for mt10 (`embodied.data.mt10_gen`), with camera frames
and one instruction per episode, paraphrases drawn per episode), each
generated once and cached like every other dataset, then concatenated. `sample_chunks` gives what
`policies.vla.VLAPolicy.loss` reads: the current frame, state and instruction, and the next `horizon`
actions, padded past an episode's end by repeating its last action (`valid` marks the real ones).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from embodied.constants import STATE_KEY, TASK_KEY, image_key
from embodied.errors import DatasetError


@dataclass
class SuiteDemos:
    states: np.ndarray              # [N, obs] float32
    actions: np.ndarray             # [N, A] float32
    images: dict[str, np.ndarray]   # camera -> [N, H, W, 3] uint8
    instructions: list[str]         # [N] the episode's instruction at every step
    task_ids: np.ndarray            # [N] 1-based task id
    last: np.ndarray                # [N] index of the last step of the step's episode
    metadata: dict
    rewards: np.ndarray | None = None     # [N] the env's reward (for a critic trained on the demos)
    terminals: np.ndarray | None = None   # [N] bool: the step ended its episode in success (the demos stop there)
    rng: np.random.Generator = field(default=None, repr=False)

    def __post_init__(self):
        if self.rng is None:
            self.rng = np.random.default_rng(0)

    def __len__(self) -> int:
        return len(self.actions)

    @property
    def observations(self) -> np.ndarray:   # the normalisation statistics are fitted on these
        return self.states

    @property
    def obs_dim(self) -> int:
        return int(self.states.shape[1])

    @property
    def act_dim(self) -> int:
        return int(self.actions.shape[1])

    def seed(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)

    def validate(self, obs_dim: int, act_dim: int) -> None:
        if self.states.shape[1:] != (obs_dim,) or self.actions.shape[1:] != (act_dim,):
            raise DatasetError(f"suite demos have states {self.states.shape[1:]} and actions {self.actions.shape[1:]}; "
                               f"the env needs ({obs_dim},) and ({act_dim},): regenerate them for this env")

    def sample_chunks(self, batch_size: int, horizon: int) -> dict:
        start = self.rng.integers(0, len(self), batch_size)
        steps, valid = chunk_steps(start, self.last, horizon)
        batch = {STATE_KEY: self.states[start], TASK_KEY: [self.instructions[i] for i in start],
                 "actions": self.actions[steps], "valid": valid.astype(np.float32)}
        batch.update({image_key(cam): frames[start] for cam, frames in self.images.items()})
        return batch


def chunk_steps(start: np.ndarray, last: np.ndarray, horizon: int) -> tuple[np.ndarray, np.ndarray]:
    """The demo steps [B, horizon] of chunks from `start`, held at each episode's last step (`last`, per step),
    and `valid` [B, horizon]: the steps still inside the episode."""
    steps = np.asarray(start)[:, None] + np.arange(horizon)[None]
    end = last[start][:, None]
    return np.minimum(steps, end), steps <= end


def episode_last_index(ends: np.ndarray) -> np.ndarray:
    """For each step, the index of the last step of its episode (`ends` marks episode ends)."""
    ends = np.asarray(ends, bool).copy()
    ends[-1] = True
    last = np.empty(len(ends), np.int64)
    current = len(ends) - 1
    for i in range(len(ends) - 1, -1, -1):
        if ends[i]:
            current = i
        last[i] = current
    return last


def load_suite(env: str, task_ids, size_per_task: int, seed: int, cameras, image_size: int, *,
               progress: bool = True, cache_dir=None) -> SuiteDemos:
    """Generate (or read from the cache) one image dataset per task id and concatenate them."""
    from embodied.data.catalog import demo_generator
    from embodied.data.d4rl import load_extras

    generator = demo_generator(env)
    if generator is None:
        raise DatasetError(f"env={env!r} has no scripted task demos for a suite: use an OGBench manipulation task or mt10")

    cameras = tuple(cameras)
    if not cameras:
        raise DatasetError("a VLA suite dataset needs at least one camera: set algo.offline_agent.cameras, e.g. [front]")
    parts = []
    for task_id in task_ids:
        spec = generator.GenSpec(env, "task", int(size_per_task), int(seed), task_id=int(task_id), images=cameras,
                                 image_size=int(image_size))
        ds = generator.load_or_generate(spec, cache_dir=cache_dir, progress=progress)
        keys = [f"images/{cam}" for cam in cameras] + ["infos/instruction_id"]
        extras = load_extras(generator.cache_path(spec, cache_dir), keys)
        texts = ds.metadata.get("instructions")
        if not texts:
            raise DatasetError(f"{env} task {task_id} data has no instructions; regenerate it (delete the cache file)")
        parts.append((int(task_id), ds, extras, list(texts)))
    states = np.concatenate([ds.observations for _, ds, _, _ in parts])
    actions = np.concatenate([ds.actions for _, ds, _, _ in parts])
    images = {cam: np.concatenate([ex[f"images/{cam}"] for _, _, ex, _ in parts]) for cam in cameras}
    instructions = [texts[int(i)] for _, _, ex, texts in parts for i in ex["infos/instruction_id"]]
    task_col = np.concatenate([np.full(len(ds), tid) for tid, ds, _, _ in parts])
    ends = np.concatenate([ds.terminals | ds.timeouts for _, ds, _, _ in parts])
    for cam, frames in images.items():
        if frames.shape[1:] != (image_size, image_size, 3) or frames.dtype != np.uint8:
            raise DatasetError(f"images/{cam} are {frames.dtype} {frames.shape[1:]}; expected uint8 "
                               f"({image_size}, {image_size}, 3): regenerate the dataset")
    metadata = {"env": env, "task_ids": [tid for tid, *_ in parts], "size_per_task": int(size_per_task),
                "episodes": int(sum(ds.metadata.get("episodes", 0) for _, ds, _, _ in parts)),
                "instructions": sorted(set(instructions))}
    rewards = np.concatenate([ds.rewards for _, ds, _, _ in parts]).astype(np.float32)
    terminals = np.concatenate([ds.terminals for _, ds, _, _ in parts]).astype(bool)
    return SuiteDemos(states, actions, images, instructions, task_col, episode_last_index(ends), metadata,
                      rewards=rewards, terminals=terminals)

