"""UFACTORY xArm (6-axis) through `xarm-python-sdk` (optional extra: `pip install xarm-python-sdk`).

Interface -> SDK (`xarm.wrapper.XArmAPI`, radians everywhere: `is_radian=True`):
    joint_position -> set_mode(1) servo mode, set_servo_angle_j(angles)
    joint_velocity -> set_mode(4) joint velocity mode, vc_set_joint_velocity(speeds, duration)
    ee_delta       -> set_mode(1), set_servo_cartesian(pose in mm / rad) from the current pose + delta
    gripper        -> set_gripper_position(width in 0.1 mm units, wait=False)
    hold           -> set_state(4) (stop), e-stop -> emergency_stop()
SDK safety used on top of the chain: collision sensitivity, self-collision detection, the
controller's reduced mode (joint speed cap, TCP speed cap, TCP boundary fence = the workspace box),
joint/TCP acceleration caps, error/warning codes on every read (-> fault), and recovery by
clean_error / clean_warn / motion_enable / set_state(0). Every SDK call returns a code; non-zero faults.
"""
from __future__ import annotations

import time

import numpy as np

from embodied.constants import STATE_KEY
from robots.base import Robot
from robots.geometry import rotvec_to_matrix
from robots.types import Command, ControlMode, RobotConfig, RobotFault

MODE_SERVO, MODE_JOINT_VELOCITY = 1, 4


def _real_sdk():
    from xarm.wrapper import XArmAPI

    return XArmAPI


def _rpy_to_matrix(r, p, y) -> np.ndarray:
    cr, sr, cp, sp, cy, sy = np.cos(r), np.sin(r), np.cos(p), np.sin(p), np.cos(y), np.sin(y)
    return np.array([[cy * cp, cy * sp * sr - sy * cr, cy * sp * cr + sy * sr],
                     [sy * cp, sy * sp * sr + cy * cr, sy * sp * cr - cy * sr],
                     [-sp, cp * sr, cp * cr]])


def _matrix_to_rpy(m: np.ndarray) -> tuple[float, float, float]:
    pitch = float(np.arcsin(np.clip(-m[2, 0], -1, 1)))
    return float(np.arctan2(m[2, 1], m[2, 2])), pitch, float(np.arctan2(m[1, 0], m[0, 0]))


