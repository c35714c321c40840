"""A task scene for the simulated arm: the OGBench manipulation task the arm stands in, its cameras and
its success test, run inside the sim arm's own process (`robots.sim_server`, config `sim.scene`).

The scene's MuJoCo model is OGBench's (the same UR5e + Robotiq 2F-85 at the world origin, plus the
table, the objects and the cameras), so the server's servo loop drives the very model the
demonstrations were recorded in, and what it publishes is what the task's policies read:

- `state`: the task's flat observation (OGBench's `compute_observation`: joints, effector, objects;
  a privileged sim observation, since a real arm has no object poses),
- `frames`: one uint8 HWC frame per camera, rendered as `sims.make(..., images=...)` renders them
  (shadows and reflections off), so a policy trained on the sims sees the same pixels,
- `success`: the task's own test (every sub-goal holds), and `instruction`: a training-vocabulary
  instruction for the task, used when the operator types none.

In ee_delta mode the scene arm is a Cartesian-controlled arm whose controller is OGBench's
(`apply_ee_delta`): the deltas its policies were trained on move it as they moved it there. The
client's chain limits the delta (step size, workspace box around the measured effector) and the
measured-state monitor checks the executed motion (joint speeds, the box).
"""
from __future__ import annotations

import threading
import time

import numpy as np

from embodied.constants import STATE_KEY, TASK_KEY, image_key
from embodied.errors import ConfigError

SCENE_KEYS = ("suite", "task_id", "cameras", "image_size", "seed")


def find_wrapper(env, cls):
    while env is not None:
        if isinstance(env, cls):
            return env
        env = getattr(env, "env", None)
    raise ConfigError(f"the scene env has no {cls.__name__} layer")


class Scene:
    def __init__(self, suite: str = "cube-single", task_id: int = 1, cameras=("front",), image_size: int = 64,
                 seed: int = 0):
        import sims
        from sims.manip import SUITES, ManipObservation, ManipTask

        if suite not in SUITES:
            raise ConfigError(f"robot.sim.scene.suite={suite!r}; choose one of {', '.join(SUITES)}")
        self.suite, self.cameras, self.image_size = suite, tuple(cameras), int(image_size)
        self.env = sims.make(suite, task_id=int(task_id), images=self.cameras, image_size=self.image_size,
                             language=True)
        self._view = find_wrapper(self.env, ManipObservation) if self.cameras else None
        self._task = find_wrapper(self.env, ManipTask)
        self.obs_dim = SUITES[suite].obs_dim
        self.instruction = ""
        self.reset(int(seed))

    @property
    def model(self):
        return self.env.unwrapped._model

    @property
    def data(self):
        return self.env.unwrapped._data

    def reset(self, seed: int) -> None:
        """OGBench's reset for the task (objects near their start poses, the arm at a sampled pose)."""
        obs, _ = self.env.reset(seed=int(seed))
        self.instruction = str(obs.get(TASK_KEY, ""))

    def task_state(self) -> np.ndarray:
        """The task's flat observation of the current MuJoCo state (cheap: no rendering)."""
        return np.asarray(self.env.unwrapped.compute_observation(), np.float32)

    def success(self) -> bool:
        return bool(self._task.subgoal_truths().all())

    def observe(self) -> tuple[np.ndarray, dict[str, np.ndarray], bool]:
        """The task state, the camera frames (rendered here, on this thread) and the success test."""
        frames = {}
        if self._view is not None:
            obs = self._view.observation({STATE_KEY: self.task_state()})
            frames = {cam: obs[image_key(cam)] for cam in self.cameras}
        return self.task_state(), frames, self.success()

    def apply_ee_delta(self, delta_m, rot_rad, width_m: float, width_max_m: float) -> np.ndarray:
        """OGBench's own Cartesian controller: the target is the measured effector plus the delta (yaw
        only; the gripper keeps pointing down), clipped to OGBench's box, solved by its IK into the arm
        servos' set-points, as `env.step` does. Returns those joint set-points."""
        base = self.env.unwrapped
        opening = float(np.clip(base._data.qpos[base._gripper_opening_joint_id] / 0.8, 0.0, 1.0))
        want = 1.0 - float(np.clip(width_m / width_max_m, 0.0, 1.0))  # OGBench: opening 1 = closed
        action = np.array([*(np.asarray(delta_m, np.float64) / 0.05), float(rot_rad[2]) / 0.3, want - opening])
        base.set_control(np.clip(action, -1.0, 1.0))
        return base._data.ctrl[base._arm_actuator_ids].copy()

    def close(self) -> None:
        self.env.close()


