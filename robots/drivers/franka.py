"""Franka (FR3 / Panda) through `franky-control` (optional extra: `pip install franky-control`).

Maps the robot interface onto franky's motions, each sent asynchronously so a new command takes over
the running one seamlessly (franky queues and blends it):
    joint_position -> JointMotion(target)             (Ruckig-limited by the dynamics factor)
    joint_velocity -> JointVelocityMotion(qd, duration = a few control periods)
    ee_delta       -> CartesianMotion(absolute pose = current pose moved by the base-frame delta)
and onto the SDK's own safety: `relative_dynamics_factor` (scales velocity/acceleration/jerk limits),
`set_collision_behavior` (torque/force reflex thresholds), libfranka's communication watchdog (a
network stall raises), `stop()` (the SDK's decelerating stop) and `recover_from_errors()`; a broken
connection is recovered by reconnecting.

`driver.realtime_config` must be set explicitly: `enforce` on a real-time kernel (the real robot);
`ignore` only for simulators such as franky-sim on a normal kernel. There is no silent default.
"""
from __future__ import annotations

import time

import numpy as np

from embodied.constants import STATE_KEY
from embodied.errors import ConfigError
from robots.base import Robot
from robots.geometry import rotvec_to_matrix
from robots.types import Command, ControlMode, RobotConfig, RobotFault


