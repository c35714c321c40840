"""Run a trained policy on a robot: `python -m robots.deploy robot=... policy=CKPT` (Hydra).

    python -m robots.deploy robot=sim_ur5e policy=runs/.../policy            # the simulated arm
    python -m robots.deploy robot=ur5e policy=CKPT dry_run=true              # UR5e limits, sim arm
    python -m robots.deploy robot=franka_sim policy=CKPT executor=temporal_ensemble
    python -m robots.deploy robot=sim_ur5e_cube policy=runs/.../policy task="move the red cube to the left of the table"

The control loop runs at the robot's `control_rate_hz` and never waits for the policy: observations go
to a policy server (a separate process, or `policy_server=tcp://host:port` on a GPU machine) and action
chunks come back asynchronously into a chunk executor (open-loop, ACT temporal ensembling, or blending;
delay is measured in actions consumed). Every command passes the robot's safety chain; the watchdog
holds the arm when no valid command goes out for `watchdog_deadline_ms`. Episodes are recorded in the
toolkit's D4RL-layout HDF5 (observations, actions actually sent; rewards 0 because a robot has no
reward), with per-step safety events, timing and chunk delays under `infos/`, so the file feeds
offline -> online training. Ctrl-C, SIGTERM or any error stops the arm before the process exits.

A VLA policy reads camera frames and an instruction: `task="..."` is sent with every observation (on
a task-scene arm such as `robot=sim_ur5e_cube` the scene's own instruction when none is typed), and
the frames come from the robot with each observation (the sim arm renders them in its own process).
On a scene arm each episode starts from `reset_scene(seed + episode)` and ends at the task's success
(`stop_on_success`). Frames are recorded as `images/<camera>` in the HDF5 file and, with
`record_lerobot`, the episodes are also written as a LeRobotDataset v3 folder (`lerobot/`).

Before the arm is armed, the policy's observation and action sizes (from the server's ping) are checked
against the robot's; a mismatch names both. The exit status tells what happened (`EXIT_CODES`):
0 ok, 1 robot fault, 2 config or spec error, 3 the watchdog held the arm, 4 no action was executed,
130 / 143 interrupted by SIGINT / SIGTERM (the episode's end reason is then "interrupted").
"""
from __future__ import annotations

import json
import logging
import os
import signal
import sys
import time
from pathlib import Path

import hydra
import numpy as np
from omegaconf import DictConfig, OmegaConf

import robots
from embodied.constants import IMAGES_PREFIX, STATE_KEY, TASK_KEY
from embodied.errors import ConfigError, UserError, exit_on_user_error
from robots.client import LocalPolicyServer, PolicyClient
from robots.types import RobotConfig, RobotFault, State

CONF_DIR = Path(__file__).parent / "conf"
log = logging.getLogger("robots.deploy")
EXIT_CODES = {"ok": 0, "fault": 1, "config": 2, "watchdog": 3, "no_action": 4, "SIGINT": 130, "SIGTERM": 143}


class Pacer:
    """Absolute-schedule loop timing: sleep most of the period, spin the last `spin_s` for precision."""

    def __init__(self, period_s: float, spin_s: float = 0.0005):
        self.period_s, self.spin_s = period_s, spin_s
        self.next_t = time.perf_counter()
        self.lateness_s: list[float] = []

    def wait(self) -> None:
        self.next_t += self.period_s
        remaining = self.next_t - time.perf_counter()
        if remaining > self.spin_s:
            time.sleep(remaining - self.spin_s)
        while time.perf_counter() < self.next_t:
            pass
        late = time.perf_counter() - self.next_t
        self.lateness_s.append(late)
        if late > self.period_s:  # fell a whole period behind: start a new schedule, do not burst
            self.next_t = time.perf_counter()


def jitter_stats(lateness_s) -> dict:
    arr = np.abs(np.asarray(lateness_s, np.float64)) * 1e3
    if not len(arr):
        return {"p50_ms": None, "p99_ms": None, "max_ms": None}
    return {"p50_ms": float(np.percentile(arr, 50)), "p99_ms": float(np.percentile(arr, 99)),
            "max_ms": float(arr.max())}


def _executor(cfg):
    from policies import executors

    kwargs = {k: v for k, v in OmegaConf.to_container(cfg.executor, resolve=True).items() if k != "name"}
    return executors.make(cfg.executor.name, **kwargs)