class XArmRobot(Robot):
    def __init__(self, config: RobotConfig, sdk=None, **kwargs):
        self.sdk = sdk or _real_sdk()
        drv = config.driver
        self.host = str(drv.get("host", "192.168.1.185"))
        self.collision_sensitivity = int(drv.get("collision_sensitivity", 3))
        self.tcp_speed_max_mm_s = float(drv.get("reduced_tcp_speed_mm_s", 250.0))
        self.tcp_acc_max_mm_s2 = float(drv.get("tcp_maxacc_mm_s2", 2000.0))
        self.gripper_speed = float(drv.get("gripper_speed", 2000.0))
        self.use_gripper = bool(drv.get("gripper", True))
        super().__init__(config, **kwargs)
        self.arm_api = None
        self._mode = None
        self._gripper_target = None

    def _call(self, name: str, *args, **kwargs):
        try:
            result = getattr(self.arm_api, name)(*args, **kwargs)
        except Exception as err:  # noqa: BLE001
            raise RobotFault(f"xArm {name}: {type(err).__name__}: {err}") from None
        code = result[0] if isinstance(result, tuple) else result
        if code not in (0, None):
            raise RobotFault(f"xArm {name} returned code {code} (error {getattr(self.arm_api, 'error_code', '?')})")
        return result

    def _connect(self) -> None:
        try:
            self.arm_api = self.sdk(self.host, is_radian=True)
        except Exception as err:  # noqa: BLE001
            raise RobotFault(f"cannot connect to xArm at {self.host}: {err}") from None
        if not self.arm_api.connected:
            raise RobotFault(f"xArm at {self.host} is not connected")
        c = self.config
        self._call("clean_warn")
        self._call("clean_error")
        self._call("motion_enable", enable=True)
        self._call("set_collision_sensitivity", self.collision_sensitivity)
        self._call("set_self_collision_detection", True)
        self._call("set_joint_maxacc", float(max(c.joint_acc_max_rad_s2)), is_radian=True)
        self._call("set_tcp_maxacc", self.tcp_acc_max_mm_s2)
        self._call("set_reduced_max_joint_speed", float(max(c.joint_vel_max_rad_s)), is_radian=True)
        self._call("set_reduced_max_tcp_speed", self.tcp_speed_max_mm_s)
        lo, hi = np.asarray(c.workspace_min_m) * 1000, np.asarray(c.workspace_max_m) * 1000
        self._call("set_reduced_tcp_boundary", [hi[0], lo[0], hi[1], lo[1], hi[2], lo[2]])
        self._call("set_fence_mode", True)
        self._call("set_reduced_mode", True)
        if self.use_gripper:
            self._call("set_gripper_enable", True)
            self._call("set_gripper_speed", self.gripper_speed)

    def _set_mode(self, mode: int) -> None:
        if self._mode != mode:
            self._call("set_mode", mode)
            self._call("set_state", 0)
            self._mode = mode

    def _arm(self) -> None:
        self._mode = None
        self._set_mode(MODE_JOINT_VELOCITY if self.mode is ControlMode.JOINT_VELOCITY else MODE_SERVO)

    def _disconnect(self) -> None:
        if self.arm_api is not None:
            self.arm_api.disconnect()
        self.arm_api = None

    def _read(self) -> dict:
        api = self.arm_api
        if api.has_err_warn and api.error_code:
            raise RobotFault(f"xArm error code {api.error_code}")
        _, (pos, vel, _effort) = self._call("get_joint_states", is_radian=True)
        _, pose = self._call("get_position", is_radian=True)
        q = np.asarray(pos[: self.config.dof], np.float32)
        qd = np.asarray(vel[: self.config.dof], np.float32)
        width = 0.0
        if self.use_gripper:
            _, gpos = self._call("get_gripper_position")
            width = float(gpos) / 10000.0  # 0.1 mm units -> m
        quat = np.zeros(4)
        import mujoco

        mujoco.mju_mat2Quat(quat, _rpy_to_matrix(*pose[3:6]).reshape(-1))
        return {STATE_KEY: np.append(q, width).astype(np.float32), "joint_pos_rad": q, "joint_vel_rad_s": qd,
                "ee_pos_m": (np.asarray(pose[:3], np.float64) / 1000).astype(np.float32),
                "ee_quat_wxyz": quat.astype(np.float32), "gripper_width_m": np.float32(width),
                "timestamp_s": time.monotonic()}

    def _command(self, cmd: Command) -> None:
        if cmd.mode is ControlMode.JOINT_POSITION:
            self._set_mode(MODE_SERVO)
            self._call("set_servo_angle_j", cmd.values.tolist(), is_radian=True)
        elif cmd.mode is ControlMode.JOINT_VELOCITY:
            self._set_mode(MODE_JOINT_VELOCITY)
            self._call("vc_set_joint_velocity", cmd.values.tolist(), is_radian=True,
                       duration=3 * self.config.period_s)
        else:
            self._set_mode(MODE_SERVO)
            _, pose = self._call("get_position", is_radian=True)
            pos = cmd.ee_target_m if cmd.ee_target_m is not None else np.asarray(pose[:3]) / 1000 + cmd.values[:3]
            rpy = _matrix_to_rpy(rotvec_to_matrix(cmd.values[3:6]) @ _rpy_to_matrix(*pose[3:6]))
            self._call("set_servo_cartesian", [*(np.asarray(pos) * 1000).tolist(), *rpy], is_radian=True)
        if self.use_gripper and (self._gripper_target is None or abs(cmd.gripper_width_m - self._gripper_target) > 0.001):
            self._call("set_gripper_position", cmd.gripper_width_m * 10000.0, wait=False)
            self._gripper_target = cmd.gripper_width_m

    def _hold(self) -> None:
        if self.arm_api is not None:
            self._call("set_state", 4)
            self._mode = None  # set_state(0) again on the next arm

    def _estop_backend(self) -> None:
        if self.arm_api is not None:
            self.arm_api.emergency_stop()
            self._mode = None

    def _recover(self) -> None:
        self._call("clean_warn")
        self._call("clean_error")
        self._call("motion_enable", enable=True)
        self._mode = None
