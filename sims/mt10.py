"""Meta-World v3 MT10 as one multi-task suite: `sims.make("mt10", task_id=1..10, images=..., language=True)`.

The ten MT10 tasks (`metaworld.env_dict.MT10_V3`, in that order) on the Sawyer arm, with Meta-World's
multi-task settings: the goal is in the 39-d state (MT10's `partially_observable=False`), each reset
draws one of the task's 50 fixed goal/object configurations (the benchmark's train tasks, made with
`benchmark_seed`), and an episode ends at the first step where Meta-World's success test holds (MT10
counts an episode a success if it succeeds at any step). `max_episode_steps` is 200, a CPU count: the
benchmark's is 500 and the scripted policies finish every task here well within 200.

Cameras are named like the OGBench suites' so the VLA's defaults carry over: `front` is Meta-World's
`corner` view (turned upright: that camera is rolled 180 degrees), `top` its `topview`, `gripper` its
`gripperPOV`. Frames are rendered with shadows and reflections off. Each task has training instructions and held-out paraphrases (`variation=paraphrase`);
`variation=positions` draws the start configurations from another 50 (a different benchmark seed).
`reward="success"` replaces the shaped reward with 1.0 at the step that succeeds: with episodes ending at
success, a return-maximiser on the shaped reward can do better hovering next to the goal than finishing.
"""
from __future__ import annotations

import gymnasium
import numpy as np
from gymnasium import spaces
from gymnasium.utils import RecordConstructorArgs

from embodied.errors import UserError
from sims import wrappers
from sims.registry import TaskSpec, register_task

TASKS = ("reach-v3", "push-v3", "pick-place-v3", "door-open-v3", "drawer-open-v3", "drawer-close-v3",
         "button-press-topdown-v3", "peg-insert-side-v3", "window-open-v3", "window-close-v3")
CAMERAS = {"front": "corner", "top": "topview", "gripper": "gripperPOV"}
UPSIDE_DOWN = ("front",)      # Meta-World's corner camera is rolled 180 degrees: turned upright here
VARIATIONS = ("none", "paraphrase", "positions")
REWARDS = ("dense", "success")   # Meta-World's shaped reward, or 1.0 at the step that succeeds (0 otherwise)
MAX_EPISODE_STEPS = 200
BENCHMARK_SEED = 0            # the 50 start configurations per task that training and evaluation share
POSITIONS_SEED = 1000         # variation=positions: 50 others
OBS_DIM, ACT_DIM = 39, 4

# (training instructions, held-out paraphrases) per task, in TASKS order
INSTRUCTIONS = (
    (("reach the red target", "move the gripper to the target", "put the hand on the goal point"),
     ("bring the end effector to the marked spot", "go to the target position")),
    (("push the puck to the target", "slide the puck to the goal", "push the block onto the green spot"),
     ("shove the puck over to the goal mark", "move the puck along the table to the target")),
    (("pick up the puck and place it at the target", "pick and place the puck at the goal",
      "lift the puck and put it on the goal point"),
     ("grab the puck and set it down at the target", "carry the puck through the air to the goal")),
    (("open the door", "pull the door open", "swing the door open"),
     ("open up the cabinet door", "pull on the handle until the door is open")),
    (("open the drawer", "pull the drawer out", "slide the drawer open"),
     ("pull out the drawer by its handle", "get the drawer open")),
    (("close the drawer", "push the drawer shut", "slide the drawer closed"),
     ("push the drawer back in", "shut the open drawer")),
    (("press the button from the top", "push the button down", "press down on the button"),
     ("hit the button from above", "push the top button all the way down")),
    (("insert the peg into the hole from the side", "put the peg in the side hole", "slide the peg into the hole"),
     ("pick up the peg and push it into the box's hole", "fit the peg into the opening on the side")),
    (("open the window", "slide the window open", "push the window to the open side"),
     ("slide the window pane open", "move the window until it is open")),
    (("close the window", "slide the window shut", "push the window closed"),
     ("slide the window pane closed", "move the window until it is shut")),
)


def task_name(task_id: int) -> str:
    return TASKS[int(task_id) - 1]


def instructions(task_id: int, words: str = "train") -> tuple[str, ...]:
    train, heldout = INSTRUCTIONS[int(task_id) - 1]
    return heldout if words == "heldout" else train


def scripted_policy(task_id: int):
    """Meta-World's own scripted policy for the task (`metaworld.policies`): state -> action."""
    from metaworld import policies

    parts = task_name(task_id)[: -len("-v3")].split("-")
    cls = "Sawyer" + "".join(p.capitalize() for p in parts) + "V3Policy"
    cls = {"SawyerPegInsertSideV3Policy": "SawyerPegInsertionSideV3Policy"}.get(cls, cls)
    return getattr(policies, cls)()


def _check_task_id(task_id) -> int:
    if isinstance(task_id, bool) or not isinstance(task_id, (int, np.integer)) or not 1 <= int(task_id) <= len(TASKS):
        raise UserError(f"task_id={task_id!r} for mt10: choose 1..{len(TASKS)} ({', '.join(TASKS)})")
    return int(task_id)


