"""Limits per unit of time and on the motion actually executed (issue 14): pacing of unpaced callers,
late commands, braking at joint limits, the measured-state monitor, ee_delta through IK on the sim arm,
and a watchdog that survives a stalled loop and a stalled process."""
from __future__ import annotations

import collections
import ctypes
import os
import signal
import threading
import time

import numpy as np
import pytest

import robots
from robot_helpers import RecordingRobot, planar_fk, small_config
from robots.base import ControlMode, State
from robots.geometry import box_distance_m
from robots.safety import braking_stop_after


def armed(real_clock=False, fk=True, **overrides):
    robot = RecordingRobot(small_config(**overrides), start_watchdog=False, real_clock=real_clock, fk=fk)
    robot.connect()
    robot.arm()
    return robot


def test_an_unpaced_caller_gets_one_command_per_period():
    robot = armed(real_clock=True)
    t0 = time.monotonic()
    while time.monotonic() - t0 < 0.3:
        robot.send_action(np.array([0.9, 0.0, 0.0, 0.0]))   # as fast as the loop can go
    sends = len(robot.commands)
    assert 5 <= sends <= 32             # at most 100 Hz for 0.3 s (fewer on a loaded machine), not thousands
    targets = np.array([c.values[0] for c in robot.commands])
    speed = np.abs(np.diff(targets)).sum() / (time.monotonic() - t0)
    assert speed <= robot.config.joint_vel_max_rad_s[0] * 1.001   # per second, not per call
    assert robot.paced_s > 0.2


def test_a_late_command_resumes_from_the_stop_the_arm_made():
    robot = armed(joint_acc_max_rad_s2=[10.0, 20.0, 5.0])
    for _ in range(40):
        robot.send_action(np.array([0.9, 0.0, 0.0, 0.0]))     # at full speed, 1 rad/s
    v_before = (robot.commands[-1].values[0] - robot.commands[-2].values[0]) / robot.config.period_s
    assert v_before == pytest.approx(1.0)
    robot.virtual_s += 0.06                                    # the next command comes 50 ms late
    robot.send_action(np.array([0.9, 0.0, 0.0, 0.0]))
    ref_vel = robot.chain.ref_vel[0]
    # the arm braked at 10 rad/s^2 for 50 ms (to 0.5 rad/s); this command may only add 10 * 0.01
    assert ref_vel <= 1.0 - 10.0 * 0.05 + 10.0 * 0.01 + 1e-9


@pytest.mark.parametrize("mode", [ControlMode.JOINT_POSITION, ControlMode.JOINT_VELOCITY])
@pytest.mark.parametrize("acc", [3.0, 5.0, 40.0])
def test_braking_at_a_joint_limit_stays_within_the_acceleration_limit(mode, acc):
    robot = armed(fk=False, control_mode=mode.value, max_relative_target_rad=1.0, joint_vel_max_rad_s=[1.0, 2.0, 0.5],
                  joint_acc_max_rad_s2=[10.0, 20.0, acc])
    dt = robot.config.period_s
    q_prev, v_prev = robot.chain.ref_pos.copy(), np.zeros(3)
    for i in range(400):
        push = np.array([0.0, 0.0, 5.0 if i < 250 else -5.0, 0.0])     # into the elbow limit, then away
        if mode is ControlMode.JOINT_POSITION:
            push[:3] = robot.chain.ref_pos + push[:3]
        robot.send_action(push)
        cmd = robot.commands[-1]
        v = cmd.values if mode is ControlMode.JOINT_VELOCITY else (cmd.values - q_prev) / dt
        assert np.all(np.abs(v - v_prev) <= np.asarray(robot.config.joint_acc_max_rad_s2) * dt * (1 + 1e-9) + 1e-12)
        q_prev, v_prev = q_prev + v * dt, v
        assert q_prev[2] <= 0.5 + 1e-9
    assert robot.chain.counts[("velocity", "clip")] > 0 and q_prev[2] < 0.45   # it reached the limit and left


