"""Roll a policy in an env and record the steps as a Dataset (how the catalog makes its data)."""
from __future__ import annotations

from typing import Callable

import numpy as np
from tqdm.auto import tqdm

from embodied.constants import STATE_KEY
from embodied.data.dataset import Dataset
from embodied.errors import ConfigError

GENERATOR_VERSION = 1


def state_of(obs) -> np.ndarray:
    """The flat state vector of an observation dict (`observation.state`) or a plain array."""
    if isinstance(obs, dict):
        obs = obs[STATE_KEY]
    return np.asarray(obs, dtype=np.float32).reshape(-1)


def collect(env, policy: Callable[[np.ndarray], np.ndarray] | None, num_steps: int, noise_std: float = 0.0,
            seed: int = 0, *, progress: bool = True, desc: str | None = None) -> Dataset:
    """Run `policy` (None: uniform random actions) for exactly `num_steps` env steps.

    A policy with a `reset()` method (e.g. a waypoint controller) is reset at every episode start.
    Gaussian noise of `noise_std` is added to the policy's action and the result is clipped to the
    action space. terminated -> terminals, truncated -> timeouts; the episode still running when
    the budget is spent is marked as a timeout (it was cut, not finished).
    """
    if num_steps < 1:
        raise ConfigError(f"collect num_steps={num_steps} must be a positive number of env steps")
    rng = np.random.default_rng(seed)
    low, high = env.action_space.low.astype(np.float32), env.action_space.high.astype(np.float32)
    act_dim = int(np.prod(env.action_space.shape))
    columns = {k: [] for k in ("observations", "actions", "rewards", "next_observations", "terminals", "timeouts")}
    episodes = successes = 0
    succeeded = has_success = False
    reset_policy = getattr(policy, "reset", None)  # stateful controllers start each episode afresh
    if callable(reset_policy):
        reset_policy()
    state = state_of(env.reset(seed=seed)[0])
    for _ in tqdm(range(num_steps), desc=desc or "collect", disable=not progress, leave=False):
        if policy is None:
            action = rng.uniform(low, high).astype(np.float32)
        else:
            action = np.asarray(policy(state), np.float32).reshape(-1)[:act_dim]
            if noise_std > 0:
                action = action + rng.normal(0.0, noise_std, size=act_dim).astype(np.float32)
            action = np.clip(action, low, high)
        obs, reward, terminated, truncated, info = env.step(action)
        next_state = state_of(obs)
        has_success |= "success" in info
        succeeded |= bool(info.get("success", False))
        for key, value in zip(columns, (state, action, reward, next_state, terminated, truncated and not terminated)):
            columns[key].append(value)
        if terminated or truncated:
            episodes += 1
            successes += succeeded
            succeeded = False
            if callable(reset_policy):
                reset_policy()
            state = state_of(env.reset()[0])
        else:
            state = next_state
    if num_steps and not (columns["terminals"][-1] or columns["timeouts"][-1]):
        columns["timeouts"][-1] = True
        episodes += 1
        successes += succeeded
    metadata = {
        "env": getattr(getattr(env, "spec", None), "id", None),
        "policy": "uniform-random" if policy is None else getattr(policy, "__name__", type(policy).__name__),
        "noise_std": float(noise_std),
        "seed": int(seed),
        "episodes": episodes,
        "generator_version": GENERATOR_VERSION,
    }
    if has_success:
        metadata["success_episodes"] = int(successes)
    return Dataset(
        observations=np.asarray(columns["observations"], np.float32).reshape(num_steps, -1),
        actions=np.asarray(columns["actions"], np.float32).reshape(num_steps, act_dim),
        rewards=np.asarray(columns["rewards"], np.float32),
        next_observations=np.asarray(columns["next_observations"], np.float32).reshape(num_steps, -1),
        terminals=np.asarray(columns["terminals"], bool),
        timeouts=np.asarray(columns["timeouts"], bool),
        metadata=metadata,
    )