def _robot_dict(cfg) -> dict:
    return OmegaConf.to_container(cfg.robot, resolve=True) if isinstance(cfg.robot, DictConfig) else dict(cfg.robot)


def action_map_kind(cfg, rcfg) -> str:
    """`auto`: OGBench actions on a task-scene arm (what its policies were trained on), else deltas."""
    kind = str(cfg.action_map.kind)
    if kind == "auto":
        return "ogbench" if rcfg.sim.get("scene") else "delta"
    return kind


def _server_args(cfg, rcfg) -> list[str]:
    am = cfg.action_map
    return ["--action-map", action_map_kind(cfg, rcfg), "--mode", rcfg.control_mode, "--dof", str(rcfg.dof),
            "--delta-scale-rad", str(am.delta_scale_rad), "--gripper-max-m", str(rcfg.gripper_width_max_m),
            "--repeat", str(cfg.repeat), "--extra-latency-ms", str(cfg.policy_extra_latency_ms),
            "--device", str(cfg.device)]


def run(cfg: DictConfig, out_dir: Path, on_step=None) -> dict:
    """Deploy and record. `on_step(step, robot, context)` is a hook for tests and benchmarks."""
    if not cfg.policy:
        raise ConfigError("policy is not set; pass policy=<directory written by Policy.save()>")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    robot_dict = _robot_dict(cfg)
    robot_type = robot_dict.get("type")
    rcfg = RobotConfig.from_dict({k: v for k, v in robot_dict.items() if k != "type"})
    if cfg.dry_run and rcfg.dof != 6:
        raise ConfigError(f"dry_run needs a 6-joint config for the UR5e sim arm; robot {rcfg.name} has "
                          f"{rcfg.dof} (use robot=franka_sim for a simulated Franka)")
    executor = _executor(cfg)
    period = rcfg.period_s
    steps_per_episode = int(round(cfg.episode_s * rcfg.control_rate_hz))
    episodes, lateness, status, outcome = [], [], "ok", "ok"
    server = client = robot = server_exit = None
    t_start = time.monotonic()
    try:  # everything from here on is undone in `finally`, whatever interrupts it (Ctrl-C included)
        if cfg.policy_server == "local":
            if not Path(str(cfg.policy)).is_dir():
                raise ConfigError(f"policy={cfg.policy} is not a directory; pass one written by Policy.save()")
            server = LocalPolicyServer(cfg.policy, args=_server_args(cfg, rcfg))
            address, token = server.address, server.token
        else:
            address, token = str(cfg.policy_server), os.environ.get("EMBODIED_POLICY_TOKEN")
        client = PolicyClient(address, token=token, max_age_ms=cfg.max_chunk_age_ms)
        spec = check_policy_spec(client, rcfg, cfg.policy)
        robot = robots.make(robot_dict, dry_run=bool(cfg.dry_run))
        context = {"server": server, "client": client, "executor": executor}
        scene = getattr(robot, "scene", None)
        with robot, _realtime(int(cfg.rt_priority)):
            task = instruction(cfg, robot, spec)
            print(f"deploying {cfg.policy} on {rcfg.name}{' (dry run)' if cfg.dry_run else ''} at "
                  f"{rcfg.control_rate_hz:g} Hz; Ctrl-C stops the arm", flush=True)
            for ep in range(int(cfg.episodes)):
                rec = _Recorder(ep)
                rec.task = task
                if scene:
                    robot.reset_scene(int(cfg.seed) + ep)
                robot.arm()
                executor.reset()
                client.new_epoch()
                pacer = Pacer(period, cfg.spin_ms / 1e3)
                rec.t_start = time.perf_counter()
                step = 0
                try:
                    while step < steps_per_episode:
                        obs = robot.observe()
                        if robot.state is not State.ARMED:
                            rec.end_reason = f"robot {robot.state.value}: " + _last_reason(robot)
                            break
                        if task:
                            obs[TASK_KEY] = task
                        if obs.get("success"):
                            rec.success = True
                            if cfg.stop_on_success:
                                rec.end_reason = "success"
                                break
                        if executor.wants_chunk(step) and len(client.in_flight) < cfg.max_in_flight:
                            client.request(obs, step)
                        for reply in client.poll():
                            accepted = executor.push(reply.chunk, reply.obs_step)
                            rec.chunks.append((step, reply.obs_step, reply.round_trip_ms, accepted))
                        action = executor.next_action(step)
                        n_events = len(robot.chain.log)
                        sent = robot.send_action(action) if action is not None else None
                        if sent is not None:
                            rec.add(obs, sent, step, time.monotonic(), executor.last_delay_steps,
                                    robot.chain.log[n_events:], action)
                        if on_step is not None:
                            on_step(step, robot, context)
                        step += 1
                        pacer.wait()
                except KeyboardInterrupt:
                    rec.end_reason = "interrupted"
                    raise
                finally:
                    rec.steps, rec.t_end = step, time.perf_counter()
                    lateness.extend(pacer.lateness_s)
                    if robot.state is State.ARMED:
                        robot.hold("episode end")
                    try:
                        time.sleep(2 * period)  # let the hold reach the arm before the last reading
                        rec.final_obs = robot.observe()
                        rec.success = rec.success or bool(rec.final_obs.get("success"))
                    except Exception:  # noqa: BLE001
                        pass
                    if hasattr(robot, "server_state"):  # the sim arm's own view (hold time, drops, overruns)
                        rec.sim = {k: v for k, v in robot.server_state().items() if k not in (
                            "joint_pos_rad", "joint_vel_rad_s", "ee_pos_m", "ee_quat_wxyz", "target_rad", "op", "task_state",
                            "frames", "frame_shape", "t_frame_s", "instruction", "received_s")}
                    episodes.append(rec)
                if robot.state is State.FAULT:
                    status = f"fault: {robot.fault_reason}"
                    break
    except KeyboardInterrupt as err:
        outcome = err.args[0] if err.args and err.args[0] in EXIT_CODES else "SIGINT"
        status = f"interrupted ({outcome}): arm stopped"
    except RobotFault as err:  # the robot already went to `fault` and stopped; record why
        status, outcome = f"fault: {err}", "fault"
    finally:
        if robot is not None and robot.state.value != "disconnected":
            robot.__exit__(None, None, None)  # stop, then disconnect
        if client is not None:
            client.close()
        server_exit = None if server is None else server.proc.poll()  # died on its own, before our stop
        if server is not None:
            server.stop()
    if outcome == "ok" and status.startswith("fault"):
        outcome = "fault"
    fired = list(robot.watchdog_fired) if robot else []
    sent = sum(len(e.actions) for e in episodes)
    # no action at all is the root cause even when the watchdog then held the arm (a loaded machine can
    # stretch a short run past the watchdog deadline): it is a no-action deploy, not a watchdog one
    if outcome == "ok" and sent == 0:
        outcome = "no_action"
        status = f"no action executed in {sum(e.steps for e in episodes)} steps"
        if client is not None and client.last_error:
            status += f" (last policy server error: {client.last_error})"
        if fired:
            status += f"; the watchdog held the arm {len(fired)} time(s)"
    if outcome == "ok" and fired:
        outcome = "watchdog"
        status = (f"watchdog: the arm was held {len(fired)} time(s), no valid command for "
                  f"{robot.config.watchdog_deadline_ms:g} ms")
    if server_exit is not None and server_exit != 0 and outcome != "ok":
        status += f"; the policy server exited with code {server_exit}"
    summary = {"robot": rcfg.name, "robot_type": "sim" if cfg.dry_run else robot_type, "dry_run": bool(cfg.dry_run),
               "policy": str(cfg.policy), "executor": cfg.executor.name, "control_rate_hz": rcfg.control_rate_hz,
               "status": status, "outcome": outcome, "exit_code": EXIT_CODES[outcome], "episodes": len(episodes), "steps": sum(e.steps for e in episodes),
               "actions_sent": sum(len(e.actions) for e in episodes), "achieved_rate_hz": _achieved_rate(episodes),
               "loop_jitter": jitter_stats(lateness), "wall_s": time.monotonic() - t_start,
               "safety": robot.chain.summary() if robot else {},
               "events": [e for e in robot.events if e["kind"] != "state"][:100] if robot else [],
               "end_reasons": [e.end_reason for e in episodes], "client": dict(client.stats) if client else {},
               "watchdog_fired": fired,
               "sim_arm": [e.sim for e in episodes if e.sim]}
    if episodes and any(e.success is not None for e in episodes):  # a task scene: its success test
        summary["task"] = episodes[0].task
        summary["success"] = [bool(e.success) for e in episodes]
        summary["success_rate"] = float(np.mean(summary["success"]))
    trips = [c[2] for e in episodes for c in e.chunks]
    summary["chunk_round_trip_ms"] = _percentiles(trips)
    ages = [a for e in episodes for a in e.frame_age_ms]
    if ages:  # how old the camera frame was when the observation was taken (rendering is asynchronous)
        summary["frame_age_ms"] = _percentiles(ages)
    delays = [d for e in episodes for d in e.delay_steps]
    summary["chunk_delay_steps"] = {"mean": float(np.mean(delays)) if delays else None,
                                    "max": int(max(delays)) if delays else None}
    if cfg.record and any(len(e.actions) for e in episodes):
        summary["dataset"] = str(_save(episodes, out_dir / cfg.record_file, rcfg, cfg, summary))
        if cfg.record_lerobot:
            summary["lerobot_dataset"] = str(_save_lerobot(episodes, out_dir / "lerobot", rcfg))
    (out_dir / "deploy_summary.json").write_text(json.dumps(summary, indent=2, default=str))
    return summary


