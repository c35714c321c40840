"""Property-based fuzzing of the public interface: >= 10,000 random commands per run, the backend
never receives a command outside the limits. Prints the rejection/clip counts (run with -s)."""
from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from robot_helpers import IKRecordingRobot, RecordingRobot, planar_fk, small_config
from robots.base import ControlMode, State

pytestmark = pytest.mark.slow  # hypothesis fuzzing, >10,000 commands

EXAMPLES = 90           # x 4 modes x ~50 commands each -> > 10,000 commands
FLOATS = st.one_of(st.floats(-2.0, 2.0), st.floats(allow_nan=True, allow_infinity=True),
                   st.sampled_from([0.0, 1e300, -1e300, np.nan, np.inf, -np.inf, 1e-300]))


class Op(str):
    """A lifecycle call in the random sequence (a plain str is a malformed command)."""


def action_strategy(dim: int):
    good = st.lists(FLOATS, min_size=dim, max_size=dim).map(lambda v: np.array(v, np.float64))
    small = st.lists(st.floats(-0.05, 0.05), min_size=dim, max_size=dim).map(np.array)
    jump = st.tuples(st.integers(0, dim - 1), st.floats(-100, 100)).map(
        lambda t: np.eye(dim)[t[0]] * t[1])
    dtypes = st.sampled_from([np.float16, np.float32, np.int8, np.int64, np.uint8])
    cast = st.tuples(good, dtypes).map(lambda t: np.nan_to_num(t[0], nan=0, posinf=1e3, neginf=-1e3)
                                       .clip(-100, 100).astype(t[1]))
    wrong_shape = st.integers(0, 12).filter(lambda n: n != dim).map(lambda n: np.ones(n))
    wrong_rank = st.just(np.zeros((2, dim)))
    odd = st.sampled_from([None, "go", {"a": 1}, [[1.0], [2.0, 3.0]], np.array(["a"] * dim),
                           np.zeros(dim, complex), np.ones(dim, bool), np.array([object()] * dim)])
    lifecycle = st.sampled_from(["disarm", "estop", "recover", "recover", "arm", "arm", "arm", "arm"]).map(Op)
    return st.one_of(good, good, small, small, small, jump, jump, cast, wrong_shape, wrong_rank, odd, lifecycle)


def check_command(robot, cmd, ref_pos, ref_vel, workspace_event: bool):
    c = robot.config
    lo, hi = np.array(c.joint_pos_min_rad), np.array(c.joint_pos_max_rad)
    vmax, amax, dt = np.array(c.joint_vel_max_rad_s), np.array(c.joint_acc_max_rad_s2), c.period_s
    assert cmd.values.dtype == np.float64 and np.all(np.isfinite(cmd.values))
    assert 0.0 <= cmd.gripper_width_m <= c.gripper_width_max_m
    assert 0.0 <= cmd.gripper_force_n <= c.gripper_force_max_n
    box_lo, box_hi = np.array(c.workspace_min_m), np.array(c.workspace_max_m)
    if cmd.mode is ControlMode.EE_DELTA:
        assert np.linalg.norm(cmd.values[:3]) <= c.ee_step_max_m + 1e-7
        assert np.linalg.norm(cmd.values[3:]) <= c.ee_rot_step_max_rad + 1e-7
        assert np.all(cmd.ee_target_m >= box_lo - 1e-7) and np.all(cmd.ee_target_m <= box_hi + 1e-7)
        return ref_pos, ref_vel
    vel = cmd.values if cmd.mode is ControlMode.JOINT_VELOCITY else (cmd.values - ref_pos) / dt
    target = ref_pos + vel * dt
    lo, hi = np.minimum(lo, ref_pos), np.maximum(hi, ref_pos)  # from outside: never further out
    assert np.all(target >= lo - 1e-7) and np.all(target <= hi + 1e-7)
    assert np.all(np.abs(vel) <= vmax * (1 + 1e-7))
    if cmd.mode is ControlMode.JOINT_POSITION:
        assert np.all(np.abs(target - ref_pos) <= c.max_relative_target_rad + 1e-7)
    if not workspace_event:  # only a cut at the wall (braking alone would leave the box) may stop harder
        assert np.all(np.abs(vel - ref_vel) <= amax * dt * (1 + 1e-6) + 1e-9)
    p = planar_fk(target)
    outside = np.linalg.norm(np.maximum(box_lo - planar_fk(ref_pos), 0) + np.maximum(planar_fk(ref_pos) - box_hi, 0))
    assert np.linalg.norm(np.maximum(box_lo - p, 0) + np.maximum(p - box_hi, 0)) <= outside + 1e-7
    return target, vel


