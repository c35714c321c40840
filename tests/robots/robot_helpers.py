"""A cheap in-process backend that records every command it receives (for state-machine and fuzz tests)."""
from __future__ import annotations

import time

import numpy as np

from embodied.constants import STATE_KEY
from robots.base import Robot, RobotConfig


def small_config(**overrides) -> RobotConfig:
    base = dict(name="recording", dof=3, control_rate_hz=100.0, joint_pos_min_rad=[-1.0, -2.0, -0.5],
                joint_pos_max_rad=[1.0, 2.0, 0.5], joint_vel_max_rad_s=[1.0, 2.0, 0.5],
                joint_acc_max_rad_s2=[10.0, 20.0, 5.0], max_relative_target_rad=0.015,
                workspace_min_m=[-1.0, -1.0, 0.2], workspace_max_m=[1.0, 1.0, 1.5],
                gripper_width_max_m=0.08, gripper_force_max_n=30.0, gripper_force_n=10.0,
                home_joint_pos_rad=[0.0, 0.0, 0.0], ee_step_max_m=0.01, ee_rot_step_max_rad=0.05)
    base.update(overrides)
    return RobotConfig(**base)


def planar_fk(q: np.ndarray) -> np.ndarray:
    """A 3-link arm: base yaw q0, shoulder q1, elbow q2, links 0.6 m and 0.5 m, base at 0.5 m height."""
    r = 0.6 * np.cos(q[1]) + 0.5 * np.cos(q[1] + q[2])
    z = 0.5 + 0.6 * np.sin(q[1]) + 0.5 * np.sin(q[1] + q[2])
    return np.array([r * np.cos(q[0]), r * np.sin(q[0]), z])


class RecordingRobot(Robot):
    """Follows its commands exactly (a perfect servo) and records them. Its clock is virtual unless
    `real_clock=True`: pacing advances it instead of sleeping, so fuzz runs are not bound to 100 Hz."""

    def __init__(self, config: RobotConfig | None = None, fk: bool = True, real_clock: bool = False, **kw):
        super().__init__(config or small_config(), **kw)
        self.real_clock = real_clock
        self.virtual_s = 0.0
        self.q = np.asarray(self.config.home_joint_pos_rad, np.float64)
        self.width = 0.0
        self.commands = []
        self.holds = 0
        self.use_fk = fk

    def clock(self):
        return time.monotonic() if self.real_clock else self.virtual_s

    def _sleep(self, seconds):
        if self.real_clock:
            time.sleep(seconds)
        else:
            self.virtual_s += seconds

    def _connect(self): pass
    def _disconnect(self): pass

    def _read(self):
        q = self.q.astype(np.float32)
        ee = planar_fk(self.q).astype(np.float32)
        return {STATE_KEY: np.append(q, self.width).astype(np.float32), "joint_pos_rad": q,
                "joint_vel_rad_s": np.zeros_like(q), "ee_pos_m": ee, "ee_quat_wxyz": np.array([1, 0, 0, 0], np.float32),
                "gripper_width_m": np.float32(self.width), "timestamp_s": time.monotonic()}

    def _command(self, cmd):
        self.commands.append(cmd)
        if cmd.mode.value == "joint_position":
            self.q = cmd.values.copy()
        elif cmd.mode.value == "joint_velocity":
            self.q = self.q + cmd.values * self.config.period_s
        self.width = cmd.gripper_width_m

    def _hold(self):
        self.holds += 1

    def fk_ee_pos_m(self, q):
        return planar_fk(np.asarray(q)) if self.use_fk else None


def planar_ik(q_ref, goal, rot_delta):
    """Position-only damped least squares on `planar_fk` (numeric Jacobian), 5 iterations from q_ref."""
    q = np.asarray(q_ref, np.float64).copy()
    for _ in range(5):
        p = planar_fk(q)
        jac = np.stack([(planar_fk(q + 1e-6 * e) - p) / 1e-6 for e in np.eye(3)], axis=1)
        q = q + jac.T @ np.linalg.solve(jac @ jac.T + 1e-4 * np.eye(3), goal - p)
    return q


class IKRecordingRobot(RecordingRobot):
    """RecordingRobot with inverse kinematics: ee_delta commands reach it as joint targets."""

    def ik_joint_targets(self, q_ref_rad, ee_target_m, rot_delta_rad):
        return planar_ik(q_ref_rad, ee_target_m, rot_delta_rad)
