"""Lifecycle state machine, context manager, each safety filter, the watchdog and the e-stop."""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from robot_helpers import RecordingRobot, small_config
from robots.base import TRANSITIONS, ControlMode, RobotConfig, RobotFault, RobotStateError, State
from robots.safety import SafetyChain
from embodied.errors import ConfigError


def test_every_illegal_transition_raises_and_legal_ones_pass():
    for src in State:
        for dst in State:
            robot = RecordingRobot(start_watchdog=False)
            robot._state = src
            if dst in TRANSITIONS[src]:
                robot._transition(dst)
                assert robot.state is dst
            else:
                with pytest.raises(RobotStateError, match=f"cannot go from {src.value} to {dst.value}"):
                    robot._transition(dst)
                assert robot.state is src


def test_public_lifecycle_enforces_order():
    robot = RecordingRobot(start_watchdog=False)
    with pytest.raises(RobotStateError):
        robot.arm()                      # not connected
    with pytest.raises(RobotStateError):
        robot.observe()
    assert robot.send_action(np.zeros(4)) is None and robot.commands == []
    robot.connect()
    with pytest.raises(RobotStateError):
        robot.connect()
    with pytest.raises(RobotStateError):
        robot.recover()                  # not faulted
    assert robot.send_action(np.zeros(4)) is None   # connected but not armed
    robot.arm()
    assert robot.state is State.ARMED
    assert robot.send_action(np.zeros(4)) is not None
    robot.estop("test")
    assert robot.state is State.FAULT and robot.send_action(np.zeros(4)) is None
    with pytest.raises(RobotStateError):
        robot.arm()
    robot.recover()
    robot.arm()
    robot.disconnect()
    assert robot.state is State.DISCONNECTED
    assert robot.chain.counts[("not_armed", "reject")] == 2 and robot.chain.counts[("estopped", "reject")] == 1


def test_context_manager_stops_the_arm_on_error():
    robot = RecordingRobot(start_watchdog=False)
    with pytest.raises(ZeroDivisionError):
        with robot:
            robot.arm()
            robot.send_action(np.zeros(4))
            1 / 0
    assert robot.state is State.DISCONNECTED and robot.holds >= 1


def test_config_errors_name_the_field():
    with pytest.raises(ConfigError, match="joint_pos_min_rad"):
        RobotConfig(dof=2, joint_pos_min_rad=[0.0], joint_pos_max_rad=[1, 1], joint_vel_max_rad_s=[1, 1],
                     joint_acc_max_rad_s2=[1, 1], home_joint_pos_rad=[0, 0])
    with pytest.raises(ConfigError, match="on_violation"):
        small_config(on_violation={"velocity": "ignore"})


def armed(**overrides):
    robot = RecordingRobot(small_config(**overrides), start_watchdog=False)
    robot.connect()
    robot.arm()
    return robot


def test_guard_rejects_nan_inf_shape_dtype_and_sends_a_hold():
    robot = armed()
    for bad in (np.full(4, np.nan), np.array([np.inf, 0, 0, 0]), np.zeros(5), np.zeros((1, 4)), "abc",
                np.array([1 + 2j, 0, 0, 0]), [[1, 2], [3]], None, np.array([True, False, True, False])):
        sent = robot.send_action(bad)
        assert sent is not None and np.allclose(sent[:3], 0.0)   # the hold: stay at rest where we are
    kinds = {k for (k, _) in robot.chain.counts}
    assert {"non_finite", "shape", "dtype"} <= kinds
    assert all(o == "reject" for (_, o) in robot.chain.counts)
    assert robot.watchdog is None


def test_relative_target_velocity_acceleration_and_joint_limits():
    robot = armed()
    cfg = robot.config
    sent = robot.send_action(np.array([5.0, 0, 0, 0.01]))          # a jump of 5 rad
    dt = cfg.period_s
    assert sent[0] == pytest.approx(cfg.joint_acc_max_rad_s2[0] * dt * dt)  # first step: acceleration bound
    for _ in range(300):
        sent = robot.send_action(np.array([5.0, 0, 0, 0.01]))
        assert abs(sent[0] - robot.commands[-2].values[0]) <= min(cfg.max_relative_target_rad,
                                                                   cfg.joint_vel_max_rad_s[0] * dt) + 1e-9
    assert sent[0] == pytest.approx(1.0)  # reached the joint limit, never beyond
    kinds = {k for (k, _) in robot.chain.counts}
    assert {"acceleration", "velocity", "joint_limit"} & kinds and "relative_target" in kinds


