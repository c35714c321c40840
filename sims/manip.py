"""Robot-arm manipulation from OGBench's manipspace (UR5e + Robotiq 2F-85 in MuJoCo).

Tasks (all through `sims.make`):
    cube-single, cube-double, scene, puzzle-3x3, puzzle-4x4    single-task, sparse reward
    <name>-goal                                                  goal-conditioned: each reset picks one
                                                                 of the suite's 5 evaluation tasks and the
                                                                 state is concat(observation, goal observation)
`sims.make("cube-double", task_id=5)` picks another of the 5 evaluation tasks (default: OGBench's).

Conventions (DESIGN.md §4): reward = satisfied sub-goals - all sub-goals, in {-n..0}, evaluated on
the state after the action; the episode terminates when every sub-goal holds (info["success"]).
info["subgoals"] is the per-sub-goal truth, in the order of `subgoals()`.

Each env exposes `scene()`, `subgoals()`, `instruction(rng)`, `describe(pred, rng)` (reach them with
`env.get_wrapper_attr(name)`), the OGBench env at `env.unwrapped`, and optionally image and language
observations (`images=("front",)`, `image_size=64`, `language=True`). `variation=` picks an
evaluation shift away from the training distribution (`sims.manip_variations`: held-out paraphrases,
unseen start positions, a moved camera, changed lighting, a distractor).

This module builds the envs (suites, the OGBench base env, the task and observation wrappers, the
registry entries); `sims.manip_scene` reads their state (sub-goals, their truths, the scene),
`sims.manip_language` puts it into words, and `sims.predicates` defines the sub-goal predicates.
"""
from __future__ import annotations

import atexit
import os
import weakref
from dataclasses import dataclass

import gymnasium
import numpy as np
from gymnasium import spaces
from gymnasium.utils import RecordConstructorArgs

from embodied.errors import UserError
from sims import wrappers
from sims.manip_language import describe_predicate, instruction_text
from sims.manip_variations import (IMAGE_VARIATIONS, apply_image_variation, check_variation, distractor_position,
                                   draw_distractor, shift_start_positions)
from sims.manip_scene import build_scene, task_subgoals
from sims.registry import TaskSpec, register_task
from sims.scene import Predicate, Scene

CAMERAS = ("front", "front_pixels")


class RenderError(UserError):
    pass


@dataclass(frozen=True)
class Suite:
    name: str
    kind: str  # "cube" | "scene" | "puzzle"
    env_type: str
    obs_dim: int
    max_episode_steps: int
    default_task: int  # OGBench's default single task
    num_tasks: int = 5


SUITES = {
    "cube-single": Suite("cube-single", "cube", "single", 28, 200, 2),
    "cube-double": Suite("cube-double", "cube", "double", 37, 500, 2),
    "scene": Suite("scene", "scene", "scene", 40, 750, 2),
    "puzzle-3x3": Suite("puzzle-3x3", "puzzle", "3x3", 55, 500, 4),
    "puzzle-4x4": Suite("puzzle-4x4", "puzzle", "4x4", 83, 500, 4),
}


# ------------------------------------------------------------------------------------------ base envs
_SHARED_IK_MODEL: dict = {}
_COMPILED = "compiled"  # stands in for the dropped MJCF tree (CustomMuJoCoEnv only rebuilds it when None)
_MJCF_REFS = ("_arm_jnts", "_arm_acts", "_gripper_jnts", "_gripper_acts", "_cube_geoms_list",
              "_cube_target_geoms_list", "_button_geoms_list")