class MT10Task(gymnasium.Wrapper, RecordConstructorArgs):
    """One MT10 task: a flat float32 state, success ends the episode, `info["success"]` a bool."""

    def __init__(self, env: gymnasium.Env, task_id: int, images: tuple = (), image_size: int = 64,
                 language: bool = False, variation: str = "none", reward: str = "dense"):
        RecordConstructorArgs.__init__(self, task_id=task_id, images=tuple(images), image_size=image_size,
                                       language=language, variation=variation, reward=reward)
        super().__init__(env)
        self._task_id = task_id
        self._success_reward = reward == "success"
        self.words = "heldout" if variation == "paraphrase" else "train"
        self.obs_options = dict(images=tuple(images), image_size=int(image_size), language=bool(language))
        self.observation_space = spaces.Box(-np.inf, np.inf, shape=(OBS_DIM,), dtype=np.float32)
        self.action_space = spaces.Box(-1.0, 1.0, shape=(ACT_DIM,), dtype=np.float32)
        self._instruction = ""
        # the start configuration is drawn here, from the reset's seed: Meta-World's own task sampler
        # draws before the seed reaches the env's generator, so `reset(seed=s)` did not fix the start
        self._configs = env.get_wrapper_attr("tasks")
        env.get_wrapper_attr("toggle_sample_tasks_on_reset")(False)
        self._rng = np.random.default_rng()

    def reset(self, *, seed=None, options=None):
        if seed is not None:
            self._rng = np.random.default_rng([int(seed), 5])
            self.env.unwrapped.seed(int(seed))   # Meta-World's reset does not pass its seed on to the env's rng
        self.env.unwrapped.set_task(self._configs[int(self._rng.integers(len(self._configs)))])
        obs, info = self.env.reset(seed=seed, options=options)
        self._instruction = self.instruction(self._rng)
        info["success"] = False
        info["task_id"] = self._task_id
        return np.asarray(obs, np.float32), info

    def step(self, action):
        obs, reward, _, truncated, info = self.env.step(np.asarray(action, np.float32))
        success = bool(info.get("success", 0.0))
        info["success"] = success
        reward = float(success) if self._success_reward else float(reward)
        return np.asarray(obs, np.float32), reward, success, truncated and not success, info

    def task_id(self) -> int:
        return self._task_id

    def instruction(self, rng=None) -> str:
        options = instructions(self._task_id, self.words)
        return options[int(rng.integers(len(options)))] if rng is not None else options[0]

    def current_instruction(self) -> str:
        return self._instruction


class MT10Observation(wrappers.CameraObservation, RecordConstructorArgs):
    """Adds `observation.images.<camera>` (uint8 HWC) and `task` (the instruction) to the state dict."""

    def __init__(self, env: gymnasium.Env, images: tuple = (), image_size: int = 64, language: bool = False):
        RecordConstructorArgs.__init__(self, images=tuple(images), image_size=image_size, language=language)
        from sims.manip import offscreen_renderer

        renderer = offscreen_renderer(env, int(image_size)) if images else None
        super().__init__(env, images, image_size, language, renderer)

    def _draw(self, camera: str) -> np.ndarray:
        self._renderer.update_scene(self.env.unwrapped.data, camera=CAMERAS[camera])
        frame = self._renderer.render()
        return np.ascontiguousarray(frame[::-1, ::-1]) if camera in UPSIDE_DOWN else frame


def _finish(env: gymnasium.Env) -> gymnasium.Env:
    options = env.get_wrapper_attr("obs_options")
    if options["images"] or options["language"]:
        env = MT10Observation(env, **options)
    return env


SPEC = TaskSpec(name="mt10", gym_id="Meta-World/MT1", obs_dim=OBS_DIM, act_dim=ACT_DIM,
                max_episode_steps=MAX_EPISODE_STEPS, ref_min_score=None, ref_max_score=None,
                approximate_normalization=False, has_success=True, sparse=False, num_tasks=len(TASKS))


@register_task(SPEC, finish=_finish)
def build_mt10(spec: TaskSpec, *, render_mode, render_size, task_id=1, images=(), image_size=64, language=False,
               variation="none", reward="dense", max_episode_steps=None, **kwargs) -> gymnasium.Env:
    if kwargs:
        raise UserError(f"unknown option(s) {sorted(kwargs)} for mt10: use task_id, images, image_size, language, "
                        "variation, reward, max_episode_steps")
    task_id = _check_task_id(task_id)
    if reward not in REWARDS:
        raise UserError(f"reward={reward!r} for mt10: choose dense (Meta-World's shaped reward) or success (1.0 at "
                        "the step that succeeds); episodes end at success either way")
    if variation not in VARIATIONS:
        raise UserError(f"variation={variation!r} for mt10: choose one of {', '.join(VARIATIONS)} (the camera, "
                        "lighting and distractor perturbations exist for the OGBench suites only)")
    if isinstance(images, str):
        images = (images,)
    bad = [c for c in images if c not in CAMERAS]
    if bad:
        raise UserError(f"unknown camera(s) {bad} for mt10: choose from {', '.join(CAMERAS)}")
    if images and not 16 <= int(image_size) <= 512:
        raise UserError(f"image_size={image_size} must be between 16 and 512 pixels")
    import metaworld  # noqa: F401  (registers Meta-World/MT1)

    seed = POSITIONS_SEED if variation == "positions" else BENCHMARK_SEED
    size = max(int(render_size), 64)
    env = gymnasium.make("Meta-World/MT1", env_name=task_name(task_id), seed=seed, disable_env_checker=True,
                         max_episode_steps=max_episode_steps or spec.max_episode_steps, render_mode=render_mode,
                         camera_name=CAMERAS["front"], width=size, height=size)
    return MT10Task(env, task_id, images=tuple(images), image_size=image_size, language=language, variation=variation,
                    reward=reward)
