"""Fakes of the UR (ur-rtde) and xArm (xarm-python-sdk) SDK classes, for the drivers' tests.

No protocol simulator exists for these arms here (URSim needs Docker), so the drivers are tested
against these call-recording fakes. Constructor signatures, method names and parameter names are
copied from the installed SDKs (pybind11 docstrings for ur-rtde, `inspect.signature` for xArm), and
`test_sdk_fakes_match_the_installed_sdk` checks they still match, so the fakes cannot drift.
The fakes behave like a perfect servo: a joint target becomes the measured position.
"""
from __future__ import annotations

import numpy as np


class Recorder:
    def __init__(self):
        self.calls: list[tuple] = []

    def _rec(self, name, *args, **kwargs):
        self.calls.append((name, args, kwargs))

    def names(self) -> list[str]:
        return [c[0] for c in self.calls]


class FakeURState:
    """Shared by the control and receive fakes (one robot)."""

    def __init__(self, q=None):
        self.q = np.array(q if q is not None else [-1.5708, -1.5708, 1.5708, -1.5708, -1.5708, 0.0])
        self.qd = np.zeros(6)
        self.tcp = np.array([0.49, 0.13, 0.33, 0.0, 3.14, 0.0])
        self.protective_stop = False
        self.connected = True
        self.program_running = True
        self.log = Recorder()


class FakeRTDEControlInterface:
    # rtde_control.RTDEControlInterface.__init__(self, hostname: str, frequency: float = -1.0,
    #     flags: int = FLAG_UPLOAD_SCRIPT, ur_cap_port: int = 50002, rt_priority: int = 0)
    shared: FakeURState | None = None

    def __init__(self, hostname, frequency=-1.0, flags=1, ur_cap_port=50002, rt_priority=0):
        self.s = FakeURState.shared_state()
        self.s.log._rec("control.__init__", hostname, frequency)

    def setWatchdog(self, min_frequency=10.0):
        self.s.log._rec("setWatchdog", min_frequency)
        return True

    def kickWatchdog(self):
        self.s.log._rec("kickWatchdog")
        return True

    def isJointsWithinSafetyLimits(self, arg0):
        self.s.log._rec("isJointsWithinSafetyLimits", arg0)
        return True

    def isPoseWithinSafetyLimits(self, arg0):
        self.s.log._rec("isPoseWithinSafetyLimits", arg0)
        return True

    def servoJ(self, arg0, arg1, arg2, arg3, arg4, arg5):  # q, speed, acceleration, time, lookahead_time, gain
        self.s.log._rec("servoJ", arg0, arg1, arg2, arg3, arg4, arg5)
        self.s.q = np.array(arg0)
        return True

    def servoL(self, arg0, arg1, arg2, arg3, arg4, arg5):  # pose, speed, acceleration, time, lookahead, gain
        self.s.log._rec("servoL", arg0, arg1, arg2, arg3, arg4, arg5)
        self.s.tcp = np.array(arg0)
        return True

    def speedJ(self, qd, acceleration=0.5, time=0.0):
        self.s.log._rec("speedJ", qd, acceleration, time)
        self.s.q = self.s.q + np.array(qd) * time
        return True

    def servoStop(self, a=10.0):
        self.s.log._rec("servoStop", a)
        return True

    def speedStop(self, a=10.0):
        self.s.log._rec("speedStop", a)
        return True

    def triggerProtectiveStop(self):
        self.s.log._rec("triggerProtectiveStop")
        self.s.protective_stop = True
        return True

    def isConnected(self):
        return self.s.connected

    def reconnect(self):
        self.s.log._rec("reconnect")
        self.s.connected = True
        return True

    def isProgramRunning(self):
        return self.s.program_running

    def reuploadScript(self):
        self.s.log._rec("reuploadScript")
        self.s.program_running = True
        return True

    def disconnect(self):
        self.s.log._rec("control.disconnect")


class FakeRTDEReceiveInterface:
    # rtde_receive.RTDEReceiveInterface.__init__(self, hostname: str, frequency: float = -1.0,
    #     variables: list[str] = [], verbose: bool = False, use_upper_range_registers: bool = False,
    #     rt_priority: int = 0)
    def __init__(self, hostname, frequency=-1.0, variables=(), verbose=False, use_upper_range_registers=False,
                 rt_priority=0):
        self.s = FakeURState.shared_state()
        self.s.log._rec("receive.__init__", hostname, frequency)

    def getActualQ(self):
        return self.s.q.tolist()

    def getActualQd(self):
        return self.s.qd.tolist()

    def getActualTCPPose(self):
        return self.s.tcp.tolist()

    def isProtectiveStopped(self):
        return self.s.protective_stop

    def isEmergencyStopped(self):
        return False

    def disconnect(self):
        self.s.log._rec("receive.disconnect")


class FakeRTDEIOInterface:
    # rtde_io.RTDEIOInterface.__init__(self, hostname: str, verbose: bool = False,
    #     use_upper_range_registers: bool = False)
    def __init__(self, hostname, verbose=False, use_upper_range_registers=False):
        self.s = FakeURState.shared_state()
        self.s.log._rec("io.__init__", hostname)

    def setSpeedSlider(self, arg0):  # speed fraction 0..1
        self.s.log._rec("setSpeedSlider", arg0)
        return True

    def disconnect(self):
        self.s.log._rec("io.disconnect")


