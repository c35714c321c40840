"""Wrappers that turn any registered env into the contract's shape (see docs/ARCHITECTURE.md)."""
from __future__ import annotations

import string

import gymnasium
import numpy as np
from gymnasium import spaces
from gymnasium.utils import RecordConstructorArgs
from gymnasium.wrappers import RescaleAction

from embodied.constants import STATE_KEY, TASK_KEY, image_key
from embodied.errors import ConfigError, UserError


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

    def step(self, action):
        obs, reward, terminated, truncated, info = super().step(action)
        return obs, float(reward), terminated, truncated, info  # InvertedPendulum returns an int

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
    model = getattr(env.unwrapped, "model", None)
    if model is None:  # not a MuJoCo env (classic control draws with pygame)
        return
    model.vis.quality.shadowsize = 0  # no shadow map -> no shadow pass
    model.mat_reflectance[:] = 0.0  # no reflective materials -> no mirrored pass


def skip_next_frames(env: gymnasium.Env) -> None:
    """Leave the camera frames out of `env`'s next observation (one step; rendering is most of a
    manipulation step's cost). For callers that know nobody reads them, e.g. mid-chunk; a no-op for
    envs that render none. A policy handed such an observation fails loudly on the missing key."""
    try:
        skip = env.get_wrapper_attr("skip_frames_once")
    except AttributeError:
        return
    skip()


class ChunkedActionWrapper(gymnasium.Wrapper):
    """Step an env with an action chunk `[H, A]`, executed open-loop, one env step per row.

    `step(chunk)` runs the first `execute_horizon` rows (all rows when None) or until the episode
    ends, and returns the last observation, the summed reward, the last terminated/truncated flags
    and, in `info["chunk"]`, every per-step record (observations, actions, rewards, next
    observations, terminated, truncated) so a learner can store single transitions and later sample
    h-step chunks with `valid` masks. A `[A]` action is a chunk of one. Successes are OR-ed.
    With `mid_chunk_frames=False` only the chunk's last step renders camera frames (a policy that acts
    once per chunk reads no others); the per-step records then hold state-only observations.
    """

    def __init__(self, env: gymnasium.Env, execute_horizon: int | None = None, mid_chunk_frames: bool = True):
        super().__init__(env)
        self.mid_chunk_frames = bool(mid_chunk_frames)
        if execute_horizon is not None and int(execute_horizon) < 1:
            raise ConfigError(f"execute_horizon={execute_horizon} must be >= 1 (or None: the whole chunk)")
        self.execute_horizon = None if execute_horizon is None else int(execute_horizon)
        self.single_action_space = env.action_space
        if self.execute_horizon is not None:  # vector envs batch [k, A] chunks by this space
            box = env.action_space
            self.action_space = spaces.Box(np.repeat(box.low[None], self.execute_horizon, 0),
                                           np.repeat(box.high[None], self.execute_horizon, 0), dtype=box.dtype)
        self._obs = None

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        self._obs = obs
        return obs, info

    def step(self, chunk):
        chunk = np.asarray(chunk, dtype=np.float32)
        if chunk.ndim == 1:
            chunk = chunk[None]
        act_dim = self.single_action_space.shape[-1]
        if chunk.ndim != 2 or chunk.shape[-1] != act_dim:
            raise UserError(f"chunk has shape {chunk.shape}; pass [H, {act_dim}] actions")
        rows = chunk if self.execute_horizon is None else chunk[: self.execute_horizon]
        record = {k: [] for k in ("observations", "actions", "rewards", "next_observations", "terminated", "truncated")}
        total, success, info = 0.0, False, {}
        terminated = truncated = False
        for i, action in enumerate(rows):
            if not self.mid_chunk_frames and i < len(rows) - 1:
                skip_next_frames(self.env)
            obs, reward, terminated, truncated, info = self.env.step(action)
            for key, value in zip(record, (self._obs, action, reward, obs, terminated, truncated)):
                record[key].append(value)
            self._obs = obs
            total += float(reward)
            success |= bool(info.get("success", False))
            if terminated or truncated:
                break
        info = dict(info)
        info["success"] = success
        info["chunk"] = record
        info["executed"] = len(record["actions"])
        return self._obs, total, terminated, truncated, info


class CameraObservation(gymnasium.ObservationWrapper):
    """Adds `observation.images.<camera>` (uint8 HWC) and `task` (the env's `current_instruction()`) to
    the state dict. A suite's subclass says how one camera is drawn (`_draw`) with `renderer` (a
    `mujoco.Renderer` of the env's model, or None when no camera is asked for)."""

    def __init__(self, env: gymnasium.Env, images: tuple, image_size: int, language: bool, renderer):
        super().__init__(env)
        self.images, self.image_size, self.language = tuple(images), int(image_size), bool(language)
        self._renderer, self._skip_frames = renderer, False
        obs_spaces = dict(env.observation_space.spaces)
        for cam in self.images:
            obs_spaces[image_key(cam)] = spaces.Box(0, 255, shape=(self.image_size, self.image_size, 3), dtype=np.uint8)
        if self.language:
            obs_spaces[TASK_KEY] = spaces.Text(max_length=1000, charset=string.printable)
        self.observation_space = spaces.Dict(obs_spaces)

    def _draw(self, camera: str) -> np.ndarray:
        raise NotImplementedError

    def _on_reset(self, seed) -> None:
        """Per-episode state of the drawing (e.g. where a distractor sits)."""

    def skip_frames_once(self) -> None:
        """Leave the camera frames out of the next observation only (`sims.skip_next_frames`)."""
        self._skip_frames = True

    def reset(self, *, seed=None, options=None):
        obs, info = self.env.reset(seed=seed, options=options)
        self._skip_frames = False   # a reset's observation always carries its frames
        self._on_reset(seed)
        return self.observation(obs), info

    def observation(self, observation):
        skip, self._skip_frames = self._skip_frames, False
        if self._renderer is not None and not skip:
            for cam in self.images:
                observation[image_key(cam)] = self._draw(cam)
        if self.language:
            observation[TASK_KEY] = self.env.get_wrapper_attr("current_instruction")()
        return observation

    def close(self):
        if self._renderer is not None:
            self._renderer.close()
            self._renderer = None
        super().close()
