import json

import numpy as np
import pytest

import sims
from planners.backends.rule import RulePlanner
from planners.executor import Executor, ExecutorConfig, Trace
from planners.sim import oracle_skills, world_from_env

pytestmark = pytest.mark.slow  # full plan-execute episodes on the MuJoCo scene


class FreezeOnce:
    """Injected fault: the first run of the wrapped skill sends zero actions (the arm stays put),
    so the skill's real success detector must report the failure."""

    def __init__(self, factory):
        self.factory, self.calls = factory, 0

    def __call__(self, env, subgoal, seed=0):
        self.calls += 1
        policy = self.factory(env, subgoal, seed=seed)
        if self.calls > 1:
            return policy
        policy.act = lambda obs, info: (setattr(policy, "done", False), np.zeros(5, np.float32))[1]
        return policy


def test_replans_after_an_injected_skill_failure_and_records_the_trace(tmp_path):
    env = sims.make("cube-single", task_id=1, seed=0, max_episode_steps=5000)
    obs, info = env.reset(seed=0)
    lib = oracle_skills(env)
    pick = lib.get("pick")
    pick.policy = FreezeOnce(pick.policy)
    pick.max_steps = 20
    trace = Trace(tmp_path / "trace.jsonl")
    executor = Executor(RulePlanner(lib), lib, world_from_env, ExecutorConfig(max_replans=2), trace)
    res = executor.run(env, "put the red cube on the left of the table", obs, info,
                       goals=[("at(cube_0,target_0)", True)], task_id="t")
    trace.close()
    assert res.success and res.replans == 1 and res.failures["skill_failure"] == 1
    assert res.subgoals_succeeded == 2 and res.ungrounded_reached_skill == 0
    events = [json.loads(line) for line in (tmp_path / "trace.jsonl").read_text().splitlines()]
    kinds = [e["event"] for e in events]
    assert kinds == ["episode_start", "plan", "subgoal", "plan", "subgoal", "subgoal", "episode_end"]
    assert events[2]["success"] is False and events[2]["steps"] == 20
    assert "failed" in events[3]["feedback"] and events[3]["candidates"]
    assert events[-1]["env_success"] is True  # the sim's own success test agrees
    pos = np.asarray(world_from_env(env).object("cube_0").pos_m)
    assert np.linalg.norm(pos[:2] - np.array([0.425, -0.1])) < 0.04


def test_invalid_plan_never_reaches_a_skill():
    env = sims.make("scene", task_id=4, seed=0)
    obs, info = env.reset(seed=0)
    lib = oracle_skills(env)
    calls = []
    for skill in lib:
        factory = skill.policy
        skill.policy = lambda e, g, seed=0, f=factory: (calls.append(g.key), f(e, g, seed=seed))[1]

    class BadPlanner:
        name = "bad"

        def plan(self, instruction, world, feedback=None):
            from planners.base import PlanResult, SubGoal

            return PlanResult([SubGoal("place_in", ("cube_0", "drawer")), SubGoal("pick", ("purple_sphere",))])

    res = Executor(BadPlanner(), lib, world_from_env, ExecutorConfig(max_replans=1)).run(env, "x", obs, info)
    assert calls == [] and res.subgoals_executable == 0
    assert res.failures["invalid_precondition"] == 2 and not res.success


def test_trace_goes_to_wandb_as_a_table(tmp_path):
    import wandb

    env = sims.make("cube-single", task_id=1, seed=0)
    obs, info = env.reset(seed=0)
    lib = oracle_skills(env)
    run = wandb.init(project="embodied-planners-test", mode="offline", dir=str(tmp_path))
    trace = Trace(tmp_path / "t.jsonl", run)
    res = Executor(RulePlanner(lib), lib, world_from_env, trace=trace).run(
        env, "put the red cube on the left of the table", obs, info, goals=[("at(cube_0,target_0)", True)])
    trace.log_metrics({"task_success": res.success}, step=0)
    trace.close()
    run.finish()
    tables = list(tmp_path.glob("wandb/offline-run-*/files/media/table/trace_*.table.json"))
    assert res.success and len(tables) == 1
    rows = json.loads(tables[0].read_text())["data"]
    assert [r[0] for r in rows] == [e["event"] for e in trace.events]
    assert (tmp_path / "t.jsonl").read_text().count("\n") == len(rows)