class FrameThread:
    """Renders the scene's cameras on a thread of its own, from a copy of the physics state, so the arm's
    servo loop never waits for a frame: MuJoCo releases the GIL while it renders, and on a CPU without a
    GPU one 64 px frame of this scene costs tens of milliseconds (the physics tick is 2 ms).

    `offer(data, now)` copies the state when the thread is idle and a frame is due; `latest()` is the
    newest frames and the time of the state they show. The renderer (and its GL context) is made on the
    thread, with the options `sims.make(..., images=...)` renders with, so the pixels are the same."""

    def __init__(self, scene: Scene, rate_hz: float):
        import mujoco

        self.mj, self.scene, self.period_s = mujoco, scene, 1.0 / float(rate_hz)
        self._data = mujoco.MjData(scene.model)
        self._wake, self._lock = threading.Event(), threading.Lock()
        self._frames: dict[str, bytes] = {}
        self._t_state_s, self._t_copy_s, self._next_s = 0.0, 0.0, 0.0
        self._busy, self._stop, self.error = False, False, None
        self.rendered = 0
        self._thread = threading.Thread(target=self._run, name="scene-frames", daemon=True)
        self._thread.start()

    def offer(self, data, now: float, force: bool = False) -> bool:
        """Hand the thread the current state if it is idle and a frame is due (or `force`)."""
        if self._busy or (now < self._next_s and not force):
            return False
        self._data.qpos[:], self._data.qvel[:] = data.qpos, data.qvel
        self._data.mocap_pos[:], self._data.mocap_quat[:] = data.mocap_pos, data.mocap_quat
        self._data.time = data.time
        self._t_copy_s, self._next_s, self._busy = now, max(now, self._next_s) + self.period_s, True
        self._wake.set()
        return True

    def due_now(self) -> None:
        """The next `offer` renders as soon as the thread is idle (after a reset)."""
        self._next_s = 0.0

    def latest(self) -> tuple[dict[str, bytes], float]:
        with self._lock:
            return self._frames, self._t_state_s

    def wait_first(self, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        while self.rendered == 0 and time.monotonic() < deadline and self.error is None:
            time.sleep(0.005)
        if self.rendered == 0:
            raise RuntimeError(f"the scene's cameras rendered no frame ({self.error or 'timed out'})")

    def _run(self) -> None:
        renderer = None
        try:
            renderer = self.mj.Renderer(self.scene.model, height=self.scene.image_size, width=self.scene.image_size)
            while not self._stop:
                if not self._wake.wait(0.1):
                    continue
                self._wake.clear()
                self.mj.mj_forward(self.scene.model, self._data)
                frames = {}
                for cam in self.scene.cameras:
                    renderer.update_scene(self._data, camera=cam)
                    frames[cam] = renderer.render().tobytes()
                with self._lock:
                    self._frames, self._t_state_s = frames, self._t_copy_s
                self.rendered += 1
                self._busy = False
        except Exception as err:  # noqa: BLE001  reported by wait_first / the server's state
            self.error = f"{type(err).__name__}: {err}"
        finally:
            if renderer is not None:
                renderer.close()

    def close(self) -> None:
        self._stop = True
        self._wake.set()
        self._thread.join(timeout=2.0)