class FakeDashboardClient:
    # dashboard_client.DashboardClient.__init__(self, hostname: str, port: int = 29999, verbose: bool = False)
    def __init__(self, hostname, port=29999, verbose=False):
        self.s = FakeURState.shared_state()

    def connect(self, timeout_ms=2000):
        self.s.log._rec("dashboard.connect")

    def closeSafetyPopup(self):
        self.s.log._rec("closeSafetyPopup")

    def unlockProtectiveStop(self):
        self.s.log._rec("unlockProtectiveStop")
        self.s.protective_stop = False

    def disconnect(self):
        self.s.log._rec("dashboard.disconnect")


_UR_STATE: list[FakeURState] = []


def _shared_state() -> FakeURState:
    if not _UR_STATE:
        _UR_STATE.append(FakeURState())
    return _UR_STATE[-1]


FakeURState.shared_state = staticmethod(_shared_state)


def fresh_ur_sdk() -> tuple[dict, FakeURState]:
    _UR_STATE.clear()
    state = _shared_state()
    return {"control": FakeRTDEControlInterface, "receive": FakeRTDEReceiveInterface,
            "io": FakeRTDEIOInterface, "dashboard": FakeDashboardClient}, state


class FakeXArmAPI:
    """xarm.wrapper.XArmAPI(port=None, is_radian=False, do_not_open=False, **kwargs)."""

    def __init__(self, port=None, is_radian=False, do_not_open=False, **kwargs):
        self.log = Recorder()
        self.log._rec("__init__", port, is_radian=is_radian)
        self._q = np.array([0.0, -0.5, -0.5, 0.0, 1.0, 0.0])
        self._pose = [300.0, 0.0, 300.0, 3.14, 0.0, 0.0]
        self._gripper = 850.0
        self._error = 0
        self._state = 0
        self._mode = 0
        self.fail_next: str | None = None

    # properties of the real class
    @property
    def connected(self):
        return True

    @property
    def error_code(self):
        return self._error

    @property
    def has_err_warn(self):
        return self._error != 0

    @property
    def state(self):
        return self._state

    @property
    def mode(self):
        return self._mode

    def _ret(self, name, *args, **kwargs):
        self.log._rec(name, *args, **kwargs)
        if self.fail_next == name:
            self.fail_next = None
            self._error = 31  # e.g. collision caused abnormal current
            return 1
        return 0

    def clean_error(self):
        code = self._ret("clean_error")
        self._error = 0
        return code

    def clean_warn(self):
        return self._ret("clean_warn")

    def motion_enable(self, enable=True, servo_id=None):
        return self._ret("motion_enable", enable=enable)

    def set_mode(self, mode=0, detection_param=0):
        self._mode = mode
        return self._ret("set_mode", mode)

    def set_state(self, state=0):
        self._state = state
        return self._ret("set_state", state)

    def set_collision_sensitivity(self, value, wait=True):
        return self._ret("set_collision_sensitivity", value)

    def set_self_collision_detection(self, on_off):
        return self._ret("set_self_collision_detection", on_off)

    def set_joint_maxacc(self, acc, is_radian=None):
        return self._ret("set_joint_maxacc", acc, is_radian=is_radian)

    def set_tcp_maxacc(self, acc):
        return self._ret("set_tcp_maxacc", acc)

    def set_reduced_max_joint_speed(self, speed, is_radian=None):
        return self._ret("set_reduced_max_joint_speed", speed, is_radian=is_radian)

    def set_reduced_max_tcp_speed(self, speed):
        return self._ret("set_reduced_max_tcp_speed", speed)

    def set_reduced_tcp_boundary(self, boundary):
        return self._ret("set_reduced_tcp_boundary", boundary)

    def set_fence_mode(self, on):
        return self._ret("set_fence_mode", on)

    def set_reduced_mode(self, on):
        return self._ret("set_reduced_mode", on)

    def set_gripper_enable(self, enable, **kwargs):
        return self._ret("set_gripper_enable", enable)

    def set_gripper_speed(self, speed, **kwargs):
        return self._ret("set_gripper_speed", speed)

    def set_gripper_position(self, pos, wait=False, speed=None, auto_enable=False, timeout=None, **kwargs):
        self._gripper = pos
        return self._ret("set_gripper_position", pos, wait=wait)

    def get_gripper_position(self, **kwargs):
        return 0, self._gripper

    def get_joint_states(self, is_radian=None, num=3):
        return 0, [self._q.tolist(), [0.0] * 6, [0.0] * 6]

    def get_position(self, is_radian=None):
        return 0, list(self._pose)

    def set_servo_angle_j(self, angles, speed=None, mvacc=None, mvtime=None, is_radian=None, **kwargs):
        code = self._ret("set_servo_angle_j", angles, is_radian=is_radian)
        if code == 0:
            self._q = np.array(angles)
        return code

    def vc_set_joint_velocity(self, speeds, is_radian=None, is_sync=True, duration=-1, **kwargs):
        code = self._ret("vc_set_joint_velocity", speeds, is_radian=is_radian, duration=duration)
        self._q = self._q + np.array(speeds) * max(duration, 0) / 3
        return code

    def set_servo_cartesian(self, mvpose, speed=None, mvacc=None, mvtime=0, is_radian=None, is_tool_coord=False,
                            **kwargs):
        code = self._ret("set_servo_cartesian", mvpose, is_radian=is_radian)
        self._pose = list(mvpose)
        return code

    def emergency_stop(self):
        self._state = 4
        return self._ret("emergency_stop")

    def disconnect(self):
        self.log._rec("disconnect")