class _realtime:
    """SCHED_FIFO at `priority` for the control-loop thread (0: leave the scheduler alone), as real-robot
    controllers run; restored on exit. Needs CAP_SYS_NICE; without it the loop runs unprioritised."""

    def __init__(self, priority: int):
        self.priority, self.previous = priority, None

    def __enter__(self):
        if self.priority > 0:
            try:
                self.previous = (os.sched_getscheduler(0), os.sched_getparam(0))
                os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(self.priority))
            except (PermissionError, OSError, AttributeError) as err:
                self.previous = None
                print(f"warning: rt_priority={self.priority} not applied ({err}); running unprioritised",
                      file=sys.stderr, flush=True)
        return self

    def __exit__(self, *exc):
        if self.previous is not None:
            os.sched_setscheduler(0, *self.previous)


def _last_reason(robot) -> str:
    for event in reversed(robot.events):
        if event.get("reason"):
            return str(event["reason"])
    return ""


def _percentiles(values) -> dict:
    if not values:
        return {"p50": None, "p99": None, "max": None, "n": 0}
    arr = np.asarray(values, np.float64)
    return {"p50": float(np.percentile(arr, 50)), "p99": float(np.percentile(arr, 99)), "max": float(arr.max()),
            "n": int(len(arr))}


def _achieved_rate(episodes) -> float:
    """Control steps per second of loop time (steps without an action to send still count)."""
    steps = sum(e.steps for e in episodes)
    span = sum(e.t_end - e.t_start for e in episodes)
    return float(steps / span) if span > 0 else 0.0


