"""OGBench manipulation tasks: contract, sparse reward and success, scene introspection, language,
images, goal-conditioned variants, and the errors a user sees."""
import ctypes.util
import os
import subprocess
import sys

import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import sims
from embodied.errors import UserError
from sims.manip import MANIP_NAMES, SUITES
from sims.scene import Predicate, Scene, SceneObject

pytestmark = [pytest.mark.slow,  # MuJoCo manipulation scenes, seconds each
              pytest.mark.filterwarnings("ignore:.*precision lowered"),
              pytest.mark.filterwarnings("ignore:.*different from the unwrapped version"),
              pytest.mark.filterwarnings("ignore:.*Box observation space m")]


@pytest.fixture(scope="module")
def cube_double():
    env = sims.make("cube-double", task_id=5, seed=0)  # task 5 stacks blue on red
    yield env
    env.close()


def _oracle_rollout(env, steps):
    """Drive a task env with the OGBench oracles (via the dataset generator's task expert)."""
    from embodied.data.ogbench_gen import GenSpec, TaskOracle

    oracle = TaskOracle(env, SUITES[env.get_wrapper_attr("suite").name].kind, GenSpec("cube-single", "task").resolved())
    obs, info = env.reset(seed=3)
    yield obs, None, False, False, info
    for _ in range(steps):
        obs, reward, terminated, truncated, info = env.step(np.clip(oracle(obs["observation.state"], info), -1, 1))
        yield obs, reward, terminated, truncated, info
        if terminated or truncated:
            return


def test_every_manip_task_is_registered():
    assert set(MANIP_NAMES) <= set(sims.names())
    assert {"cube-single", "cube-double", "scene", "puzzle-3x3", "cube-single-goal"} <= set(MANIP_NAMES)
    # check_env for every name sims.make knows (these included) runs in test_sims_registry.py


def test_check_env_with_images_and_language():
    env = sims.make("cube-single", images=("front",), image_size=32, language=True)
    check_env(env, skip_render_check=True)
    obs, _ = env.reset(seed=0)
    assert set(obs) == {"observation.state", "observation.images.front", "task"}
    frame = obs["observation.images.front"]
    assert frame.shape == (32, 32, 3) and frame.dtype == np.uint8 and frame.std() > 0
    assert env.unwrapped.model.vis.quality.shadowsize == 0
    assert isinstance(obs["task"], str) and "red cube" in obs["task"]
    env.close()


def test_skip_next_frames_leaves_out_one_observations_frames_and_nothing_else():
    env = sims.make("cube-single", images=("front",), image_size=32, language=True)
    twin = sims.make("cube-single", images=("front",), image_size=32, language=True)
    obs, _ = env.reset(seed=3)
    twin.reset(seed=3)
    action = np.full(5, 0.3, np.float32)
    sims.skip_next_frames(env)
    skipped, *_ = env.step(action)
    full, *_ = twin.step(action)
    assert set(skipped) == {"observation.state", "task"}                        # the frames only, for this step
    np.testing.assert_array_equal(skipped["observation.state"], full["observation.state"])   # physics untouched
    after, *_ = env.step(action)
    twin_after, *_ = twin.step(action)
    np.testing.assert_array_equal(after["observation.images.front"], twin_after["observation.images.front"])
    sims.skip_next_frames(env)
    assert "observation.images.front" in env.reset(seed=4)[0]                 # a reset always renders
    state_only = sims.make("cube-single")
    state_only.reset(seed=0)
    sims.skip_next_frames(state_only)                                          # no frames: a no-op
    assert set(state_only.step(action)[0]) == {"observation.state"}
    for e in (env, twin, state_only):
        e.close()


def test_a_chunked_env_without_mid_chunk_frames_renders_only_the_chunks_last_observation():
    kwargs = dict(images=("front",), image_size=32, language=True, execute_horizon=3)
    env = sims.make("cube-single", mid_chunk_frames=False, **kwargs)
    twin = sims.make("cube-single", **kwargs)
    env.reset(seed=5)
    twin.reset(seed=5)
    chunk = np.full((3, 5), 0.2, np.float32)
    obs, reward, *_, info = env.step(chunk)
    twin_obs, twin_reward, *_, twin_info = twin.step(chunk)
    seen = [set(o) for o in info["chunk"]["next_observations"]]
    assert seen[:2] == [{"observation.state", "task"}] * 2 and "observation.images.front" in seen[2]
    assert all("observation.images.front" in o for o in twin_info["chunk"]["next_observations"])
    np.testing.assert_array_equal(obs["observation.images.front"], twin_obs["observation.images.front"])
    np.testing.assert_array_equal(obs["observation.state"], twin_obs["observation.state"])
    assert reward == twin_reward
    env.close()
    twin.close()


def test_sparse_reward_success_and_scene_agree_along_an_oracle_episode():
    env = sims.make("cube-single", seed=0)
    preds = env.get_wrapper_attr("subgoals")()
    assert [str(p) for p in preds] == ["at(cube_0,target_0)"]
    seen_success = False
    for obs, reward, terminated, truncated, info in _oracle_rollout(env, 200):
        scene = env.get_wrapper_attr("scene")()
        truths = [scene.holds(p) for p in preds]
        assert truths == list(info["subgoals"])  # the scene and the reward read the same state
        if reward is not None:
            assert reward == float(sum(truths) - len(truths))
            assert terminated == info["success"] == all(truths)
        seen_success |= info["success"]
    assert seen_success and terminated  # the oracle solved it and the episode ended there
    env.close()


