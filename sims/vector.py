"""Vectorised `sims.make` envs: N copies stepped together, in this process or in N workers.

    vec = sims.vector.make_vec("cube-single", 8, asynchronous=True, seed=0)
    obs, info = vec.reset()            # obs["observation.state"]: [8, obs_dim]
    obs, r, term, trunc, info = vec.step(actions)   # finished envs reset themselves on the next step

Asynchronous workers start with "forkserver" by default and with "spawn" whenever frames are
rendered (images or render=True): a forked child inherits the parent's GL/EGL state and hangs.
Language observations (`task`, a string) need `shared_memory=False`, which is chosen for you.
"""
from __future__ import annotations

import functools
import multiprocessing

import gymnasium
import numpy as np
from gymnasium.vector import AsyncVectorEnv, AutoresetMode, SyncVectorEnv

import sims
from embodied.constants import STATE_KEY
from embodied.errors import UserError

CONTEXTS = ("spawn", "forkserver", "fork")


def _make_one(name: str, seed: int | None, kwargs: dict):
    return sims.make(name, seed=seed, **kwargs)


def default_context(renders: bool) -> str:
    if renders:
        return "spawn"
    return "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"


def make_vec(name: str, num_envs: int, *, asynchronous: bool = False, seed: int | None = None,
             context: str | None = None, autoreset: str = "next_step", **make_kwargs) -> gymnasium.vector.VectorEnv:
    """`num_envs` copies of `sims.make(name, **make_kwargs)`; copy i is seeded `seed + i`."""
    sims.spec(name)  # unknown names fail here, listing the valid ones
    if isinstance(num_envs, bool) or not isinstance(num_envs, int) or num_envs < 1:
        raise UserError(f"num_envs={num_envs!r} must be a positive integer")
    if context is not None and context not in CONTEXTS:
        raise UserError(f"context={context!r}: choose one of {', '.join(CONTEXTS)}")
    modes = {"next_step": AutoresetMode.NEXT_STEP, "same_step": AutoresetMode.SAME_STEP}
    if autoreset not in modes:
        raise UserError(f"autoreset={autoreset!r}: choose one of {', '.join(modes)}")
    fns = [functools.partial(_make_one, name, None if seed is None else seed + i, dict(make_kwargs))
           for i in range(num_envs)]
    if not asynchronous:
        vec = SyncVectorEnv(fns, autoreset_mode=modes[autoreset])
    else:
        renders = bool(make_kwargs.get("render") or make_kwargs.get("images"))
        ctx = context or default_context(renders)
        if renders and ctx == "fork":
            raise UserError("context=fork with rendering hangs (GL state is not fork-safe): use spawn or forkserver")
        if ctx == "forkserver":  # workers fork from a server that has already imported the tasks
            multiprocessing.get_context("forkserver").set_forkserver_preload(["sims"])
        vec = AsyncVectorEnv(fns, context=ctx, shared_memory=not make_kwargs.get("language", False),
                             autoreset_mode=modes[autoreset])
    if seed is not None:
        vec.action_space.seed(seed)
    return vec


def rollout(vec: gymnasium.vector.VectorEnv, policy, num_steps: int, seed: int | None = None) -> dict:
    """Step `vec` for `num_steps` vector steps with `policy(states [N, obs]) -> actions [N, A]`
    (None: uniform random); returns stacked arrays plus the finished episodes' returns and successes.
    Steps that only reset an env (NEXT_STEP autoreset) are left out of the transitions."""
    obs, _ = vec.reset(seed=seed)
    n = vec.num_envs
    out = {k: [] for k in ("observations", "actions", "rewards", "next_observations", "terminals", "timeouts")}
    returns, successes = [], []
    running = np.zeros(n)
    succeeded = np.zeros(n, bool)
    resetting = np.zeros(n, bool)
    for _ in range(num_steps):
        state = obs[STATE_KEY]
        action = vec.action_space.sample() if policy is None else np.asarray(policy(state), np.float32)
        obs, reward, terminated, truncated, info = vec.step(action)
        live = ~resetting
        out["observations"].append(state[live])
        out["actions"].append(action[live])
        out["rewards"].append(reward[live])
        out["next_observations"].append(obs[STATE_KEY][live])
        out["terminals"].append(terminated[live])
        out["timeouts"].append((truncated & ~terminated)[live])
        running[live] += reward[live]
        if "success" in info:
            succeeded |= np.asarray(info["success"], bool) & live
        done = (terminated | truncated) & live
        for i in np.flatnonzero(done):
            returns.append(float(running[i]))
            successes.append(bool(succeeded[i]))
        running[done] = 0.0
        succeeded[done] = False
        resetting = done
    stacked = {k: np.concatenate(v) for k, v in out.items()}
    stacked["episode_returns"] = np.asarray(returns)
    stacked["episode_successes"] = np.asarray(successes, bool)
    return stacked