class _Recorder:
    def __init__(self, index: int):
        self.index = index
        self.obs, self.actions, self.t, self.step_ids, self.delay_steps, self.events = [], [], [], [], [], []
        self.policy_actions: list = []
        self.frame_age_ms: list = []
        self.images: dict[str, list] = {}
        self.task: str | None = None
        self.success: bool | None = None
        self.chunks: list = []
        self.final_obs = None
        self.sim: dict = {}
        self.t_start = self.t_end = 0.0
        self.end_reason = "time limit"
        self.steps = 0

    def add(self, obs, sent, step, t, delay, events, policy_action):
        self.obs.append(np.asarray(obs[STATE_KEY], np.float32))
        self.actions.append(np.asarray(sent, np.float32))
        self.policy_actions.append(np.asarray(policy_action, np.float32))
        if "image_timestamp_s" in obs:
            self.frame_age_ms.append((obs["timestamp_s"] - obs["image_timestamp_s"]) * 1e3)
        if "success" in obs and self.success is None:
            self.success = False
        for key, frame in obs.items():
            if key.startswith(IMAGES_PREFIX):
                self.images.setdefault(key[len(IMAGES_PREFIX) + 1:], []).append(np.asarray(frame, np.uint8))
        self.t.append(t)
        self.step_ids.append(step)
        self.delay_steps.append(delay)
        self.events.append(events)


