"""Universal Robots (e-Series) through `ur-rtde` (optional extra: `pip install ur-rtde`).

Interface -> SDK:
    joint_position -> RTDEControlInterface.servoJ(q, 0, 0, dt, lookahead_time, gain)
    joint_velocity -> speedJ(qd, acceleration, dt)
    ee_delta       -> servoL(pose, 0, 0, dt, lookahead_time, gain), pose = actual TCP pose moved by the
                      base-frame delta (rotation vectors composed)
    hold / stop    -> servoStop / speedStop (decelerating), e-stop -> triggerProtectiveStop
    observe        -> RTDEReceiveInterface getActualQ / getActualQd / getActualTCPPose
SDK safety used on top of the chain: the speed slider (`RTDEIOInterface.setSpeedSlider`, the
controller's dynamics scaling), the RTDE watchdog (`setWatchdog(min_frequency)`, kicked with every
command: if the controller stops kicking, the robot program stops itself), `isJointsWithinSafetyLimits`
before every servoJ, protective/emergency-stop status on every read (-> fault), and recovery by
unlocking a protective stop through the dashboard server and re-uploading the RTDE script.
UR arms have no gripper in this driver; `gripper_width_m` reports the last commanded width.
"""
from __future__ import annotations

import time

import numpy as np

from embodied.constants import STATE_KEY
from robots.base import Robot
from robots.geometry import rotvec_to_matrix
from robots.sim_model import ArmModel
from robots.types import Command, ControlMode, RobotConfig, RobotFault


def _real_sdk() -> dict:
    import dashboard_client
    import rtde_control
    import rtde_io
    import rtde_receive

    return {"control": rtde_control.RTDEControlInterface, "receive": rtde_receive.RTDEReceiveInterface,
            "io": rtde_io.RTDEIOInterface, "dashboard": dashboard_client.DashboardClient}


def _rotvec_compose(delta: np.ndarray, rotvec: np.ndarray) -> np.ndarray:
    """Rotation vector of R(delta) @ R(rotvec)."""
    r = rotvec_to_matrix(delta) @ rotvec_to_matrix(rotvec)
    angle = np.arccos(np.clip((np.trace(r) - 1) / 2, -1.0, 1.0))
    if angle < 1e-9:
        return np.zeros(3)
    axis = np.array([r[2, 1] - r[1, 2], r[0, 2] - r[2, 0], r[1, 0] - r[0, 1]])
    if np.sin(angle) < 1e-6:  # angle near pi
        axis = np.sqrt(np.maximum((np.diag(r) + 1) / 2, 0))
        return axis / np.linalg.norm(axis) * angle
    return axis / (2 * np.sin(angle)) * angle