class _CachedSpaces:
    """OGBench builds a fresh Box on every `action_space` access (and an observation on every
    `observation_space` access). Cache both, and seed the action space on reset(seed) so the random
    settling steps OGBench takes inside reset are reproducible."""

    metadata = {"render_modes": ["rgb_array"], "render_fps": 20}

    def __init__(self, *args, render_mode=None, **kwargs):
        self._act_space = spaces.Box(-1.0, 1.0, shape=(5,), dtype=np.float32)
        self._obs_space = None
        super().__init__(*args, **kwargs)
        self.render_mode = render_mode
        # The IK controller only reads its UR5e model (36 MB of meshes): share one per process.
        shared = _SHARED_IK_MODEL.setdefault("ur5e", self._ik._model)
        if shared is not self._ik._model:
            self._ik._model = shared
            self._ik._data = _mujoco().MjData(shared)

    @property
    def action_space(self):
        return self._act_space

    @property
    def observation_space(self):
        if self._obs_space is None:
            if self._model is None:
                self.reset()
            ob = self.compute_observation()
            self._obs_space = spaces.Box(-np.inf, np.inf, shape=ob.shape, dtype=ob.dtype)
        return self._obs_space

    def reset(self, *, seed=None, options=None, **kwargs):
        if seed is not None:
            self._act_space.seed(int(seed))
        return super().reset(options=options, seed=seed, **kwargs)

    def compile_model_and_data(self):
        """Compile once, then drop the MJCF tree (it holds every mesh and texture file's bytes,
        ~100 MB per env): only the MjModel is used after compilation, and nothing recompiles."""
        super().compile_model_and_data()
        self._mjcf_model = _COMPILED
        for name in _MJCF_REFS:
            if hasattr(self, name):
                setattr(self, name, None)


_GL_HELP = ("set MUJOCO_GL=egl (NVIDIA/Mesa EGL), or `apt-get install libosmesa6` and set MUJOCO_GL=osmesa "
            "(and PYOPENGL_PLATFORM=osmesa)")


def _mujoco():
    """`import mujoco`, which loads the OpenGL backend named by MUJOCO_GL at import time: a missing
    backend becomes a UserError that says how to install one, not a deep import traceback."""
    try:
        import mujoco
    except (ImportError, AttributeError, OSError, RuntimeError) as err:
        backend = os.environ.get("MUJOCO_GL", "(unset)")
        raise RenderError(f"MuJoCo cannot load its OpenGL backend MUJOCO_GL={backend} ({type(err).__name__}: "
                          f"{str(err).splitlines()[0] if str(err) else ''}); {_GL_HELP}, or unset MUJOCO_GL "
                          "for state-only use") from None
    return mujoco


def _base_classes():
    _mujoco()
    from ogbench.manipspace.envs.cube_env import CubeEnv
    from ogbench.manipspace.envs.puzzle_env import PuzzleEnv
    from ogbench.manipspace.envs.scene_env import SceneEnv

    return {
        "cube": type("ManipCubeEnv", (_CachedSpaces, CubeEnv), {"__module__": __name__}),
        "scene": type("ManipSceneEnv", (_CachedSpaces, SceneEnv), {"__module__": __name__}),
        "puzzle": type("ManipPuzzleEnv", (_CachedSpaces, PuzzleEnv), {"__module__": __name__}),
    }


_CLASSES: dict = {}


def base_class(kind: str):
    if not _CLASSES:
        _CLASSES.update(_base_classes())
    return _CLASSES[kind]


def _make_base(kind: str, **kwargs):
    """gymnasium entry point (so env.spec exists and spec.make() can rebuild the stack)."""
    return base_class(kind)(**kwargs)


def gym_id(suite: Suite) -> str:
    return f"embodied/{suite.name}-v0"


def _register_gym_ids() -> None:
    for suite in SUITES.values():
        if gym_id(suite) not in gymnasium.registry:
            gymnasium.register(gym_id(suite), entry_point=f"{__name__}:_make_base",
                               max_episode_steps=suite.max_episode_steps, kwargs={"kind": suite.kind})


def make_base(name: str, *, mode: str = "task", task_id: int | None = None, max_episode_steps=None,
              render_mode=None, size: int = 200, **kwargs):
    """The OGBench env (our cached-spaces subclass) via gymnasium.make: TimeLimit and checks on top.

    mode="task": single-task reward of task `task_id` (None: no fixed task, pass options task_id).
    mode="data_collection": OGBench's random-target mode that its oracles need.
    """
    suite = SUITES[name]
    _register_gym_ids()
    extra = dict(permute_blocks=False) if suite.kind in ("cube", "scene") else {}
    if mode == "task":
        extra.update(reward_task_id=task_id)
    return gymnasium.make(
        gym_id(suite), env_type=suite.env_type, mode=mode, terminate_at_goal=False, success_timing="post",
        visualize_info=False, render_mode=render_mode, width=size, height=size,
        max_episode_steps=max_episode_steps or suite.max_episode_steps, **extra, **kwargs)