class DriftingRobot(RecordingRobot):
    """Reports a measured state that differs from what it was told: an arm that does not follow."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.ee_offset = np.zeros(3, np.float32)
        self.qd = np.zeros(3, np.float32)

    def _read(self):
        obs = super()._read()
        obs["ee_pos_m"] = obs["ee_pos_m"] + self.ee_offset
        obs["joint_vel_rad_s"] = self.qd.copy()
        return obs


def test_the_monitor_holds_when_the_measured_arm_leaves_the_box_or_speeds():
    robot = DriftingRobot(small_config(home_joint_pos_rad=[0.0, 0.6, -0.4]), start_watchdog=False)
    robot.connect()
    robot.arm()
    assert robot.send_action(np.array([0.0, 0.6, -0.4, 0.0])) is not None
    robot.ee_offset[2] = -2.0          # measured: far below the floor, whatever was commanded
    assert robot.send_action(np.array([0.0, 0.6, -0.4, 0.0])) is None
    assert robot.state is State.CONNECTED and robot.chain.counts[("measured_workspace", "reject")] == 1
    robot.ee_offset[:] = 0
    robot.arm()
    robot.qd[1] = 2.0 * 1.2            # joint 1 measured 20% over its 2 rad/s limit
    robot.observe()
    assert robot.state is State.CONNECTED and robot.chain.counts[("measured_speed", "reject")] == 1
    assert any(e["kind"] == "monitor" and "joint 1" in e["reason"] for e in robot.events)
    robot.qd[:] = 0
    robot.config.on_violation["measured_speed"] = "fault"
    robot.arm()
    robot.qd[0] = 5.0
    robot.observe()
    assert robot.state is State.FAULT


@pytest.mark.slow
def test_the_watchdog_holds_when_the_loop_stalls_holding_the_robot_lock():
    robot = RecordingRobot(small_config(watchdog_deadline_ms=200.0), real_clock=True)
    robot.connect()
    robot.arm()
    robot.send_action(np.zeros(4))
    t_last = time.monotonic()
    stalled = threading.Thread(target=lambda: (robot._lock.acquire(), time.sleep(1.0), robot._lock.release()))
    stalled.start()
    time.sleep(0.6)
    assert robot.holds == 1                        # the backend was told to stop while the loop was stuck
    fired = robot.watchdog_fired[0]
    assert "stalled" in fired["source"]
    assert fired["t_s"] - t_last <= 0.2 + robot.config.period_s + 0.03
    stalled.join()
    assert robot.send_action(np.zeros(4)) is None and robot.state is State.CONNECTED   # the state followed
    robot.disconnect()


@pytest.fixture(scope="module")
def ee_arm():
    cfg = robots.load_config("sim_ur5e")
    cfg["control_mode"] = "ee_delta"
    with robots.make(cfg) as robot:
        yield robot


@pytest.mark.slow
def test_ee_delta_through_ik_keeps_the_measured_arm_inside_its_limits(ee_arm):
    """Push the end effector into the floor and a side wall, unpaced: what the arm does is checked."""
    robot = ee_arm
    robot.arm()
    robot.reset_peaks()
    for direction in ([0, 0, -1], [0, 1, 0], [1, 0, 0], [0, 0, 1]):
        for _ in range(80):
            robot.send_action(np.array([*(0.05 * np.asarray(direction, float)), 0.0, 0.0, 0.2, 0.085]))
    time.sleep(0.1)
    state = robot.server_state()
    assert state["cmds_ignored"] == 0 and state["mode"] == "run"   # all of them executed, as joint targets
    assert state["peak_speed_ratio"] <= 1.05 and state["peak_acc_ratio"] <= 1.05
    assert state["peak_box_excess_m"] <= robot.config.monitor_workspace_tol_m
    at = state["peak_acc_at"]   # what the arm was doing at that peak, for the fuzz's attribution
    assert at["joint"] == state["peak_acc_joint"] and at["mode"] == "run" and len(at["window_vel_rad_s"]) == 2
    assert at["since_arm_ms"] >= at["since_command_started_ms"] >= 0   # armed before any command ran
    assert at["since_release_ms"] is None   # no e-stop was released in this run
    counts = robot.chain.counts
    assert counts[("ee_step", "clip")] > 0 and counts[("workspace", "clip")] > 0
    robot.hold()


@pytest.mark.slow
def test_a_recover_while_the_arm_still_moves_waits_for_rest():
    """An e-stop at the speed limit, then a recover at once, with `estop_settle_ms` 4: the arm is released
    only once it rests, and the hold starts where it rests. Releasing it on the timeout while it still
    moved, into a hold at the position the stop froze, yanked it back: 6.03x the acceleration limit here,
    1.28x in a loaded fuzz, 310 ms after a self-collision stop (issue 14)."""
    cfg = robots.load_config("sim_ur5e")
    cfg["control_mode"] = "joint_velocity"
    cfg["sim"] = {**cfg.get("sim", {}), "estop_settle_ms": 4.0}   # the timeout passes long before the arm rests
    with robots.make(cfg) as robot:
        robot.arm()
        end = time.monotonic() + 1.2
        while time.monotonic() < end:   # the base joint up to its speed limit (send_action paces itself)
            robot.send_action(np.array([1.0, 0, 0, 0, 0, 0, 0.085]))
        robot.estop()
        robot.reset_peaks()              # the stop itself is a category-0 stop: not counted
        robot.recover()                  # returns once the server has left the stop
        released = robot.server_state()
        assert released["mode"] == "hold" and np.abs(released["joint_vel_rad_s"]).max() < 0.05
        time.sleep(0.4)
        state = robot.server_state()
    assert state["peak_acc_ratio"] <= 1.05, state["peak_acc_at"]


@pytest.mark.slow  # a few seconds on 2 cores
def test_an_arm_resting_past_a_joint_limit_is_not_yanked_back_when_it_moves_again():
    """A collision can push a joint past its software limit (the hard stop lies beyond it): the hold takes
    the arm where it rests, and the first command used to clip that reference onto the limit in one tick,
    a step the servos made at 2.55x the acceleration limit (a loaded fuzz: wrist 1 27 mrad past its limit,
    released 12 ms before). The reference may start past a limit; it only may not move further out."""
    cfg = robots.load_config("sim_ur5e")
    cfg["control_mode"] = "joint_velocity"
    with robots.make(cfg) as robot:
        q = np.asarray(robot.config.home_joint_pos_rad, float).copy()
        q[3] = robot.config.joint_pos_max_rad[3] + 0.027      # inside the hard stop, past the software limit
        robot.reset_joints(q)
        time.sleep(0.1)
        robot.arm()
        robot.reset_peaks()
        end = time.monotonic() + 0.4
        while time.monotonic() < end:   # another joint moves: every joint's reference is stepped each tick
            robot.send_action(np.array([0.3, 0, 0, 0, 0, 0, 0.085]))
        time.sleep(0.1)
        state = robot.server_state()
    assert state["peak_acc_ratio"] <= 1.05, state["peak_acc_at"]
    assert state["joint_pos_rad"][3] > robot.config.joint_pos_max_rad[3]   # not dragged back without a command


@pytest.mark.slow
def test_the_arm_holds_by_itself_when_the_whole_controller_process_stalls(ee_arm):
    """Every thread of this process stops (the GIL held in a C call): only the arm's own deadline acts."""
    robot = ee_arm
    robot.arm()
    for _ in range(10):
        robot.send_action(np.array([0, 0, 0, 0, 0, 0, 0.085]))
    ctypes.PyDLL(None).usleep(1_000_000)
    robot.observe()
    state = robot.server_state()
    assert state["mode"] == "hold" and state["hold_reason"] == "watchdog"
    hold_after_s = state["t_hold_s"] - state["last_cmd_sent_s"]
    assert robot.config.watchdog_deadline_ms / 1e3 <= hold_after_s <= (robot.config.watchdog_deadline_ms / 1e3
                                                                        + robot.config.period_s)
    assert robot.state is State.CONNECTED and robot.watchdog_fired   # recorded here too once the process ran


