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


def test_train_skills_collects_oracle_demos_trains_saves_and_the_suite_runs_with_learned_skills(tmp_path):
    """A tiny learned-skill run: oracle demos -> flow BC -> checkpoint -> the planner suite with skills=learned."""
    import json

    from embodied.data.d4rl import load_hdf5
    from planners.evaluate import run_suite
    from planners.tasks import TASKS
    from planners.train_skills import SkillTrainConfig, run

    cfg = SkillTrainConfig(envs=("cube-single",), episodes=2, subgoals_per_episode=2, steps=30, batch_size=32,
                           hidden=(32, 32), threads=1)
    summary = run(cfg, tmp_path, log=lambda m: None)
    meta = json.loads((tmp_path / "cube-single" / "skills.json").read_text())
    demos = load_hdf5(tmp_path / "cube-single" / "demos.hdf5")
    names = meta["skill_names"]
    assert summary["cube-single"]["transitions"] == len(demos) == meta["transitions"] > 0
    # observation without OGBench's goal half, then the sub-goal's goal vector
    assert demos.obs_dim == meta["obs_dim"] + goal_dim(names) and meta["obs_dim"] == 28
    onehot = demos.observations[:, meta["obs_dim"]:meta["obs_dim"] + len(names)]
    assert np.all(onehot.sum(1) == 1) and set(np.flatnonzero(onehot.sum(0))) == {names.index("pick"), names.index("place_at")}
    assert meta["oracle_finished_attempted"]["pick"][1] == 2  # two start states, pick then place each
    # the demos keep every column; the policy reads all but the arm's joint velocities (obs[6:12])
    assert meta["obs_columns"] == [i for i in range(demos.obs_dim) if not 6 <= i < 12]
    assert policies.load(tmp_path / "cube-single").obs_dim == demos.obs_dim - 6

    # retraining on those demos (--demos) reads them back instead of collecting, with velocities on request
    again = tmp_path / "again"
    run(SkillTrainConfig(**{**cfg.__dict__, "joint_velocities": True}), again, log=lambda m: None, demos_dir=tmp_path)
    meta2 = json.loads((again / "cube-single" / "skills.json").read_text())
    assert meta2["transitions"] == len(demos) and meta2["obs_columns"] == list(range(demos.obs_dim))
    assert meta2["demos_from"] == str(tmp_path / "cube-single")
    assert np.array_equal(load_hdf5(again / "cube-single" / "demos.hdf5").observations, demos.observations)

    task = next(t for t in TASKS if t.id == "cs1-left")
    res = run_suite("rule", (task,), (), seed=0, skills="learned", skills_dir=tmp_path, log=lambda m: None)
    row = res["tasks"][0]
    assert res["skills"] == "learned" and not row["success"]  # 30 gradient steps do not grasp
    assert row["skill_outcomes"]["pick"][1] == row["replans"] + 1 and row["skill_outcomes"]["pick"][0] == 0
    assert res["summary"]["per_skill"]["pick"]["run"] == row["replans"] + 1
    assert res["summary"]["failed_tasks"] == {"skill": 1, "planning": 0}


def test_learned_skills_name_the_training_command_when_a_suite_has_no_checkpoint(tmp_path):
    from embodied.errors import UserError
    from planners.learned_skill import load_learned_skills

    env = sims.make("scene-goal")
    with pytest.raises(UserError, match=r"no learned skills for 'scene' .*`python -m planners.train_skills --envs scene"):
        load_learned_skills(env, tmp_path)


def test_a_learned_skill_samples_fresh_noise_per_chunk_unless_told_to_use_the_fixed_draw():
    """Sampling is the default (Diffusion Policy samples); the fixed draw biased every chunk the same way."""
    from planners.base import SubGoal
    from planners.learned_skill import LearnedPolicy

    names = ["pick", "open"]
    policy = policies.make("flow", obs_dim=3 + goal_dim(names), act_dim=2, obs_horizon=1, pred_horizon=2,
                           execute_horizon=1, denoiser="mlp", denoiser_kwargs={"hidden": (16,)})
    goal = SubGoal("pick", ("cube_0",), "pick up the red cube", ("holding(cube_0)",), {"target_pos_m": [[0.1, 0.2, 0.0]]})
    obs = {"observation.state": np.array([0.1, -0.2, 0.3], np.float32)}

    def actions(sample: bool) -> np.ndarray:
        skill = LearnedPolicy(policy, goal, names, language=False, detector=lambda: False, sample=sample)
        skill.reset(obs, {})
        return np.stack([skill.act(obs, {}) for _ in range(4)])  # one chunk row per call: 4 chunks

    fixed = actions(sample=False)
    np.testing.assert_array_equal(fixed, np.repeat(fixed[:1], 4, 0))       # the same draw every time
    sampled = actions(sample=True)
    assert len({tuple(row) for row in sampled.round(6)}) == 4              # a fresh draw every chunk
    assert LearnedPolicy(policy, goal, names, False, lambda: False).sample  # and that is the default