# ------------------------------------------------------------------------------------------ GL check
def check_gl(model, size: int = 8) -> None:
    """Make a tiny offscreen context; a UserError that says how to get one when none works."""
    mujoco = _mujoco()
    try:
        renderer = mujoco.Renderer(model, height=size, width=size)
        renderer.close()
    except Exception as err:  # ImportError/AttributeError/FatalError depending on the backend
        backend = os.environ.get("MUJOCO_GL", "(unset: glfw, needs a display)")
        raise RenderError(
            f"no working OpenGL backend for MuJoCo rendering (MUJOCO_GL={backend}: {type(err).__name__}: "
            f"{str(err).splitlines()[0] if str(err) else ''}); {_GL_HELP}"
        ) from None


def offscreen_renderer(env: gymnasium.Env, size: int):
    """A MuJoCo offscreen renderer of `env`'s model, shadows and reflections off (much faster at small
    sizes), after checking that an OpenGL backend works."""
    global _CLOSE_AT_EXIT
    wrappers.disable_costly_rendering(env)
    model = env.unwrapped.model
    check_gl(model)
    renderer = _mujoco().Renderer(model, height=size, width=size)
    if not _CLOSE_AT_EXIT:   # registered after EGL's own eglTerminate hook, so it runs before it
        atexit.register(_close_renderers)
        _CLOSE_AT_EXIT = True
    _RENDERERS.add(renderer)
    return renderer


_RENDERERS: weakref.WeakSet = weakref.WeakSet()
_CLOSE_AT_EXIT = False


def _close_renderers() -> None:
    """Close live renderers while EGL still runs: left to garbage collection after EGL's exit hook, each
    printed an EGLError traceback at interpreter exit."""
    for renderer in list(_RENDERERS):
        try:
            renderer.close()
        except Exception:  # noqa: BLE001  its context is already gone; the process is ending anyway
            pass


def task_info(name: str, task_id: int) -> dict:
    """OGBench's definition of task `task_id` (1-based) of a suite: goal poses and states (`task_infos`)."""
    env = make_base(suite_of(name).name, mode="task", task_id=task_id)
    info = env.unwrapped.task_infos[task_id - 1]
    env.close()
    return info