class FrankaRobot(Robot):
    def __init__(self, config: RobotConfig, **kwargs):
        import franky

        self.franky = franky
        drv = config.driver
        rt = drv.get("realtime_config")
        if rt not in ("enforce", "ignore"):
            raise ConfigError("robot.driver.realtime_config must be set to 'enforce' (real-time kernel, real robot) "
                              "or 'ignore' (simulator on a normal kernel); it has no default")
        self.realtime = franky.RealtimeConfig.Enforce if rt == "enforce" else franky.RealtimeConfig.Ignore
        self.host = str(drv.get("host", "172.16.0.2"))
        self.dynamics_factor = float(drv.get("relative_dynamics_factor", 0.1))
        self.torque_thresholds = [float(v) for v in drv.get("torque_thresholds_nm", [20.0] * 7)]
        self.force_thresholds = [float(v) for v in drv.get("force_thresholds_n", [30.0] * 6)]
        self.use_gripper = bool(drv.get("gripper", True))
        self.gripper_speed_m_s = float(drv.get("gripper_speed_m_s", 0.05))
        self.gripper_period_s = float(drv.get("gripper_read_period_ms", 100.0)) / 1e3
        super().__init__(config, **kwargs)
        self.robot = None
        self.gripper = None
        self._width, self._width_t = 0.0, 0.0
        self._gripper_target: float | None = None
        self._frames = None

    # ------------------------------------------------------------------ connection
    def _open(self) -> None:
        f = self.franky
        try:
            self.robot = f.Robot(self.host, realtime_config=self.realtime)
            self.robot.relative_dynamics_factor = self.dynamics_factor
            self.robot.set_collision_behavior(self.torque_thresholds, self.force_thresholds)
            if self.use_gripper and self.gripper is None:
                self.gripper = f.Gripper(self.host)
        except Exception as err:  # noqa: BLE001  franky raises several exception types
            raise RobotFault(f"cannot connect to Franka at {self.host}: {type(err).__name__}: {err}") from None

    def _connect(self) -> None:
        self._open()

    def _disconnect(self) -> None:
        self.robot, self.gripper = None, None  # franky closes the connection when the objects go

    def _arm(self) -> None:
        self._check()

    def _check(self) -> None:
        """Surface SDK errors of the running (asynchronous) motion as a RobotFault."""
        try:
            if self.robot.has_errors:
                raise RobotFault(f"Franka reports errors: {self.robot.state.current_errors}")
            self.robot.poll_motion()
        except RobotFault:
            raise
        except Exception as err:  # noqa: BLE001
            if "preempted" in str(err):  # a motion replaced by the next one: not an error
                return
            raise RobotFault(f"{type(err).__name__}: {err}") from None

    # ------------------------------------------------------------------ data path
    def _read(self) -> dict:
        if self.robot is None:
            raise RobotFault("not connected")
        try:
            self._check()
            js = self.robot.current_joint_state
            pose = self.robot.current_cartesian_state.pose.end_effector_pose
            q = np.asarray(js.position, np.float32)
            qd = np.asarray(js.velocity, np.float32)
            xyz = np.asarray(pose.translation, np.float32)
            qx, qy, qz, qw = np.asarray(pose.quaternion, np.float64)
        except RobotFault:
            raise
        except Exception as err:  # noqa: BLE001
            raise RobotFault(f"{type(err).__name__}: {err}") from None
        now = time.monotonic()
        if self.gripper is not None and now - self._width_t > self.gripper_period_s:
            try:
                self._width, self._width_t = float(self.gripper.width), now
            except Exception as err:  # noqa: BLE001
                raise RobotFault(f"gripper: {type(err).__name__}: {err}") from None
        width = np.float32(self._width)
        return {STATE_KEY: np.append(q, width).astype(np.float32), "joint_pos_rad": q, "joint_vel_rad_s": qd,
                "ee_pos_m": xyz, "ee_quat_wxyz": np.array([qw, qx, qy, qz], np.float32), "gripper_width_m": width,
                "timestamp_s": now}

    def _command(self, cmd: Command) -> None:
        f = self.franky
        try:
            if cmd.mode is ControlMode.JOINT_POSITION:
                motion = f.JointMotion(cmd.values.tolist())
            elif cmd.mode is ControlMode.JOINT_VELOCITY:
                hold_ms = int(max(3 * 1000.0 / self.config.control_rate_hz, 10))
                motion = f.JointVelocityMotion(cmd.values.tolist(), duration=f.Duration(hold_ms))
            else:
                pose = self.robot.current_cartesian_state.pose.end_effector_pose
                rot = rotvec_to_matrix(cmd.values[3:6]) @ pose.matrix[:3, :3]
                target = np.eye(4)
                target[:3, :3] = rot
                target[:3, 3] = cmd.ee_target_m if cmd.ee_target_m is not None else pose.translation + cmd.values[:3]
                motion = f.CartesianMotion(f.Affine(target))
            self.robot.move(motion, asynchronous=True)
            if self.gripper is not None and (self._gripper_target is None
                                             or abs(cmd.gripper_width_m - self._gripper_target) > 0.002):
                self.gripper.move_async(float(cmd.gripper_width_m), self.gripper_speed_m_s)
                self._gripper_target = cmd.gripper_width_m
        except Exception as err:  # noqa: BLE001
            if "preempted" in str(err):
                return
            raise RobotFault(f"{type(err).__name__}: {err}") from None

    def _hold(self) -> None:
        """A stopped motion ends "preempted"; any other error (a network stall breaks the link) is a fault."""
        if self.robot is None:
            return
        try:
            self.robot.stop()           # franky's decelerating stop of the running motion
            self.robot.join_motion()
        except Exception as err:  # noqa: BLE001  franky raises several exception types
            if "preempted" not in str(err):
                raise RobotFault(f"{type(err).__name__}: {err}") from None

    def _estop_backend(self) -> None:
        try:
            self._hold()
        except RobotFault as err:  # estop() faults the robot whatever the link says; keep why, as stop() does
            self.events.append({"t_s": time.monotonic(), "kind": "estop_error", "reason": str(err)})

    def _recover(self) -> None:
        try:
            self.robot.recover_from_errors()
            if not self.robot.has_errors:
                return
        except Exception:  # noqa: BLE001  the connection itself is broken: reconnect
            pass
        self.robot = None
        self._open()

    def fk_ee_pos_m(self, q_rad):
        """End-effector position from franky's kinematic model, for the workspace filter in joint modes."""
        try:
            if self._frames is None:
                state = self.robot.state
                self._frames = (state.F_T_EE, state.EE_T_K)
            pose = self.robot.model.pose(self.franky.Frame.EndEffector, np.asarray(q_rad, np.float64), *self._frames)
            return np.asarray(pose.translation, np.float64)
        except Exception:  # noqa: BLE001  no model available: the workspace is checked in ee mode only
            return None