def _save(episodes, path: Path, rcfg, cfg, summary) -> Path:
    """D4RL-layout HDF5 via the toolkit's writer, then `infos/*` per-step arrays added to the same file."""
    import h5py

    from embodied.data.d4rl import save_hdf5
    from embodied.data.dataset import Dataset, Episode

    eps, infos = [], {"t_s": [], "step": [], "episode": [], "chunk_delay_steps": [], "safety_clips": [],
                      "safety_rejects": [], "safety_events": [], "policy_action": []}
    images: dict[str, list] = {}
    for rec in episodes:
        if not rec.actions:
            continue
        final = rec.final_obs[STATE_KEY] if rec.final_obs is not None else rec.obs[-1]
        obs = np.stack(rec.obs + [np.asarray(final, np.float32)])
        eps.append(Episode(observations=obs, actions=np.stack(rec.actions), rewards=np.zeros(len(rec.actions)),
                           terminated=False, truncated=True))
        infos["t_s"] += rec.t
        infos["step"] += rec.step_ids
        infos["episode"] += [rec.index] * len(rec.actions)
        infos["chunk_delay_steps"] += rec.delay_steps
        infos["policy_action"] += rec.policy_actions
        for cam, frames in rec.images.items():
            images.setdefault(cam, []).extend(frames)
        for events in rec.events:
            infos["safety_clips"].append(sum(e["outcome"] == "clip" for e in events))
            infos["safety_rejects"].append(sum(e["outcome"] == "reject" for e in events))
            infos["safety_events"].append(json.dumps([f"{e['kind']}/{e['outcome']}" for e in events]))
    metadata = {"source": "robots.deploy", "robot": rcfg.to_dict(), "policy": str(cfg.policy),
                "executor": OmegaConf.to_container(cfg.executor, resolve=True), "dry_run": bool(cfg.dry_run),
                "rewards": "0: unlabelled robot data; relabel before RL", "safety": summary["safety"],
                "status": summary["status"], "end_reasons": summary["end_reasons"],
                "observation": ("the task scene's state" if rcfg.sim.get("scene") else "joint_pos_rad then gripper_width_m"),
                "action": f"{rcfg.control_mode} robot units as sent (infos/policy_action: what the policy asked)",
                "tasks": [rec.task for rec in episodes if rec.actions], "success": summary.get("success")}
    ds = Dataset.from_episodes(eps, metadata=metadata)
    if any(len(v) != len(ds) for v in images.values()):
        images = {}  # a camera missing on some steps: the frames cannot be aligned row by row
    save_hdf5(ds, path, extras={f"images/{cam}": np.stack(frames) for cam, frames in images.items()})
    with h5py.File(path, "a") as f:
        group = f.create_group("infos")
        for key, values in infos.items():
            if key == "safety_events":
                group.create_dataset(key, data=np.array(values, dtype=object), dtype=h5py.string_dtype())
            else:
                group.create_dataset(key, data=np.asarray(values))
    return path


def _save_lerobot(episodes, root: Path, rcfg) -> Path:
    """The recorded episodes as a LeRobotDataset v3 folder (frames as mp4), for LeRobot's tools."""
    from embodied.data.lerobot import save_lerobot

    eps = []
    for rec in episodes:
        if not rec.actions:
            continue
        final = rec.final_obs[STATE_KEY] if rec.final_obs is not None else rec.obs[-1]
        eps.append({"observations": np.stack(rec.obs + [np.asarray(final, np.float32)]),
                    "actions": np.stack(rec.actions), "rewards": np.zeros(len(rec.actions), np.float32),
                    "terminated": bool(rec.success), "truncated": not rec.success, "task": rec.task or "",
                    "images": {cam: np.stack(f) for cam, f in rec.images.items()} or None})
    fps = max(1, int(round(rcfg.control_rate_hz)))
    return save_lerobot(root, eps, fps=fps, robot_type=rcfg.name, overwrite=True)


@hydra.main(config_path="conf", config_name="deploy", version_base="1.3")
def _hydra_main(cfg: DictConfig) -> None:
    from hydra.core.hydra_config import HydraConfig

    try:
        summary = run(cfg, Path(HydraConfig.get().runtime.output_dir))
    except UserError as err:
        print(f"error: {err}", file=sys.stderr, flush=True)
        raise SystemExit(2) from None
    j = summary["loop_jitter"]
    print(f"{summary['robot']} ({'dry run' if summary['dry_run'] else summary['robot_type']}): "
          f"{summary['actions_sent']} actions in {summary['steps']} steps, {summary['achieved_rate_hz']:.1f} Hz, "
          f"jitter p50 {j['p50_ms']} ms p99 {j['p99_ms']} ms; status {summary['status']}; "
          f"safety {summary['safety']['by_outcome']}; dataset {summary.get('dataset')}", flush=True)
    if summary["exit_code"]:
        print(f"deploy: {summary['status']} (exit {summary['exit_code']})", file=sys.stderr, flush=True)
        raise SystemExit(summary["exit_code"])


