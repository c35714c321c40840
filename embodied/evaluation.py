"""Policy evaluation, for step and chunk policies alike: N episodes stepped in lock-step so the actor runs batched, D4RL-normalised
scores, success rates, Monte-Carlo returns for critic calibration, and mp4 videos."""
from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

import sims
from embodied.data.dataset import discounted_return_to_go
from policies.base import STATE_KEY
from policies.executors import OpenLoopExecutor

BatchPolicy = Callable[[np.ndarray], np.ndarray]  # [B, obs] -> [B, A]
ChunkPolicy = Callable[[np.ndarray], np.ndarray]  # [B, To, obs] -> [B, H, A]


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


class ChunkActor:
    """One env's acting state: observation history plus an open-loop executor over chunks.

    A step policy is the special case obs_horizon = execute_horizon = 1."""

    def __init__(self, chunk_fn, obs_horizon: int, execute_horizon: int):
        self.chunk_fn, self.obs_horizon = chunk_fn, obs_horizon
        self.executor = OpenLoopExecutor(execute_horizon)
        self.history: deque = deque(maxlen=obs_horizon)
        self.step = 0

    def reset(self) -> None:
        self.executor.reset()
        self.history.clear()
        self.step = 0

    def observe(self, state: np.ndarray) -> bool:
        """Append the current state; True when the executor wants a fresh chunk for this step."""
        state = np.asarray(state, np.float32)
        if not self.history:
            self.history.extend([state] * self.obs_horizon)
        self.history.append(state)
        return self.executor.wants_chunk(self.step)

    def push(self, chunk: np.ndarray) -> None:
        self.executor.push(chunk, self.step)

    def wants_chunk_next(self) -> bool:
        """Will the next `observe` ask for a chunk (so the next observation's frames will be read)?"""
        return self.executor.will_want_chunk(self.step)

    def next_action(self) -> np.ndarray:
        action = self.executor.next_action(self.step)
        self.step += 1
        return action

    def __call__(self, state: np.ndarray) -> np.ndarray:
        if self.observe(state):
            self.push(self.chunk_fn(np.stack(self.history)[None])[0])
        return self.next_action()


def dict_step_policy(chunk_fn, execute_horizon: int):
    """A per-step policy over observation dicts (one env, a batch of one): each chunk runs open-loop.
    `chunk_fn(obs)` gets the dict only when a chunk is due; `wants_chunk_next()` tells `record_video`
    which frames the policy will read."""
    actor = ChunkActor(None, 1, execute_horizon)

    def act(obs: dict) -> np.ndarray:
        if actor.observe(obs[STATE_KEY][0]):
            actor.push(chunk_fn(obs)[0])
        return actor.next_action()[None]
    act.wants_chunk_next = actor.wants_chunk_next
    return act


def stack_observations(observations: list[dict]) -> dict:
    """Observation dicts -> one batch: arrays stacked on a new first axis, strings (instructions) as a list."""
    return {key: [o[key] for o in observations] if isinstance(value, str) else np.stack([o[key] for o in observations])
            for key, value in observations[0].items()}


def step_chunks(policy: BatchPolicy) -> ChunkPolicy:
    """A step policy as a chunk policy with To = H = 1."""
    return lambda obs_seq: np.asarray(policy(obs_seq[:, -1]), np.float32)[:, None]