def run_sequence(mode: ControlMode, actions, totals: Counter, ik: bool = False) -> None:
    cls = IKRecordingRobot if ik else RecordingRobot
    robot = cls(small_config(control_mode=mode.value, home_joint_pos_rad=[0.0, 0.6, -0.4]), start_watchdog=False)
    robot.connect()
    robot.arm()
    ref_pos, ref_vel = robot.observe()["joint_pos_rad"].astype(np.float64), np.zeros(3)
    for action in actions:
        if isinstance(action, Op):
            before = robot.state
            try:
                {"disarm": robot.disarm, "estop": robot.estop, "recover": robot.recover, "arm": robot.arm}[action]()
            except Exception as err:  # illegal transitions raise RobotStateError, nothing else
                assert type(err).__name__ == "RobotStateError", err
            if action == "arm" and before is State.CONNECTED and robot.state is State.ARMED:
                ref_pos, ref_vel = robot.observe()["joint_pos_rad"].astype(np.float64), np.zeros(3)
            continue
        was_armed = robot.state is State.ARMED
        n_before = len(robot.commands)
        ws_before = sum(n for (k, _), n in robot.chain.counts.items() if k == "workspace_wall")
        sent = robot.send_action(action)
        totals["commands"] += 1
        totals["armed_commands"] += was_armed
        if not was_armed:
            assert sent is None and len(robot.commands) == n_before   # nothing reaches the backend
            continue
        if sent is None:
            assert robot.state is State.FAULT and len(robot.commands) == n_before
            continue
        cmd = robot.commands[-1]
        assert np.array_equal(cmd.as_action(), sent)
        assert cmd.mode is (ControlMode.JOINT_POSITION if ik else mode)  # through IK: a checked joint command
        ref_pos, ref_vel = check_command(robot, cmd, ref_pos, ref_vel,
                                         sum(n for (k, _), n in robot.chain.counts.items() if k == "workspace_wall") > ws_before)
    for (kind, outcome), n in robot.chain.counts.items():
        totals[f"{outcome}/{kind}"] += n
        totals[outcome] += n
    assert robot.chain.counts[("final_check", "fault")] == 0   # the filters alone kept every limit
    robot.disconnect()


MODES = {m.value: (m, False) for m in ControlMode} | {"ee_delta_through_ik": (ControlMode.EE_DELTA, True)}
_FUZZED: dict[str, Counter] = {}  # mode id -> counts of its fuzz run; each mode is fuzzed once per session


def fuzz(mode_id: str) -> Counter:
    """Fuzz one control mode (derandomized, so every run sends the same commands) and return its counts;
    a mode already fuzzed in this session returns the counts of that run."""
    if mode_id not in _FUZZED:
        mode, ik = MODES[mode_id]
        dim = small_config(control_mode=mode.value).action_dim()
        totals: Counter = Counter()

        @settings(max_examples=EXAMPLES, deadline=None, derandomize=True,
                  suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
                  phases=[Phase.explicit, Phase.generate, Phase.shrink])
        @given(st.lists(action_strategy(dim), min_size=40, max_size=60))
        def run(actions):
            run_sequence(mode, actions, totals, ik)

        run()
        _FUZZED[mode_id] = totals
    return _FUZZED[mode_id]


@pytest.mark.parametrize("mode_id", list(MODES))
def test_fuzz_backend_never_sees_an_out_of_limit_command(mode_id):
    counts = fuzz(mode_id)   # every command's limits are asserted as it is sent
    assert counts["armed_commands"] > 0


def test_fuzz_total_and_report():
    """Every mode together sent >= 10,000 commands, some clipped and some rejected; prints the counts.
    Fuzzes the modes not yet fuzzed in this session, so it also holds when run alone or in any order."""
    totals = sum((fuzz(mode_id) for mode_id in MODES), Counter())
    print("\nsafety fuzz totals:", dict(sorted(totals.items())))
    assert totals["commands"] >= 10_000
    assert totals["reject"] > 0 and totals["clip"] > 0
