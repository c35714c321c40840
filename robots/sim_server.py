"""The simulated arm's server: a MuJoCo arm in its own process, stepped in real time.

The server process (`python -m robots.sim_server`, started by `robots.sim_arm.SimArm`) steps the
UR5e + Robotiq 2F-85 model (`robots.sim_model`) in real time at `sim.server_rate_hz` (500 Hz, UR's
RTDE rate), tracks joint targets with the model's position servos plus gravity compensation, and
publishes its state every tick. It talks to the controller on 127.0.0.1 with msgpack messages, like a
real arm on a network: commands as length-prefixed frames on a TCP socket that the server's loop reads
itself (so the kernel queues what is sent while the process stalls; `robots.wire.FrameReader`), state
on ZeroMQ PUB/SUB where the reader keeps only the newest message, so a slow reader never sees a stale
backlog. It can misbehave on purpose:

- `latency_ms` + `jitter_ms` (uniform in [0, jitter]) delay commands and state in both directions;
- `drop_prob` drops command and state packets (control messages such as hold/e-stop are reliable,
  as RTDE runs over TCP);
- `noise_q_rad`, `noise_qd_rad_s` add Gaussian sensor noise to the published joint state.

Commands: joint position targets and joint velocities (integrated into targets at the tick rate).
Each holds for one control period, in the order sent (one that arrives early waits for the last one's
period; a backlog over `sim.max_pending_cmds` drops the oldest), reached through an
acceleration-limited ramp; with no next command the reference brakes at the acceleration limit, which
is the stopping path the safety chain checked, half a period later. Position commands feed forward
the velocity the chain planned (`Command.velocity_rad_s`) and only trim it by the position error. A
tick late by more than a tick is caught up, so the arm keeps the wall clock the commands are timed on,
and each tick takes only the commands sent by the time it simulates (`_receive`).
End-effector deltas never reach the server: the client solves them to joint targets
(`ArmModel.ik`, damped least squares at the pinch site) and those pass the joint safety checks first.
The server has its own state: `run` follows commands; `hold` brakes the targets at the acceleration
limit, keeps the position where they stop and ignores commands until `arm`; `estop` stops at once
and waits for `recover`, which it takes only once the arm rests (`_release_stop`). Like a real arm it
has its own command deadline: in `run`, no command for `watchdog_deadline_ms` is a hold with
`hold_reason: watchdog`, whatever happens to the controller.
It also measures what it executes (peak joint speed and acceleration over a control period against the
limits, the furthest the pinch site got outside the workspace box) and publishes the peaks with the
state, for the fuzz benchmarks (`reset_peaks` clears them).

With `sim.scene` (`robots.sim_scene`: an OGBench task, its cameras, its success test) the server steps
the task's own model instead of the bare arm, starts from the task's reset pose; in ee_delta mode it
executes each delta with OGBench's own Cartesian controller (`Scene.apply_ee_delta`), so the deltas a
policy learnt there move the arm as they did there (the joint-mode servo loop is not used). It renders the cameras
in this process every `sim.image_rate_hz` (default: the control rate), and publishes the frames, the
task state and the success flag with every state message; `reset_scene` (with a seed) resets the task.
Gripper contacts with the scene (a grasp, the table) are not collisions; an arm link's are.
"""
from __future__ import annotations

import argparse
import collections
import heapq
import json
import os
import socket
import time

import msgpack
import mujoco
import numpy as np
import zmq

from robots.geometry import box_distance_m
from robots.sim_model import GRIPPER_OPEN_M, ArmModel
from robots.types import ControlMode, RobotConfig
from robots.wire import FrameReader

MAX_COMMAND_BYTES = 1 << 16  # a command frame over this closes the link


def _sent_s(msg: dict, now: float) -> float:
    """When a command was sent (`t_send_s`), never later than `now`; `now` if it does not say."""
    try:
        sent = float(msg.get("t_send_s", now))
    except (TypeError, ValueError):
        return now
    return min(now, sent) if sent == sent else now  # NaN: now