def evaluate(env_name: str, policy: BatchPolicy | None, episodes: int, seed: int, gamma: float = 0.99,
             reward_transform: Callable[[np.ndarray], np.ndarray] = lambda r: r, env_kwargs: dict | None = None,
             chunk_policy: ChunkPolicy | None = None, obs_horizon: int = 1, execute_horizon: int = 1,
             max_envs: int | None = None, full_obs: bool = False) -> EvalResult:
    """Run `episodes` episodes in lock-step, one batched policy call for every env that needs an action.

    Pass a step `policy` ([B, obs] -> [B, A]), or a `chunk_policy` ([B, To, obs] -> [B, H, A]) with its
    horizons: each env executes its chunk open-loop and asks for the next one after `execute_horizon`
    actions. At most `max_envs` envs exist at once (episodes run in waves; a manipulation env holds
    ~100 MB); None runs every episode at once. Deterministic acting is the caller's choice.
    `full_obs`: the chunk policy gets the envs' whole observation dicts batched (state, camera frames,
    the instruction: what a VLA reads) instead of state histories; it needs obs_horizon 1."""
    if (policy is None) == (chunk_policy is None):
        raise TypeError("evaluate takes exactly one of policy= and chunk_policy=")
    if full_obs and (chunk_policy is None or obs_horizon != 1):
        raise TypeError("full_obs=True takes a chunk_policy with obs_horizon=1")
    if chunk_policy is None:
        chunk_policy, obs_horizon, execute_horizon = step_chunks(policy), 1, 1
    width = max(1, min(episodes, max_envs or episodes))
    envs = eval_envs(env_name, width, env_kwargs)
    returns, lengths, successes = np.zeros(episodes), np.zeros(episodes, int), np.zeros(episodes, bool)
    traj = [([], [], []) for _ in range(episodes)]
    for first in range(0, episodes, width):
        wave = list(range(first, min(first + width, episodes)))
        actors = [ChunkActor(None, obs_horizon, execute_horizon) for _ in wave]
        latest = [envs[j].reset(seed=seed + i)[0] for j, i in enumerate(wave)]  # each env's observation dict
        alive = np.ones(len(wave), bool)
        while alive.any():
            index = np.flatnonzero(alive)
            need = [j for j in index if actors[j].observe(latest[j][STATE_KEY])]  # histories, then one batched call
            if need:
                if full_obs:
                    chunks = chunk_policy(stack_observations([latest[j] for j in need]))
                else:
                    chunks = chunk_policy(np.stack([np.stack(actors[j].history) for j in need]))
                for row, j in enumerate(need):
                    actors[j].push(chunks[row])
            for j in index:
                i = wave[j]
                action = actors[j].next_action()
                if full_obs and not actors[j].wants_chunk_next():
                    sims.skip_next_frames(envs[j])  # mid-chunk: nobody reads these frames
                obs, reward, terminated, truncated, info = envs[j].step(action)
                traj[i][0].append(np.asarray(latest[j][STATE_KEY], np.float32).copy())
                traj[i][1].append(action)
                traj[i][2].append(reward)
                returns[i] += reward
                lengths[i] += 1
                successes[i] |= bool(info.get("success", False))
                latest[j] = obs
                if terminated or truncated:
                    alive[j] = False
    ep_states, ep_actions, ep_rewards = zip(*traj)
    return episode_result(env_name, returns, lengths, successes, ep_states, ep_actions, ep_rewards, gamma,
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


_ENV_CACHE: OrderedDict = OrderedDict()
_SLOW_TO_BUILD = ("cube-", "scene", "puzzle-")  # OGBench manipspace: ~1 s per env build
ENV_CACHE_MAX = 25   # ~100 MB per manipulation env: 5 tasks x 5 envs; older kinds (a variation, a task) are closed


def eval_envs(env_name: str, episodes: int, env_kwargs: dict | None = None) -> list:
    """Fresh envs, except for tasks that are slow to build: those are built once and reused (every
    episode starts with reset(seed=...), so reuse changes nothing but the time)."""
    if not env_name.startswith(_SLOW_TO_BUILD):
        return [sims.make(env_name, **(env_kwargs or {})) for _ in range(episodes)]
    key = (env_name, repr(sorted((env_kwargs or {}).items())))
    cached = _ENV_CACHE.setdefault(key, [])
    _ENV_CACHE.move_to_end(key)
    while len(cached) < episodes:
        cached.append(sims.make(env_name, **(env_kwargs or {})))
    while sum(len(v) for v in _ENV_CACHE.values()) > max(ENV_CACHE_MAX, episodes) and len(_ENV_CACHE) > 1:
        for env in _ENV_CACHE.popitem(last=False)[1]:    # the least recently used kind
            env.close()
    return cached[:episodes]


def record_video(env_name: str, policy: BatchPolicy, path: str | Path, episodes: int = 2, seed: int = 0,
                 size: int = 128, fps: int = 30, max_steps: int | None = None, env_kwargs: dict | None = None,
                 full_obs: bool = False) -> Path | None:
    """Render a few episodes into one mp4. Returns None (with a warning) when no GL backend works.
    `full_obs`: the policy gets the observation dict as a batch of one (frames, instruction), not [1, obs].
    A policy with a `wants_chunk_next()` method (a chunk executed open-loop) is not given the frames it will
    not read: mid-chunk observations skip their camera frames, as in `evaluate` (the video frames are apart)."""
    import imageio.v2 as imageio
    import warnings

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        env = sims.make(env_name, render=True, render_size=size, **(env_kwargs or {}))
        frames = []
        for episode in range(episodes):
            obs, _ = env.reset(seed=seed + episode)
            frames.append(env.render())
            done, steps = False, 0
            while not done and (max_steps is None or steps < max_steps):
                query = stack_observations([obs]) if full_obs else obs[STATE_KEY][None]
                action = np.asarray(policy(query))[0]
                if full_obs and not getattr(policy, "wants_chunk_next", lambda: True)():
                    sims.skip_next_frames(env)  # mid-chunk: the policy will not read these frames
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
