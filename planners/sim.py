"""The planner's view of a `sims.make` manipulation env, and its skills as OGBench oracles.

`world_from_env(env)` turns the env's `scene()` into a `World`: the task's target markers become named
places ("the back left of the table"), a staging spot is added for rearrangements that need a free
place, and the lock buttons say what they control. `oracle_skills(env)` registers pick / place_* /
open / close / press, each driven by the scripted OGBench Markov oracle with the sub-goal's target
written into the privileged-info dict the oracle reads, so the oracle does exactly the one sub-goal.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from planners.base import SubGoal, World
from planners.skills import SkillLibrary, manipulation_skills
from sims import predicates
from sims.manip_language import region_words
from sims.predicates import DRAWER_CLOSED_M, DRAWER_OPEN_M, WINDOW_CLOSED_M, WINDOW_OPEN_M
from sims.scene import Scene, SceneObject

# free table spots per suite kind, away from every OGBench task's start and goal positions
STAGING = {"cube": (0.30, -0.15, 0.02), "scene": (0.45, 0.0, 0.02)}
LIFT_Z_M = 0.12  # pick ends with the cube this high
CLEAR_Z_M = 0.16  # skills end with the gripper above this height (out of the way)


def suite_kind(env) -> str:
    return env.get_wrapper_attr("suite").kind


def suite_name(env) -> str:
    return env.get_wrapper_attr("suite").name


def world_from_scene(scene: Scene, kind: str) -> World:
    objects, places = [], []
    for o in scene.objects:
        if o.kind != "target":
            objects.append(o)
            continue
        pos = np.asarray(o.pos_m)
        if pos[2] > 0.04:
            continue  # a target on another cube or inside the drawer: reached by place_on / place_in, not a spot
        region = f"{region_words(pos)} of the table"
        same = [t for t in scene.objects if t.kind == "target" and t.id != o.id
                and region_words(t.pos_m) == region_words(pos)]
        name = f"{region} ({o.color} target)" if same else region
        places.append(dataclasses.replace(o, name=name, state={**o.state, "aliases": [region, o.name]}))
    if kind in STAGING:
        places.append(SceneObject("staging", "staging area", "place", None, STAGING[kind], None,
                                  {"aliases": ["staging area", "free spot", "spare spot"]}))
    controls = {o.id: o.state["unlocks"] for o in objects if o.kind == "button" and "unlocks" in o.state}
    return World(Scene(tuple(objects), dict(scene.gripper), dict(scene.truths)), tuple(places), controls)


def world_from_env(env) -> World:
    return world_from_scene(env.get_wrapper_attr("scene")(), suite_kind(env))


# ---------------------------------------------------------------------------------------- policies
class _OraclePolicy:
    """Common loop: read the env's privileged info, add this sub-goal's target, ask the oracle."""

    oracle_cls = None
    oracle_kwargs: dict = {}

    def __init__(self, env, subgoal: SubGoal, seed: int = 0):
        self.env, self.base, self.subgoal = env, env.unwrapped, subgoal
        self.done = False
        self.oracle = self.oracle_cls(env=self.base, **self.oracle_kwargs)
        self.rng = np.random.default_rng(seed)

    def info(self) -> dict:
        return self.base.compute_ob_info()

    def reset(self, obs, info) -> None:
        self.done = False
        state = np.random.get_state()
        np.random.seed(int(self.rng.integers(2**31)))  # the oracles draw their retreat pose from np.random
        self.oracle.reset(obs, self.target_info(self.info()))
        np.random.set_state(state)

    clear_z_m = CLEAR_Z_M

    def act(self, obs, info) -> np.ndarray:
        pinfo = self.target_info(self.info())
        if self.achieved(pinfo):
            # straight up, gripper open: the oracles retreat to a pose drawn at reset, which no
            # observation shows, so a policy cloned from them could only average it
            action = np.array([0.0, 0.0, 1.0, 0.0, -1.0], np.float32)
        else:
            action = np.asarray(self.oracle.select_action(obs, pinfo), dtype=np.float32)
        self.done = self.finished(pinfo)
        return np.clip(action, -1.0, 1.0)

    def target_info(self, info: dict) -> dict:
        raise NotImplementedError

    def achieved(self, info: dict) -> bool:
        """The skill's effect holds (what is left is getting the gripper clear)."""
        return False

    def finished(self, info: dict) -> bool:
        return bool(self.achieved(info) and info["proprio/effector_pos"][2] > self.clear_z_m)


def _wrap(angle: float) -> float:
    """Angle in [-pi, pi)."""
    return float((angle + np.pi) % (2 * np.pi) - np.pi)


def _cube_index(obj_id: str) -> int:
    return int(obj_id.split("_")[1])