def robot_observation(rcfg) -> tuple[int, str, list[str], int | None]:
    """What the robot's observations hold: state size and what it is, cameras, frame size."""
    scene = rcfg.sim.get("scene")
    if scene:
        from sims.manip import SUITES

        suite = scene.get("suite", "cube-single")
        size = int(scene.get("image_size", 64))
        return SUITES[suite].obs_dim, f"the {suite} task state", list(scene.get("cameras", ["front"])), size
    return rcfg.dof + 1, f"{rcfg.dof} joint positions + gripper width", [], None


def check_policy_spec(client, rcfg, policy) -> dict:
    """The policy's observation, camera and action sizes against the robot's, before anything moves."""
    try:
        spec = client.spec(timeout_ms=10_000)
    except TimeoutError:
        raise UserError(f"the policy server at {client.address} did not answer a ping within 10 s; "
                        "is it running (and is the token right)?") from None
    want_obs, what, cameras, size = robot_observation(rcfg)
    want_act = rcfg.action_dim()
    missing = [c for c in spec.get("cameras") or [] if c not in cameras]
    if missing:
        raise ConfigError(f"policy {policy} reads camera(s) {missing} but robot {rcfg.name} has "
                          f"{cameras or 'no cameras'}; use a robot config whose sim.scene.cameras include them")
    if spec.get("obs_dim") not in (None, want_obs):
        raise ConfigError(f"policy {policy} reads observations of size {spec['obs_dim']} but robot {rcfg.name} "
                          f"gives {want_obs} ({what}); use a policy trained on this robot's observation")
    shape = spec.get("image_shape")
    if spec.get("cameras") and shape and size is not None and list(shape) != [size, size, 3]:
        raise ConfigError(f"policy {policy} reads {shape[0]}x{shape[1]} frames but robot {rcfg.name} renders "
                          f"{size}x{size}; set robot.sim.scene.image_size={shape[0]}")
    if spec.get("action_dim") not in (None, want_act) and spec.get("action_map") != "ogbench":
        raise ConfigError(f"policy {policy} outputs actions of size {spec['action_dim']} but robot {rcfg.name} "
                          f"takes {want_act} in {rcfg.control_mode} mode; use a policy for this robot and mode")
    if spec.get("action_map") == "ogbench" and spec.get("action_dim") not in (None, 5):
        raise ConfigError(f"action_map.kind=ogbench reads 5 OGBench actions but policy {policy} outputs "
                          f"{spec['action_dim']}; use a policy trained on an OGBench manipulation task")
    return spec


def instruction(cfg, robot, spec) -> str | None:
    """The typed `task`, else the scene's own instruction; a camera policy with neither is an error."""
    if cfg.task:
        text = str(cfg.task)
        if len(text) > 1000 or not text.isprintable():
            raise ConfigError("task must be at most 1,000 printable characters (the policy server's limit)")
        return text
    if getattr(robot, "scene", None):
        text = robot.scene_instruction()
        print(f"task not set: using the scene's instruction {text!r}", flush=True)
        return text or None
    if spec.get("cameras"):
        raise ConfigError(f"policy {cfg.policy} reads an instruction; pass task=\"...\" (what the robot should do)")
    return None


def check_robot_override(argv: list[str]) -> None:
    for arg in argv:
        key, sep, value = arg.partition("=")
        if sep and key == "robot" and value not in robots.names():
            raise ConfigError(f"robot={value} is not a valid choice; valid: {', '.join(robots.names())}")


def _stop_on_signals() -> None:
    """Ctrl-C and `kill` (SIGTERM, what systemd and docker send) both raise KeyboardInterrupt, whose
    path stops the arm and saves the data; SIGINT is re-armed because shells start background jobs
    (`nohup ... &`) with it ignored, and Python keeps an inherited ignore."""
    def interrupt(signum, frame):
        raise KeyboardInterrupt(signal.Signals(signum).name)

    signal.signal(signal.SIGINT, interrupt)
    signal.signal(signal.SIGTERM, interrupt)


@exit_on_user_error
def main() -> None:
    check_robot_override(sys.argv[1:])
    _stop_on_signals()
    _hydra_main()


if __name__ == "__main__":
    main()
