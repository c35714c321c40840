"""One definition of the sub-goal predicates (`sims.predicates`), and its three users agree.

On states set at and around every tolerance, these give the same truths: OGBench's own success test
(`_compute_successes`), the scene (`Scene.truths`, which the env's reward and the planners read),
the dataset labels (`task_truths` for generated data, `ogbench_npz.subgoal_truths` for OGBench's
files) and the planners' symbolic atoms computed from poses alone (a scene without truths)."""
from pathlib import Path

import mujoco
import numpy as np
import pytest

import sims
from embodied.data import ogbench_npz
from planners import symbolic
from planners.base import World
from sims import predicates
from sims.manip_scene import task_subgoals, task_truths
from sims.scene import Scene

pytestmark = [pytest.mark.filterwarnings("ignore:.*precision lowered"),
              pytest.mark.filterwarnings("ignore:.*Box observation space m")]


def _ogbench(base, kind) -> list[bool]:
    out = base._compute_successes()
    if kind == "scene":
        cubes, buttons, drawer, window = out
        out = list(cubes) + list(buttons) + [drawer, window]
    return [bool(v) for v in out]


def _set_cube(base, i, pos) -> None:
    base._data.joint(f"object_joint_{i}").qpos[:3] = pos
    mujoco.mj_forward(base._model, base._data)


def _geometric_atoms(env) -> frozenset[str]:
    """The planners' atoms from poses only: the scene without its truths, the cube targets as places."""
    scene = env.get_wrapper_attr("scene")()
    places = tuple(o for o in scene.objects if o.kind == "target")
    return symbolic.atoms(World(Scene(scene.objects, scene.gripper, {}), places))


def _labels_agree(env, kind, states) -> None:
    """For every state set by `states()` (a generator that sets one, then yields): OGBench == scene ==
    task_truths; then ogbench_npz's vectorised labels of all of them == OGBench's."""
    base = env.unwrapped
    task_id = env.get_wrapper_attr("task_id")()
    suite = env.get_wrapper_attr("suite")
    preds = task_subgoals(base, kind)
    qpos, buttons, expected = [], [], []
    for _ in states():
        truth = _ogbench(base, kind)
        scene = env.get_wrapper_attr("scene")()
        assert [scene.holds(p) for p in preds] == truth
        assert [bool(v) for v in task_truths(base, kind, base.task_infos[task_id - 1])] == truth
        qpos.append(base._data.qpos.copy())
        buttons.append(np.asarray(getattr(base, "_cur_button_states", ())).reshape(-1).copy())
        expected.append(truth)
    arrays = {"qpos": np.asarray(qpos), "button_states": np.asarray(buttons)}
    npz = ogbench_npz.subgoal_truths(arrays, np.arange(len(qpos)), suite, task_id, Path("x.npz"))
    np.testing.assert_array_equal(npz, np.asarray(expected))


@pytest.mark.slow
def test_at_and_on_agree_across_users_around_the_tolerances():
    env = sims.make("cube-double", task_id=5, seed=0)  # task 5 stacks blue (cube_1) on red (cube_0)
    env.reset(seed=0)
    base = env.unwrapped
    target = [np.asarray(base._data.mocap_pos[base._cube_target_mocap_ids[i]], float) for i in range(2)]
    assert predicates.on(target[1], target[0])  # OGBench's stack target: one cube size up

    def states():
        for d_at in (0.0, 0.0399, 0.0401):  # the red cube near its target, along x
            for dxy in (0.0, 0.0199, 0.0201, 0.025):  # the blue cube's offset from the red one, along y
                for dz in (0.0299, 0.0301, 0.04, 0.0499, 0.0501, 0.055):
                    red = target[0] + np.array([d_at, 0.0, 0.0])
                    blue = red + np.array([0.0, dxy, dz])
                    _set_cube(base, 0, red)
                    _set_cube(base, 1, blue)
                    on = dxy <= predicates.STACK_XY_TOL_M and predicates.STACK_DZ_MIN_M <= dz <= predicates.STACK_DZ_MAX_M
                    scene = env.get_wrapper_attr("scene")()
                    atoms = _geometric_atoms(env)
                    assert scene.holds("on(cube_1,cube_0)") == ("on(cube_1,cube_0)" in atoms) == on
                    assert not scene.holds("on(cube_0,cube_1)") and "on(cube_0,cube_1)" not in atoms
                    for i in range(2):
                        key = f"at(cube_{i},target_{i})"
                        assert scene.holds(key) == (key in atoms)
                    assert scene.holds("at(cube_0,target_0)") == (d_at <= predicates.AT_TOL_M)
                    yield

    _labels_agree(env, "cube", states)
    env.close()


@pytest.mark.slow
@pytest.mark.parametrize("task_id", [1, 2, 4])  # open both / lock both / cube in the closed drawer
def test_drawer_window_and_buttons_agree_across_users(task_id):
    env = sims.make("scene", task_id=task_id, seed=0)
    env.reset(seed=0)
    base = env.unwrapped

    def states():
        for drawer, window, buttons in ((0.0, 0.0, (0, 0)), (-0.0399, 0.0399, (1, 0)), (-0.0401, 0.0401, (0, 1)),
                                        (-0.1199, 0.1601, (1, 1)), (-0.1201, 0.1599, (1, 1)), (-0.16, 0.2, (0, 0))):
            base._data.joint("drawer_slide").qpos[0] = drawer
            base._data.joint("window_slide").qpos[0] = window
            base._cur_button_states[:] = buttons
            mujoco.mj_forward(base._model, base._data)
            scene = env.get_wrapper_attr("scene")()
            for what, pos in (("drawer", drawer), ("window", window)):
                assert scene.holds(f"open({what})") == predicates.is_open(what, pos)
                assert scene.holds(f"closed({what})") == predicates.is_closed(what, pos)
                assert scene.object(what).state["open"] == (f"open({what})" in _geometric_atoms(env))
            yield

    _labels_agree(env, "scene", states)
    env.close()


@pytest.mark.slow
def test_puzzle_buttons_agree_across_users():
    env = sims.make("puzzle-3x3", seed=0)
    env.reset(seed=0)
    base = env.unwrapped
    rng = np.random.default_rng(0)

    def states():
        for _ in range(6):
            base._cur_button_states[:] = rng.integers(0, 2, len(base._cur_button_states))
            yield

    _labels_agree(env, "puzzle", states)
    env.close()
