"""Learned skills: a goal-conditioned checkpoint from `policies/` registered like the oracles.

The policy sees `concat(observation.state, goal vector)`; the goal vector encodes the sub-goal as a
one-hot over the library's skill names followed by the target positions of its arguments (3 floats
per argument slot, zero-padded), which is exactly what `SubGoal.goal` carries. A language-conditioned
policy gets the observation dict with `task` set to the sub-goal's text instead.
"""
from __future__ import annotations

import numpy as np

from embodied.constants import STATE_KEY
from embodied.errors import UserError
from planners.base import SubGoal
from planners.skills import Skill

MAX_ARGS = 2


def goal_vector(subgoal: SubGoal, skill_names: list[str]) -> np.ndarray:
    """One-hot skill + target_pos_m of each argument (MAX_ARGS x 3), float32."""
    if subgoal.skill not in skill_names:
        raise UserError(f"skill {subgoal.skill!r} is not in the goal encoding's skill list {skill_names}")
    onehot = np.zeros(len(skill_names), np.float32)
    onehot[skill_names.index(subgoal.skill)] = 1.0
    pos = np.zeros((MAX_ARGS, 3), np.float32)
    for i, p in enumerate(subgoal.goal.get("target_pos_m", [])[:MAX_ARGS]):
        pos[i] = p
    return np.concatenate([onehot, pos.ravel()])


def goal_dim(skill_names: list[str]) -> int:
    return len(skill_names) + 3 * MAX_ARGS


class LearnedPolicy:
    """Runs a `policies` checkpoint on one sub-goal; done when the skill's success detector fires.

    The policy reads `observation.state[:obs_dim]` (the observation without a goal-conditioned env's
    goal half, when `obs_dim` is given) followed by the goal vector, of which it keeps `columns` (all,
    when None), and runs `execute_horizon` rows of each predicted chunk before predicting again.

    `sample` (default): a generative policy draws fresh initial noise per chunk, as Diffusion Policy
    samples. Without it, the policy's `deterministic` acting uses the same noise draw on every call; that
    one draw biased every chunk the same way (the learned window `open` turned the wrist to its limit),
    and the suite solved 15.6 of 23 tasks against 20.6 sampled (benchmarks/RESULTS.md).
    """

    def __init__(self, policy, subgoal: SubGoal, skill_names: list[str], language: bool, detector,
                 obs_dim: int | None = None, columns: list[int] | None = None, sample: bool = True):
        self.policy, self.subgoal, self.language, self.detector = policy, subgoal, language, detector
        self.sample = sample
        self.goal = None if language else goal_vector(subgoal, skill_names)
        self.obs_dim = obs_dim
        self.columns = None if columns is None else np.asarray(columns, np.int64)
        self.execute = int(getattr(policy, "execute_horizon", 0)) or None
        self.done = False
        self._chunk: list[np.ndarray] = []

    def reset(self, obs, info) -> None:
        self.done, self._chunk = False, []
        if hasattr(self.policy, "reset"):
            self.policy.reset()  # observation history of chunk policies

    def act(self, obs, info) -> np.ndarray:
        if not self._chunk:
            if self.language:
                inp = dict(obs, task=self.subgoal.text)
            else:
                state = np.asarray(obs[STATE_KEY], np.float32)[: self.obs_dim]
                inp = np.concatenate([state, self.goal])
                if self.columns is not None:
                    inp = inp[self.columns]
            self._chunk = list(np.asarray(self.policy.act(inp, deterministic=not self.sample), np.float32))[: self.execute]  # [H, A]
        action = np.clip(self._chunk.pop(0), -1.0, 1.0)
        self.done = bool(self.detector())
        return action


def learned_skill(base: Skill, policy, skill_names: list[str], world_fn=None, language: bool = False,
                  max_steps: int | None = None, obs_dim: int | None = None, detector_fn=None,
                  columns: list[int] | None = None, sample: bool = True) -> Skill:
    """A copy of `base` (same name, arguments, symbolic model) whose policy is the checkpoint.

    `detector_fn(env, subgoal) -> () -> bool` says when the skill is finished; by default, when the
    skill's success atoms hold in `world_fn(env)`.
    """

    def factory(env, subgoal, seed=0):
        detector = (detector_fn(env, subgoal) if detector_fn is not None
                    else (lambda: base.succeeded(world_fn(env), subgoal)))
        return LearnedPolicy(policy, subgoal, skill_names, language, detector, obs_dim, columns, sample)

    return Skill(base.name, base.description, base.args, base.template, base.preconditions, base.effects,
                 factory, max_steps or base.max_steps, base.affordance_fn, {**base.extra, "learned": True})


def load_learned_skills(env, directory, device: str = "cpu", sample: bool = True):
    """The sim's skill library with each skill's policy replaced by the suite's checkpoint
    (`<directory>/<suite>`, written by `python -m planners.train_skills`)."""
    import json
    from pathlib import Path

    import policies
    from planners.sim import oracle_detector, oracle_skills, suite_name

    suite = suite_name(env)
    path = Path(directory) / suite
    if not (path / "skills.json").is_file():
        raise UserError(f"no learned skills for {suite!r} under {directory}: run "
                        f"`python -m planners.train_skills --envs {suite} --out {directory}`")
    meta = json.loads((path / "skills.json").read_text())
    policy = policies.load(path, device=device)
    oracles = oracle_skills(env)
    if meta["skill_names"] != oracles.names():
        raise UserError(f"{path}/skills.json encodes skills {meta['skill_names']}, the library has "
                        f"{oracles.names()}; retrain with `python -m planners.train_skills`")
    from planners.skills import SkillLibrary

    columns = meta.get("obs_columns")  # absent in checkpoints from before stop 25: every column
    width = len(columns) if columns is not None else meta["obs_dim"] + goal_dim(meta["skill_names"])
    if getattr(policy, "obs_dim", width) != width:
        raise UserError(f"{path}: the policy reads {policy.obs_dim} inputs, skills.json's obs_columns give {width}; "
                        f"retrain with `python -m planners.train_skills`")
    return SkillLibrary(learned_skill(s, policy, meta["skill_names"], obs_dim=meta["obs_dim"],
                                      detector_fn=oracle_detector(s.policy), columns=columns, sample=sample)
                        for s in oracles)
