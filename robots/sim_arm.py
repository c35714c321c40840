"""A MuJoCo arm in its own process, behind the same interface and keys as the real drivers.

The server process (`python -m robots.sim_arm`) steps the UR5e + Robotiq 2F-85 model from the
`ogbench` package's assets in real time at `sim.server_rate_hz` (500 Hz, UR's RTDE rate), tracks
joint targets with the model's position servos plus gravity compensation, and publishes its state
every tick. It talks to the controller over ZeroMQ on 127.0.0.1 with msgpack messages, like a real arm
on a network (commands on a PAIR socket; state on PUB/SUB where the reader keeps only the newest
message, so a slow reader never sees a stale backlog), and can misbehave on purpose:

- `latency_ms` + `jitter_ms` (uniform in [0, jitter]) delay commands and state in both directions;
- `drop_prob` drops command and state packets (control messages such as hold/e-stop are reliable,
  as RTDE runs over TCP);
- `noise_q_rad`, `noise_qd_rad_s` add Gaussian sensor noise to the published joint state.

Commands: joint position targets and joint velocities (integrated into targets at the tick rate).
End-effector deltas never reach the server: the client solves them to joint targets
(`ArmModel.ik`, damped least squares at the pinch site) and those pass the joint safety checks first.
The server has its own state: `run` follows commands; `hold` brakes the targets at the acceleration
limit, keeps the position where they stop and ignores commands until `arm`; `estop` stops at once
and waits for `recover`. Like a real arm it has its own command deadline: in `run`, no command for
`watchdog_deadline_ms` is a hold with `hold_reason: watchdog`, whatever happens to the controller.
It also measures what it executes (peak joint speed and acceleration over a control period against the
limits, the furthest the pinch site got outside the workspace box) and publishes the peaks with the
state, for the fuzz benchmarks (`reset_peaks` clears them).
"""
from __future__ import annotations

import argparse
import heapq
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import msgpack
import numpy as np

from robots.base import STATE_KEY, Command, ControlMode, Robot, RobotConfig, RobotFault, box_distance_m

UR5E_HOME_RAD = [-1.5708, -1.5708, 1.5708, -1.5708, -1.5708, 0.0]
GRIPPER_OPEN_M = 0.085          # Robotiq 2F-85 stroke
PAD_OFFSET_M = 0.0133           # pad-centre distance minus finger gap (measured on the model)


# ---------------------------------------------------------------------- the model
def build_model():
    """UR5e with a Robotiq 2F-85 on its flange, from ogbench's MJCF files (as ogbench assembles them)."""
    import mujoco
    import ogbench.manipspace as manipspace
    from dm_control import mjcf
    from ogbench.manipspace import mjcf_utils

    desc = Path(manipspace.__file__).parent / "descriptions"
    arena = mjcf.RootElement()
    arena.model = "arena"
    arena.option.timestep = 0.002
    arena.option.integrator = "implicitfast"
    arm = mjcf.from_path(str(desc / "universal_robots_ur5e" / "ur5e.xml"), escape_separators=True)
    arm.model = "ur5e"
    for light in arm.find_all("light"):
        light.remove()
    gripper = mjcf.from_path(str(desc / "robotiq_2f85" / "2f85.xml"), escape_separators=True)
    gripper.model = "robotiq"
    mjcf_utils.attach(arm, gripper, "attachment_site")
    mjcf_utils.attach(arena, arm)
    return mujoco.MjModel.from_xml_string(mjcf_utils.to_string(arena), mjcf_utils.get_assets(arena))


