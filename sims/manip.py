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
observations (`images=("front",)`, `image_size=64`, `language=True`).
"""
from __future__ import annotations

import string
from dataclasses import dataclass

import gymnasium
import numpy as np
from gymnasium import spaces
from gymnasium.utils import RecordConstructorArgs

from embodied.errors import UserError
from sims import wrappers
from sims.registry import TaskSpec, register_task
from sims.scene import Predicate, Scene, SceneObject

CUBE_COLORS = ("red", "blue", "orange", "green", "purple", "yellow", "magenta", "gray")  # OGBench's order
SUCCESS_TOL_M = 0.04  # OGBench: a cube is at its target within 4 cm, a drawer/window within 4 cm
DRAWER_OPEN_M, WINDOW_OPEN_M = -0.16, 0.2  # slide positions of the open drawer / window
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
    import os

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
    import os

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


# ------------------------------------------------------------------------------------------ scene
def _region_words(pos) -> str:
    """Where on the table, as seen from the front camera (+x toward the camera, +y to the right)."""
    x, y = float(pos[0]), float(pos[1])
    depth = "back" if x < 0.39 else ("front" if x > 0.46 else "")
    side = "left" if y < -0.06 else ("right" if y > 0.06 else "")
    if depth and side:
        return f"{depth} {side}"
    return depth or side or "center"


def _grid_words(index: int, rows: int, cols: int) -> str:
    r, c = divmod(index, cols)
    if rows == 3 and cols == 3:
        return f"{('back', 'middle', 'front')[r]} {('left', 'center', 'right')[c]}".replace("middle center", "center")
    return f"row {r + 1}, column {c + 1}"


class ManipTask(gymnasium.Wrapper, RecordConstructorArgs):
    """Single-task (or goal-conditioned) sparse-reward view of an OGBench manipspace env, with scene
    introspection and language. Observation: a flat float32 state (the registry wraps it in a dict)."""

    def __init__(self, env: gymnasium.Env, suite_name: str, task_id: int | None = None,
                 goal_conditioned: bool = False, images: tuple = (), image_size: int = 64, language: bool = False):
        RecordConstructorArgs.__init__(self, suite_name=suite_name, task_id=task_id, goal_conditioned=goal_conditioned,
                                       images=tuple(images), image_size=image_size, language=language)
        super().__init__(env)
        self.suite = SUITES[suite_name]
        self.goal_conditioned = goal_conditioned
        self.fixed_task = task_id
        self.obs_options = dict(images=tuple(images), image_size=int(image_size), language=bool(language))
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
        return instruction_text(self.env.unwrapped, self.suite.kind, pending or preds, rng)

    def current_instruction(self) -> str:
        """The paraphrase chosen at the last reset (what the `task` observation carries)."""
        return self._instruction

    def describe(self, pred: Predicate | str, rng=None) -> str:
        pred = pred if isinstance(pred, Predicate) else Predicate.parse(pred)
        return describe_predicate(self.env.unwrapped, self.suite.kind, pred, rng)


def _cube_count(base) -> int:
    return int(getattr(base, "_num_cubes", 0))


def task_subgoals(base, kind: str) -> list[Predicate]:
    """The current task's sub-goals, in the order of OGBench's `_compute_successes`."""
    if kind == "cube":
        return [Predicate("at", (f"cube_{i}", f"target_{i}")) for i in range(_cube_count(base))]
    if kind == "scene":
        buttons = np.asarray(base._target_button_states).reshape(-1)
        preds = [Predicate("at", (f"cube_{i}", f"target_{i}")) for i in range(_cube_count(base))]
        preds += [Predicate("unlocked" if buttons[0] else "locked", ("drawer",)),
                  Predicate("unlocked" if buttons[1] else "locked", ("window",))]
        preds.append(Predicate("open" if base._target_drawer_pos < -0.08 else "closed", ("drawer",)))
        preds.append(Predicate("open" if base._target_window_pos > 0.1 else "closed", ("window",)))
        return preds
    targets = np.asarray(base._target_button_states).reshape(-1)
    return [Predicate("blue" if t else "red", (f"button_{i}",)) for i, t in enumerate(targets)]


def build_scene(base, kind: str) -> Scene:
    """Objects, gripper and every ground predicate's truth from the live MuJoCo state."""
    data = base._data
    info = base.compute_ob_info()
    objects, truths = [], {}
    eff = np.asarray(info["proprio/effector_pos"], float)
    closed_on_something = float(info["proprio/gripper_contact"][0]) > 0.5
    holding = None
    n_cubes = _cube_count(base)
    cube_pos = [np.asarray(data.joint(f"object_joint_{i}").qpos[:3], float) for i in range(n_cubes)]
    colors = CUBE_COLORS if kind == "cube" else ("red", "blue")
    for i, pos in enumerate(cube_pos):
        quat = tuple(float(q) for q in data.joint(f"object_joint_{i}").qpos[3:7])
        target = np.asarray(data.mocap_pos[base._cube_target_mocap_ids[i]], float)
        held = closed_on_something and np.linalg.norm(pos - eff) <= 0.03
        if held:
            holding = f"cube_{i}"
        state = {"at_target": bool(np.linalg.norm(pos - target) <= SUCCESS_TOL_M), "held": bool(held)}
        objects.append(SceneObject(f"cube_{i}", f"{colors[i]} cube", "cube", colors[i], tuple(map(float, pos)), quat, state))
        objects.append(SceneObject(f"target_{i}", f"target of the {colors[i]} cube", "target", colors[i],
                                   tuple(map(float, target)), None, {}))
        truths[f"at(cube_{i},target_{i})"] = state["at_target"]
        truths[f"holding(cube_{i})"] = bool(held)
    for i in range(n_cubes):
        for j in range(n_cubes):
            if i != j:
                dz = cube_pos[i][2] - cube_pos[j][2]
                on = np.linalg.norm(cube_pos[i][:2] - cube_pos[j][:2]) <= 0.02 and 0.03 <= dz <= 0.05
                truths[f"on(cube_{i},cube_{j})"] = bool(on)
    if kind == "scene":
        buttons = np.asarray(base._cur_button_states).reshape(-1)
        drawer = float(data.joint("drawer_slide").qpos[0])
        window = float(data.joint("window_slide").qpos[0])
        drawer_open, drawer_closed = drawer <= DRAWER_OPEN_M + SUCCESS_TOL_M, drawer >= -SUCCESS_TOL_M
        window_open, window_closed = window >= WINDOW_OPEN_M - SUCCESS_TOL_M, window <= SUCCESS_TOL_M
        objects.append(SceneObject("drawer", "drawer", "drawer", None, tuple(map(float, data.site_xpos[base._drawer_site_id])),
                                   None, {"open": drawer_open, "closed": drawer_closed, "open_frac": drawer / DRAWER_OPEN_M,
                                          "locked": bool(buttons[0] == 0)}))
        objects.append(SceneObject("window", "window", "window", None, tuple(map(float, data.site_xpos[base._window_site_id])),
                                   None, {"open": window_open, "closed": window_closed, "open_frac": window / WINDOW_OPEN_M,
                                          "locked": bool(buttons[1] == 0)}))
        for i, what in enumerate(("drawer", "window")):
            color = "red" if buttons[i] == 0 else "white"
            objects.append(SceneObject(f"button_{i}", f"{what} lock button", "button", color,
                                       tuple(map(float, data.site_xpos[base._button_site_ids[i]])), None,
                                       {"unlocks": what, "state": int(buttons[i]), "locked": bool(buttons[i] == 0)}))
            truths[f"locked({what})"] = bool(buttons[i] == 0)
            truths[f"unlocked({what})"] = bool(buttons[i] == 1)
        truths.update({"open(drawer)": drawer_open, "closed(drawer)": drawer_closed,
                       "open(window)": window_open, "closed(window)": window_closed})
        for i, pos in enumerate(cube_pos):
            truths[f"in(cube_{i},drawer)"] = bool(base._is_in_drawer(pos))
    if kind == "puzzle":
        buttons = np.asarray(base._cur_button_states).reshape(-1)
        rows, cols = base._num_rows, base._num_cols
        for i, state in enumerate(buttons):
            color = "blue" if state else "red"
            objects.append(SceneObject(f"button_{i}", f"{_grid_words(i, rows, cols)} button", "button", color,
                                       tuple(map(float, data.site_xpos[base._button_site_ids[i]])), None,
                                       {"state": int(state), "row": i // cols, "col": i % cols}))
            truths[f"blue(button_{i})"] = bool(state == 1)
            truths[f"red(button_{i})"] = bool(state == 0)
    gripper = {"pos_m": tuple(map(float, eff)), "opening": float(info["proprio/gripper_opening"][0]),
               "holding": holding}
    return Scene(objects=tuple(objects), gripper=gripper, truths=truths)


# ------------------------------------------------------------------------------------------ language
_CUBE_TEMPLATES = ("put the {obj} {at}", "move the {obj} {to}", "place the {obj} {at}",
                   "bring the {obj} {to}", "pick up the {obj} and set it down {at}")
_STACK_TEMPLATES = ("put the {a} cube on the {b} one", "stack {a} on {b}", "place the {a} cube on top of the {b} cube",
                    "stack the {a} cube onto the {b} cube", "pick up the {a} cube and put it on the {b} cube")
_PHRASES = {
    "open(drawer)": ("open the drawer", "pull the drawer open", "slide the drawer out"),
    "closed(drawer)": ("close the drawer", "push the drawer shut", "slide the drawer closed"),
    "open(window)": ("open the window", "slide the window open", "push the window open"),
    "closed(window)": ("close the window", "slide the window shut", "push the window closed"),
    "locked(drawer)": ("lock the drawer", "press the drawer button so the drawer is locked", "make sure the drawer is locked"),
    "unlocked(drawer)": ("unlock the drawer", "press the drawer button to unlock the drawer", "make sure the drawer is unlocked"),
    "locked(window)": ("lock the window", "press the window button so the window is locked", "make sure the window is locked"),
    "unlocked(window)": ("unlock the window", "press the window button to unlock the window", "make sure the window is unlocked"),
}
_BUTTON_TEMPLATES = ("turn the {name} {color}", "make the {name} {color}", "switch the {name} to {color}")
_ALL_BUTTONS = ("make all the buttons {color}", "turn every button {color}", "set all the buttons to {color}")


def _pick(options, rng) -> str:
    return options[0] if rng is None else options[int(rng.integers(len(options)))]


def _cube_target(base, i: int) -> np.ndarray:
    return np.asarray(base._data.mocap_pos[base._cube_target_mocap_ids[i]], float)


def describe_predicate(base, kind: str, pred: Predicate, rng=None) -> str:
    """Natural-language text of one sub-goal; `rng` picks a paraphrase (None: the canonical one)."""
    key = str(pred)
    if key in _PHRASES:
        return _pick(_PHRASES[key], rng)
    colors = CUBE_COLORS if kind == "cube" else ("red", "blue")
    if pred.name == "at" and len(pred.args) == 2 and pred.args[0].startswith("cube_"):
        i = int(pred.args[0].split("_")[1])
        if not 0 <= i < _cube_count(base):
            raise UserError(f"unknown object {pred.args[0]!r} in {key}; cubes: cube_0..cube_{_cube_count(base) - 1}")
        target = _cube_target(base, i)
        for j in range(_cube_count(base)):  # stacked on another cube's target?
            below = _cube_target(base, j)
            if j != i and np.linalg.norm(target[:2] - below[:2]) <= 0.02 and 0.03 <= target[2] - below[2] <= 0.05:
                return _pick(_STACK_TEMPLATES, rng).format(a=colors[i], b=colors[j])
        if kind == "scene" and base._is_in_drawer(target):
            at = to = "in the drawer"
        else:
            region = _region_words(target)
            at = _pick(("at the {r} of the table", "on the {r} spot"), rng).format(r=region)
            to = _pick(("to the {r} of the table", "over to the {r} spot"), rng).format(r=region)
        return _pick(_CUBE_TEMPLATES, rng).format(obj=f"{colors[i]} cube", at=at, to=to)
    if pred.name in ("blue", "red") and kind == "puzzle" and len(pred.args) == 1:
        i = int(pred.args[0].split("_")[1])
        name = f"{_grid_words(i, base._num_rows, base._num_cols)} button"
        return _pick(_BUTTON_TEMPLATES, rng).format(name=name, color=pred.name)
    if pred.name == "on" and len(pred.args) == 2:
        a, b = (colors[int(x.split("_")[1])] for x in pred.args)
        return _pick(_STACK_TEMPLATES, rng).format(a=a, b=b)
    raise UserError(f"no description for predicate {key!r} in a {kind} task; sub-goals look like "
                    f"{', '.join(str(p) for p in task_subgoals(base, kind)[:3])}")


def _join(parts: list[str], rng) -> str:
    if len(parts) == 1:
        return parts[0]
    style = 0 if rng is None else int(rng.integers(3))
    if style == 0:
        return ", ".join(parts[:-1]) + " and " + parts[-1]
    if style == 1:
        return "first " + ", then ".join(parts)
    return "; ".join(parts)


def instruction_text(base, kind: str, preds: list[Predicate], rng=None) -> str:
    """One instruction for a set of sub-goals, with paraphrase variety drawn from `rng`."""
    if kind == "puzzle":
        colors = {p.name for p in preds}
        all_preds = task_subgoals(base, kind)
        if len({p.name for p in all_preds}) == 1 and rng is not None and rng.random() < 0.5:
            return _pick(_ALL_BUTTONS, rng).format(color=all_preds[0].name)
        if len(colors) == 1 and len(preds) == len(all_preds):
            return _pick(_ALL_BUTTONS, rng).format(color=colors.pop())
    return _join([describe_predicate(base, kind, p, rng) for p in preds], rng)


# ------------------------------------------------------------------------------------------ observation
class ManipObservation(gymnasium.ObservationWrapper, RecordConstructorArgs):
    """Adds `observation.images.<camera>` (uint8 HWC, shadows/reflections off) and `task` (the
    instruction) to the registry's {"observation.state": ...} dict."""

    def __init__(self, env: gymnasium.Env, images: tuple = (), image_size: int = 64, language: bool = False):
        RecordConstructorArgs.__init__(self, images=tuple(images), image_size=image_size, language=language)
        super().__init__(env)
        self.images, self.image_size, self.language = tuple(images), int(image_size), bool(language)
        obs_spaces = dict(env.observation_space.spaces)
        base = env.unwrapped
        self._renderer = None
        if self.images:
            bad = [c for c in self.images if c not in CAMERAS]
            if bad:
                raise UserError(f"unknown camera(s) {bad}: choose from {', '.join(CAMERAS)}")
            if not 16 <= self.image_size <= 512:
                raise UserError(f"image_size={self.image_size} must be between 16 and 512 pixels")
            wrappers.disable_costly_rendering(env)
            check_gl(base.model)
            self._renderer = _mujoco().Renderer(base.model, height=self.image_size, width=self.image_size)
            for cam in self.images:
                obs_spaces[f"observation.images.{cam}"] = spaces.Box(
                    0, 255, shape=(self.image_size, self.image_size, 3), dtype=np.uint8)
        if self.language:
            obs_spaces["task"] = spaces.Text(max_length=1000, charset=string.printable)
        self.observation_space = spaces.Dict(obs_spaces)

    def observation(self, observation):
        if self._renderer is not None:
            data = self.env.unwrapped._data
            for cam in self.images:
                self._renderer.update_scene(data, camera=cam)
                observation[f"observation.images.{cam}"] = self._renderer.render()
        if self.language:
            observation["task"] = self.env.get_wrapper_attr("current_instruction")()
        return observation

    def close(self):
        if self._renderer is not None:
            self._renderer.close()
            self._renderer = None
        super().close()


def _finish(env: gymnasium.Env) -> gymnasium.Env:
    options = env.get_wrapper_attr("obs_options")
    if options["images"] or options["language"]:
        env = ManipObservation(env, **options)
    return env


# ------------------------------------------------------------------------------------------ registration
def build_manip(spec: TaskSpec, *, render_mode, render_size, task_id=None, images=(), image_size=64,
                language=False, max_episode_steps=None, **kwargs) -> gymnasium.Env:
    if kwargs:
        raise UserError(f"unknown option(s) {sorted(kwargs)} for {spec.name}: use task_id, images, image_size, "
                        "language, max_episode_steps")
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
                     images=tuple(images), image_size=image_size, language=language)


def _spec(name: str, suite: Suite, goal: bool) -> TaskSpec:
    return TaskSpec(
        name=name, gym_id=gym_id(suite), obs_dim=suite.obs_dim * (2 if goal else 1), act_dim=5,
        max_episode_steps=suite.max_episode_steps, ref_min_score=None, ref_max_score=None,
        approximate_normalization=False, has_success=True, sparse=True, success_reward_threshold=None)


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