class PickPolicy(_OraclePolicy):
    """Cube oracle with the target straight above the cube: it grasps and lifts; we stop at the top."""

    def __init__(self, env, subgoal, seed=0):
        from ogbench.manipspace.oracles.markov.cube_markov import CubeMarkovOracle

        self.oracle_cls = CubeMarkovOracle
        self.oracle_kwargs = {"min_norm": 0.4}
        super().__init__(env, subgoal, seed)
        self.i = _cube_index(subgoal.args[0])
        self.lift_xy = None

    def act(self, obs, info) -> np.ndarray:
        pinfo = self.info()
        cube = pinfo[f"privileged/block_{self.i}_pos"]
        handle = pinfo.get("privileged/drawer_handle_pos")
        # A cube in the drawer or just in front of it: fingers spread along y land on the drawer's
        # walls or front, so turn them to spread along x first (yaw = cube yaw + k pi/2 nearest pi/2).
        near = (handle is not None and handle[1] - 0.3 < cube[1] < handle[1] + 0.07
                and abs(cube[0] - handle[0]) < 0.15)
        if near and pinfo["proprio/gripper_contact"][0] < 0.5:
            base_yaw = pinfo[f"privileged/block_{self.i}_yaw"][0]
            yaw = min((base_yaw + k * np.pi / 2 for k in range(-4, 5)), key=lambda y: abs(_wrap(y - np.pi / 2)))
            action = align_above(pinfo, yaw, cube, np.array([cube[0], cube[1], 0.2]))
            if action is not None:
                return action
        return super().act(obs, info)

    def target_info(self, info):
        pos = info[f"privileged/block_{self.i}_pos"]
        if self.lift_xy is None:
            self.lift_xy = pos[:2].copy()
        info["privileged/target_block"] = self.i
        info["privileged/target_block_pos"] = np.array([*self.lift_xy, LIFT_Z_M + 0.04])
        info["privileged/target_block_yaw"] = info[f"privileged/block_{self.i}_yaw"]
        return info

    def finished(self, info):
        pos = info[f"privileged/block_{self.i}_pos"]
        grasped = info["proprio/gripper_contact"][0] > 0.5
        return bool(grasped and pos[2] >= LIFT_Z_M)


WRIST_RANGE_RAD = 2 * np.pi  # |wrist_3| limit of OGBench's UR5e
ALIGNED_RAD = 0.15           # yaw error below which the oracle takes over (it keeps turning at gain 3)


def wrist_safe_turn(eff_yaw: float, wrist_q: float, goal_yaw: float) -> float:
    """Signed yaw turn to the nearest of goal_yaw + k pi (the fingers are symmetric) that keeps wrist_3
    inside its range, else the other way round. The effector yaw turns against wrist_3 in this model
    (d yaw = -d q). A function of the observed state only, so a cloned policy can learn it: an earlier
    version remembered a target and flipped it when the wrist stalled, which no observation shows."""
    turn = _wrap(2 * (goal_yaw - eff_yaw)) / 2  # in [-pi/2, pi/2)
    if abs(wrist_q - turn) > WRIST_RANGE_RAD - 0.3:
        turn -= np.pi * np.sign(turn)
    return float(turn)


def align_above(info: dict, goal_yaw: float, grasp_pos, above) -> np.ndarray | None:
    """Before a grasp whose approach would hit something while still turning: rise to `above` and turn to
    `goal_yaw` (mod pi) at full rate; None once aligned, or when the gripper is already at `grasp_pos`."""
    eff = info["proprio/effector_pos"]
    turn = wrist_safe_turn(float(info["proprio/effector_yaw"][0]), float(info["proprio/joint_pos"][5]), goal_yaw)
    if abs(turn) <= ALIGNED_RAD or np.linalg.norm(np.asarray(grasp_pos) - eff) < 0.05:
        return None
    action = np.zeros(5, np.float32)
    diff = np.asarray(above, float) - eff
    if np.linalg.norm(diff) >= 0.03:
        action[:3] = np.clip(diff / (np.linalg.norm(diff) + 1e-6) * max(np.linalg.norm(diff), 0.4) * 5, -1, 1)
    action[3] = np.sign(turn)  # full rate: no slow creep near the hand-over that a clone would stall in
    action[4] = -1
    return action


