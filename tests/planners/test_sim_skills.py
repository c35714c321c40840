import pytest

import sims
from planners import symbolic as sym
from planners.executor import run_skill
from planners.sim import oracle_skills, world_from_env

pytestmark = pytest.mark.slow  # oracle skills driving the MuJoCo arm


def run_plan(env, obs, info, keys):
    lib = oracle_skills(env)
    for key in keys:
        name, args = key[:-1].split("(")
        world = world_from_env(env)
        goal = lib.make_subgoal(world, name, args.split(","))
        obs, info, steps = run_skill(env, lib, goal, obs, info)
        assert lib.get(name).succeeded(world_from_env(env), goal), (key, steps, sorted(sym.atoms(world_from_env(env))))
    return info


def test_oracle_skills_put_the_cube_in_the_drawer_and_close_it():
    env = sims.make("scene", task_id=4, seed=0)
    obs, info = env.reset(seed=0)
    info = run_plan(env, obs, info, ["press(button_0)", "open(drawer)", "pick(cube_0)", "place_in(cube_0,drawer)",
                                     "close(drawer)"])
    atoms = sym.atoms(world_from_env(env))
    assert {"in(cube_0,drawer)", "closed(drawer)", "unlocked(drawer)"} <= atoms
    assert info["subgoals"][0]  # OGBench's own test: the cube is at its target inside the drawer


def test_oracle_skills_stack_and_window():
    env = sims.make("cube-double", task_id=5, seed=0)
    obs, info = env.reset(seed=0)
    run_plan(env, obs, info, ["pick(cube_1)", "place_on(cube_1,cube_0)"])
    assert "on(cube_1,cube_0)" in sym.atoms(world_from_env(env))
    env = sims.make("scene", task_id=1, seed=0)
    obs, info = env.reset(seed=0)
    run_plan(env, obs, info, ["open(window)", "press(button_1)"])
    assert {"open(window)", "locked(window)"} <= sym.atoms(world_from_env(env))


def test_pick_next_to_the_open_drawer_turns_the_fingers_clear_of_it():
    """OGBench scene task 2 starts with the cube 1-2 cm in front of the open drawer: the oracle's
    nearest grasp yaw puts a finger on the drawer front; the skill turns the fingers along x first."""
    env = sims.make("scene-goal")
    obs, info = env.reset(seed=1, options={"task_id": 2})
    run_plan(env, obs, info, ["pick(cube_0)"])
    assert "holding(cube_0)" in sym.atoms(world_from_env(env))


def test_the_effector_yaw_turns_against_the_wrist_joint_as_wrist_safe_turn_assumes():
    import numpy as np

    env = sims.make("scene-goal")
    env.reset(seed=0)
    before = env.unwrapped.compute_ob_info()
    for _ in range(8):
        env.step(np.array([0, 0, 0, 1, -1], np.float32))  # turn the yaw up
    after = env.unwrapped.compute_ob_info()
    d_yaw = float(np.angle(np.exp(1j * (after["proprio/effector_yaw"][0] - before["proprio/effector_yaw"][0]))))
    d_wrist = float(after["proprio/joint_pos"][5] - before["proprio/joint_pos"][5])
    assert d_yaw > 0.1 and abs(d_yaw + d_wrist) < 0.1 * abs(d_yaw), (d_yaw, d_wrist)


def test_wrist_safe_turn_takes_the_nearest_symmetric_yaw_unless_the_wrist_would_leave_its_range():
    import numpy as np

    from planners.sim import wrist_safe_turn

    assert np.isclose(wrist_safe_turn(0.0, 0.0, 0.5), 0.5)
    assert np.isclose(wrist_safe_turn(0.0, 0.0, 0.5 + np.pi), 0.5)  # the fingers are symmetric under pi
    assert np.isclose(wrist_safe_turn(3.0, 0.0, -3.0), 2 * np.pi - 6.0)  # across the +-pi seam, not the long way
    # turning yaw up by 0.5 moves wrist_3 down by 0.5: from -6.0 that leaves the range, so turn the other way
    assert np.isclose(wrist_safe_turn(0.0, -6.0, 0.5), 0.5 - np.pi)
    assert np.isclose(wrist_safe_turn(0.0, 6.0, -0.5), np.pi - 0.5)


@pytest.mark.parametrize("task_id,skill,arg", [(1, "open", "drawer"), (1, "open", "window"), (2, "pick", "cube_0")])
def test_the_skills_lead_in_is_a_function_of_the_state_so_a_cloned_policy_can_learn_it(task_id, skill, arg):
    """Mid-skill, a fresh oracle policy on the same sim state gives the same action as the one that got
    there: no hidden phase or remembered target (the learned slides failed on exactly that)."""
    import numpy as np

    env = sims.make("scene-goal")
    obs, info = env.reset(seed=3, options={"task_id": task_id})
    lib = oracle_skills(env)
    goal = lib.make_subgoal(world_from_env(env), skill, (arg,))
    running = lib.get(skill).policy(env, goal, seed=0)
    running.reset(obs, info)
    compared = 0
    for t in range(60):
        if t % 3 == 0:
            fresh = lib.get(skill).policy(env, goal, seed=1)
            fresh.reset(obs, info)
            expected = running.act(obs, info)
            np.testing.assert_allclose(fresh.act(obs, info), expected, atol=1e-6, err_msg=f"step {t}")
            compared += 1
        else:
            expected = running.act(obs, info)
        obs, _, _, _, info = env.step(expected)
        if running.done:
            break
    assert compared >= 5
