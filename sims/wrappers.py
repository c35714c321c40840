"""Wrappers that turn any registered env into the contract's shape (see docs/ARCHITECTURE.md)."""
from __future__ import annotations

import gymnasium
import numpy as np
from gymnasium import spaces
from gymnasium.utils import RecordConstructorArgs
from gymnasium.wrappers import RescaleAction

STATE_KEY = "observation.state"


class StateDictObservation(gymnasium.ObservationWrapper, RecordConstructorArgs):
    """Flat vector -> {"observation.state": float32[obs_dim]}; holds the task spec for callers.

    Records its arguments so `env.spec.make()` can rebuild the whole stack (the env checker does).
    """

    def __init__(self, env: gymnasium.Env, task_spec):
        RecordConstructorArgs.__init__(self, task_spec=task_spec)
        super().__init__(env)
        inner = env.observation_space
        if not isinstance(inner, spaces.Box) or inner.shape != (task_spec.obs_dim,):
            raise ValueError(f"{task_spec.name}: expected a Box({task_spec.obs_dim},), got {inner}")
        self.task_spec = task_spec
        state_space = spaces.Box(-np.inf, np.inf, shape=(task_spec.obs_dim,), dtype=np.float32)
        self.observation_space = spaces.Dict({STATE_KEY: state_space})

    def observation(self, observation):
        # asarray does not copy when the task already gives float32 (PointMaze).
        return {STATE_KEY: np.asarray(observation, dtype=np.float32)}


def unit_actions(env: gymnasium.Env) -> gymnasium.Env:
    """Rescale actions to [-1, 1] only when the env's bounds differ (no wrapper cost otherwise)."""
    box = env.action_space
    if np.all(box.low == -1.0) and np.all(box.high == 1.0) and box.dtype == np.float32:
        return env
    unit_low = np.full(box.shape, -1.0, dtype=np.float32)
    env = RescaleAction(env, unit_low, -unit_low)
    env.action_space = spaces.Box(unit_low, -unit_low, dtype=np.float32)
    return env


def disable_costly_rendering(env: gymnasium.Env) -> None:
    """Turn off shadows and reflections on the MuJoCo model: ~6x more frames/s at small sizes.

    Must run before the first `render()`: the shadow map size is read when the GL context is made.
    """
    model = env.unwrapped.model
    model.vis.quality.shadowsize = 0  # no shadow map -> no shadow pass
    model.mat_reflectance[:] = 0.0  # no reflective materials -> no mirrored pass
