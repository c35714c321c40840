"""The simulated UR5e: its own process, real-time pacing, the drivers' keys, injected faults."""
from __future__ import annotations

import os
import signal
import time

import numpy as np
import pytest

import robots
from robots.base import RobotFault, State
from robots.sim_arm import SimArm

pytestmark = pytest.mark.slow  # the sim arm runs in its own process

KEYS = {"observation.state", "joint_pos_rad", "joint_vel_rad_s", "ee_pos_m", "ee_quat_wxyz", "gripper_width_m",
        "timestamp_s"}


def run_for(robot, seconds, action_fn):
    period = robot.config.period_s
    next_t = time.monotonic()
    while next_t < time.monotonic() + seconds and seconds > 0:
        obs = robot.observe()
        robot.send_action(action_fn(obs))
        seconds -= period
        next_t += period
        time.sleep(max(0.0, next_t - time.monotonic()))


@pytest.fixture(scope="module")
def arm():
    robot = robots.make("sim_ur5e")
    with robot:
        yield robot


def test_keys_units_and_real_time_pacing(arm):
    assert isinstance(arm, SimArm) and arm.state is State.CONNECTED
    obs = arm.observe()
    assert set(obs) == KEYS
    assert obs["observation.state"].shape == (7,) and obs["observation.state"].dtype == np.float32
    assert np.allclose(obs["joint_pos_rad"], arm.config.home_joint_pos_rad, atol=0.02)
    t0, s0 = time.monotonic(), arm.server_state()["t_s"]
    time.sleep(0.5)
    dt_server = arm.server_state()["t_s"] - s0
    assert abs(dt_server - (time.monotonic() - t0)) < 0.1   # the server runs on the wall clock


def test_episode_joint_targets_and_gripper(arm):
    arm.reset_joints(arm.config.home_joint_pos_rad)
    time.sleep(0.05)
    arm.arm()
    q0 = arm.observe()["joint_pos_rad"].astype(np.float64)
    goal = q0 + np.array([0.3, -0.2, 0.2, 0, 0, 0.3])
    t0 = time.monotonic()
    ramp = lambda o: np.append(q0 + min(1.0, (time.monotonic() - t0) / 1.0) * (goal - q0), 0.01)  # noqa: E731
    run_for(arm, 1.6, ramp)   # a trajectory within the limits (0.3 rad in 1 s), then stay on the goal
    obs = arm.observe()
    assert np.abs(obs["joint_pos_rad"] - goal).max() < 0.03     # MuJoCo servos tracked the filtered targets
    assert obs["gripper_width_m"] < 0.03                        # Robotiq fingers closed
    run_for(arm, 0.8, lambda o: np.append(goal, 0.085))
    assert arm.observe()["gripper_width_m"] > 0.07
    arm.hold()


def test_ee_delta_mode_moves_the_pinch_site():
    cfg = robots.load_config("sim_ur5e")
    cfg["control_mode"] = "ee_delta"
    with robots.make(cfg) as robot:
        robot.arm()
        p0 = robot.observe()["ee_pos_m"].astype(np.float64)
        run_for(robot, 1.0, lambda o: np.array([0.0, 0.0, 0.004, 0, 0, 0, 0.085]))
        p1 = robot.observe()["ee_pos_m"]
        assert 0.05 < p1[2] - p0[2] < 0.6 and np.abs(p1[:2] - p0[:2]).max() < 0.03


def test_injected_latency_drops_and_noise(arm):
    arm.reset_joints(arm.config.home_joint_pos_rad)
    time.sleep(0.1)
    arm.inject(noise_q_rad=0.01)
    time.sleep(0.1)
    qs = np.stack([arm.observe()["joint_pos_rad"] for _ in range(30) if not time.sleep(0.004)])
    assert 0.003 < qs.std(0).mean() < 0.03                      # sensor noise on the joint readings
    arm.inject(noise_q_rad=0.0, latency_ms=40.0)
    time.sleep(0.2)
    ages = []
    for _ in range(20):
        obs = arm.observe()
        ages.append(time.monotonic() - obs["timestamp_s"])
        time.sleep(0.005)
    assert np.median(ages) > 0.035                              # state arrives ~40 ms after it was measured
    arm.inject(latency_ms=0.0, drop_prob=0.5)
    time.sleep(0.3)
    before = arm.server_state()
    time.sleep(0.3)
    after = arm.server_state()
    assert after["states_dropped"] - before["states_dropped"] > 40   # ~150 states in 0.3 s at 500 Hz
    arm.inject(drop_prob=0.0)


def test_injected_jitter_and_dropped_commands(arm):
    arm.reset_joints(arm.config.home_joint_pos_rad)
    arm.inject(latency_ms=5.0, jitter_ms=30.0)
    time.sleep(0.2)
    ages = []
    for _ in range(60):
        obs = arm.observe()
        ages.append(time.monotonic() - obs["timestamp_s"])
        time.sleep(0.003)
    assert np.std(ages) > 0.003 and np.max(ages) > 0.02                 # delays vary by up to 30 ms
    arm.inject(latency_ms=0.0, jitter_ms=0.0, drop_prob=0.5)
    time.sleep(0.05)
    arm.arm()
    before = arm.server_state()
    q = arm.observe()["joint_pos_rad"]
    for _ in range(100):
        arm.observe()
        arm.send_action(np.append(q, 0.085))
        time.sleep(0.005)
    time.sleep(0.1)
    after = arm.server_state()
    arm.inject(drop_prob=0.0)
    dropped = after["cmds_dropped"] - before["cmds_dropped"]
    arrived = after["cmds"] - before["cmds"]
    assert dropped + arrived == 100 and 25 < dropped < 75              # about half the packets lost
    arm.hold()


def test_server_death_is_a_fault():
    with robots.make("sim_ur5e") as robot:
        robot.arm()
        robot.kill_server()
        time.sleep(0.4)
        with pytest.raises(RobotFault):
            robot.observe()
        assert robot.state is State.FAULT


def test_an_arm_op_the_server_never_applies_is_a_fault_that_names_the_state_it_stayed_in():
    """The fuzz once saw arm() time out with no reason given; the error now says where the arm stayed."""
    with robots.make("sim_ur5e") as robot:
        pid = robot._proc.pid
        os.kill(pid, signal.SIGSTOP)   # the server never reads the arm op within arm()'s 2 s
        try:
            with pytest.raises(RobotFault, match=r"did not enter run mode after arm \(it stayed in 'hold'"):
                robot.arm()
        finally:
            os.kill(pid, signal.SIGCONT)
        assert robot.state is not State.ARMED


def test_a_stop_that_races_the_arm_op_is_named_as_a_stop_after_arming():
    """A stop the server applies in the same tick as the arm op (the fuzz's self-collision re-trips of an arm
    resting in contact) never shows `run` to the client; the error says the arm ran and was stopped again."""
    with robots.make("sim_ur5e") as robot:
        send = robot._send

        def arm_then_stop(msg):
            send(msg)
            if msg.get("op") == "arm":   # the same wire, the next message: the server reads both in one tick
                send({"op": "estop"})
        robot._send = arm_then_stop
        with pytest.raises(RobotFault, match=r"entered run mode after arm, then stopped again at once \('client'\)"):
            robot.arm()
        assert robot.state is not State.ARMED
