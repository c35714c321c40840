"""Tasks by name: a spec and a builder each; new suites plug in with `@register_task(spec)`."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import gymnasium

from embodied.errors import UserError
from sims import wrappers
from sims.wrappers import skip_next_frames  # noqa: F401  (sims.skip_next_frames)

# builder(spec, *, render_mode, render_size, **kwargs) -> env with a flat Box observation
Builder = Callable[..., gymnasium.Env]


@dataclass(frozen=True)
class TaskSpec:
    """What callers may know about a task without building it."""

    name: str
    gym_id: str
    obs_dim: int
    act_dim: int
    max_episode_steps: int
    ref_min_score: float | None  # D4RL-style normalisation; None: no reference
    ref_max_score: float | None
    approximate_normalization: bool  # reference scores come from different physics
    has_success: bool  # info["success"] exists
    sparse: bool
    success_reward_threshold: float | None = None  # an episode return >= this means success
    num_tasks: int | None = None  # a multi-task suite: `make(name, task_id=1..num_tasks)`


@dataclass(frozen=True)
class _Task:
    spec: TaskSpec
    build: Builder
    finish: Callable[[gymnasium.Env], gymnasium.Env] | None = None  # wraps the dict-observation env last


_TASKS: dict[str, _Task] = {}


def register_task(spec: TaskSpec, finish=None) -> Callable[[Builder], Builder]:
    """Decorator: `@register_task(TaskSpec(...))` over a builder of a flat-observation env.

    `finish(env)`, when given, wraps the finished dict-observation env (e.g. to add image or
    language keys next to `observation.state`).
    """

    def decorate(build: Builder) -> Builder:
        if spec.name in _TASKS:
            raise ValueError(f"task {spec.name!r} is registered twice")
        _TASKS[spec.name] = _Task(spec, build, finish)
        return build

    return decorate


def names() -> list[str]:
    return sorted(_TASKS)


def _task(name: str) -> _Task:
    try:
        return _TASKS[name]
    except KeyError:
        raise UserError(f"unknown env {name!r}; choose one of: {', '.join(names())}") from None


def spec(name: str) -> TaskSpec:
    return _task(name).spec


def make(
    name: str, *, seed: int | None = None, render: bool = False, render_size: int = 128,
    execute_horizon: int | None = None, mid_chunk_frames: bool = True, **kwargs
) -> gymnasium.Env:
    """Build a task with the contract's dict observations and [-1, 1] actions.

    `seed` seeds the env (one reset) and its action space: later `reset()` calls are reproducible.
    `render=True` gives uint8 HWC frames of render_size x render_size from `env.render()`.
    `execute_horizon=k` makes `step` take an action chunk [H, A] and run its first k rows open-loop
    (`wrappers.ChunkedActionWrapper`; info["executed"] says how many ran before the episode ended);
    with `mid_chunk_frames=False` cameras render only at the chunk's last step.
    """
    task = _task(name)
    render_mode = "rgb_array" if render else None
    env = task.build(task.spec, render_mode=render_mode, render_size=render_size, **kwargs)
    env = wrappers.unit_actions(env)
    env = wrappers.StateDictObservation(env, task.spec)
    if render:
        wrappers.disable_costly_rendering(env)
    if task.finish is not None:
        env = task.finish(env)
    if execute_horizon is not None:
        env = wrappers.ChunkedActionWrapper(env, execute_horizon, mid_chunk_frames)
    if seed is not None:
        env.reset(seed=seed)
        env.action_space.seed(seed)
    return env


def normalized_score(name: str, episode_return: float) -> float | None:
    """D4RL normalised score, 100 (R - min) / (max - min); None when the task has no reference."""
    task_spec = spec(name)
    if task_spec.ref_min_score is None or task_spec.ref_max_score is None:
        return None
    span = task_spec.ref_max_score - task_spec.ref_min_score
    return 100.0 * (float(episode_return) - task_spec.ref_min_score) / span