class ManipTask(gymnasium.Wrapper, RecordConstructorArgs):
    """Single-task (or goal-conditioned) sparse-reward view of an OGBench manipspace env, with scene
    introspection and language. Observation: a flat float32 state (the registry wraps it in a dict)."""

    def __init__(self, env: gymnasium.Env, suite_name: str, task_id: int | None = None,
                 goal_conditioned: bool = False, images: tuple = (), image_size: int = 64, language: bool = False,
                 variation: str = "none"):
        RecordConstructorArgs.__init__(self, suite_name=suite_name, task_id=task_id, goal_conditioned=goal_conditioned,
                                       images=tuple(images), image_size=image_size, language=language,
                                       variation=variation)
        super().__init__(env)
        self.suite = SUITES[suite_name]
        self.goal_conditioned = goal_conditioned
        self.fixed_task = task_id
        self.variation = check_variation(variation)
        self.words = "heldout" if variation == "paraphrase" else "train"
        self.obs_options = dict(images=tuple(images), image_size=int(image_size), language=bool(language),
                                variation=variation)
        base = env.unwrapped
        if base._model is None:
            base.reset(seed=0)
        dim = self.suite.obs_dim * (2 if goal_conditioned else 1)
        self.observation_space = spaces.Box(-np.inf, np.inf, shape=(dim,), dtype=np.float32)
        self.action_space = spaces.Box(-1.0, 1.0, shape=(5,), dtype=np.float32)
        self._goal = np.zeros(self.suite.obs_dim, np.float32)
        self._task_id = task_id
        self._instruction = ""
        self._initial_truths = None

    # -- gymnasium ------------------------------------------------------------------------------
    def reset(self, *, seed=None, options=None):
        options = dict(options or {})
        if self.goal_conditioned:
            task_id = options.get("task_id")
            if task_id is None:
                # the base env seeds its rng inside reset; draw the task from a seed-derived stream
                rng = np.random.default_rng(seed) if seed is not None else self.np_random
                task_id = int(rng.integers(1, self.suite.num_tasks + 1))
            self._check_task(task_id)
            self._task_id = int(task_id)
            obs, info = self.env.reset(seed=seed, options={"task_id": self._task_id})
            self._goal = np.asarray(info["goal"], np.float32)
        else:
            obs, info = self.env.reset(seed=seed)
            self._task_id = self.env.unwrapped.cur_task_id
        if self.variation == "positions":
            obs = self._shift_start(seed)
        truths = self.subgoal_truths()
        self._initial_truths = truths
        info["subgoals"] = truths
        info["success"] = bool(truths.all())
        info["task_id"] = self._task_id
        self._instruction = self.instruction(self.env.unwrapped.np_random)
        return self._state(obs), info

    def step(self, action):
        obs, _, _, truncated, info = self.env.step(action)
        truths = self.subgoal_truths()
        success = bool(truths.all())
        info["subgoals"] = truths
        info["success"] = success
        reward = float(truths.sum() - len(truths))
        return self._state(obs), reward, success, truncated, info

    def _shift_start(self, seed) -> np.ndarray:
        """variation=positions: move the cubes still to be moved out of the training start box."""
        base = self.env.unwrapped
        n_cubes = len(base._cube_target_mocap_ids)
        pending = [i for i, done in enumerate(self.subgoal_truths()[:n_cubes]) if not done]
        rng = np.random.default_rng(None if seed is None else [int(seed), 7])
        shift_start_positions(base, pending or list(range(n_cubes)), rng)
        return base.compute_observation()

    def _state(self, obs) -> np.ndarray:
        if self.goal_conditioned:
            return np.concatenate([np.asarray(obs, np.float32), self._goal])
        return np.asarray(obs, np.float32)

    def _check_task(self, task_id) -> None:
        if not isinstance(task_id, (int, np.integer)) or not 1 <= int(task_id) <= self.suite.num_tasks:
            raise UserError(f"task_id={task_id!r} for {self.suite.name}: choose 1..{self.suite.num_tasks}")

    # -- sub-goals --------------------------------------------------------------------------------
    def subgoal_truths(self) -> np.ndarray:
        """OGBench's own per-object success tests, flattened (cubes, buttons, drawer, window)."""
        out = self.env.unwrapped._compute_successes()
        if self.suite.kind == "scene":
            cubes, buttons, drawer, window = out
            out = list(cubes) + list(buttons) + [drawer, window]
        return np.asarray(out, dtype=bool)

    def subgoals(self) -> list[Predicate]:
        return task_subgoals(self.env.unwrapped, self.suite.kind)

    def task_id(self) -> int | None:
        return self._task_id

    def scene(self) -> Scene:
        return build_scene(self.env.unwrapped, self.suite.kind)

    def instruction(self, rng=None) -> str:
        preds = self.subgoals()
        pending = [p for p, t in zip(preds, self._initial_truths if self._initial_truths is not None
                                     else np.zeros(len(preds), bool)) if not t]
        return instruction_text(self.env.unwrapped, self.suite.kind, pending or preds, rng, self.words)

    def current_instruction(self) -> str:
        """The paraphrase chosen at the last reset (what the `task` observation carries)."""
        return self._instruction

    def describe(self, pred: Predicate | str, rng=None) -> str:
        pred = pred if isinstance(pred, Predicate) else Predicate.parse(pred)
        return describe_predicate(self.env.unwrapped, self.suite.kind, pred, rng, self.words)


