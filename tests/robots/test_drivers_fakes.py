"""UR and xArm drivers against call-recording fakes of their SDK classes (no protocol simulator exists
for them here); the fakes' signatures are checked against the installed SDKs."""
from __future__ import annotations

import inspect

import numpy as np
import pytest

import robots
from robots.base import RobotFault, State
from sdk_fakes import (FakeDashboardClient, FakeRTDEControlInterface, FakeRTDEIOInterface, FakeRTDEReceiveInterface,
                       FakeXArmAPI, fresh_ur_sdk)


def _pybind_params(doc: str) -> list[str]:
    """Parameter names from a pybind11 signature line: `name(self: T, a: list[float], b: float = 1) -> R`."""
    line = doc.strip().splitlines()[0]
    inner = line[line.index("(") + 1: line.rindex(")")]
    params, depth, cur = [], 0, ""
    for ch in inner:
        depth += ch in "[(" and 1 or 0
        depth -= ch in "])" and 1 or 0
        if ch == "," and depth == 0:
            params.append(cur)
            cur = ""
        else:
            cur += ch
    params.append(cur)
    return [p.split(":")[0].strip() for p in params if p.strip() and p.split(":")[0].strip() != "self"]


def _fake_params(fn) -> list[str]:
    return [p.name for p in inspect.signature(fn).parameters.values()
            if p.name != "self" and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)]


def _public(cls) -> list[str]:
    return [n for n, v in vars(cls).items() if not n.startswith("_") and callable(v)]


@pytest.mark.parametrize("fake,module,real", [
    (FakeRTDEControlInterface, "rtde_control", "RTDEControlInterface"),
    (FakeRTDEReceiveInterface, "rtde_receive", "RTDEReceiveInterface"),
    (FakeRTDEIOInterface, "rtde_io", "RTDEIOInterface"),
    (FakeDashboardClient, "dashboard_client", "DashboardClient"),
])
def test_ur_fakes_match_the_installed_sdk(fake, module, real):
    real_cls = getattr(pytest.importorskip(module), real)
    for name in _public(fake) + ["__init__"]:
        assert hasattr(real_cls, name), f"{real}.{name} does not exist in the installed SDK"
        real_params = _pybind_params(getattr(real_cls, name).__doc__)
        assert _fake_params(getattr(fake, name)) == real_params, f"{real}.{name}: {real_params}"


def test_xarm_fake_matches_the_installed_sdk():
    real_cls = pytest.importorskip("xarm.wrapper").XArmAPI
    for name in _public(FakeXArmAPI) + ["__init__"]:
        assert hasattr(real_cls, name), f"XArmAPI.{name} does not exist"
        assert _fake_params(getattr(FakeXArmAPI, name)) == _fake_params(getattr(real_cls, name)), name
    for prop in ("connected", "error_code", "has_err_warn", "state", "mode"):
        assert isinstance(getattr(real_cls, prop), property)


def ur_robot(**overrides):
    sdk, state = fresh_ur_sdk()
    cfg = robots.load_config("ur5e")
    cfg.update(overrides)
    return robots.make(cfg, sdk=sdk), state


@pytest.mark.slow
def test_ur_driver_maps_modes_watchdog_and_recovery():
    robot, s = ur_robot()
    with robot:
        assert s.log.names()[:5] == ["receive.__init__", "control.__init__", "io.__init__", "setSpeedSlider",
                                     "setWatchdog"]
        assert ("setSpeedSlider", (0.3,), {}) in s.log.calls
        robot.arm()
        q0 = robot.observe()["joint_pos_rad"].astype(np.float64)
        for _ in range(20):
            robot.observe()
            robot.send_action(np.append(q0 + 1.0, 0.04))   # far jump: clipped by the chain
        servo = [c for c in s.log.calls if c[0] == "servoJ"]
        assert len(servo) == 20 and s.log.names().count("kickWatchdog") == 20
        steps = np.diff(np.array([c[1][0] for c in servo]), axis=0)
        assert np.abs(steps).max() <= 0.05 + 1e-9                  # max_relative_target
        assert servo[0][1][3] == pytest.approx(0.01)                # time = control period
        robot.estop("test")
        assert "triggerProtectiveStop" in s.log.names() and robot.state is State.FAULT
        robot.recover()
        assert {"closeSafetyPopup", "unlockProtectiveStop"} <= set(s.log.names())
        robot.arm()
        robot.send_action(np.append(robot.observe()["joint_pos_rad"], 0.04))
    assert "servoStop" in s.log.names() and "control.disconnect" in s.log.names()


@pytest.mark.slow
def test_ur_protective_stop_on_read_faults():
    robot, s = ur_robot(control_mode="joint_velocity")
    with robot:
        robot.arm()
        robot.observe()
        robot.send_action(np.array([0.1, 0, 0, 0, 0, 0, 0.0]))
        assert s.log.calls[-1][0] == "speedJ"
        s.protective_stop = True
        with pytest.raises(RobotFault, match="protective stop"):
            robot.observe()
        assert robot.state is State.FAULT


@pytest.mark.slow
def test_ur_ee_delta_uses_servol_with_the_clipped_pose():
    robot, s = ur_robot(control_mode="ee_delta")
    with robot:
        robot.arm()
        robot.observe()
        robot.send_action(np.array([0.5, 0, 0, 0, 0, 0, 0.0]))
        name, args, _ = s.log.calls[-1]
        assert name == "servoL" and args[0][0] == pytest.approx(0.49 + 0.01)


def xarm_robot(**overrides):
    api = {}

    def factory(*args, **kwargs):
        api["api"] = FakeXArmAPI(*args, **kwargs)
        return api["api"]

    cfg = robots.load_config("xarm")
    cfg.update(overrides)
    return robots.make(cfg, sdk=factory), api


def test_xarm_driver_sets_sdk_safety_and_servo_mode():
    robot, api = xarm_robot()
    with robot:
        log = api["api"].log
        assert {"set_collision_sensitivity", "set_self_collision_detection", "set_reduced_mode",
                "set_reduced_tcp_boundary", "set_fence_mode", "set_reduced_max_joint_speed"} <= set(log.names())
        boundary = [c for c in log.calls if c[0] == "set_reduced_tcp_boundary"][0][1][0]
        assert boundary == pytest.approx([700, 100, 600, -600, 700, 50])
        robot.arm()
        assert ("set_mode", (1,), {}) in log.calls
        q0 = robot.observe()["joint_pos_rad"].astype(np.float64)
        robot.send_action(np.append(q0 + 0.01, 0.05))
        name, args, kwargs = [c for c in log.calls if c[0] == "set_servo_angle_j"][-1]
        assert kwargs["is_radian"] is True  # first step from rest: the acceleration limit, 8 rad/s2 * dt^2
        assert np.allclose(args[0], q0 + 8.0 * 0.01**2, atol=1e-6)
        grip = [c for c in log.calls if c[0] == "set_gripper_position"][-1]
        assert grip[1][0] == pytest.approx(500.0)  # 0.05 m in 0.1 mm units
        robot.stop()
        assert ("set_state", (4,), {}) in log.calls


def test_xarm_error_code_faults_and_recovers():
    robot, api = xarm_robot()
    with robot:
        robot.arm()
        q0 = robot.observe()["joint_pos_rad"].astype(np.float64)
        api["api"].fail_next = "set_servo_angle_j"
        assert robot.send_action(np.append(q0, 0.05)) is None
        assert robot.state is State.FAULT and "code 1" in robot.fault_reason
        robot.recover()
        assert api["api"].error_code == 0
        robot.arm()
        assert robot.send_action(np.append(q0, 0.05)) is not None