class URRobot(Robot):
    def __init__(self, config: RobotConfig, sdk: dict | None = None, **kwargs):
        self.sdk = sdk or _real_sdk()
        drv = config.driver
        self.host = str(drv.get("host", "192.168.1.10"))
        self.rtde_frequency_hz = float(drv.get("rtde_frequency_hz", 500.0))
        self.lookahead_time_s = float(drv.get("lookahead_time_s", 0.1))
        self.servo_gain = float(drv.get("servo_gain", 300.0))
        self.speed_acc_rad_s2 = float(drv.get("speedj_acceleration_rad_s2", 1.0))
        self.watchdog_min_hz = float(drv.get("rtde_watchdog_min_hz", 10.0))
        self.speed_slider = float(drv.get("speed_slider", 0.3))  # the controller's own speed scaling, 0..1
        self.use_fk = bool(drv.get("mujoco_fk", True))
        super().__init__(config, **kwargs)
        self.ctrl = self.recv = self.io = None
        self._width = 0.0
        self._kin = None
        self._speeding = False

    def _connect(self) -> None:
        try:
            self.recv = self.sdk["receive"](self.host, self.rtde_frequency_hz)
            self.ctrl = self.sdk["control"](self.host, self.rtde_frequency_hz)
            self.io = self.sdk["io"](self.host)
            if not self.io.setSpeedSlider(self.speed_slider):
                raise RobotFault("RTDE setSpeedSlider failed")
            if not self.ctrl.setWatchdog(self.watchdog_min_hz):
                raise RobotFault("RTDE setWatchdog failed")
        except RobotFault:
            raise
        except Exception as err:  # noqa: BLE001  ur_rtde raises RuntimeError on connection problems
            raise RobotFault(f"cannot connect to UR at {self.host}: {err}") from None
        if self.use_fk:
            self._kin = ArmModel()

    def _disconnect(self) -> None:
        for iface in (self.ctrl, self.recv, self.io):
            if iface is not None:
                try:
                    iface.disconnect()
                except Exception:  # noqa: BLE001
                    pass
        self.ctrl = self.recv = self.io = None

    def _read(self) -> dict:
        try:
            if self.recv.isProtectiveStopped():
                raise RobotFault("UR protective stop")
            if self.recv.isEmergencyStopped():
                raise RobotFault("UR emergency stop")
            q = np.asarray(self.recv.getActualQ(), np.float32)
            qd = np.asarray(self.recv.getActualQd(), np.float32)
            tcp = np.asarray(self.recv.getActualTCPPose(), np.float64)
        except RobotFault:
            raise
        except Exception as err:  # noqa: BLE001
            raise RobotFault(f"RTDE receive: {err}") from None
        import mujoco

        quat = np.zeros(4)
        mujoco.mju_mat2Quat(quat, rotvec_to_matrix(tcp[3:6]).reshape(-1))
        width = np.float32(self._width)
        return {STATE_KEY: np.append(q, width).astype(np.float32), "joint_pos_rad": q, "joint_vel_rad_s": qd,
                "ee_pos_m": tcp[:3].astype(np.float32), "ee_quat_wxyz": quat.astype(np.float32),
                "gripper_width_m": width, "timestamp_s": time.monotonic()}

    def _command(self, cmd: Command) -> None:
        dt = self.config.period_s
        c = self.ctrl
        try:
            c.kickWatchdog()
            if cmd.mode is ControlMode.JOINT_POSITION:
                q = cmd.values.tolist()
                if not c.isJointsWithinSafetyLimits(q):
                    raise RobotFault("target outside the controller's safety limits (isJointsWithinSafetyLimits)")
                ok = c.servoJ(q, 0.0, 0.0, dt, self.lookahead_time_s, self.servo_gain)
            elif cmd.mode is ControlMode.JOINT_VELOCITY:
                ok = c.speedJ(cmd.values.tolist(), self.speed_acc_rad_s2, dt)
                self._speeding = True
            else:
                tcp = np.asarray(self.recv.getActualTCPPose(), np.float64)
                pos = cmd.ee_target_m if cmd.ee_target_m is not None else tcp[:3] + cmd.values[:3]
                pose = np.concatenate([pos, _rotvec_compose(cmd.values[3:6], tcp[3:6])]).tolist()
                if not c.isPoseWithinSafetyLimits(pose):
                    raise RobotFault("pose outside the controller's safety limits (isPoseWithinSafetyLimits)")
                ok = c.servoL(pose, 0.0, 0.0, dt, self.lookahead_time_s, self.servo_gain)
        except RobotFault:
            raise
        except Exception as err:  # noqa: BLE001
            raise RobotFault(f"RTDE control: {err}") from None
        if ok is False:
            raise RobotFault(f"RTDE control refused the {cmd.mode.value} command")
        self._width = cmd.gripper_width_m

    def _hold(self) -> None:
        if self.ctrl is None:
            return
        if self._speeding:
            self.ctrl.speedStop(10.0)
            self._speeding = False
        else:
            self.ctrl.servoStop(10.0)

    def _estop_backend(self) -> None:
        if self.ctrl is not None:
            self.ctrl.triggerProtectiveStop()

    def _recover(self) -> None:
        dash = self.sdk["dashboard"](self.host)
        try:
            dash.connect()
            dash.closeSafetyPopup()
            dash.unlockProtectiveStop()
        finally:
            dash.disconnect()
        if not self.ctrl.isConnected():
            self.ctrl.reconnect()
        if not self.ctrl.isProgramRunning():
            self.ctrl.reuploadScript()
        self.ctrl.setWatchdog(self.watchdog_min_hz)

    def fk_ee_pos_m(self, q_rad):
        return None if self._kin is None else self._kin.fk(np.asarray(q_rad, np.float64))