@pytest.mark.slow
def test_joint_position_pushes_into_the_floor_stop_where_the_chain_planned():
    """Unpaced joint-position bursts at the speed and acceleration limits (a zigzag of the shoulder,
    then straight down into the floor): the sim arm must execute the chain's path, not lag behind it
    and catch up. Its reference fell behind (ticks and command arrivals a few ms late, no room to make
    that up at the limits), caught up faster than the chain moved and reached the stop the workspace
    filter had planned at the floor faster than planned: it braked past it, 23-56 mm out of the box,
    and the monitor held the arm (issue 14)."""
    with robots.make("sim_ur5e") as robot:
        robot.arm()
        robot.reset_peaks()
        time.sleep(0.05)
        pushes = [np.array([0.0, (-1.0) ** (k // 6), 0.0, 1.0, 1.0, 0.0]) for k in range(60)]
        pushes += [np.array([0.0, 1.0, 0.0, 1.0, 1.0, 0.0])] * 100
        for push in pushes:   # as fast as send_action lets the loop go, each a far jump
            robot.send_action(np.append(robot.observe()["joint_pos_rad"] + 3.0 * push, 0.085))
        time.sleep(0.3)       # the last stop brakes out
        state = robot.server_state()
        assert robot.state is State.ARMED and state["mode"] == "run" and state["cmds_ignored"] == 0
        assert robot.chain.counts[("workspace", "clip")] > 0            # it did meet the floor
        assert state["peak_box_excess_m"] <= 0.01   # the plan stops 2 mm inside; before: 23-56 mm
        assert state["peak_speed_ratio"] <= 1.05 and state["peak_acc_ratio"] <= 1.05


def test_joint_velocity_stops_inside_the_box_from_where_the_arm_measures():
    """joint_velocity: the arm sits 0.05 rad lower at the shoulder than the chain's reference (velocities
    carry no position, and late commands' ageing leaves such offsets behind). Driven hard into the floor,
    the measured arm must still stop inside the box: the stop is checked from the measured joints too.
    Checked from the reference alone, it went below the floor until the monitor held it (issue 14)."""
    robot = armed(control_mode="joint_velocity", home_joint_pos_rad=[0.0, 0.3, -1.2])
    robot.q = robot.q + np.array([0.0, -0.05, 0.0])      # the arm is not where the chain thinks
    floor = robot.config.workspace_min_m[2]
    lowest = np.inf
    for _ in range(300):
        robot.send_action(np.array([0.0, -2.0, 0.0, 0.0]))  # the shoulder down, hard
        lowest = min(lowest, planar_fk(robot.q)[2])
    assert robot.chain.counts[("workspace", "clip")] > 0
    assert robot.state is State.ARMED and lowest >= floor - 1e-9, lowest - floor


class StaleArm(RecordingRobot):
    """A perfect servo whose measured state (joint speeds included) arrives `lag` readings late, as a
    loaded machine delivers it."""

    def __init__(self, lag: int, **overrides):
        super().__init__(small_config(**overrides), start_watchdog=False)
        self.history = collections.deque(maxlen=lag + 1)
        self.prev_q = self.q.copy()

    def _read(self):
        obs = super()._read()
        obs["joint_vel_rad_s"] = ((self.q - self.prev_q) / self.config.period_s).astype(np.float32)
        self.prev_q = self.q.copy()
        self.history.append(obs)
        return self.history[0]


def test_joint_velocity_reference_reanchors_where_the_arm_rests():
    """joint_velocity: the arm rests 0.05 rad lower at the shoulder than the chain's reference (what a
    loaded fuzz left between them: 13.6 mrad, since a velocity carries no position), and its measured state
    is 30 ms old. Then a hard push into the floor: before, the reference stopped at the floor, the arm went
    25.6 mm below it and the monitor held it (a loaded fuzz: 10-22 mm, issue 14). Now, once both rest,
    the reference is where the arm is, and the push stops inside."""
    robot = StaleArm(lag=3, control_mode="joint_velocity", home_joint_pos_rad=[0.0, 0.3, -1.2])
    robot.connect()
    robot.arm()
    robot.q = robot.prev_q = robot.q + np.array([0.0, -0.05, 0.0])   # at rest, off the reference
    for _ in range(5):
        robot.send_action(np.zeros(4))                                # resting: the new state comes in
    assert np.abs(robot.chain.ref_pos - robot.q).max() < 1e-6
    floor, lowest = robot.config.workspace_min_m[2], np.inf
    for _ in range(300):
        robot.send_action(np.array([0.0, -2.0, 0.0, 0.0]))            # the shoulder down, hard
        lowest = min(lowest, planar_fk(robot.q)[2])
    assert robot.chain.counts[("workspace", "clip")] > 0
    assert robot.state is State.ARMED and lowest >= floor - 1e-9, lowest - floor


def test_a_reference_reanchored_after_a_late_command_does_not_brake_on_from_the_arm():
    """joint_velocity: a command at 1 rad/s, then the next one 0.5 s late, when the stop (0.05 s at 20 rad/s^2)
    is long over and the arm rests. The reference re-anchors where the arm is, at rest: its old velocity must
    not age it on by the stopping distance (25 mrad) past the arm."""
    robot = armed(control_mode="joint_velocity")
    for _ in range(10):
        robot.send_action(np.array([0.0, 1.0, 0.0, 0.0]))   # up to 1 rad/s at 20 rad/s^2
    assert robot.chain.ref_vel[1] == pytest.approx(1.0)
    robot.virtual_s += 0.5
    robot.send_action(np.zeros(4))
    assert np.abs(robot.chain.ref_pos - robot.q).max() < 1e-6 and not np.any(robot.chain.ref_vel)


@pytest.mark.parametrize("late_ms", [0.4, 3.0])
def test_late_commands_into_a_wall_brake_within_the_acceleration_limit(late_ms):
    """Every command a little late (as on a loaded machine) while pushing into the floor: the aged
    reference must stay on the stopping path the workspace filter checked, so braking still stops
    inside the box. Ageing along a continuous stop put it past that path; even braking then left the
    box, the step was cut at the wall harder than the arm can stop, and the reference walked out of
    the box, where every step away from it was stopped dead (issue 14)."""
    robot = armed(home_joint_pos_rad=[0.0, 0.6, -0.4])
    dt, amax = robot.config.period_s, np.asarray(robot.config.joint_acc_max_rad_s2)
    lo, hi = np.array(robot.config.workspace_min_m), np.array(robot.config.workspace_max_m)
    v_prev = np.zeros(3)
    for _ in range(200):
        ref = robot.chain.ref_pos.copy()
        robot.send_action(np.array([0.0, ref[1] - 1.0, 0.0, 0.0]))   # the shoulder down, hard
        robot.virtual_s += dt + late_ms / 1e3                        # the next one comes late
        v = robot.chain.ref_vel.copy()
        assert np.all(np.abs(v - v_prev) <= amax * dt + amax * late_ms / 1e3 + 1e-9)  # braking, never a cut
        v_prev = v
    assert robot.chain.counts[("workspace", "clip")] > 0                 # it met the floor
    assert robot.chain.counts[("workspace_wall", "clip")] == 0           # and never had to stop harder
    p = planar_fk(robot.chain.ref_pos)
    assert np.all(p >= lo - 1e-9) and np.all(p <= hi + 1e-9) and np.abs(robot.chain.ref_vel).max() < 1e-9


@pytest.mark.slow
@pytest.mark.parametrize("joint,sign,jitter_ms", [(0, 1.0, 0.0), (5, 1.0, 0.0), (4, -1.0, 0.0), (4, -1.0, 4.0)])
def test_braking_into_a_joint_limit_the_arm_follows_its_reference_to_rest(joint, sign, jitter_ms):
    """Push one joint into its limit at 2 pi, unpaced (with and without delivery jitter): the chain brakes
    it to rest at the limit and the arm must follow its reference there, within its acceleration limit.
    The servo set-point is the reference plus a velocity lead, and the model's ctrlrange (the joint
    range) clipped that lead within 0.2 rad of a limit: the arm lagged its reference there and came to
    rest 1.1-1.4 mrad short of it. The model's joint range, the same numbers as the configured limits,
    acted as a hard stop right at them, and the reference, which here ran each queued command one
    period back to back while the chain aged its own by the time between commands, could reach a limit
    at up to 0.4 rad/s and be clipped there (1.1-1.25x the acceleration limit in robot_safety_fuzz,
    issue 14)."""
    cfg = robots.load_config("sim_ur5e")
    cfg["control_mode"] = "joint_velocity"
    cfg["sim"]["jitter_ms"] = jitter_ms
    q0 = np.array([-1.5708, -1.5708, 1.5708, -1.5708, -1.5708, 0.0])
    q0[joint] = sign * 5.8
    push = np.zeros(6)
    push[joint] = sign
    with robots.make(cfg) as robot:
        limit = (robot.config.joint_pos_max_rad if sign > 0 else robot.config.joint_pos_min_rad)[joint]
        robot.reset_joints(q0)
        time.sleep(0.2)
        robot.arm()
        robot.reset_peaks()
        time.sleep(0.02)
        for _ in range(100):
            robot.send_action(np.append(3.0 * push, 0.085))
        deadline = time.monotonic() + 3.0  # at rest, however loaded the machine (the old code rests short too)
        while True:
            time.sleep(0.05)
            state = robot.server_state()
            at_rest = (abs(state["target_vel_rad_s"][joint]) < 1e-9 and abs(state["joint_vel_rad_s"][joint]) < 1e-3)
            if at_rest or time.monotonic() > deadline:
                break
        assert robot.state is State.ARMED and state["mode"] == "run" and state["cmds_ignored"] == 0
        q, target = state["joint_pos_rad"][joint], state["target_rad"][joint]
        assert abs(q - target) < 5e-4, (q, target)   # the arm rests where its reference does (before: 1.1-1.4 mrad off)
        assert state["peak_speed_ratio"] <= 1.05 and state["peak_acc_ratio"] <= 1.05, state["peak_acc_ratio"]
        assert sign * (target - limit) <= 1e-9       # never past the limit
        # and at it, when the server met every command on time. After a stall of its own on a loaded
        # machine it met the ones sent during it 10-50 ms late (the sim server's docstring, still open),
        # and in joint_velocity nothing then brings its reference back to the chain's: it rested 1.1-2.7
        # mrad short in a CI run. Those runs still check everything above
        if state["peak_cmd_late_s"] <= 2.5 / robot.config.sim.get("server_rate_hz", 500.0):
            assert abs(q - limit) < 5e-4, (q, limit, state["peak_cmd_late_s"])


@pytest.mark.slow
def test_commands_sent_while_the_sim_server_stalls_are_met_when_due():
    """The server process stops (SIGSTOP, as a loaded machine deschedules it) while the controller keeps
    sending at its rate. Resumed, the server runs its missed ticks back to back; each command sent
    meanwhile must be met at the tick it was due, not after the catch-up. Over ZeroMQ the commands sat
    in its I/O thread, stopped with the loop, and were met 10-50 ms late (`peak_cmd_late_s`): in
    joint_velocity nothing re-anchors that, so the arm's rest drifted from the chain's (issue 14). The
    command socket is now one the loop reads itself, and the kernel queues datagrams while it is stopped."""
    cfg = robots.load_config("sim_ur5e")
    cfg["control_mode"] = "joint_velocity"
    push = np.zeros(7)
    push[5], push[6] = 0.3, 0.085
    tick_s = 1.0 / float(cfg["sim"]["server_rate_hz"])
    late = []
    with robots.make(cfg) as robot:
        robot.arm()
        for stall in range(10):
            robot.reset_peaks()
            for _ in range(5):
                robot.send_action(push)
            pid = robot._proc.pid
            os.kill(pid, signal.SIGSTOP)
            try:
                for _ in range(3 + stall % 5):   # 30-70 ms of commands while the server is stopped
                    robot.send_action(push)
            finally:
                os.kill(pid, signal.SIGCONT)
            for _ in range(5):
                robot.send_action(push)
            time.sleep(0.05)
            state = robot.server_state()
            assert state["time_lost_s"] == 0.0 and robot.state is State.ARMED
            late.append(state["peak_cmd_late_s"])
            push[5] = -push[5]
    # every stall's commands within a few ticks of when they were due: before, 1-2 stalls in 10 had them
    # met 25-48 ms late (three runs, load 3.5 on 2 cores); after, at most 4.3 ms (two runs, same load)
    assert max(late) <= 5 * tick_s, late


@pytest.mark.slow  # a few seconds on 2 cores
def test_after_a_stall_the_sim_arm_runs_each_command_when_it_was_sent():
    """The sim arm server stalls (SIGSTOP) while the controller sends a velocity command, waits 30 ms and
    sends the next: the chain, which saw the second one come late, ages its reference along the stop the
    arm makes meanwhile. The server, resumed, runs its missed ticks back to back and must meet each
    command at the time it was sent, as a real-time arm would. It met both at its first catch-up tick
    instead; in joint_velocity mode nothing anchors the reference, so each stall moved the arm's rest
    1-10 mrad off the chain's, and the offsets added up (29 mrad after 4 stalls), as under load in
    robot_safety_fuzz, where the arm left the workspace box by 39 mm (issue 14). After the fix each
    stall moves it by at most 1.4 mrad here. One rest read wrong spoils the two differences around it (a CI
    run: 0.1, 10.3, 9.4, 0.1 mrad), so the median is over 6 stalls; the message carries the signed offsets and
    each stall's latest command, to tell that apart from the drift."""
    cfg = robots.load_config("sim_ur5e")
    cfg["control_mode"] = "joint_velocity"
    joint = 5  # the flange: the pinch site stays on its axis, far from every wall
    push = np.zeros(7)
    push[joint], push[6] = 0.6, 0.085
    offsets = [0.0]
    with robots.make(cfg) as robot:
        amax, dt = np.asarray(robot.config.joint_acc_max_rad_s2), robot.config.period_s
        robot.arm()
        late = []
        for _ in range(6):
            time.sleep(0.02)
            robot.reset_peaks()
            for _ in range(15):
                robot.send_action(push)
            pid = robot._proc.pid
            os.kill(pid, signal.SIGSTOP)
            try:
                robot.send_action(push)
                time.sleep(0.03)
                robot.send_action(push)
                time.sleep(0.01)
            finally:
                os.kill(pid, signal.SIGCONT)
            rest = braking_stop_after(robot.chain.ref_pos, robot.chain.ref_vel, 10.0, amax, dt)[0][joint]
            deadline = time.monotonic() + 3.0
            while time.monotonic() < deadline:
                time.sleep(0.05)
                state = robot.server_state()
                if abs(state["target_vel_rad_s"][joint]) < 1e-9 and abs(state["joint_vel_rad_s"][joint]) < 1e-3:
                    break
            assert robot.state is State.ARMED and state["time_lost_s"] == 0.0   # caught up, not given up on
            offsets.append(state["target_rad"][joint] - rest)   # the arm's rest minus the chain's
            late.append(state["peak_cmd_late_s"])
    per_stall = np.abs(np.diff(offsets))
    assert float(np.median(per_stall)) < 4e-3, (np.diff(offsets), late)   # before: 1-10 mrad per stall, median ~9


class SteppedServer:
    """The sim arm server stepped tick by tick in this process (real MuJoCo, no sockets used), so a
    contact scenario plays out the same way every time: the fuzz meets these only under load."""

    def __init__(self, mode="joint_velocity"):
        from robots.sim_server import SimArmServer
        from robots.types import RobotConfig

        cfg = robots.load_config("sim_ur5e")
        cfg["control_mode"] = mode
        self.server = SimArmServer(RobotConfig.from_dict(cfg))
        self.t_s, self.freed_in_run = 0.0, False

    def tick(self, n=1):
        s = self.server
        for _ in range(n):
            was_in_contact = s._in_contact
            self.t_s += 1.0 / s.rate_hz
            s.step(self.t_s)
            self.freed_in_run |= was_in_contact and not s._in_contact and s.mode == "run"

    def send(self, op, **msg):
        self.server._apply({"op": op, **msg}, self.t_s)

    def rest_in_contact_then_arm(self, joint_pos_rad):
        self.send("reset", joint_pos_rad=joint_pos_rad)
        self.tick(150)
        assert self.server._in_contact and self.server.mode == "hold"
        self.send("arm")
        self.send("reset_peaks")

    def velocity(self, vel_rad_s, ticks):
        for k in range(ticks):
            if k % self.server._window == 0 and self.server.mode == "run":
                self.send("cmd", mode="joint_velocity", values=list(vel_rad_s), gripper_width_m=0.085,
                          t_send_s=self.t_s)
            self.tick()


@pytest.fixture
def stepped():
    server = SteppedServer()
    yield server
    server.server.close()


def test_an_arm_a_contact_held_back_is_not_sprung_forward_when_the_contact_ends(stepped):
    """The gripper rests against the forearm (a contact that outlasted a stop is no new collision) and
    wrist 1 turns it away: the contact holds the arm back while the reference goes on, and when it let
    go the servos sprang the arm to its reference at 1.50x the acceleration limit here (1.05-1.10x in
    loaded fuzzes, 20 ms after the touch)."""
    stepped.rest_in_contact_then_arm([-2.7177, -2.4025, 2.7963, -0.306, -1.8036, 0.0])
    stepped.velocity([0, 0, 0, -0.3, 0, 0], ticks=100)
    server = stepped.server
    assert stepped.freed_in_run
    assert server.peaks["peak_acc_ratio"] <= 1.05, server.peak_acc_at
    assert server.mode == "run"   # before: the spring-back ran the arm into a new collision stop


@pytest.mark.parametrize("vel, counted_mm", [([0, 0, 0, 0.3, 0, 0], (0.0, 1.0)),    # away from the contact
                                             ([0, 0, -0.3, 0, 0, 0], (3.0, 10.0))])  # and further out
def test_box_excess_a_collision_left_is_reported_apart_from_the_controllers(stepped, vel, counted_mm):
    """An arm pressed against itself below the box floor moves off the contact: where the collision left
    it is `peak_box_displaced_m`, and only what the controller adds beyond it counts (a loaded fuzz
    counted 29.6 mm for an arm resting where a self-collision had left it). The raw server has no chain
    to stop the elbow from going further out, so that motion is counted."""
    stepped.rest_in_contact_then_arm([-2.2648, -0.8297, 2.9197, -2.1729, -0.3374, 0.0])
    stepped.velocity(vel, ticks=50)
    stepped.tick(100)
    server = stepped.server
    assert stepped.freed_in_run and server.mode == "run"
    assert box_distance_m(server.data.site_xpos[server.arm.site], server.box_lo, server.box_hi) > 0.025
    assert server.peaks["peak_box_displaced_m"] > 0.025
    assert counted_mm[0] <= 1e3 * server.peaks["peak_box_excess_m"] <= counted_mm[1]


def test_outside_the_box_a_step_that_goes_no_further_out_is_allowed():
    """An arm left a hair below the floor (a Cartesian move that ended there) could make no motion that
    left the end effector's distance to the box unchanged, a wrist turn included: every such step was
    stopped, and franka_sim's joint-7 test saw 1400 of 1400 commands stopped (issue 14). Steps further
    out stay stopped."""
    home = [0.0, -0.45, -0.2]
    lo = np.array(small_config().workspace_min_m)
    assert planar_fk(np.array(home))[2] < lo[2] - 0.2                       # well below the floor
    robot = armed(control_mode="joint_velocity", home_joint_pos_rad=home)
    for _ in range(20):                                                    # base yaw: the height stays
        robot.send_action(np.array([0.5, 0.0, 0.0, 0.04]))
        robot.virtual_s += robot.config.period_s
    assert robot.q[0] > 0.05 and robot.chain.counts[("workspace_wall", "clip")] == 0
    q_before = robot.q.copy()
    for _ in range(5):                                                     # the shoulder down: further out
        robot.send_action(np.array([0.0, -1.0, 0.0, 0.04]))
        robot.virtual_s += robot.config.period_s
    assert robot.q[1] >= q_before[1] - 1e-9 and robot.chain.counts[("workspace_wall", "clip")] >= 5


def corner_chain(mode: str):
    """A 3-joint chain whose end effector is its joints (fk = identity), in the unit box, with the speed and
    acceleration to reach any point of the 2 mm planning margin in one step and stop on the next."""
    from robots.safety import SafetyChain
    config = small_config(control_mode=mode, joint_pos_min_rad=[-5.0] * 3, joint_pos_max_rad=[5.0] * 3,
                          joint_vel_max_rad_s=[2.0] * 3, joint_acc_max_rad_s2=[400.0] * 3,
                          max_relative_target_rad=0.05, workspace_min_m=[0.0] * 3, workspace_max_m=[1.0] * 3,
                          home_joint_pos_rad=[1.0] * 3)
    return SafetyChain(config)


def step_command(chain, mode: ControlMode, q: np.ndarray, step: np.ndarray) -> np.ndarray:
    """The mode's action (gripper included) that moves the joints by `step` in one period from `q`."""
    values = step / chain.config.period_s if mode is ControlMode.JOINT_VELOCITY else q + step
    return np.append(values, 0.04)


@pytest.mark.parametrize("mode", [ControlMode.JOINT_VELOCITY, ControlMode.JOINT_POSITION])
def test_from_a_corner_of_the_planning_margin_no_step_leaves_the_box_along_one_axis(mode):
    """The planned stop may go no deeper into the 2 mm margin than the arm already is. That allowance was
    one Euclidean depth: in a corner of the margin (2 mm deep on three axes, 3.5 mm in all) a step could
    spend it on one axis, 1.2 mm past the box's wall, while the others moved inwards. The filters passed
    it, `final_check` refused it and the arm faulted (371 of the 3,000 random steps below did). The likely
    cause of the 34 `final_check` faults of the stop-38 loaded fuzz (joint_velocity, seed 19), whose
    record does not say where the arm was. The allowance is per axis now."""
    fk = lambda q: np.asarray(q, np.float64).copy()
    chain = corner_chain(mode.value)
    q = np.ones(3)                                        # the box's corner: 2 mm into the margin per axis
    obs = {"joint_pos_rad": q, "joint_vel_rad_s": np.zeros(3)}
    chain.reset(obs)
    step = np.array([0.0012, -0.002, -0.002])             # out along x, in along y and z
    result = chain.filter(step_command(chain, mode, q, step), obs, mode, fk=fk)
    assert result.fault is None, result.fault
    sent = result.command.values
    target = sent * chain.config.period_s + q if mode is ControlMode.JOINT_VELOCITY else sent
    assert np.all(target <= 1.0) and np.all(target >= 0.0)
    inward = step_command(chain, mode, q, np.array([-0.001, -0.002, -0.002]))  # leaves the margin: sent as asked
    result = chain.filter(inward, obs, mode, fk=fk)
    assert result.accepted and not result.events and np.allclose(result.command.values, inward[:3])

    rng = np.random.default_rng(0)                       # and from anywhere near a wall, any small step
    faults = 0
    for _ in range(3000):
        chain = corner_chain(mode.value)
        q = np.clip(rng.choice([0.0, 1.0], 3) + rng.uniform(-0.004, 0.004, 3), 0.0, 1.0)
        q = np.where(rng.random(3) < 0.3, 0.5, q)
        obs = {"joint_pos_rad": q, "joint_vel_rad_s": np.zeros(3)}
        chain.reset(obs)
        step = rng.uniform(-0.005, 0.005, 3)
        faults += chain.filter(step_command(chain, mode, q, step), obs, mode, fk=fk).fault is not None
    assert faults == 0
