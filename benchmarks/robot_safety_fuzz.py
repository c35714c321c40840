"""Safety on the motion actually executed: a fuzz of the simulated UR5e through the public API.

    python benchmarks/robot_safety_fuzz.py                      # 10,000 commands per control mode
    python benchmarks/robot_safety_fuzz.py --commands 500 --no-write   # a quick look

For each control mode it drives `robots.make("sim_ur5e")` with random segments: unpaced bursts (a tight
loop of `send_action` with no sleep, pushing one direction hard: into joint and workspace walls),
random jumps, abrupt reversals and garbage (NaN, Inf, wrong shapes). Whatever holds the arm (the
measured-state monitor, the watchdog, a safety fault) is counted and the arm is re-armed. The sim arm
server measures what it executes every 2 ms tick: the peak joint speed and the peak joint acceleration
over one control period, as ratios to the limits, and how far the pinch site got outside the workspace
box. Goals (issue 14): speed and acceleration ratios <= 1.05, box excess <= `monitor_workspace_tol_m`.
Then a 1 s stall of the whole controller process (the GIL held by a C call, so no thread of it runs):
the arm's own deadline must hold it within deadline + one control period of the last command.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))
from machine import cpu_info  # noqa: E402

import robots  # noqa: E402
from robots.base import RobotFault, State  # noqa: E402


def cpu_name() -> str:
    info = cpu_info()
    return f"{info['model']} ({'avx512_bf16' if info['avx512_bf16'] else 'no avx512_bf16'})"


def make_action(kind: str, mode: str, rng, direction: np.ndarray, obs: dict, cfg) -> np.ndarray:
    dof = cfg.dof
    grip = rng.uniform(-0.02, 0.1)
    if kind == "garbage":
        options = [np.full(cfg.action_dim(), np.nan), np.full(cfg.action_dim(), np.inf), np.zeros(2)]
        return options[int(rng.choice(3, p=[0.5, 0.3, 0.2]))]
    if mode == "joint_position":
        q = np.asarray(obs["joint_pos_rad"], np.float64)
        step = direction * 3.0 if kind == "burst" else rng.normal(0, 0.5, dof)
        return np.append(q + step, grip)
    if mode == "joint_velocity":
        vel = direction * 3.0 if kind == "burst" else rng.normal(0, 1.5, dof)
        return np.append(vel, grip)
    move = direction[:6] * np.array([0.05, 0.05, 0.05, 0.2, 0.2, 0.2]) if kind == "burst" else \
        rng.normal(0, [0.02, 0.02, 0.02, 0.1, 0.1, 0.1])
    return np.append(move, grip)


# late: not a goal, a cause; displaced: how far out of the box collisions pushed the arm (the server counts
# the controller's box excess beyond that)
PEAKS = ("peak_speed_ratio", "peak_acc_ratio", "peak_box_excess_m", "peak_cmd_late_s", "peak_box_displaced_m")


def fold_peaks(robot, overall: dict) -> dict:
    """Read the server's peaks since the last reset into `overall`, reset them, return them. `overall`
    also keeps what the arm was doing at the largest box excess and acceleration (`peak_box_at`,
    `peak_acc_at`, from the server)."""
    state = robot.server_state()
    stretch = {k: state.get(k, 0.0) for k in PEAKS}
    if stretch["peak_box_excess_m"] > overall["peak_box_excess_m"]:
        overall["peak_box_at"] = state.get("peak_box_at", {})
    if stretch["peak_acc_ratio"] > overall["peak_acc_ratio"]:
        overall["peak_acc_at"] = state.get("peak_acc_at", {})
    for k in PEAKS:
        overall[k] = max(overall[k], stretch[k])
    robot.reset_peaks()
    return stretch


def observe(robot, last: dict | None) -> dict | None:
    """A reading, or the last one when this reading faulted the robot (a protective stop)."""
    try:
        return robot.observe()
    except RobotFault:
        return last


def fuzz_mode(mode: str, commands: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    cfg_dict = robots.load_config("sim_ur5e")
    cfg_dict["control_mode"] = mode
    robot = robots.make(cfg_dict)
    cfg = robot.config
    holds: Counter = Counter()
    reasons: Counter = Counter()
    box_by_end: dict = {}  # the largest box excess of the stretches ended by each kind of hold
    overall = dict.fromkeys(PEAKS, 0.0)
    sent = segments = 0
    obs = None
    t0 = time.monotonic()
    with robot:
        robot.arm()
        robot.reset_peaks()
        time.sleep(0.05)
        while sent < commands:
            segments += 1
            kind = rng.choice(["burst", "burst", "random", "reverse", "garbage"])
            direction = np.zeros(cfg.dof)
            joints = rng.choice(cfg.dof, size=rng.integers(1, cfg.dof + 1), replace=False)
            direction[joints] = rng.choice([-1.0, 1.0], size=len(joints))
            length = int(rng.integers(20, 120))
            obs = observe(robot, obs if segments > 1 else None)
            for i in range(length):
                if kind == "reverse" and i == length // 2:
                    direction = -direction
                if robot.state is not State.ARMED:
                    reason = next((e.get("reason", "") for e in reversed(robot.events) if e.get("reason")), "")
                    holds[reason.split(":")[0] or robot.state.value] += 1
                    reasons[reason[:200]] += 1
                    stretch = fold_peaks(robot, overall)  # the peaks of the stretch this hold ended
                    key = "self-collision" if "collision" in reason else reason.split(":")[0] or robot.state.value
                    box_by_end[key] = max(box_by_end.get(key, 0.0), stretch["peak_box_excess_m"])
                    try:
                        if robot.state is State.FAULT:
                            robot.recover()
                        robot.arm()
                    except RobotFault:
                        continue  # arm() faulted (a protective stop not yet read): recover next time
                    obs = observe(robot, obs)
                if kind != "burst":
                    obs = observe(robot, obs)  # a normal loop observes; a burst only sends, as fast as it can
                action = make_action("burst" if kind == "reverse" else kind, mode, rng, direction, obs, cfg)
                robot.send_action(action)
                sent += 1
                if sent % 2000 == 0:
                    print(f"  {mode}: {sent}/{commands} commands, {time.monotonic() - t0:.0f} s", flush=True)
        wall = time.monotonic() - t0
        time.sleep(0.05)
        server = robot.server_state()
        box_by_end["end of run"] = fold_peaks(robot, overall)["peak_box_excess_m"]  # the last stretch's peaks
    peaks = {k: overall[k] for k in PEAKS}
    return {"mode": mode, "commands": sent, "segments": segments, "wall_s": round(wall, 1),
            "commands_per_s": round(sent / wall, 1), "paced_s": round(robot.paced_s, 1), **peaks,
            "monitor_workspace_tol_m": cfg.monitor_workspace_tol_m, "holds_rearmed": dict(holds),
            "hold_reasons": dict(reasons.most_common(12)),
            "box_excess_m_by_what_ended_the_stretch": {k: round(v, 4) for k, v in box_by_end.items()},
            "peak_box_at": overall.get("peak_box_at", {}), "peak_acc_at": overall.get("peak_acc_at", {}),
            "safety": robot.chain.summary(), "server_overruns": server.get("overruns"),
            "self_collision_stops": server.get("collision_stops"),
            "goals_met": bool(peaks["peak_speed_ratio"] <= 1.05 and peaks["peak_acc_ratio"] <= 1.05
                              and peaks["peak_box_excess_m"] <= cfg.monitor_workspace_tol_m)}


def process_stall(stall_s: float = 1.0) -> dict:
    """Hold the GIL for `stall_s` in a C call (usleep through PyDLL): every thread of this process stops,
    the controller watchdog included. The arm server's own deadline must still hold the arm."""
    robot = robots.make("sim_ur5e")
    libc = ctypes.PyDLL(None)
    with robot:
        robot.arm()
        for _ in range(30):
            robot.send_action(np.append(robot.observe()["joint_pos_rad"], 0.085))
        t_last = time.monotonic()
        libc.usleep(int(stall_s * 1e6))
        t_back = time.monotonic()
        robot.observe()
        server = robot.server_state()
        fired = list(robot.watchdog_fired)
    hold_after_ms = (server["t_hold_s"] - server["last_cmd_sent_s"]) * 1e3 if server.get("t_hold_s") else None
    limit_ms = robot.config.watchdog_deadline_ms + 1e3 * robot.config.period_s
    return {"stall_s": round(t_back - t_last, 3), "server_mode": server["mode"], "hold_reason": server["hold_reason"],
            "hold_after_last_command_ms": None if hold_after_ms is None else round(hold_after_ms, 1),
            "limit_ms": limit_ms, "robot_state_after": robot.state.value,
            "watchdog_events": [{k: v for k, v in f.items() if k in ("source", "late_ms")} for f in fired],
            "goal_met": bool(hold_after_ms is not None and hold_after_ms <= limit_ms and server["hold_reason"] == "watchdog")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--commands", type=int, default=10_000, help="per control mode")
    parser.add_argument("--modes", nargs="+", default=["joint_position", "joint_velocity", "ee_delta"])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    rows = []
    for i, mode in enumerate(args.modes):
        rows.append(fuzz_mode(mode, args.commands, args.seed + i))
        r = rows[-1]
        print(f"{mode:15s} {r['commands']} commands in {r['wall_s']} s: peak speed {r['peak_speed_ratio']:.3f}x, "
              f"peak acc {r['peak_acc_ratio']:.3f}x, box excess {r['peak_box_excess_m'] * 1e3:.1f} mm "
              f"(beyond collisions' {r['peak_box_displaced_m'] * 1e3:.1f}), "
              f"latest command {r['peak_cmd_late_s'] * 1e3:.1f} ms after due, "
              f"holds {r['holds_rearmed']}, goals {'met' if r['goals_met'] else 'NOT met'}", flush=True)
        print("   safety:", r["safety"]["by_kind"], flush=True)
        print("   box excess by what ended the stretch:", r["box_excess_m_by_what_ended_the_stretch"], flush=True)
        print("   hold reasons:", r["hold_reasons"], flush=True)
        print("   at the largest box excess:", r["peak_box_at"], flush=True)
        print("   at the largest acceleration:", r["peak_acc_at"], flush=True)
    stall = process_stall()
    print(f"process stall {stall['stall_s']} s: arm held {stall['hold_after_last_command_ms']} ms after the last "
          f"command (limit {stall['limit_ms']} ms, reason {stall['hold_reason']}), goal "
          f"{'met' if stall['goal_met'] else 'NOT met'}", flush=True)
    result = {"benchmark": "robot_safety_fuzz", "cpu": cpu_name(), "date": time.strftime("%Y-%m-%d %H:%M:%S"),
              "modes": rows, "process_stall": stall}
    if not args.no_write:
        out = REPO / "benchmarks" / "results" / f"robot_safety_fuzz-{time.strftime('%Y%m%d-%H%M%S')}.json"
        out.write_text(json.dumps(result, indent=2, default=str))
        print("wrote", out.relative_to(REPO))


if __name__ == "__main__":
    main()