def test_scene_objects_and_predicates(cube_double):
    cube_double.reset(seed=0)
    scene = cube_double.get_wrapper_attr("scene")()
    assert scene.ids() == ["cube_0", "target_0", "cube_1", "target_1"]
    red = scene.object("cube_0")
    assert red.name == "red cube" and red.color == "red" and red.kind == "cube" and len(red.quat_wxyz) == 4
    assert scene.object("cube_1").color == "blue"
    assert 0.0 < red.pos_m[2] < 0.05  # resting on the table
    assert scene.gripper["holding"] is None and 0.0 <= scene.gripper["opening"] <= 1.0
    assert scene.holds(Predicate("on", ("cube_0", "cube_1"))) is False
    with pytest.raises(UserError, match="cube_0, target_0"):
        scene.object("cube_9")
    with pytest.raises(UserError, match="unknown predicate"):
        scene.holds(Predicate("flying", ("cube_0",)))


def test_stack_task_language_and_paraphrases(cube_double):
    cube_double.reset(seed=0)
    describe = cube_double.get_wrapper_attr("describe")
    stack = describe("at(cube_1,target_1)")
    assert stack == "put the blue cube on the red one"
    texts = {describe(Predicate("at", ("cube_1", "target_1")), np.random.default_rng(s)) for s in range(20)}
    assert len(texts) >= 3 and all("blue" in t and "red" in t for t in texts)
    instruction = cube_double.get_wrapper_attr("instruction")
    assert instruction() == instruction()  # no rng: the canonical wording
    assert len({instruction(np.random.default_rng(s)) for s in range(20)}) >= 3
    with pytest.raises(UserError):
        describe("at(cube_7,target_7)")


def test_scene_task_drawer_window_and_locks():
    env = sims.make("scene", task_id=4)  # put the cube in the drawer, drawer unlocked, closed
    obs, info = env.reset(seed=0)
    preds = [str(p) for p in env.get_wrapper_attr("subgoals")()]
    assert preds == ["at(cube_0,target_0)", "unlocked(drawer)", "locked(window)", "closed(drawer)", "closed(window)"]
    scene = env.get_wrapper_attr("scene")()
    assert {"drawer", "window", "button_0", "button_1"} <= set(scene.ids())
    assert scene.object("drawer").state["locked"] is True and scene.holds("closed(drawer)")
    assert list(info["subgoals"]) == [scene.holds(p) for p in preds]
    text = env.get_wrapper_attr("instruction")()
    assert "in the drawer" in text and "unlock the drawer" in text
    env.close()


def test_puzzle_buttons_and_instruction():
    env = sims.make("puzzle-3x3")
    env.reset(seed=0)
    scene = env.get_wrapper_attr("scene")()
    assert len(scene.ids()) == 9 and scene.object("button_4").name == "center button"
    preds = env.get_wrapper_attr("subgoals")()
    assert len(preds) == 9 and all(p.name in ("blue", "red") for p in preds)
    assert "button" in env.get_wrapper_attr("instruction")()
    env.close()


def test_goal_conditioned_variant_samples_tasks_reproducibly():
    env = sims.make("cube-single-goal")
    assert sims.spec("cube-single-goal").obs_dim == 2 * sims.spec("cube-single").obs_dim
    first = env.reset(seed=5)
    again = env.reset(seed=5)
    np.testing.assert_array_equal(first[0]["observation.state"], again[0]["observation.state"])
    assert first[1]["task_id"] == again[1]["task_id"]
    tasks = {env.reset(seed=s)[1]["task_id"] for s in range(12)}
    assert len(tasks) >= 3
    obs, info = env.reset(options={"task_id": 4})
    assert info["task_id"] == 4
    goal = obs["observation.state"][28:]
    assert np.abs(goal).sum() > 0  # the goal observation is part of the state
    with pytest.raises(UserError, match="1..5"):
        env.reset(options={"task_id": 9})
    env.close()


def test_bad_options_are_user_errors():
    with pytest.raises(UserError, match="1..5"):
        sims.make("cube-single", task_id=7)
    with pytest.raises(UserError, match="unknown option"):
        sims.make("cube-single", colour="red")
    with pytest.raises(UserError, match="front"):
        sims.make("cube-single", images=("top",))
    with pytest.raises(UserError) as err:
        sims.make("cube-singel")
    assert "cube-single" in str(err.value) and "puzzle-3x3" in str(err.value) and "hopper" in str(err.value)


def test_predicate_text_round_trip():
    pred = Predicate("on", ("cube_0", "cube_1"))
    assert str(pred) == "on(cube_0,cube_1)"
    assert Predicate.parse(" on( cube_0 , cube_1 ) ") == pred
    assert Predicate.parse("open(drawer)") == Predicate("open", ("drawer",))
    for bad in ("on cube_0", "on(cube 0)", "(x)", "", "on(a,,b)"):
        with pytest.raises(UserError):
            Predicate.parse(bad)
    scene = Scene(objects=(SceneObject("a", "a", "cube", None, (0, 0, 0), None, {}),), gripper={}, truths={"p(a)": True})
    assert scene.holds("p(a)") and scene.true_predicates() == [Predicate("p", ("a",))]


@pytest.mark.skipif(ctypes.util.find_library("OSMesa") is not None, reason="OSMesa is installed here")
def test_render_without_gl_backend_says_how_to_install_one():
    code = ("import sims\n"
            "from embodied.errors import UserError\n"
            "try:\n    sims.make('cube-single', images=('front',))\n"
            "except UserError as err:\n    print('USERERROR', err)\n")
    env = {**os.environ, "MUJOCO_GL": "osmesa", "PYOPENGL_PLATFORM": "osmesa"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert "USERERROR" in out.stdout, out.stderr[-2000:]
    assert "apt-get install libosmesa6" in out.stdout and "MUJOCO_GL=egl" in out.stdout
