import numpy as np
import pytest

import policies
import sims
from planners.executor import run_skill
from planners.learned_skill import goal_dim, goal_vector, learned_skill
from planners.sim import oracle_skills, world_from_env
from planners.skills import SkillLibrary

pytestmark = pytest.mark.slow  # trains and runs a policy as a skill


def test_a_saved_goal_conditioned_checkpoint_registers_and_runs_as_a_skill(tmp_path):
    env = sims.make("cube-single", task_id=1, seed=0)
    obs, info = env.reset(seed=0)
    oracle = oracle_skills(env)
    names = oracle.names()
    obs_dim = env.observation_space["observation.state"].shape[0]
    policies.make("gaussian", obs_dim=obs_dim + goal_dim(names), act_dim=5, hidden=(32,)).save(tmp_path / "pick")
    policy = policies.load(tmp_path / "pick")  # any registered policy loads by directory alone
    lib = SkillLibrary([learned_skill(oracle.get("pick"), policy, names, world_from_env, max_steps=15)]
                       + [s for s in oracle if s.name != "pick"])
    goal = lib.make_subgoal(world_from_env(env), "pick", ("cube_0",))
    vec = goal_vector(goal, names)
    assert vec[names.index("pick")] == 1.0 and np.allclose(vec[len(names):len(names) + 3], goal.goal["target_pos_m"][0])
    before = np.asarray(info["proprio/effector_pos"]).copy()
    obs, info, steps = run_skill(env, lib, goal, obs, info)
    assert steps == 15  # an untrained policy does not grasp: the real detector keeps it running to its budget
    assert not lib.get("pick").succeeded(world_from_env(env), goal)
    assert not np.allclose(info["proprio/effector_pos"], before)  # but its actions did move the arm