class PlacePolicy(_OraclePolicy):
    """Cube oracle from a grasp to the target (a place, on another cube, or into the open drawer)."""

    def __init__(self, env, subgoal, seed=0):
        from ogbench.manipspace.oracles.markov.cube_markov import CubeMarkovOracle

        self.oracle_cls = CubeMarkovOracle
        self.oracle_kwargs = {"min_norm": 0.4}
        super().__init__(env, subgoal, seed)
        self.i = _cube_index(subgoal.args[0])
        self.released = False

    def target_pos(self, info) -> np.ndarray:
        skill, target = self.subgoal.skill, self.subgoal.args[1]
        if skill == "place_on":
            return info[f"privileged/block_{_cube_index(target)}_pos"] + np.array([0.0, 0.0, predicates.CUBE_SIZE_M])
        if skill == "place_in":
            handle = info["privileged/drawer_handle_pos"]
            return np.array([0.33, handle[1] - 0.17, 0.066])  # OGBench's drawer centre (0.33, -0.24) when open
        world = world_from_env(self.env)
        return np.asarray(world.object(target).pos_m, dtype=float)

    def target_info(self, info):
        info["privileged/target_block"] = self.i
        info["privileged/target_block_pos"] = self.target_pos(info)
        info["privileged/target_block_yaw"] = info[f"privileged/block_{self.i}_yaw"]
        return info

    def achieved(self, info):
        pos = info[f"privileged/block_{self.i}_pos"]
        at = np.linalg.norm(pos - info["privileged/target_block_pos"]) <= 0.02
        return bool(at and info["proprio/gripper_contact"][0] < 0.1)


class SlidePolicy(_OraclePolicy):
    """Drawer or window oracle with the handle target at the open or closed slide position."""

    def __init__(self, env, subgoal, seed=0):
        from ogbench.manipspace.oracles.markov.drawer_markov import DrawerMarkovOracle
        from ogbench.manipspace.oracles.markov.window_markov import WindowMarkovOracle

        self.what = subgoal.args[0]
        self.oracle_cls = DrawerMarkovOracle if self.what == "drawer" else WindowMarkovOracle
        self.oracle_kwargs = {"min_norm": 0.4, "max_step": 10**6}
        super().__init__(env, subgoal, seed)
        opening = subgoal.skill == "open"
        if self.what == "drawer":
            self.goal_q = DRAWER_OPEN_M if opening else DRAWER_CLOSED_M
        else:
            self.goal_q = WINDOW_OPEN_M if opening else WINDOW_CLOSED_M
        model = self.base.model
        self.joint = model.joint(f"{self.what}_slide").id
        # clear of the handle before the next skill (the window handle sits at 0.24 m; oracle: 0.28 m)
        self.clear_z_m = 0.18 if self.what == "drawer" else 0.30

    def act(self, obs, info) -> np.ndarray:
        # Turn the gripper to the handle's yaw high above it before the oracle descends: descending
        # while still turning can hit the drawer front and push the handle away.
        pinfo = self.target_info(self.info())
        if not predicates.slide_at(self.q, self.goal_q):
            handle = pinfo[f"privileged/{self.what}_handle_pos"]
            above = np.array([handle[0], handle[1], max(handle[2] + 0.12, 0.2)])
            action = align_above(pinfo, pinfo[f"privileged/{self.what}_handle_yaw"][0], handle, above)
            if action is not None:
                return action
        return super().act(obs, info)

    def target_info(self, info):
        q = float(self.base._data.qpos[self.base.model.jnt_qposadr[self.joint]])
        axis = np.asarray(self.base._data.xaxis[self.joint], dtype=float)
        handle = info[f"privileged/{self.what}_handle_pos"]
        info[f"privileged/target_{self.what}_handle_pos"] = handle + axis * (self.goal_q - q)
        self.q = q
        return info

    def achieved(self, info):
        return bool(predicates.slide_at(self.q, self.goal_q))


class PressPolicy(_OraclePolicy):
    """Button oracle aimed at one button, with the toggled state as its target."""

    def __init__(self, env, subgoal, seed=0):
        from ogbench.manipspace.oracles.markov.button_markov import ButtonMarkovOracle

        self.oracle_cls = ButtonMarkovOracle
        self.oracle_kwargs = {"min_norm": 0.4, "max_step": 10**6}
        super().__init__(env, subgoal, seed)
        self.i = _cube_index(subgoal.args[0])
        self.start_state = int(self.base._cur_button_states[self.i])

    def target_info(self, info):
        info["privileged/target_button"] = self.i
        info["privileged/target_button_state"] = 1 - self.start_state
        info["privileged/target_button_top_pos"] = self.base._data.site_xpos[self.base._button_site_ids[self.i]].copy()
        return info

    def achieved(self, info):
        return int(info[f"privileged/button_{self.i}_state"]) != self.start_state


def oracle_detector(factory):
    """detector_fn for a learned skill: the oracle's own finished test (the same target, the same
    clearance height), read from the sim's privileged info; the oracle's actions are never used."""

    def detector_fn(env, subgoal):
        oracle = factory(env, subgoal)
        return lambda: oracle.finished(oracle.target_info(oracle.info()))

    return detector_fn


def oracle_skills(env) -> SkillLibrary:
    """The manipulation skills for this env, each driven by its OGBench oracle."""
    world = world_from_env(env)
    policies = {"pick": PickPolicy, "place": PlacePolicy, "open": SlidePolicy, "close": SlidePolicy,
                "press": PressPolicy}
    return manipulation_skills(world.controls, policies)