def test_velocity_mode_brakes_before_the_joint_limit():
    robot = armed(control_mode="joint_velocity")
    for _ in range(400):
        robot.send_action(np.array([0.0, 0.0, 10.0, 0.0]))
    targets = np.array([c.values for c in robot.commands])
    assert np.all(np.abs(targets[:, 2]) <= 0.5 + 1e-9)
    assert robot.q[2] <= 0.5 + 1e-9 and robot.q[2] > 0.45
    acc = np.diff(targets[:, 2]) / robot.config.period_s
    assert np.all(np.abs(acc) <= 5.0 + 1e-6)  # braking respected the acceleration limit


def test_workspace_box_in_joint_mode_and_ee_mode():
    robot = armed(max_relative_target_rad=0.5, joint_vel_max_rad_s=[50.0] * 3, joint_acc_max_rad_s2=[1e5] * 3)
    from robot_helpers import planar_fk
    for _ in range(200):
        robot.send_action(np.array([0.0, -1.5, 0.0, 0.0]))    # pointing down into the floor
    assert planar_fk(robot.q)[2] >= 0.2 - 1e-6
    assert robot.chain.counts[("workspace", "clip")] + robot.chain.counts[("workspace_wall", "clip")] > 0
    ee = armed(control_mode="ee_delta")
    for _ in range(50):
        sent = ee.send_action(np.array([0.5, 0, -0.5, 0.3, 0, 0, 0.0]))
        assert np.linalg.norm(sent[:3]) <= 0.01 + 1e-9 and np.linalg.norm(sent[3:6]) <= 0.05 + 1e-9
    assert ee.chain.counts[("ee_step", "clip")] == 100


def test_gripper_width_and_force():
    robot = armed(gripper_force_n=99.0)
    sent = robot.send_action(np.array([0.0, 0, 0, 0.5]))
    assert sent[-1] == pytest.approx(0.08) and robot.commands[-1].gripper_force_n == pytest.approx(30.0)
    assert robot.chain.counts[("gripper_width", "clip")] == 1 and robot.chain.counts[("gripper_force", "clip")] == 1


def test_policy_reject_and_fault():
    robot = armed(on_violation={"relative_target": "reject"})
    sent = robot.send_action(np.array([0.5, 0, 0, 0.0]))
    assert np.allclose(sent[:3], 0) and robot.state is State.ARMED
    assert robot.chain.counts[("relative_target", "reject")] == 1
    robot = armed(on_violation={"relative_target": "fault"})
    assert robot.send_action(np.array([0.5, 0, 0, 0.0])) is None
    assert robot.state is State.FAULT and "relative_target" in robot.fault_reason and robot.commands == []


def test_final_check_catches_a_broken_filter():
    class Broken:
        name = "broken"
        def __call__(self, cmd, ctx):
            cmd.values = cmd.values + 100.0
            return cmd, []

    robot = armed()
    robot.chain.filters.append(Broken())
    assert robot.send_action(np.zeros(4)) is None
    assert robot.state is State.FAULT and robot.commands == [] and "final_check" in robot.fault_reason


def arm_send_once_and_wait(robot, timeout_s: float = 2.0) -> float:
    """Arm, send one command, and wait for the watchdog to end the armed state; returns the seconds waited."""
    robot.arm()
    robot.send_action(np.zeros(4))
    t0 = time.monotonic()
    while robot.state is State.ARMED and time.monotonic() - t0 < timeout_s:
        time.sleep(0.001)
    return time.monotonic() - t0


