"""Closed-loop execution: plan, validate, run each sub-goal's skill, check it, replan on failure.

Nothing reaches a skill unless it passes the grounding gate (`require_grounded`) and the symbolic
validator on the live world; a failed or timed-out skill, an invalid plan, or a back-end fault sends
the planner back with the failure in its prompt, up to `max_replans`. Every plan (prompt, candidates,
scores, chosen sub-goals) and every outcome is one JSON line in the trace, and episode metrics go to
wandb when a run is given.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

from embodied.logging import to_jsonable
from planners import symbolic as sym
from planners.backends.base import BackendError, BackendUnsupported
from planners.base import LLMUsage, PlanRefusal, SubGoal, World
from planners.grounding import UngroundedSubGoal, require_grounded
from planners.search import Goal, satisfied
from planners.skills import SkillLibrary
from planners.validator import UNGROUNDED, validate

FAILURES = ("ungrounded_output", "invalid_precondition", "skill_failure", "backend_error")


class Trace:
    """Append-only JSONL trace (flushed per line) plus an optional wandb run for episode metrics."""

    def __init__(self, path: str | Path | None = None, wandb_run=None):
        self.path = Path(path) if path else None
        self.wandb = wandb_run
        self.events: list[dict] = []
        if self.path:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._fh = self.path.open("a", encoding="utf-8")
        else:
            self._fh = None

    def write(self, event: str, **data) -> dict:
        record = to_jsonable({"event": event, "time": time.time(), **data})
        self.events.append(record)
        if self._fh:
            self._fh.write(json.dumps(record) + "\n")
            self._fh.flush()
        return record

    def log_metrics(self, metrics: dict, step: int) -> None:
        if self.wandb is not None:
            self.wandb.log({k: v for k, v in metrics.items() if isinstance(v, (int, float, bool))}, step=step)

    def close(self) -> None:
        """Flush the JSONL file; with a wandb run, also log the whole trace as a table (one row per event)."""
        if self.wandb is not None and self.events:
            import wandb

            table = wandb.Table(columns=["event", "task", "record"])
            for e in self.events:
                table.add_data(e["event"], str(e.get("task", "")), json.dumps(e))
            self.wandb.log({"trace": table})
            self.events_logged = len(self.events)
        if self._fh:
            self._fh.close()
            self._fh = None


@dataclass
class EpisodeResult:
    success: bool
    refused: str | None = None
    replans: int = 0
    plans: int = 0
    subgoals_proposed: int = 0
    subgoals_valid: int = 0  # proposed sub-goals that were grounded and passed the symbolic validator
    subgoals_executable: int = 0  # passed the live gate and were handed to a skill
    subgoals_succeeded: int = 0
    ungrounded_reached_skill: int = 0  # must stay 0: counted by an independent check at the skill call
    failures: dict = field(default_factory=lambda: {k: 0 for k in FAILURES})
    usage: LLMUsage = field(default_factory=LLMUsage)
    env_steps: int = 0
    wall_s: float = 0.0

    def to_json(self) -> dict:
        d = dict(self.__dict__)
        d["usage"] = self.usage.to_json()
        return d


@dataclass
class ExecutorConfig:
    max_replans: int = 3
    max_plans: int = 6  # hard cap on planner calls per episode (replans + re-plans after completed plans)
    seed: int = 0


def run_skill(env, library: SkillLibrary, subgoal: SubGoal, obs, info, seed: int = 0):
    """Drive one skill's policy until it says done or its step budget runs out; returns obs, info, steps."""
    skill = library.get(subgoal.skill)
    policy = skill.policy(env, subgoal, seed=seed)
    policy.reset(obs, info)
    steps = 0
    for steps in range(1, skill.max_steps + 1):
        action = policy.act(obs, info)
        obs, _, _, _, info = env.step(action)
        if policy.done:
            break
    return obs, info, steps