class ArmModel:
    """Indices and kinematics helpers around the compiled model."""

    def __init__(self, model=None):
        import mujoco

        self.mj = mujoco
        self.model = model if model is not None else build_model()
        self.data = mujoco.MjData(self.model)
        self._ik_data = mujoco.MjData(self.model)
        self.dof = 6
        self.site = self.model.site("ur5e/robotiq/pinch").id
        self.left = self.model.body("ur5e/robotiq/left_pad").id
        self.right = self.model.body("ur5e/robotiq/right_pad").id
        self.joint_range = self.model.jnt_range[: self.dof].copy()

    def fk(self, q: np.ndarray) -> np.ndarray:
        self.data.qpos[: self.dof] = q
        self.mj.mj_kinematics(self.model, self.data)
        return self.data.site_xpos[self.site].copy()

    def ik(self, q_start: np.ndarray, goal_p: np.ndarray, rot_delta: np.ndarray, iterations: int = 3) -> np.ndarray:
        """Joint positions that bring the pinch site to `goal_p` with the orientation at `q_start` turned
        by `rot_delta` (base frame), by damped least squares from `q_start`, within the model's joint range.
        Not clipped to any speed: the safety chain's joint filters do that to the result."""
        mj, m = self.mj, self.model
        d = self._ik_data
        d.qpos[:] = 0
        d.qpos[: self.dof] = q_start
        mj.mj_kinematics(m, d)
        mj.mj_comPos(m, d)
        site = self.site
        goal_q, cur_q, turn = np.zeros(4), np.zeros(4), np.zeros(4)
        mj.mju_mat2Quat(cur_q, d.site_xmat[site])
        angle = float(np.linalg.norm(rot_delta))
        mj.mju_axisAngle2Quat(turn, rot_delta / (angle or 1.0), angle)
        mj.mju_mulQuat(goal_q, turn, cur_q)
        jac_p, jac_r = np.zeros((3, m.nv)), np.zeros((3, m.nv))
        lo, hi = self.joint_range[:, 0], self.joint_range[:, 1]
        q = np.asarray(q_start, np.float64).copy()
        for _ in range(iterations):
            mj.mju_mat2Quat(cur_q, d.site_xmat[site])
            rot_err = np.zeros(3)
            mj.mju_subQuat(rot_err, goal_q, cur_q)               # in the site's frame ...
            rot_err = d.site_xmat[site].reshape(3, 3) @ rot_err  # ... the Jacobian wants the world frame
            err = np.concatenate([goal_p - d.site_xpos[site], rot_err])
            mj.mj_jacSite(m, d, jac_p, jac_r, site)
            jac = np.vstack([jac_p[:, : self.dof], jac_r[:, : self.dof]])
            q = np.clip(q + jac.T @ np.linalg.solve(jac @ jac.T + 1e-4 * np.eye(6), err), lo, hi)
            d.qpos[: self.dof] = q
            mj.mj_kinematics(m, d)
            mj.mj_comPos(m, d)
        return q

    def gripper_width(self, data) -> float:
        gap = np.linalg.norm(data.xpos[self.left] - data.xpos[self.right]) - PAD_OFFSET_M
        return float(np.clip(gap, 0.0, GRIPPER_OPEN_M))


