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

    def act(self, obs, info) -> np.ndarray:
        pinfo = self.target_info(self.info())
        action = np.asarray(self.oracle.select_action(obs, pinfo), dtype=np.float32)
        self.done = self.finished(pinfo)
        return np.clip(action, -1.0, 1.0)

    def target_info(self, info: dict) -> dict:
        raise NotImplementedError

    def finished(self, info: dict) -> bool:
        raise NotImplementedError


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
        self.aligner = None

    def act(self, obs, info) -> np.ndarray:
        if self.aligner is None:
            pinfo = self.info()
            cube = pinfo[f"privileged/block_{self.i}_pos"]
            handle = pinfo.get("privileged/drawer_handle_pos")
            # A cube in the drawer or just in front of it: fingers spread along y land on the drawer's
            # walls or front, so turn them to spread along x first (yaw = cube yaw + k pi/2 nearest pi/2).
            near = (handle is not None and handle[1] - 0.3 < cube[1] < handle[1] + 0.07
                    and abs(cube[0] - handle[0]) < 0.15)
            if near:
                base_yaw = pinfo[f"privileged/block_{self.i}_yaw"][0]
                cands = [base_yaw + k * np.pi / 2 for k in range(-4, 5)]
                yaw = min(cands, key=lambda y: abs(_wrap(y - np.pi / 2)))
                self.aligner = _YawAligner(yaw, above=np.array([cube[0], cube[1], 0.2]))
            else:
                self.aligner = False
        if self.aligner and not self.aligner.done:
            action = self.aligner.step(self.info())
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


class _YawAligner:
    """Moves above a point and turns the gripper to a yaw (mod pi, the fingers are symmetric), turning
    the other way when the wrist stalls at its joint limit."""

    def __init__(self, yaw: float, above: np.ndarray, max_steps: int = 120):
        self.yaw, self.above, self.max_steps = float(yaw), np.asarray(above, float), max_steps
        self.seen: list[float] = []
        self.steps = 0
        self.done = False

    def step(self, info: dict) -> np.ndarray | None:
        self.steps += 1
        eff, eff_yaw = info["proprio/effector_pos"], float(info["proprio/effector_yaw"][0])
        self.seen.append(eff_yaw)
        err = _wrap(self.yaw - eff_yaw)
        if len(self.seen) > 10 and abs(_wrap(self.seen[-1] - self.seen[-11])) < 0.02 and abs(err) > 0.05:
            self.yaw -= np.pi * np.sign(err)
            self.seen = []
            err = _wrap(self.yaw - eff_yaw)
        diff = self.above - eff
        if (abs(err) < 0.05 and np.linalg.norm(diff) < 0.03) or self.steps > self.max_steps:
            self.done = True
            return None
        action = np.zeros(5, np.float32)
        if np.linalg.norm(diff) >= 0.03:
            action[:3] = np.clip(diff / (np.linalg.norm(diff) + 1e-6) * max(np.linalg.norm(diff), 0.4) * 5, -1, 1)
        action[3] = np.clip(err * 3, -1, 1)
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

    def finished(self, info):
        pos = info[f"privileged/block_{self.i}_pos"]
        at = np.linalg.norm(pos - info["privileged/target_block_pos"]) <= 0.02
        free = info["proprio/gripper_contact"][0] < 0.1
        return bool(at and free and info["proprio/effector_pos"][2] > CLEAR_Z_M)


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
        self.aligned = False

    def act(self, obs, info) -> np.ndarray:
        # Turn the gripper to the handle's yaw high above it before the oracle descends: descending
        # while still turning can hit the drawer front and push the handle away.
        self.steps = getattr(self, "steps", 0) + 1
        if not self.aligned and self.steps > 120:
            self.aligned = True  # could not settle: let the oracle try anyway
        if not self.aligned:
            pinfo = self.target_info(self.info())
            eff = pinfo["proprio/effector_pos"]
            eff_yaw = pinfo["proprio/effector_yaw"][0]
            handle = pinfo[f"privileged/{self.what}_handle_pos"]
            if getattr(self, "yaw_target", None) is None:
                self.yaw_target = self.oracle.shortest_yaw(eff_yaw, pinfo[f"privileged/{self.what}_handle_yaw"][0], n=2)
                self.yaw_seen = []
            self.yaw_seen.append(eff_yaw)
            err = _wrap(self.yaw_target - eff_yaw)
            if len(self.yaw_seen) > 10 and abs(_wrap(self.yaw_seen[-1] - self.yaw_seen[-11])) < 0.02 and abs(err) > 0.05:
                # the wrist is at its joint limit: turn the other way to the handle's other symmetric yaw
                self.yaw_target -= np.pi * np.sign(err)
                self.yaw_seen = []
                err = _wrap(self.yaw_target - eff_yaw)
            above = np.array([handle[0], handle[1], max(handle[2] + 0.12, 0.2)])
            diff = above - eff
            if abs(err) < 0.05 and np.linalg.norm(diff) < 0.03:
                self.aligned = True
            else:
                action = np.zeros(5, np.float32)
                action[:3] = np.clip(self.oracle.shape_diff(diff) * 5, -1, 1) if np.linalg.norm(diff) >= 0.03 else 0
                action[3] = np.clip(err * 3, -1, 1)
                action[4] = -1
                return action
        return super().act(obs, info)

    def target_info(self, info):
        q = float(self.base._data.qpos[self.base.model.jnt_qposadr[self.joint]])
        axis = np.asarray(self.base._data.xaxis[self.joint], dtype=float)
        handle = info[f"privileged/{self.what}_handle_pos"]
        info[f"privileged/target_{self.what}_handle_pos"] = handle + axis * (self.goal_q - q)
        self.q = q
        return info

    def finished(self, info):
        # clear of the handle before the next skill (the window handle sits at 0.24 m; oracle: 0.28 m)
        clear_z = 0.18 if self.what == "drawer" else 0.30
        return bool(predicates.slide_at(self.q, self.goal_q) and info["proprio/effector_pos"][2] > clear_z)


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

    def finished(self, info):
        toggled = int(info[f"privileged/button_{self.i}_state"]) != self.start_state
        return bool(toggled and info["proprio/effector_pos"][2] > CLEAR_Z_M)


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