class SimArmServer:
    def __init__(self, config: RobotConfig, port: int = 0):
        self.mj = mujoco
        self.config = config
        sim = config.sim
        self.rate_hz = float(sim.get("server_rate_hz", 500.0))
        self.latency_s = float(sim.get("latency_ms", 0.0)) / 1e3
        self.jitter_s = float(sim.get("jitter_ms", 0.0)) / 1e3
        self.drop_prob = float(sim.get("drop_prob", 0.0))
        self.noise_q = float(sim.get("noise_q_rad", 0.0))
        self.noise_qd = float(sim.get("noise_qd_rad_s", 0.0))
        self.rng = np.random.default_rng(int(sim.get("seed", 0)))
        self.scene = None
        if sim.get("scene"):  # a task scene (objects, cameras, success): its model is the arm's model
            from robots.sim_scene import SCENE_KEYS, Scene

            scene = dict(sim["scene"])
            unknown = sorted(set(scene) - set(SCENE_KEYS))
            if unknown:
                raise ValueError(f"robot.sim.scene has unknown keys {unknown}; valid: {list(SCENE_KEYS)}")
            self.scene = Scene(**scene)
            self.arm = ArmModel(self.scene.model)
            self.model, self.data = self.scene.model, self.scene.data
        else:
            self.arm = ArmModel()
            self.model, self.data = self.arm.model, mujoco.MjData(self.arm.model)
            home = np.asarray(sim.get("start_joint_pos_rad", config.home_joint_pos_rad), np.float64)
            self.data.qpos[:6] = home
        # a scene in ee_delta mode is a Cartesian-controlled arm: OGBench's controller executes the deltas
        self.cartesian = self.scene is not None and config.mode is ControlMode.EE_DELTA
        self.substeps = max(1, int(round(1.0 / self.rate_hz / self.model.opt.timestep)))
        mujoco.mj_forward(self.model, self.data)
        home = self.data.qpos[:6].copy()  # the scene's reset pose, or the configured start
        if self.cartesian:
            self.data.ctrl[:6] = home  # the Cartesian controller holds the reset pose (OGBench leaves ctrl at 0)
        self.target = home.copy()       # the joint reference the servos track ...
        self.target_vel = np.zeros(6)   # ... and its velocity (feed-forward)
        self.braking = False                 # the command's period ended with no next one: brake
        self.ramp_step, self.ramp_ticks = np.zeros(6), 0  # a new velocity is reached over one period
        self.pending: collections.deque = collections.deque()  # commands received, not yet started
        self.period_ticks = 0   # ticks left of the period of the command being executed
        act = self.model.actuator_gainprm[:6, 0]
        self._rne = np.zeros(self.model.nv)
        self.servo_lead_s = -self.model.actuator_biasprm[:6, 2] / act  # kv / kp of the position servos
        self.grip_ctrl = 0.0
        self.mode, self.t_hold_s = "hold", None
        # commands: one controller on a plain TCP socket this loop reads itself (`robots.wire.FrameReader`),
        # so what is sent while the process stalls is queued by the kernel and met when due (`_receive`)
        self.listener = socket.create_server(("127.0.0.1", port))
        self.listener.setblocking(False)
        self.port = self.listener.getsockname()[1]
        self.link: FrameReader | None = None
        self.ctx = zmq.Context()
        addr = "tcp://127.0.0.1"
        # state goes out on PUB: a slow or absent reader never builds a backlog here (PUB drops), and the
        # reader's SUB keeps only the newest message (CONFLATE), so a reading is never an old queued one
        self.pub = self.ctx.socket(zmq.PUB)
        self.pub.setsockopt(zmq.LINGER, 0)
        self.pub.setsockopt(zmq.SNDHWM, 64)
        self.state_port = self.pub.bind_to_random_port(addr)
        self.inbox: list = []   # heap of (due_s, seq, message)
        self.outbox: list = []
        self.n = 0
        self.stats = {"cmds": 0, "cmds_dropped": 0, "states_dropped": 0, "cmds_ignored": 0, "overruns": 0,
                      "last_cmd_seq": -1, "last_ctrl_seq": -1,   # last_ctrl_seq: the `ctrl_seq` of the last recover applied
                      "last_arm_seq": -1}   # the `ctrl_seq` of the last arm op that put the arm in run
        self.lo, self.hi = np.asarray(config.joint_pos_min_rad), np.asarray(config.joint_pos_max_rad)
        self.vmax = np.asarray(config.joint_vel_max_rad_s)
        # the servo set-point is the reference plus its velocity lead (`servo_lead_s * target_vel`): the
        # model's ctrlrange (the joint range) clipped that lead within `servo_lead_s * v` of a joint limit
        # (0.2 rad at 1 rad/s), so there the servos lagged the reference by that much, and the arm reached
        # the stop the reference made at the limit late and on its own PD dynamics (issue 14). The
        # reference itself stays inside the joint limits (unless a collision left the arm past one: then it
        # only moves back in, see `_physics`); only the set-point may lead past them.
        lead = self.servo_lead_s * self.vmax + 1e-3
        rng = self.model.actuator_ctrlrange[:6]
        rng[:, 0] = np.minimum(rng[:, 0], self.lo - lead)
        rng[:, 1] = np.maximum(rng[:, 1], self.hi + lead)
        # the model's joint range is the arm's mechanical stop; the configured limits (the safety chain's
        # and the reference's) are software limits, and on a real arm those lie inside the hard stops.
        # Here they were the same numbers, so a reference braking to rest at the limit drove the arm, a
        # few mrad off its reference, into the stop's constraint: 1.17-1.25x the acceleration limit
        # measured on wrist 2 at -2 pi (issue 14). The stops are put `hard_stop_margin_rad` beyond.
        margin = float(sim.get("hard_stop_margin_rad", 0.05))
        jr = self.model.jnt_range[:6]
        jr[:, 0] = np.minimum(jr[:, 0], self.lo - margin)
        jr[:, 1] = np.maximum(jr[:, 1], self.hi + margin)
        # mj_rne leaves out the joints' armature (the rotor inertia, 0.1 kg m^2 here): the feed-forward
        # adds it, or the wrist joints, whose links weigh little against it, got almost none and their
        # servos lagged by 1-3 mrad whenever the reference accelerated
        self._armature = self.model.dof_armature[:6].copy()
        self.amax = np.asarray(config.joint_acc_max_rad_s2)
        self.deadline_s = float(config.watchdog_deadline_ms) / 1e3
        self.last_cmd_s, self.last_cmd_sent_s, self.hold_reason = 0.0, None, "start"
        self.box_lo, self.box_hi = np.asarray(config.workspace_min_m), np.asarray(config.workspace_max_m)
        window = max(1, int(round(config.period_s * self.rate_hz)))
        self._qd_window: list = []     # joint velocities over the last control period, per tick
        self._window = window
        n = window * self.substeps
        self._ramp_lag = (n - 1) / (2.0 * n)  # the ramp's lag behind the commanded path, in periods
        gripper = {i for i in range(self.model.nbody) if self.model.body(i).name.startswith("ur5e/robotiq")}
        robot = {i for i in range(self.model.nbody) if self.model.body(i).name.startswith("ur5e/")}
        self._geom_in_gripper = np.array([self.model.geom_bodyid[g] in gripper for g in range(self.model.ngeom)])
        self._geom_in_robot = np.array([self.model.geom_bodyid[g] in robot for g in range(self.model.ngeom)])
        # a scene's task state and success test go out with every state message; its camera frames are
        # rendered on a thread of their own (`FrameThread`) at up to `image_rate_hz` (default: the control
        # rate), each sent with the time of the state it shows
        self.snapshot, self.frames = {}, None
        if self.scene is not None:
            from robots.sim_scene import FrameThread

            self.frames = FrameThread(self.scene, float(sim.get("image_rate_hz", config.control_rate_hz)))
            self.frames.offer(self.data, time.monotonic(), force=True)
            self.frames.wait_first()
            self._snapshot(time.monotonic())
        self._in_contact, self._contact_ticks = False, 0
        # a contact that is already there when the arm is armed (it began during a hold, or outlasted an
        # e-stop) is no new collision, but pushing on into it is: the servos' position error grows while
        # the contact pins the arm, and when the contact lets go the arm springs to its reference (10x
        # the acceleration limit and 1.5x the speed limit measured in the fuzz). A reference this far
        # from the arm during a contact is a protective stop too, as a force limit would make one
        self.contact_deviation_rad = float(sim.get("contact_deviation_rad", 0.005))
        self.stats["collision_stops"] = 0
        self.stats["cmds_superseded"] = 0  # dropped from a backlog over `max_pending` (bounds the delay)
        self.max_pending = int(sim.get("max_pending_cmds", 3))
        self._recover_pending, self.settle_s = False, float(sim.get("estop_settle_ms", 300.0)) / 1e3
        self.max_catch_up_s = float(sim.get("max_catch_up_ms", 100.0)) / 1e3
        # joint_position with the planned velocity: a position error is made up over `catch_up_s`, at
        # most `catch_up` of the speed limit faster or slower than planned
        self.catch_up, self.catch_up_s = float(sim.get("catch_up", 0.02)), float(sim.get("catch_up_ms", 50.0)) / 1e3
        self.stats["time_lost_s"] = 0.0  # simulated time given up after stalls over max_catch_up_s
        # a collision can push the arm out of the box (it is not counted while in contact): the excess where
        # it leaves a stopped arm is the collision's, reported as `peak_box_displaced_m`, and the controller's
        # excess is counted beyond it, as the client's monitor counts from where the arm was armed. That
        # allowance only shrinks as the arm comes back in (a loaded fuzz: 29.6 mm counted for an arm
        # resting where a self-collision left it, 28 ms after the touch)
        self._box_displaced_m = 0.0
        self.peaks = {"peak_speed_ratio": 0.0, "peak_acc_ratio": 0.0, "peak_acc_joint": -1, "peak_box_excess_m": 0.0,
                      "peak_box_displaced_m": 0.0,
                      "peak_cmd_late_s": 0.0}  # the latest a command was met after it was due (see `_receive`)
        # what the arm was doing at the tick of the largest box excess since the last reset (`_measure`):
        # the fuzz benchmark attributes an excursion with it, not by guessing from what ended the stretch
        self.peak_box_at: dict = {}
        self.peak_acc_at: dict = {}   # the same at the largest acceleration, with that joint's velocities
        self._tick_s, self._cmd_started_s, self._cmd_late_s = 0.0, None, 0.0
        # when the arm was last armed, released from an e-stop, and touching anything (a grasp-like
        # touch of the gripper included): `_moment` reports them, to attribute a peak to its cause
        self._t_arm_s = self._t_release_s = self._t_touch_s = None

    def _stop(self, now: float, op: str, reason: str) -> None:
        """hold: the reference brakes from its own speed at the acceleration limit (a controlled stop,
        like servoStop/speedStop); estop: the reference is frozen where the arm is (a category-0 stop)."""
        if self.mode == "estop" and op == "hold":
            return  # an e-stop is only left through recover
        self.ramp_ticks, self.period_ticks = 0, 0
        self.pending.clear()
        if op == "estop":
            self.target, self.target_vel = self.data.qpos[:6].copy(), np.zeros(6)
            self._recover_pending = False
        if self.cartesian:  # the Cartesian controller stops where the arm is
            self.data.ctrl[:6] = self.target = self.data.qpos[:6].copy()
        if self.mode != op or op == "estop":
            self.mode, self.t_hold_s, self.hold_reason = op, now, reason

    def _ramp_to(self, vel: np.ndarray) -> None:
        """Reach `vel` at constant acceleration over one control period (or longer, never above the
        acceleration limit), the way servo interpolators do, instead of a step at the 2 ms tick."""
        dt = self.model.opt.timestep
        delta = vel - self.target_vel
        # never faster than the acceleration limit, even when two commands arrive close together (the
        # server catching up after a stall of its own)
        self.ramp_ticks = max(self._window * self.substeps, int(np.ceil(np.max(np.abs(delta) / (self.amax * dt)) - 1e-9)))
        self.ramp_step = delta / self.ramp_ticks

    def _execute(self, mode: str, values: np.ndarray, width: float, planned: np.ndarray | None) -> None:
        """Start a command's period: ramp to its velocity, brake after the period if no next one.

        joint_position: the reference is kept a fixed delay behind the commanded path. The ramp from u
        to w over the n ticks of a period moves (a u + (1 - a) w) dt, a = (n - 1) / 2n (about half a
        period), and should end a w dt short of the goal: w = (goal - target - a u dt) / dt. Where the
        client sends the velocity the chain planned (`planned`, Command.velocity_rad_s), that is fed
        forward and the position error only trims it: a reference ahead of the path slows down by up to
        one acceleration step a period, one behind it (a tick of this loop late, a command that came a
        tick late, the limits leaving no room to make it up) is sped up by at most `catch_up` of the
        speed limit, so it follows the chain's speeds a little later and at a stop the chain planned
        arrives no faster than planned. Correcting the whole error in a period,
        as heading for each target in one period did, left such a lag to grow while the chain used the
        full speed and acceleration, then caught it up faster than the chain moved, and braked past the
        stop the workspace filter had planned at the wall, out of the box (issue 14)."""
        dt = self.config.period_s
        if mode == ControlMode.JOINT_POSITION.value:
            goal = np.clip(values, self.lo, self.hi)
            vel = (goal - self.target - self._ramp_lag * self.target_vel * dt) / dt
            if planned is not None and planned.shape == vel.shape and np.all(np.isfinite(planned)):
                error = vel - planned  # the position error, per period
                slower = error * planned < 0  # ahead of the path: slowing down is always on the safe side
                trim = self.catch_up * self.vmax
                vel = planned + np.where(slower, np.clip(error, -self.amax * dt, self.amax * dt),
                                         np.clip(error * dt / self.catch_up_s, -trim, trim))
            self._ramp_to(vel / max(1.0, float(np.max(np.abs(vel) / self.vmax))))  # scaled: stay on the line
        else:
            self._ramp_to(np.clip(values, -self.vmax, self.vmax))
        self.braking, self.period_ticks = False, self._window * self.substeps
        self._cmd_started_s = self._tick_s
        self.grip_ctrl = 255.0 * (1.0 - np.clip(width / GRIPPER_OPEN_M, 0.0, 1.0))

    def _arm_contact(self) -> bool:
        """A contact between arm links, between the arm and the gripper, or between an arm link and the
        scene. The fingers touching each other, or the gripper touching the scene's objects and table,
        is a grasp, not a collision."""
        grip, robot = self._geom_in_gripper, self._geom_in_robot
        for i in range(self.data.ncon):
            c = self.data.contact[i]
            g1, g2 = c.geom1, c.geom2
            if (grip[g1] and grip[g2]) or not (robot[g1] or robot[g2]):
                continue   # the fingers on each other, or scene objects among themselves
            self._t_touch_s = self._tick_s   # a grasp-like touch too: no collision, but it can pin the arm
            if not ((grip[g1] and not robot[g2]) or (grip[g2] and not robot[g1])):
                return True
        return False

    def _snapshot(self, now: float) -> None:
        """The scene's task state and success test now, and the newest camera frames, for the state
        message (the reader keeps only the newest message, so each one carries them)."""
        self.frames.offer(self.data, now)
        frames, t_frame = self.frames.latest()
        size = self.scene.image_size
        self.snapshot = {"task_state": self.scene.task_state().tolist(), "frames": frames,
                         "frame_shape": [size, size, 3], "t_frame_s": t_frame, "success": self.scene.success(),
                         "instruction": self.scene.instruction, "frames_rendered": self.frames.rendered}

    def _release_stop(self, now: float) -> None:
        """A recover releases an e-stop (a category-0 stop: the reference frozen where the arm was) only
        once the arm has come to rest and out of contact, or at rest in contact after `settle_s`: leaving
        it while the arm still sprang back to the frozen reference counted that impact's tail as the
        controller's acceleration."""
        # an arm that still moves is never released, as a real arm does not resume from a protective stop
        # while moving: the timeout released a self-collision's spring-back at 0.13 rad/s and the hold
        # yanked it to the frozen reference (1.28x in a loaded fuzz, 6x in
        # test_a_recover_while_the_arm_still_moves_waits_for_rest); a hold that took over the moving arm's
        # speed instead was re-armed while braking from a stale measured speed (1.06x in 2 of 6 runs)
        if self.mode == "estop" and self._recover_pending and float(np.max(np.abs(self.data.qvel[:6]))) < 0.02 and (
                not self._contact_ticks or now - (self.t_hold_s or now) > self.settle_s):
            self.mode, self._recover_pending, self._t_release_s = "hold", False, now
            if not self.cartesian:   # the hold starts where the resting arm is, not where the stop froze it
                self.target = self.data.qpos[:6].copy()
                self.target_vel = np.zeros(6)
            # the stop itself is not the controller's motion (a category-0 stop is harder than the
            # acceleration limit): the acceleration window starts again after it, instead of spanning
            # the stop's last ticks (measured: 2.1x on the first tick after a release)
            self._qd_window = []

    def _reanchor_after_contact(self) -> None:
        """A contact that ends lets go of an arm it held back: the reference went on without it (a few
        mrad, up to `contact_deviation_rad`, and the speed the friction took), and the servos sprang the
        arm to it once free, faster than the acceleration limit (1.05-1.10x in loaded fuzzes 20 ms after
        the touch, 1.50x in tests/robots/test_executed_motion.py). The reference is moved to the arm as it
        is, with its speed, and ramps from there to the command's velocity at the acceleration limit, as
        a bumpless transfer does; a brake brakes on from the arm's speed. This only ever lowers the
        servo force against a contact, so it cannot weaken the collision check."""
        if self.ramp_ticks:
            goal = self.target_vel + self.ramp_ticks * self.ramp_step
        else:
            goal = None if self.braking or self.mode == "hold" else self.target_vel.copy()
        self.target = self.data.qpos[:6].copy()   # past a joint limit too: from there it only moves back in
        self.target_vel = self.data.qvel[:6].copy()
        self.ramp_ticks = 0
        if goal is not None:
            self._ramp_to(goal)

    def _measure(self, now: float) -> None:
        """Peaks of the executed motion; a self-collision is a protective stop (as UR's collision
        detection makes one), and its impact is counted there, not as a controller overshoot."""
        d = self.data
        self._release_stop(now)
        contact = self._arm_contact()
        if contact and self.mode == "run" and (not self._in_contact or float(
                np.max(np.abs(self.target - d.qpos[:6]))) > self.contact_deviation_rad):
            self.stats["collision_stops"] += 1
            self._stop(now, "estop", "self-collision")
        if self._in_contact and not contact and self.mode in ("run", "hold") and not self.cartesian:
            self._reanchor_after_contact()
        self._in_contact = contact
        self._contact_ticks = 2 * self._window if contact else max(0, self._contact_ticks - 1)
        qd = d.qvel[:6].copy()
        if not self._contact_ticks:
            self.peaks["peak_speed_ratio"] = max(self.peaks["peak_speed_ratio"], float(np.max(np.abs(qd) / self.vmax)))
        self._qd_window.append(qd)
        if len(self._qd_window) > self._window:
            old = self._qd_window.pop(0)
            acc = (qd - old) / (self._window / self.rate_hz)
            ratio = np.abs(acc) / self.amax
            if self.mode != "estop" and not self._contact_ticks and ratio.max() > self.peaks["peak_acc_ratio"]:
                joint = int(ratio.argmax())
                self.peaks["peak_acc_ratio"], self.peaks["peak_acc_joint"] = float(ratio.max()), joint
                self.peak_acc_at = {**self._moment(now, qd), "joint": joint,
                                    "window_vel_rad_s": [round(float(old[joint]), 4), round(float(qd[joint]), 4)],
                                    "target_vel_rad_s": round(float(self.target_vel[joint]), 4)}
        excess = box_distance_m(d.site_xpos[self.arm.site], self.box_lo, self.box_hi)
        if self._contact_ticks:  # a collision's impact and its stop are counted as collision_stops
            # stopped (a collision's e-stop, a hold), the impact moves the arm; running in a contact, the
            # controller may, so what it drives out then is counted once the contact is over
            self._box_displaced_m = excess if self.mode != "run" else min(self._box_displaced_m, excess)
            self.peaks["peak_box_displaced_m"] = max(self.peaks["peak_box_displaced_m"], excess)
            return
        self._box_displaced_m = min(self._box_displaced_m, excess)
        excess -= self._box_displaced_m
        if excess > self.peaks["peak_box_excess_m"]:
            self.peaks["peak_box_excess_m"] = excess
            self.peak_box_at = self._moment(now, qd)

    def _moment(self, now: float, qd: np.ndarray) -> dict:
        """What the arm is doing this tick, for attributing a peak to its cause."""
        ms = lambda t: None if t is None else round(1e3 * (now - t), 1)
        error = np.abs(self.target - self.data.qpos[:6])
        return {"mode": self.mode, "braking": bool(self.braking), "ramping": bool(self.ramp_ticks),
                "since_command_started_ms": ms(self._cmd_started_s), "since_last_command_ms": ms(self.last_cmd_s),
                "since_hold_ms": ms(self.t_hold_s), "since_arm_ms": ms(self._t_arm_s),
                "since_release_ms": ms(self._t_release_s), "since_touch_ms": ms(self._t_touch_s),
                "last_command_late_ms": round(1e3 * self._cmd_late_s, 1),
                "pending": len(self.pending),
                "tracking_error_mrad": round(1e3 * float(error.max()), 1), "tracking_error_joint": int(error.argmax()),
                "speed_ratio": round(float(np.max(np.abs(qd) / self.vmax)), 3)}

    def _delay(self) -> float:
        return self.latency_s + (self.rng.uniform(0, self.jitter_s) if self.jitter_s > 0 else 0.0)

    def _receive(self, now: float, tick_s: float) -> bool:
        """Take what arrived, and apply what is due by `tick_s`, the wall-clock time this tick simulates.

        A command is due when it was sent (`t_send_s`, the controller's clock, which is this machine's
        monotonic clock; never later than its arrival) plus the injected delay, not when this loop read
        it: a real arm's controller runs in real time and meets each command at the time it came. This
        loop is not real time; after a stall it runs the missed ticks back to back, and reading the
        commands sent meanwhile at the first of those ticks executed them early, back to back with no
        stop between, where the chain, which had seen them come late, aged its reference along the stop
        the arm should have made. In joint_velocity mode nothing anchors that difference, so it added
        up: in a loaded fuzz the arm at rest sat a median 6 mrad (up to 31) from where the chain had it
        (1.2 after this change), the likely source of the 39 mm box excess of issue 14's fuzz. Other
        messages are due at once.

        The command socket is read here, not by a ZeroMQ I/O thread: that thread stopped with this loop
        and handed over the commands sent during a stall only after the missed ticks had run, so they
        were met 10-50 ms late (`peak_cmd_late_s`); the kernel queues them on a plain socket, so the
        first catch-up tick sees them all. (Sleeping 2 ms before catching up also met them, but made every
        short delay longer on a loaded machine.)"""
        for raw in self._frames():
            try:
                msg = msgpack.unpackb(raw, raw=False)
                op = msg["op"]
            except Exception:  # noqa: BLE001  garbage on the wire is ignored, never fatal
                continue
            if op == "cmd" and self.drop_prob > 0 and self.rng.random() < self.drop_prob:
                self.stats["cmds_dropped"] += 1
                continue
            self.n += 1
            start = tick_s
            if op == "cmd":
                start = msg["t_send_s"] = _sent_s(msg, now)  # read once; `_apply` takes it from here
            heapq.heappush(self.inbox, (start + self._delay(), self.n, msg))
        while self.inbox and self.inbox[0][0] <= tick_s:
            due_s, _, msg = heapq.heappop(self.inbox)
            if msg["op"] == "cmd":
                self._cmd_late_s = tick_s - due_s
                self.peaks["peak_cmd_late_s"] = max(self.peaks["peak_cmd_late_s"], self._cmd_late_s)
            if not self._apply(msg, tick_s):
                return False
        return True

    def _frames(self) -> list[bytes]:
        """The command frames that arrived; the first controller to connect is the only one served."""
        if self.link is None and self.listener is not None:
            try:
                conn, _ = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return []
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.link = FrameReader(conn, MAX_COMMAND_BYTES)
            self.listener.close()
            self.listener = None
        return [] if self.link is None else self.link.read()

    def _apply(self, msg: dict, now: float) -> bool:
        op = msg["op"]
        q = self.data.qpos[:6].copy()
        if op == "close":
            return False
        if op == "cmd":
            self.stats["cmds"] += 1
            self.stats["last_cmd_seq"] = int(msg.get("seq", -1))
            if self.mode != "run":
                self.stats["cmds_ignored"] += 1
                return True
            mode = msg["mode"]
            joint_modes = (ControlMode.JOINT_POSITION.value, ControlMode.JOINT_VELOCITY.value)
            if mode not in ((ControlMode.EE_DELTA.value,) if self.cartesian else joint_modes):
                self.stats["cmds_ignored"] += 1  # the client solves ee deltas to joint targets
                return True
            self.last_cmd_s, self.last_cmd_sent_s = now, msg["t_send_s"]  # due by now, so sent by now
            # each command holds for one period, in the order sent: one that arrives while the last one's
            # period still runs (a late tick of this loop, delivery jitter) waits for it instead of cutting
            # it short, so a bunch of arrivals is executed as the path the chain planned, a little later,
            # and not as a jump the reference can only catch up at the speed and acceleration limits
            if len(self.pending) >= self.max_pending:
                self.pending.popleft()
                self.stats["cmds_superseded"] += 1
            vel = msg.get("vel")
            self.pending.append((mode, np.asarray(msg["values"], np.float64), float(msg["gripper_width_m"]),
                                 None if vel is None else np.asarray(vel, np.float64)))
        elif op in ("hold", "estop"):
            self._stop(now, op, "client")
        elif op == "arm":
            if self.mode == "hold":  # still braking from a hold: keep braking, the client's chain knows
                self.stats["last_arm_seq"] = int(msg.get("ctrl_seq", -1))
                self.mode, self.braking, self.ramp_ticks, self.period_ticks = "run", True, 0, 0
                self.pending.clear()
                if not np.any(self.target_vel):
                    self.target = q
                self.last_cmd_s, self.last_cmd_sent_s, self.hold_reason, self._t_arm_s = now, None, None, now
        elif op == "recover":
            self.stats["last_ctrl_seq"] = int(msg.get("ctrl_seq", self.stats["last_ctrl_seq"]))
            if self.mode == "estop":
                self._recover_pending = True  # released once the stop is over (`_release_stop`)
        elif op == "reset":
            self.data.qpos[:6] = np.asarray(msg["joint_pos_rad"], np.float64)
            self.data.qvel[:] = 0
            self.mj.mj_forward(self.model, self.data)
            self.target, self.target_vel, self.mode = self.data.qpos[:6].copy(), np.zeros(6), "hold"
            self._recover_pending = False
            self.pending.clear()
            self.ramp_ticks = self.period_ticks = 0
            self.hold_reason, self._qd_window = "reset", []
        elif op == "reset_scene" and self.scene is not None:
            self.scene.reset(int(msg.get("seed", 0)))  # OGBench's reset: objects and arm to a start pose
            self.data = self.scene.data
            self.target, self.target_vel, self.mode = self.data.qpos[:6].copy(), np.zeros(6), "hold"
            self.grip_ctrl, self._recover_pending = 0.0, False
            self.data.ctrl[:6] = self.target
            self.pending.clear()
            self.ramp_ticks = self.period_ticks = 0
            self.hold_reason, self._qd_window = "reset", []
            self.frames.due_now()  # the next frame shows the new scene
        elif op == "reset_peaks":
            self.peaks, self.peak_box_at, self.peak_acc_at = dict.fromkeys(self.peaks, 0.0), {}, {}
        elif op == "set":
            for key in ("latency_ms", "jitter_ms"):
                if key in msg:
                    setattr(self, key.replace("_ms", "_s"), float(msg[key]) / 1e3)
            for key, attr in (("drop_prob", "drop_prob"), ("noise_q_rad", "noise_q"), ("noise_qd_rad_s", "noise_qd")):
                if key in msg:
                    setattr(self, attr, float(msg[key]))
        return True

    def _state(self, now: float) -> dict:
        d = self.data
        q = d.qpos[:6].copy()
        qd = d.qvel[:6].copy()
        if self.noise_q > 0:
            q += self.rng.normal(0, self.noise_q, 6)
        if self.noise_qd > 0:
            qd += self.rng.normal(0, self.noise_qd, 6)
        quat = np.zeros(4)
        self.mj.mju_mat2Quat(quat, d.site_xmat[self.arm.site])
        return {"op": "state", "t_s": now, "joint_pos_rad": q.tolist(), "joint_vel_rad_s": qd.tolist(),
                "ee_pos_m": d.site_xpos[self.arm.site].tolist(), "ee_quat_wxyz": quat.tolist(),
                "gripper_width_m": self.arm.gripper_width(d), "mode": self.mode, "t_hold_s": self.t_hold_s,
                "hold_reason": self.hold_reason, "last_cmd_sent_s": self.last_cmd_sent_s,
                "target_rad": self.target.tolist(), "target_vel_rad_s": self.target_vel.tolist(), **self.stats, **self.peaks,
                "peak_box_at": self.peak_box_at, "peak_acc_at": self.peak_acc_at,
                **self.snapshot}

    def _physics_cartesian(self) -> None:
        """A scene in ee_delta mode: each command's delta goes to OGBench's controller at the start of its
        period (its IK sets the servos' set-points) and the physics runs on them, as in `env.step`."""
        for _ in range(self.substeps):
            if self.mode == "run" and self.period_ticks == 0 and self.pending:
                _, values, width, _ = self.pending.popleft()
                self.target = self.scene.apply_ee_delta(values[:3], values[3:6], width,
                                                        self.config.gripper_width_max_m)
                self.period_ticks = self._window * self.substeps
            self.period_ticks = max(0, self.period_ticks - 1)
            self.mj.mj_step(self.model, self.data)

    def _physics(self) -> None:
        if self.cartesian:
            return self._physics_cartesian()
        d = self.data
        dt = self.model.opt.timestep
        for _ in range(self.substeps):
            if self.mode == "run" and self.period_ticks == 0 and self.pending:
                self._execute(*self.pending.popleft())
            self.period_ticks = max(0, self.period_ticks - 1)
            prev_vel = self.target_vel.copy()
            if self.mode == "run" and self.ramp_ticks > 0:  # constant acceleration to the new velocity
                self.target_vel = self.target_vel + self.ramp_step
                self.ramp_ticks -= 1
            elif self.mode == "run":
                # the command's period is over and no next one came: brake at the acceleration limit.
                # That is the chain's stopping path (the velocity held for a period, then braked) delayed
                # by the ramp's half period, in both joint modes
                self.braking = True
            if self.mode == "hold" or (self.braking and self.ramp_ticks == 0):  # at the acceleration limit
                self.target_vel = np.sign(self.target_vel) * np.maximum(np.abs(self.target_vel) - self.amax * dt, 0)
            # the reference keeps its own joint limits: towards a limit it is never faster than it can
            # brake from at the acceleration limit in whole ticks (v dt + (v - a dt) dt + ... <= room:
            # v^2 / 2a + v dt / 2 <= room), so it comes to rest there. The
            # chain plans the same stop, but its reference is aged by the time between commands while
            # here each queued command runs one period back to back; when that made the reference
            # lag the chain's deceleration, it reached the limit at up to 0.4 rad/s and was clipped
            # there, an instant stop the arm then made on its servos (1.09x in the fuzz, issue 14)
            room = np.where(self.target_vel > 0, self.hi - self.target, self.target - self.lo)
            half = 0.5 * self.amax * dt
            cap = np.sqrt(half * half + 2.0 * self.amax * np.maximum(room, 0.0)) - half
            self.target_vel = np.clip(self.target_vel, -cap, cap)
            if np.any(self.target_vel):
                # a reference past a limit (the hold took an arm a collision pushed there) stays where it
                # is until commanded back, and never moves further out: clipping it onto the limit was a
                # step of up to the hard-stop margin in one tick (2.55x the acceleration limit, issue 14)
                self.target = np.clip(self.target + self.target_vel * dt, np.minimum(self.lo, self.target),
                                      np.maximum(self.hi, self.target))
            # PD tracking of the reference: the velocity feed-forward cancels the servos' damping lag, and
            # inverse dynamics of the reference acceleration (gravity and coupling included) is fed forward,
            # as arm controllers do, so one joint's acceleration does not shake the others
            d.ctrl[:6] = self.target + self.servo_lead_s * self.target_vel
            d.ctrl[6] = self.grip_ctrl
            acc_ref = (self.target_vel - prev_vel) / dt
            qacc = d.qacc.copy()
            d.qacc[:] = 0
            d.qacc[:6] = acc_ref
            self.mj.mj_rne(self.model, d, 1, self._rne)
            d.qacc[:] = qacc
            d.qfrc_applied[:6] = self._rne[:6] + self._armature * acc_ref
            self.mj.mj_step(self.model, d)

    def serve(self) -> None:
        period = 1.0 / self.rate_hz
        next_t = time.monotonic()
        parent = os.getppid()
        try:
            while True:
                if self.n % 256 == 0 and os.getppid() != parent:
                    break  # the controller died without closing us: do not run forever
                now = time.monotonic()
                tick_s = min(now, next_t)  # the time this tick simulates: behind `now` while catching up
                if not self._receive(now, tick_s):
                    break
                last = self.last_cmd_sent_s if self.last_cmd_sent_s is not None else self.last_cmd_s
                if self.mode == "run" and tick_s - last > self.deadline_s:
                    self._stop(tick_s, "hold", "watchdog")  # the arm's own deadline, outside the controller
                self.step(tick_s)
                if self.scene is not None:
                    self._snapshot(now)
                now = time.monotonic()
                if not (self.drop_prob > 0 and self.rng.random() < self.drop_prob):
                    self.n += 1
                    heapq.heappush(self.outbox, (now + self._delay(), self.n, self._state(now)))
                else:
                    self.stats["states_dropped"] += 1
                while self.outbox and self.outbox[0][0] <= now:
                    try:
                        self.pub.send(msgpack.packb(heapq.heappop(self.outbox)[2]), zmq.NOBLOCK)
                    except zmq.Again:
                        pass  # a state nobody reads is a dropped packet
                next_t += period
                sleep = next_t - time.monotonic()
                if sleep > 0:
                    time.sleep(sleep)
                elif sleep < -period:
                    # late by more than a tick (descheduled on a loaded machine): the ticks missed are run
                    # back to back, so the simulated arm keeps the wall clock that the controller's
                    # commands and limits are timed on. Dropping them instead lost the time: the arm fell
                    # behind the chain's path by a few milliseconds of travel each time, a lag it could
                    # not make up while the chain moved at the speed limit (issue 14). Only a stall longer
                    # than `max_catch_up_s` is given up on.
                    self.stats["overruns"] += 1
                    if sleep < -self.max_catch_up_s:
                        self.stats["time_lost_s"] += -sleep
                        next_t = time.monotonic()
        finally:
            self.close()

    def step(self, tick_s: float) -> None:
        """One tick of the arm at `tick_s`: physics, then what it executed is measured (`serve` runs it in
        real time; tests step it directly, so a contact scenario plays out the same way every time)."""
        self._tick_s = tick_s
        self._physics()
        self._measure(tick_s)

    def close(self) -> None:
        for sock in (self.listener, self.link.sock if self.link else None):
            if sock is not None:
                sock.close()
        self.pub.close()
        self.ctx.term()
        if self.scene is not None:
            self.frames.close()
            self.scene.close()


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description="Run the simulated arm server (used by robots.SimArm).")
    parser.add_argument("--config-json", required=True, help="RobotConfig as JSON")
    parser.add_argument("--port", type=int, default=0, help="0: pick a free port on 127.0.0.1")
    args = parser.parse_args(argv)
    server = SimArmServer(RobotConfig.from_dict(json.loads(args.config_json)), args.port)
    print(f"PORT {server.port} {server.state_port}", flush=True)
    server.serve()


if __name__ == "__main__":
    main()