def test_watchdog_holds_and_needs_rearm():
    robot = RecordingRobot(small_config(watchdog_deadline_ms=100.0))
    with robot:
        waited = arm_send_once_and_wait(robot)
        assert robot.state is State.CONNECTED and robot.holds == 1
        assert 0.09 < waited < 0.5
        assert robot.send_action(np.zeros(4)) is None   # needs an explicit re-arm
        robot.arm()
        for _ in range(30):                              # valid commands keep it armed
            robot.send_action(np.zeros(4))
            time.sleep(0.01)
        assert robot.state is State.ARMED
        for _ in range(30):                              # rejected commands do not
            robot.send_action(np.full(4, np.nan))
            time.sleep(0.01)
        assert robot.state is State.CONNECTED


class BrokenLinkRobot(RecordingRobot):
    """Its hold fails the way a stalled network makes an SDK's stop fail."""

    def _hold(self):
        self.holds += 1
        raise ConnectionError("link interrupted")


def test_a_hold_that_fails_faults_the_robot():
    """Before: the Franka driver swallowed the error, so a watchdog hold over a broken link left the robot
    'held' and nothing faulted it (franky-sim stall test, CI on the AMD EPYC)."""
    robot = BrokenLinkRobot(start_watchdog=False)
    with robot:
        robot.arm()
        with pytest.raises(RobotFault, match="hold failed: link interrupted"):
            robot.hold("stop")
        assert robot.state is State.FAULT and "hold failed" in robot.fault_reason


def test_a_watchdog_hold_that_fails_faults_the_robot():
    robot = BrokenLinkRobot(small_config(watchdog_deadline_ms=50.0))
    with robot:
        arm_send_once_and_wait(robot)
        assert robot.state is State.FAULT and robot.holds >= 1
        assert robot.send_action(np.zeros(4)) is None


def test_estop_from_another_thread():
    robot = RecordingRobot(small_config())
    with robot:
        robot.arm()
        thread = threading.Thread(target=robot.estop, args=("button",))
        thread.start()
        thread.join()
        assert robot.state is State.FAULT and robot.send_action(np.zeros(4)) is None
        assert any(e["kind"] == "estop" for e in robot.events)


def test_chain_is_the_only_path_to_the_backend():
    """Every backend command equals what send_action returned: nothing is sent around the chain."""
    robot = armed()
    rng = np.random.default_rng(0)
    returned = [robot.send_action(rng.normal(size=4) * 3) for _ in range(50)]
    assert len(robot.commands) == 50
    for cmd, out in zip(robot.commands, returned):
        assert np.array_equal(cmd.as_action(), out)
    assert isinstance(robot.chain, SafetyChain) and ControlMode.JOINT_POSITION is robot.mode


@pytest.mark.parametrize("base", ["commanded", "measured"])
def test_ee_delta_steps_add_to_the_commanded_or_the_measured_end_effector(base):
    cfg = RobotConfig(dof=3, control_mode="ee_delta", ee_delta_base=base, joint_pos_min_rad=[-3.0] * 3,
                      joint_pos_max_rad=[3.0] * 3, joint_vel_max_rad_s=[1.0] * 3, joint_acc_max_rad_s2=[8.0] * 3,
                      home_joint_pos_rad=[0.0] * 3, workspace_min_m=[-1, -1, 0], workspace_max_m=[1, 1, 1])
    chain = SafetyChain.from_config(cfg)
    obs = {"joint_pos_rad": np.zeros(3), "ee_pos_m": np.array([0.3, 0.0, 0.5]), "gripper_width_m": 0.04}
    chain.reset(obs)
    targets = []
    for _ in range(3):  # the arm does not move: a Cartesian controller that lags, or a blocked arm
        result = chain.filter(np.array([0.0, 0.0, -0.01, 0.0, 0.0, 0.0, 0.04]), obs, ControlMode.EE_DELTA)
        chain.commit(result.command)
        targets.append(result.command.ee_target_m[2])
    want = [0.49, 0.49, 0.49] if base == "measured" else [0.49, 0.48, 0.47]
    assert np.allclose(targets, want)
    with pytest.raises(ConfigError, match="ee_delta_base"):
        RobotConfig(ee_delta_base="target")
