"""MuJoCo locomotion (gymnasium v5) with D4RL reference scores.

D4RL normalised against the v2 envs; v5 physics differ, so every score here is approximate.
"""
from __future__ import annotations

import os

import gymnasium

from sims.registry import TaskSpec, register_task

# name: (gym id, obs dim, act dim, D4RL random score, D4RL expert score)
_LOCOMOTION = {
    "hopper": ("Hopper-v5", 11, 3, -20.272305, 3234.3),
    "halfcheetah": ("HalfCheetah-v5", 17, 6, -280.178953, 12135.0),
    "walker2d": ("Walker2d-v5", 17, 6, 1.629008, 4592.3),
    "ant": ("Ant-v5", 105, 8, -325.6, 3879.7),
    # Not in D4RL. Random: the mean return of uniform actions over 100 seeded episodes (5.6); max: the
    # return of an episode that balances for all 1,000 steps. The default main job's task: SAC solves it
    # within a few thousand steps, so an online phase on a CPU has room to show a gain.
    "inverted-pendulum": ("InvertedPendulum-v5", 4, 1, 5.63, 1000.0),
}


def build_locomotion(spec: TaskSpec, *, render_mode, render_size, **kwargs) -> gymnasium.Env:
    kwargs.setdefault("max_episode_steps", spec.max_episode_steps)
    return gymnasium.make(
        spec.gym_id, render_mode=render_mode, width=render_size, height=render_size, **kwargs
    )


for _name, (_gym_id, _obs_dim, _act_dim, _ref_min, _ref_max) in _LOCOMOTION.items():
    register_task(
        TaskSpec(
            name=_name,
            gym_id=_gym_id,
            obs_dim=_obs_dim,
            act_dim=_act_dim,
            max_episode_steps=1000,
            ref_min_score=_ref_min,
            ref_max_score=_ref_max,
            approximate_normalization=_name != "inverted-pendulum",  # D4RL's references, v2 physics
            has_success=False,
            sparse=False,
        )
    )(build_locomotion)

# Gymnasium's classic-control Pendulum-v1 swing-up (not MuJoCo): 200-step episodes that only time out, a dense
# cost on the angle, speed and torque, and a random start angle and speed per episode, so a 20-episode score moves
# smoothly with the policy. Random: the mean return of uniform actions over 100 seeded episodes (-1197.2); max: 0,
# a pendulum held upright from the first step (unreachable from a hanging start, as InvertedPendulum's 1,000 is a
# bound, not an expert). Not in D4RL. A smooth-scored check of the main job's switch (benchmarks/RESULTS.md).
@register_task(TaskSpec(name="pendulum", gym_id="Pendulum-v1", obs_dim=3, act_dim=1, max_episode_steps=200,
                        ref_min_score=-1197.2, ref_max_score=0.0, approximate_normalization=False,
                        has_success=False, sparse=False))
def build_pendulum(spec: TaskSpec, *, render_mode, render_size, **kwargs) -> gymnasium.Env:
    kwargs.setdefault("max_episode_steps", spec.max_episode_steps)
    if render_mode is not None:  # pygame draws off-screen; without these SDL looks for a display and complains
        os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
        os.environ.setdefault("SDL_AUDIODRIVER", "dummy")
    env = gymnasium.make(spec.gym_id, render_mode=render_mode, **kwargs)
    env.unwrapped.screen_dim = render_size  # the frame size render() draws at (500 by default)
    return env