class Executor:
    def __init__(self, planner, library: SkillLibrary, world_fn, config: ExecutorConfig | None = None,
                 trace: Trace | None = None):
        """world_fn(env) -> World: how to see the scene (planners.sim.world_from_env for the sims)."""
        self.planner, self.library, self.world_fn = planner, library, world_fn
        self.config = config or ExecutorConfig()
        self.trace = trace or Trace()

    def run(self, env, instruction: str, obs, info, goals: list[Goal] | None = None, task_id: str = "") -> EpisodeResult:
        t0 = time.perf_counter()
        res = EpisodeResult(success=False)
        feedback = None
        self.trace.write("episode_start", task=task_id, instruction=instruction, planner=self.planner.name,
                         goals=[a if w else f"not {a}" for a, w in (goals or [])])
        while res.plans < self.config.max_plans:
            world = self.world_fn(env)
            if goals is not None and satisfied(sym.atoms(world), goals) and res.plans > 0:
                res.success = True
                break
            res.plans += 1
            try:
                plan = self.planner.plan(instruction, world, feedback)
            except PlanRefusal as err:
                res.refused = str(err)
                self.trace.write("refusal", task=task_id, reason=str(err))
                break
            except (BackendError, BackendUnsupported) as err:
                res.failures["backend_error"] += 1
                self.trace.write("backend_error", task=task_id, error=str(err))
                # a missing server feature does not come back on a retry: stop instead of replanning
                if isinstance(err, BackendUnsupported) or not self._replan(res):
                    break
                feedback = "the language model did not answer"
                continue
            res.usage.add(plan.usage)
            res.subgoals_proposed += len(plan.subgoals) + len(plan.ungrounded)
            res.failures["ungrounded_output"] += len(plan.ungrounded)
            self.trace.write("plan", task=task_id, attempt=res.plans, feedback=feedback, **plan.to_json())
            if not plan.subgoals:
                res.refused = plan.refusal or "empty plan"
                if plan.ungrounded and self._replan(res):
                    feedback = f"these steps match no skill: {'; '.join(plan.ungrounded[:3])}"
                    continue
                break
            verdict = validate(world, plan.subgoals, self.library)
            runnable = plan.subgoals
            if not verdict.ok:
                # the valid prefix still runs; the invalid step and everything after it is replanned
                key = "ungrounded_output" if verdict.category == UNGROUNDED else "invalid_precondition"
                res.failures[key] += 1
                invalid = verdict.message(plan.subgoals)
                self.trace.write("invalid_plan", task=task_id, category=verdict.category, reason=invalid,
                                 runnable_prefix=verdict.index)
                runnable = plan.subgoals[: verdict.index]
            res.subgoals_valid += len(runnable)
            feedback, obs, info = self._execute(env, runnable, res, obs, info, task_id)
            if feedback is None and not verdict.ok:
                feedback = invalid
            if feedback is None:
                world = self.world_fn(env)
                if goals is None or satisfied(sym.atoms(world), goals):
                    res.success = True
                    break
                unmet = [a if w else f"not {a}" for a, w in goals if (a in sym.atoms(world)) != w]
                feedback = f"the plan finished but these still do not hold: {', '.join(unmet)}"
            if not self._replan(res):
                break
        if goals is not None and not res.success:
            res.success = satisfied(sym.atoms(self.world_fn(env)), goals)
        res.wall_s = time.perf_counter() - t0
        self.trace.write("episode_end", task=task_id, **res.to_json(), env_success=bool(info.get("success", False)))
        return res

    def _replan(self, res: EpisodeResult) -> bool:
        if res.replans >= self.config.max_replans:
            return False
        res.replans += 1
        return True

    def _execute(self, env, plan: list[SubGoal], res: EpisodeResult, obs, info, task_id: str):
        """Run sub-goals in order; returns (failure feedback or None, obs, info)."""
        for index, goal in enumerate(plan):
            world = self.world_fn(env)
            try:
                require_grounded(goal, world, self.library)
            except UngroundedSubGoal as err:
                res.failures["ungrounded_output"] += 1
                return str(err), obs, info
            state = sym.atoms(world)
            reason = self.library.get(goal.skill).check(state, goal.args)
            if reason:
                res.failures["invalid_precondition"] += 1
                self.trace.write("precondition_failed", task=task_id, subgoal=goal.key, reason=reason)
                return f"{goal.text}: {reason}", obs, info
            # success atoms are recomputed on the live state (the plan was made on a predicted one)
            goal = self.library.make_subgoal(world, goal.skill, goal.args, state)
            res.subgoals_executable += 1
            if not _independently_grounded(goal, world):
                res.ungrounded_reached_skill += 1
            obs, info, steps = run_skill(env, self.library, goal, obs, info, seed=self.config.seed + res.env_steps)
            res.env_steps += steps
            after = self.world_fn(env)
            ok = self.library.get(goal.skill).succeeded(after, goal)
            self.trace.write("subgoal", task=task_id, index=index, subgoal=goal.to_json(), steps=steps, success=ok,
                             atoms_after=sorted(sym.atoms(after)))
            if not ok:
                res.failures["skill_failure"] += 1
                return f"the step '{goal.text}' failed after {steps} steps", obs, info
            res.subgoals_succeeded += 1
        return None, obs, info


def _independently_grounded(goal: SubGoal, world: World) -> bool:
    """A second, minimal check at the skill call: every argument is an object id of this scene."""
    ids = set(world.ids())
    return bool(goal.args) and all(a in ids for a in goal.args)