# ---------------------------------------------------------------------- the server process
class SimArmServer:
    def __init__(self, config: RobotConfig, port: int = 0):
        import mujoco
        import zmq

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
        self.arm = ArmModel()
        self.model, self.data = self.arm.model, mujoco.MjData(self.arm.model)
        self.substeps = max(1, int(round(1.0 / self.rate_hz / self.model.opt.timestep)))
        home = np.asarray(sim.get("start_joint_pos_rad", config.home_joint_pos_rad), np.float64)
        self.data.qpos[:6] = home
        mujoco.mj_forward(self.model, self.data)
        self.target = home.copy()       # the joint reference the servos track ...
        self.target_vel = np.zeros(6)   # ... and its velocity (feed-forward)
        self.goal: np.ndarray | None = None  # joint_position: where the reference is heading
        self.braking = False                 # the target was reached with no next one: brake
        self.ramp_step, self.ramp_ticks = np.zeros(6), 0  # a new velocity is reached over one period
        act = self.model.actuator_gainprm[:6, 0]
        self._rne = np.zeros(self.model.nv)
        self.servo_lead_s = -self.model.actuator_biasprm[:6, 2] / act  # kv / kp of the position servos
        self.grip_ctrl = 0.0
        self.mode, self.t_hold_s = "hold", None
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.PAIR)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.MAXMSGSIZE, 1 << 16)
        addr = "tcp://127.0.0.1"
        self.port = self.sock.bind_to_random_port(addr) if port == 0 else (self.sock.bind(f"{addr}:{port}") or port)
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
                      "last_cmd_seq": -1}
        self.lo, self.hi = np.asarray(config.joint_pos_min_rad), np.asarray(config.joint_pos_max_rad)
        self.vmax = np.asarray(config.joint_vel_max_rad_s)
        self.amax = np.asarray(config.joint_acc_max_rad_s2)
        self.deadline_s = float(config.watchdog_deadline_ms) / 1e3
        self.last_cmd_s, self.last_cmd_sent_s, self.hold_reason = 0.0, None, "start"
        self.box_lo, self.box_hi = np.asarray(config.workspace_min_m), np.asarray(config.workspace_max_m)
        window = max(1, int(round(config.period_s * self.rate_hz)))
        self._qd_window: list = []     # joint velocities over the last control period, per tick
        self._window = window
        gripper = {i for i in range(self.model.nbody) if self.model.body(i).name.startswith("ur5e/robotiq")}
        self._geom_in_gripper = np.array([self.model.geom_bodyid[g] in gripper for g in range(self.model.ngeom)])
        self._in_contact, self._contact_ticks = False, 0
        self.stats["collision_stops"] = 0
        self.peaks = {"peak_speed_ratio": 0.0, "peak_acc_ratio": 0.0, "peak_acc_joint": -1, "peak_box_excess_m": 0.0}

    def _stop(self, now: float, op: str, reason: str) -> None:
        """hold: the reference brakes from its own speed at the acceleration limit (a controlled stop,
        like servoStop/speedStop); estop: the reference is frozen where the arm is (a category-0 stop)."""
        if self.mode == "estop" and op == "hold":
            return  # an e-stop is only left through recover
        self.goal, self.ramp_ticks = None, 0
        if op == "estop":
            self.target, self.target_vel = self.data.qpos[:6].copy(), np.zeros(6)
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

    def _arm_contact(self) -> bool:
        """A contact between arm links, or between the arm and the gripper (the fingers touching each
        other is a grasp, not a collision)."""
        for i in range(self.data.ncon):
            c = self.data.contact[i]
            if not (self._geom_in_gripper[c.geom1] and self._geom_in_gripper[c.geom2]):
                return True
        return False

    def _measure(self, now: float) -> None:
        """Peaks of the executed motion; a self-collision is a protective stop (as UR's collision
        detection makes one), and its impact is counted there, not as a controller overshoot."""
        d = self.data
        contact = self._arm_contact()
        if contact and not self._in_contact and self.mode == "run":
            self.stats["collision_stops"] += 1
            self._stop(now, "estop", "self-collision")
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
                self.peaks["peak_acc_ratio"], self.peaks["peak_acc_joint"] = float(ratio.max()), int(ratio.argmax())
        if self._contact_ticks:
            return  # a collision's impact and its stop are counted as collision_stops, not as overshoots
        p = d.site_xpos[self.arm.site]
        excess = box_distance_m(p, self.box_lo, self.box_hi)
        self.peaks["peak_box_excess_m"] = max(self.peaks["peak_box_excess_m"], excess)

    def _delay(self) -> float:
        return self.latency_s + (self.rng.uniform(0, self.jitter_s) if self.jitter_s > 0 else 0.0)

    def _receive(self, now: float) -> bool:
        import zmq

        while True:
            try:
                raw = self.sock.recv(zmq.NOBLOCK)
            except zmq.Again:
                break
            try:
                msg = msgpack.unpackb(raw, raw=False)
                op = msg["op"]
            except Exception:  # noqa: BLE001  garbage on the wire is ignored, never fatal
                continue
            if op == "cmd" and self.drop_prob > 0 and self.rng.random() < self.drop_prob:
                self.stats["cmds_dropped"] += 1
                continue
            self.n += 1
            heapq.heappush(self.inbox, (now + self._delay(), self.n, msg))
        while self.inbox and self.inbox[0][0] <= now:
            _, _, msg = heapq.heappop(self.inbox)
            if not self._apply(msg, now):
                return False
        return True

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
            values = np.asarray(msg["values"], np.float64)
            if mode == ControlMode.JOINT_POSITION.value:
                # head for the target so as to reach it in one period (distance / time: a lag is caught up),
                # through the acceleration-limited ramp, so arrival jitter never becomes a velocity jump;
                # braking takes over if it is reached before the next one arrives
                self.goal, self.braking = np.clip(values, self.lo, self.hi), False
                vel = (self.goal - self.target) / self.config.period_s
                self._ramp_to(vel / max(1.0, float(np.max(np.abs(vel) / self.vmax))))  # scaled: stay on the line
            elif mode == ControlMode.JOINT_VELOCITY.value:
                self.goal, self.braking = None, False
                self._ramp_to(np.clip(values, -self.vmax, self.vmax))
            else:  # the client solves ee deltas to joint targets; anything else is not executed
                self.stats["cmds_ignored"] += 1
                return True
            self.last_cmd_s, self.last_cmd_sent_s = now, float(msg.get("t_send_s", now))
            width = float(msg["gripper_width_m"])
            self.grip_ctrl = 255.0 * (1.0 - np.clip(width / GRIPPER_OPEN_M, 0.0, 1.0))
        elif op in ("hold", "estop"):
            self._stop(now, op, "client")
        elif op == "arm":
            if self.mode == "hold":  # still braking from a hold: keep braking, the client's chain knows
                self.mode, self.goal, self.braking, self.ramp_ticks = "run", None, True, 0
                if not np.any(self.target_vel):
                    self.target = q
                self.last_cmd_s, self.last_cmd_sent_s, self.hold_reason = now, None, None
        elif op == "recover":
            if self.mode == "estop":
                self.mode = "hold"
        elif op == "reset":
            self.data.qpos[:6] = np.asarray(msg["joint_pos_rad"], np.float64)
            self.data.qvel[:] = 0
            self.mj.mj_forward(self.model, self.data)
            self.target, self.target_vel, self.goal, self.mode = self.data.qpos[:6].copy(), np.zeros(6), None, "hold"
            self.hold_reason, self._qd_window = "reset", []
        elif op == "reset_peaks":
            self.peaks = dict.fromkeys(self.peaks, 0.0)
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
                "target_rad": self.target.tolist(), "target_vel_rad_s": self.target_vel.tolist(), **self.stats, **self.peaks}

    def _physics(self) -> None:
        d = self.data
        dt = self.model.opt.timestep
        for _ in range(self.substeps):
            prev_vel = self.target_vel.copy()
            if self.mode == "run" and self.ramp_ticks > 0:  # constant acceleration to the new velocity
                self.target_vel = self.target_vel + self.ramp_step
                self.ramp_ticks -= 1
            elif self.mode == "run" and self.goal is None:
                self.braking = True  # the velocity command's period is over and no next one came
            if self.mode == "hold" or (self.braking and self.ramp_ticks == 0):  # at the acceleration limit
                self.target_vel = np.sign(self.target_vel) * np.maximum(np.abs(self.target_vel) - self.amax * dt, 0)
            if self.goal is not None and self.ramp_ticks == 0 and np.all((np.abs(self.target_vel * dt) >= np.abs(self.goal - self.target))
                                                | (self.target_vel * (self.goal - self.target) <= 0)):
                # joint_position target reached and no next one yet: brake from here (the stopping path the
                # safety chain checked), rather than stop dead at full speed
                self.goal, self.braking = None, True
            if np.any(self.target_vel):
                self.target = np.clip(self.target + self.target_vel * dt, self.lo, self.hi)
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
            d.qfrc_applied[:6] = self._rne[:6]
            self.mj.mj_step(self.model, d)

    def serve(self) -> None:
        import zmq

        period = 1.0 / self.rate_hz
        next_t = time.monotonic()
        parent = os.getppid()
        try:
            while True:
                if self.n % 256 == 0 and os.getppid() != parent:
                    break  # the controller died without closing us: do not run forever
                now = time.monotonic()
                if not self._receive(now):
                    break
                last = self.last_cmd_sent_s if self.last_cmd_sent_s is not None else self.last_cmd_s
                if self.mode == "run" and now - last > self.deadline_s:
                    self._stop(now, "hold", "watchdog")  # the arm's own deadline, outside the controller
                self._physics()
                self._measure(now)
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
                    self.stats["overruns"] += 1
                    next_t = time.monotonic()
        finally:
            self.sock.close()
            self.pub.close()
            self.ctx.term()


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description="Run the simulated arm server (used by robots.SimArm).")
    parser.add_argument("--config-json", required=True, help="RobotConfig as JSON")
    parser.add_argument("--port", type=int, default=0, help="0: pick a free port on 127.0.0.1")
    args = parser.parse_args(argv)
    server = SimArmServer(RobotConfig.from_dict(json.loads(args.config_json)), args.port)
    print(f"PORT {server.port} {server.state_port}", flush=True)
    server.serve()


