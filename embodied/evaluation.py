"""Policy evaluation: N episodes stepped in lock-step so the actor runs batched, D4RL-normalised
scores, success rates, Monte-Carlo returns for critic calibration, and mp4 videos."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

import sims
from embodied.data.dataset import discounted_return_to_go
from policies.base import STATE_KEY

BatchPolicy = Callable[[np.ndarray], np.ndarray]  # [B, obs] -> [B, A]


@dataclass
class EvalResult:
    returns: np.ndarray                    # raw environment return per episode
    lengths: np.ndarray
    successes: np.ndarray | None           # per-episode success, where the task defines it
    normalized: np.ndarray | None          # D4RL-normalised score per episode
    # per-step (state, action, discounted MC return) of every episode, for the calibration gap
    states: np.ndarray = field(repr=False, default=None)
    actions: np.ndarray = field(repr=False, default=None)
    mc_returns: np.ndarray = field(repr=False, default=None)

    @property
    def score(self) -> float:
        """The headline number: normalised score if the task has one, else mean return."""
        return float(np.mean(self.normalized if self.normalized is not None else self.returns))

    def metrics(self, prefix: str = "eval/") -> dict[str, float]:
        out = {f"{prefix}score": self.score, f"{prefix}return": float(np.mean(self.returns)),
               f"{prefix}return_std": float(np.std(self.returns)), f"{prefix}length": float(np.mean(self.lengths)),
               f"{prefix}episodes": float(len(self.returns))}
        if self.successes is not None:
            out[f"{prefix}success"] = float(np.mean(self.successes))
        return out


def evaluate(env_name: str, policy: BatchPolicy, episodes: int, seed: int, gamma: float = 0.99,
             reward_transform: Callable[[np.ndarray], np.ndarray] = lambda r: r, env_kwargs: dict | None = None,
             envs: list | None = None) -> EvalResult:
    """Run `episodes` episodes of `policy` (deterministic is the caller's choice) in lock-step."""
    envs = envs or eval_envs(env_name, episodes, env_kwargs)
    states = np.stack([env.reset(seed=seed + i)[0][STATE_KEY] for i, env in enumerate(envs[:episodes])])
    alive = np.ones(episodes, bool)
    returns, lengths, successes = np.zeros(episodes), np.zeros(episodes, int), np.zeros(episodes, bool)
    traj_states, traj_actions, traj_rewards = [[] for _ in range(episodes)], [[] for _ in range(episodes)], [[] for _ in range(episodes)]
    while alive.any():
        index = np.flatnonzero(alive)
        actions = np.asarray(policy(states[index]), dtype=np.float32)
        for row, i in enumerate(index):
            obs, reward, terminated, truncated, info = envs[i].step(actions[row])
            traj_states[i].append(states[i].copy())
            traj_actions[i].append(actions[row])
            traj_rewards[i].append(reward)
            returns[i] += reward
            lengths[i] += 1
            successes[i] |= bool(info.get("success", False))
            states[i] = obs[STATE_KEY]
            if terminated or truncated:
                alive[i] = False
    return episode_result(env_name, returns, lengths, successes, traj_states, traj_actions, traj_rewards, gamma,
                          reward_transform)


def episode_result(env_name: str, returns, lengths, successes, traj_states, traj_actions, traj_rewards,
                   gamma: float, reward_transform) -> EvalResult:
    """Per-episode step lists -> EvalResult: normalised scores, success where the task has it, and
    Monte-Carlo returns of the transformed rewards (the calibration diagnostic's reference)."""
    spec = sims.spec(env_name)
    mc = [discounted_return_to_go(reward_transform(np.asarray(r, np.float32)), gamma) for r in traj_rewards]
    normalized = None
    if spec.ref_min_score is not None:
        normalized = np.array([sims.normalized_score(env_name, r) for r in returns])
    return EvalResult(returns=returns, lengths=lengths, successes=successes if spec.has_success else None,
                      normalized=normalized, states=np.concatenate([np.stack(s) for s in traj_states]),
                      actions=np.concatenate([np.stack(a) for a in traj_actions]), mc_returns=np.concatenate(mc))


_ENV_CACHE: dict = {}
_SLOW_TO_BUILD = ("cube-", "scene", "puzzle-")  # OGBench manipspace: ~1 s per env build


def eval_envs(env_name: str, episodes: int, env_kwargs: dict | None = None) -> list:
    """Fresh envs, except for tasks that are slow to build: those are built once and reused (every
    episode starts with reset(seed=...), so reuse changes nothing but the time)."""
    if not env_name.startswith(_SLOW_TO_BUILD):
        return [sims.make(env_name, **(env_kwargs or {})) for _ in range(episodes)]
    key = (env_name, repr(sorted((env_kwargs or {}).items())))
    cached = _ENV_CACHE.setdefault(key, [])
    while len(cached) < episodes:
        cached.append(sims.make(env_name, **(env_kwargs or {})))
    return cached[:episodes]


def record_video(env_name: str, policy: BatchPolicy, path: str | Path, episodes: int = 2, seed: int = 0,
                 size: int = 128, fps: int = 30, max_steps: int | None = None) -> Path | None:
    """Render a few episodes into one mp4. Returns None (with a warning) when no GL backend works."""
    import imageio.v2 as imageio
    import warnings

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        env = sims.make(env_name, render=True, render_size=size)
        frames = []
        for episode in range(episodes):
            obs, _ = env.reset(seed=seed + episode)
            frames.append(env.render())
            done, steps = False, 0
            while not done and (max_steps is None or steps < max_steps):
                action = np.asarray(policy(obs[STATE_KEY][None]))[0]
                obs, _, terminated, truncated, _ = env.step(action)
                frames.append(env.render())
                done, steps = terminated or truncated, steps + 1
        env.close()
    except Exception as err:  # rendering is a nice-to-have: never kill a training run over it
        warnings.warn(f"video skipped ({type(err).__name__}: {err}); set MUJOCO_GL=egl or install libosmesa6 "
                      "and set MUJOCO_GL=osmesa")
        return None
    imageio.mimsave(path, frames, fps=fps, macro_block_size=1)
    return path