# ------------------------------------------------------------------------------------------ observation
class ManipObservation(wrappers.CameraObservation, RecordConstructorArgs):
    """Adds `observation.images.<camera>` (uint8 HWC, shadows/reflections off) and `task` (the
    instruction) to the registry's {"observation.state": ...} dict; the image variations
    (sims.manip_variations) change what the cameras see."""

    def __init__(self, env: gymnasium.Env, images: tuple = (), image_size: int = 64, language: bool = False,
                 variation: str = "none"):
        RecordConstructorArgs.__init__(self, images=tuple(images), image_size=image_size, language=language,
                                       variation=variation)
        self.variation = check_variation(variation)
        self._distractor_pos = None
        if self.variation in IMAGE_VARIATIONS and not images:
            raise UserError(f"variation={variation} changes camera frames: pass images=('front',) too")
        bad = [c for c in images if c not in CAMERAS]
        if bad:
            raise UserError(f"unknown camera(s) {bad}: choose from {', '.join(CAMERAS)}")
        if images and not 16 <= int(image_size) <= 512:
            raise UserError(f"image_size={image_size} must be between 16 and 512 pixels")
        apply_image_variation(env.unwrapped.model, self.variation)
        renderer = offscreen_renderer(env, int(image_size)) if images else None
        super().__init__(env, images, image_size, language, renderer)

    def _on_reset(self, seed) -> None:
        if self.variation == "distractor":
            rng = np.random.default_rng(None if seed is None else [int(seed), 11])
            self._distractor_pos = distractor_position(self.env.unwrapped, rng)

    def _draw(self, camera: str) -> np.ndarray:
        self._renderer.update_scene(self.env.unwrapped._data, camera=camera)
        if self._distractor_pos is not None:
            draw_distractor(self._renderer.scene, self._distractor_pos)
        return self._renderer.render()


def _finish(env: gymnasium.Env) -> gymnasium.Env:
    options = env.get_wrapper_attr("obs_options")
    if options["images"] or options["language"] or options["variation"] in IMAGE_VARIATIONS:
        env = ManipObservation(env, **options)
    return env


# ------------------------------------------------------------------------------------------ registration
def build_manip(spec: TaskSpec, *, render_mode, render_size, task_id=None, images=(), image_size=64,
                language=False, variation="none", max_episode_steps=None, **kwargs) -> gymnasium.Env:
    if kwargs:
        raise UserError(f"unknown option(s) {sorted(kwargs)} for {spec.name}: use task_id, images, image_size, "
                        "language, variation, max_episode_steps")
    goal = spec.name.endswith("-goal")
    suite = SUITES[spec.name[: -len("-goal")] if goal else spec.name]
    if isinstance(images, str):
        images = (images,)
    if not goal:
        task_id = suite.default_task if task_id is None else task_id
        if not isinstance(task_id, (int, np.integer)) or not 1 <= int(task_id) <= suite.num_tasks:
            raise UserError(f"task_id={task_id!r} for {suite.name}: choose 1..{suite.num_tasks}")
    elif task_id is not None:
        raise UserError(f"{spec.name} samples its task each reset: pass options={{'task_id': k}} to reset instead")
    size = max(int(render_size), int(image_size) if images else 0, 64)
    _mujoco()  # a broken MUJOCO_GL fails here, with the fix
    env = make_base(suite.name, mode="task", task_id=None if goal else int(task_id), render_mode=render_mode,
                    size=size, max_episode_steps=max_episode_steps)
    if render_mode is not None:
        env.unwrapped.reset(seed=0)
        check_gl(env.unwrapped.model)
    return ManipTask(env, suite.name, task_id=None if goal else int(task_id), goal_conditioned=goal,
                     images=tuple(images), image_size=image_size, language=language, variation=check_variation(variation))


def _spec(name: str, suite: Suite, goal: bool) -> TaskSpec:
    return TaskSpec(
        name=name, gym_id=gym_id(suite), obs_dim=suite.obs_dim * (2 if goal else 1), act_dim=5,
        max_episode_steps=suite.max_episode_steps, ref_min_score=None, ref_max_score=None,
        approximate_normalization=False, has_success=True, sparse=True, success_reward_threshold=None,
        num_tasks=None if goal else suite.num_tasks)


MANIP_NAMES = tuple(n for s in SUITES for n in (s, f"{s}-goal"))

for _name, _suite in SUITES.items():
    register_task(_spec(_name, _suite, False), finish=_finish)(build_manip)
    register_task(_spec(f"{_name}-goal", _suite, True), finish=_finish)(build_manip)


def suite_of(name: str) -> Suite:
    """The suite of a registered manipulation task name (with or without -goal)."""
    key = name[: -len("-goal")] if name.endswith("-goal") else name
    if key not in SUITES:
        raise UserError(f"{name!r} is not a manipulation task; choose one of: {', '.join(MANIP_NAMES)}")
    return SUITES[key]