# ---------------------------------------------------------------------- the client (a Robot)
class SimArm(Robot):
    """The simulated arm: a `Robot` whose backend is a `robots.sim_arm` server process."""

    def __init__(self, config: RobotConfig, **kwargs):
        if config.dof != 6:
            raise RobotFault(f"the sim arm is a 6-dof UR5e; robot {config.name} has dof={config.dof}")
        super().__init__(config, **kwargs)
        self._proc: subprocess.Popen | None = None
        self._latest: dict | None = None
        self._seq = 0
        self._kin: ArmModel | None = None
        self._t_armed_s = float("inf")
        self.stale_after_s = float(config.sim.get("stale_after_ms", 500.0)) / 1e3

    def _connect(self) -> None:
        import zmq

        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        self._proc = subprocess.Popen([sys.executable, "-m", "robots.sim_arm", "--config-json",
                                       json.dumps(self.config.to_dict())], stdout=subprocess.PIPE,
                                      env=env, cwd=str(Path(__file__).resolve().parents[1]), text=True,
                                      start_new_session=True)  # a terminal's Ctrl-C goes to the controller only
        line = self._proc.stdout.readline()
        if not line.startswith("PORT "):
            self._proc.kill()
            raise RobotFault(f"sim arm server did not start (said {line!r})")
        self.port, state_port = (int(v) for v in line.split()[1:3])
        self._ctx = zmq.Context()
        self._sock = self._ctx.socket(zmq.PAIR)   # commands
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.connect(f"tcp://127.0.0.1:{self.port}")
        self._sub = self._ctx.socket(zmq.SUB)     # state: only the newest message is kept
        self._sub.setsockopt(zmq.CONFLATE, 1)
        self._sub.setsockopt(zmq.SUBSCRIBE, b"")
        self._sub.setsockopt(zmq.LINGER, 0)
        self._sub.connect(f"tcp://127.0.0.1:{state_port}")
        self._send_lock = threading.Lock()
        self._recv_lock = threading.Lock()
        self._kin = ArmModel()
        self._wait_state(5.0)

    def _drain(self) -> None:
        """Take every state message waiting on the socket and keep the newest. Done on each read
        instead of in a receiver thread, so nothing in this process wakes up 500 times a second."""
        import zmq

        with self._recv_lock:
            latest = None
            while True:
                try:
                    latest = self._sub.recv(zmq.NOBLOCK)
                except zmq.Again:
                    break
                except zmq.ZMQError:
                    return
            if latest is None:
                return
            try:
                msg = msgpack.unpackb(latest, raw=False)
            except ValueError:
                return
            msg["received_s"] = time.monotonic()
            self._latest = msg

    def _wait_state(self, timeout_s: float) -> dict:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self._drain()
            if self._latest is not None:
                return self._latest
            self._sub.poll(20)
        raise RobotFault("no state from the sim arm server")

    def _send(self, msg: dict) -> None:
        with self._send_lock:
            self._sock.send(msgpack.packb(msg))

    def _disconnect(self) -> None:
        try:
            self._send({"op": "close"})
        except Exception:  # noqa: BLE001
            pass
        self._sock.close()
        self._sub.close()
        self._ctx.term()
        if self._proc is not None:
            try:
                self._proc.wait(timeout=3.0)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
            self._proc.stdout.close()
        self._proc, self._latest = None, None

    def _read(self) -> dict:
        self._drain()
        msg = self._latest
        if msg is None:
            msg = self._wait_state(1.0)
        if self._proc is not None and self._proc.poll() is not None:
            raise RobotFault(f"sim arm server exited with {self._proc.returncode}")
        age = time.monotonic() - msg["t_s"]  # the server is a local process: one monotonic clock
        if age > self.stale_after_s:
            raise RobotFault(f"sim arm state is {1e3 * age:.0f} ms old")
        if self.state.value == "armed" and msg.get("mode") == "estop" and msg.get("hold_reason") == "self-collision" \
                and (msg.get("t_hold_s") or 0.0) > self._t_armed_s:
            raise RobotFault("sim arm protective stop: self-collision")
        if (self.state.value == "armed" and msg.get("mode") == "hold" and msg.get("hold_reason") == "watchdog"
                and (msg.get("t_hold_s") or 0.0) > self._t_armed_s):
            self._backend_held("arm watchdog: no command within the deadline", float(msg["t_hold_s"]),
                               msg.get("last_cmd_sent_s"))
        q = np.asarray(msg["joint_pos_rad"], np.float32)
        width = np.float32(msg["gripper_width_m"])
        return {STATE_KEY: np.append(q, width).astype(np.float32), "joint_pos_rad": q,
                "joint_vel_rad_s": np.asarray(msg["joint_vel_rad_s"], np.float32),
                "ee_pos_m": np.asarray(msg["ee_pos_m"], np.float32),
                "ee_quat_wxyz": np.asarray(msg["ee_quat_wxyz"], np.float32),
                "gripper_width_m": width, "timestamp_s": float(msg["t_s"])}

    def server_state(self) -> dict:
        """The raw last message (mode, t_hold_s, drop counters): for tests and benchmarks."""
        if self._proc is not None:
            self._drain()
        return dict(self._latest or {})

    def _command(self, cmd: Command) -> None:
        self._seq += 1
        self._send({"op": "cmd", "seq": self._seq, "mode": cmd.mode.value, "values": cmd.values.tolist(),
                    "gripper_width_m": cmd.gripper_width_m, "gripper_force_n": cmd.gripper_force_n,
                    "ee_target_m": None if cmd.ee_target_m is None else cmd.ee_target_m.tolist(),
                    "t_send_s": time.monotonic()})

    def _hold(self) -> None:
        self._send({"op": "hold"})

    def _estop_backend(self) -> None:
        self._send({"op": "estop"})

    def _recover(self) -> None:
        self._send({"op": "recover"})
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:  # so that the next arm() sees the stop released
            self._drain()
            if (self._latest or {}).get("mode") != "estop":
                return
            time.sleep(0.002)
        raise RobotFault("sim arm did not leave its stop after recover")

    def _arm(self) -> None:
        self._t_armed_s = time.monotonic()
        self._drain()
        if (self._latest or {}).get("mode") == "estop":
            raise RobotFault(f"sim arm is stopped ({self._latest.get('hold_reason')}); call recover() first")
        self._send({"op": "arm"})
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline:  # the arm op travels with the injected latency
            self._drain()
            if (self._latest or {}).get("mode") == "run":
                return
            time.sleep(0.002)
        raise RobotFault("sim arm did not enter run mode after arm")

    def inject(self, **settings) -> None:
        """Change latency_ms, jitter_ms, drop_prob, noise_q_rad, noise_qd_rad_s while running."""
        self._send({"op": "set", **settings})

    def reset_joints(self, q_rad) -> None:
        """Teleport the arm (sim only) and hold there; needs arm() again."""
        with self._lock:
            self._send({"op": "reset", "joint_pos_rad": [float(v) for v in q_rad]})
            if self.state.value == "armed":
                self._transition(type(self.state).CONNECTED, "reset")

    def fk_ee_pos_m(self, q_rad: np.ndarray) -> np.ndarray | None:
        return None if self._kin is None else self._kin.fk(q_rad)

    def ik_joint_targets(self, q_ref_rad, ee_target_m, rot_delta_rad):
        return None if self._kin is None else self._kin.ik(q_ref_rad, ee_target_m, rot_delta_rad)

    def reset_peaks(self) -> None:
        """Clear the server's measured peaks (speed, acceleration, box excess)."""
        self._send({"op": "reset_peaks"})

    def kill_server(self) -> None:
        """Test hook: the server dies like a robot that loses power."""
        if self._proc is not None:
            self._proc.kill()


if __name__ == "__main__":
    main()
