"""The simulated arm as a `Robot`: the client side of a `robots.sim_server` process.

`SimArm` starts the server (`python -m robots.sim_server`), sends commands as frames on a TCP socket
(`robots.wire.send_frame`) and reads the newest state published on ZeroMQ, with the same observation
keys as the real drivers. End-effector deltas are solved here (`ArmModel.ik`) to joint targets that pass
the joint safety checks first; the server's own command deadline, protective stop on self-collision and
measured peaks are mirrored into the robot's lifecycle and `server_state()`. See `robots.sim_server` for
what the server models.

With a task scene (`sim.scene`) `observation.state` is the task's state (what its policies were trained
on), the camera frames rendered in the server arrive as `observation.images.<camera>` with every
observation, `success` is the task's test, and `reset_scene(seed)` starts a new episode.
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import msgpack
import numpy as np
import zmq

from embodied.constants import STATE_KEY, image_key
from robots.base import Robot
from robots.sim_model import ArmModel
from robots.types import Command, ControlMode, RobotConfig, RobotFault
from robots.wire import send_frame


class SimArm(Robot):
    """The simulated arm: a `Robot` whose backend is a `robots.sim_arm` server process."""

    def __init__(self, config: RobotConfig, **kwargs):
        if config.dof != 6:
            raise RobotFault(f"the sim arm is a 6-dof UR5e; robot {config.name} has dof={config.dof}")
        super().__init__(config, **kwargs)
        self._proc: subprocess.Popen | None = None
        self._latest: dict | None = None
        self._seq = 0
        self._ctrl_seq = 0   # recover and arm messages sent: the server echoes the last of each it applied
        self._kin: ArmModel | None = None
        self._arm_seq = 0    # the `ctrl_seq` of the last arm op sent
        self.stale_after_s = float(config.sim.get("stale_after_ms", 500.0)) / 1e3
        if config.sim.get("scene") and config.mode is ControlMode.EE_DELTA:
            self.ik_joint_targets = None  # a Cartesian-controlled scene arm: its own controller takes deltas

    def _connect(self) -> None:
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        if self.config.sim.get("scene") and self.config.sim["scene"].get("cameras", ["front"]):
            env.setdefault("MUJOCO_GL", "egl")  # the server renders the scene's cameras headless
        self._proc = subprocess.Popen([sys.executable, "-m", "robots.sim_server", "--config-json",
                                       json.dumps(self.config.to_dict())], stdout=subprocess.PIPE,
                                      env=env, cwd=str(Path(__file__).resolve().parents[1]), text=True,
                                      start_new_session=True)  # a terminal's Ctrl-C goes to the controller only
        line = self._proc.stdout.readline()
        if not line.startswith("PORT "):
            self._proc.kill()
            raise RobotFault(f"sim arm server did not start (said {line!r})")
        self.port, state_port = (int(v) for v in line.split()[1:3])
        self._sock = socket.create_connection(("127.0.0.1", self.port), timeout=5.0)  # commands
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._ctx = zmq.Context()
        self._sub = self._ctx.socket(zmq.SUB)     # state: only the newest message is kept
        self._sub.setsockopt(zmq.CONFLATE, 1)
        self._sub.setsockopt(zmq.SUBSCRIBE, b"")
        self._sub.setsockopt(zmq.LINGER, 0)
        self._sub.connect(f"tcp://127.0.0.1:{state_port}")
        self._send_lock = threading.Lock()
        self._recv_lock = threading.Lock()
        self._kin = ArmModel()
        self._wait_state(30.0 if self.scene else 5.0)  # a scene builds OGBench's env and a GL context

    def _drain(self) -> None:
        """Take every state message waiting on the socket and keep the newest. Done on each read
        instead of in a receiver thread, so nothing in this process wakes up 500 times a second."""
        with self._recv_lock:
            latest = None
            while True:
                try:
                    latest = self._sub.recv(zmq.NOBLOCK)
                except zmq.Again:
                    break
                except zmq.ZMQError:
                    return
            if latest is None:
                return
            try:
                msg = msgpack.unpackb(latest, raw=False)
            except ValueError:
                return
            msg["received_s"] = time.monotonic()
            self._latest = msg

    def _wait_state(self, timeout_s: float) -> dict:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self._drain()
            if self._latest is not None:
                return self._latest
            self._sub.poll(20)
        raise RobotFault("no state from the sim arm server")

    def _send(self, msg: dict) -> None:
        with self._send_lock:
            try:
                send_frame(self._sock, msgpack.packb(msg))
            except OSError as err:  # the server died or stopped reading for the socket timeout
                raise RobotFault(f"sim arm server link lost ({type(err).__name__}: {err})") from None

    def _disconnect(self) -> None:
        try:
            self._send({"op": "close"})
        except Exception:  # noqa: BLE001
            pass
        self._sock.close()
        self._sub.close()
        self._ctx.term()
        if self._proc is not None:
            try:
                self._proc.wait(timeout=3.0)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
            self._proc.stdout.close()
        self._proc, self._latest = None, None

    def _read(self) -> dict:
        self._drain()
        msg = self._latest
        if msg is None:
            msg = self._wait_state(1.0)
        if self._proc is not None and self._proc.poll() is not None:
            raise RobotFault(f"sim arm server exited with {self._proc.returncode}")
        age = time.monotonic() - msg["t_s"]  # the server is a local process: one monotonic clock
        if age > self.stale_after_s:
            raise RobotFault(f"sim arm state is {1e3 * age:.0f} ms old")
        if self.state.value == "armed" and msg.get("mode") == "estop" and msg.get("hold_reason") == "self-collision" \
                and self._applied_this_arm(msg):
            raise RobotFault("sim arm protective stop: self-collision")
        if (self.state.value == "armed" and msg.get("mode") == "hold" and msg.get("hold_reason") == "watchdog"
                and self._applied_this_arm(msg)):
            self._backend_held("arm watchdog: no command within the deadline", float(msg["t_hold_s"]),
                               msg.get("last_cmd_sent_s"))
        q = np.asarray(msg["joint_pos_rad"], np.float32)
        width = np.float32(msg["gripper_width_m"])
        obs = {STATE_KEY: np.append(q, width).astype(np.float32), "joint_pos_rad": q,
               "joint_vel_rad_s": np.asarray(msg["joint_vel_rad_s"], np.float32),
               "ee_pos_m": np.asarray(msg["ee_pos_m"], np.float32),
               "ee_quat_wxyz": np.asarray(msg["ee_quat_wxyz"], np.float32),
               "gripper_width_m": width, "timestamp_s": float(msg["t_s"])}
        if "task_state" in msg:  # a task scene: its policies read the task's state and the cameras
            obs[STATE_KEY] = np.asarray(msg["task_state"], np.float32)
            shape = msg.get("frame_shape")
            for cam, raw in (msg.get("frames") or {}).items():
                obs[image_key(cam)] = np.frombuffer(raw, np.uint8).reshape(shape)
            obs["success"] = bool(msg.get("success"))
            obs["image_timestamp_s"] = float(msg.get("t_frame_s", msg["t_s"]))
        return obs

    @property
    def scene(self) -> dict | None:
        """The task scene this arm stands in (`sim.scene`), or None for the bare arm."""
        return self.config.sim.get("scene") or None

    def scene_instruction(self) -> str:
        """The scene's own training-vocabulary instruction for its task ("" without a scene)."""
        self._drain()
        return str((self._latest or {}).get("instruction", ""))

    def reset_scene(self, seed: int) -> None:
        """Reset the task scene (sim only): objects and arm to a start pose drawn from `seed`, held there;
        needs arm() again. Returns once a state from after the reset has arrived."""
        with self._lock:
            t_sent = time.monotonic()
            self._send({"op": "reset_scene", "seed": int(seed)})
            if self.state.value == "armed":
                self._transition(type(self.state).CONNECTED, "reset")
        deadline = time.monotonic() + 10.0
        while time.monotonic() < deadline:
            self._drain()
            if (self._latest or {}).get("t_frame_s", 0.0) > t_sent and self._latest.get("hold_reason") == "reset":
                return
            time.sleep(0.005)
        raise RobotFault("sim arm scene did not reset within 10 s")

    def server_state(self) -> dict:
        """The raw last message (mode, t_hold_s, drop counters): for tests and benchmarks."""
        if self._proc is not None:
            self._drain()
        return dict(self._latest or {})

    def _command(self, cmd: Command) -> None:
        self._seq += 1
        self._send({"op": "cmd", "seq": self._seq, "mode": cmd.mode.value, "values": cmd.values.tolist(),
                    "gripper_width_m": cmd.gripper_width_m, "gripper_force_n": cmd.gripper_force_n,
                    "ee_target_m": None if cmd.ee_target_m is None else cmd.ee_target_m.tolist(),
                    "vel": None if cmd.velocity_rad_s is None else cmd.velocity_rad_s.tolist(),
                    "t_send_s": time.monotonic() if cmd.t_s is None else cmd.t_s})

    def _hold(self) -> None:
        self._send({"op": "hold"})

    def _estop_backend(self) -> None:
        self._send({"op": "estop"})

    def _recover(self) -> None:
        # the server says which recover it has applied: a state stamped after this send could still come from a
        # tick that read its commands before the e-stop sent just earlier arrived (seen under load: recover()
        # returned on a state still in `run`)
        self._ctrl_seq += 1
        self._send({"op": "recover", "ctrl_seq": self._ctrl_seq})
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:  # so that the next arm() sees the stop released
            self._drain()
            latest = self._latest or {}
            if latest.get("last_ctrl_seq", -1) >= self._ctrl_seq and latest.get("mode") != "estop":
                return
            time.sleep(0.002)
        raise RobotFault("sim arm did not leave its stop after recover")

    def _applied_this_arm(self, msg: dict) -> bool:
        """The server put the arm in run on the last arm op sent, so a stop it reports now came after it. The
        server echoes the op's sequence number; its stop times are tick times, which lag the client under load."""
        return msg.get("last_arm_seq", -1) >= self._arm_seq

    def _arm(self) -> None:
        self._drain()
        if (self._latest or {}).get("mode") == "estop":
            raise RobotFault(f"sim arm is stopped ({self._latest.get('hold_reason')}); call recover() first")
        self._ctrl_seq += 1
        self._arm_seq = self._ctrl_seq
        self._send({"op": "arm", "ctrl_seq": self._arm_seq})
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline:  # the arm op travels with the injected latency
            self._drain()
            if (self._latest or {}).get("mode") == "run":
                return
            time.sleep(0.002)
        last = self._latest or {}  # which state it stayed in says why (a collision stop racing the arm op, ...)
        if last.get("mode") == "estop" and self._applied_this_arm(last):
            # it ran for a tick or two (shorter than the state polling) and stopped again: an arm that rests
            # in contact (released after its settle time) re-trips the collision check
            reason = last.get("hold_reason")
            advice = ": it rests in contact; move it clear before arming" if reason == "self-collision" else ""
            raise RobotFault(f"sim arm entered run mode after arm, then stopped again at once ({reason!r}){advice}")
        raise RobotFault(f"sim arm did not enter run mode after arm (it stayed in {last.get('mode')!r}, "
                         f"hold reason {last.get('hold_reason')!r})")

    def inject(self, **settings) -> None:
        """Change latency_ms, jitter_ms, drop_prob, noise_q_rad, noise_qd_rad_s while running."""
        self._send({"op": "set", **settings})

    def reset_joints(self, q_rad) -> None:
        """Teleport the arm (sim only) and hold there; needs arm() again."""
        with self._lock:
            self._send({"op": "reset", "joint_pos_rad": [float(v) for v in q_rad]})
            if self.state.value == "armed":
                self._transition(type(self.state).CONNECTED, "reset")

    def fk_ee_pos_m(self, q_rad: np.ndarray) -> np.ndarray | None:
        return None if self._kin is None else self._kin.fk(q_rad)

    def ik_joint_targets(self, q_ref_rad, ee_target_m, rot_delta_rad):
        return None if self._kin is None else self._kin.ik(q_ref_rad, ee_target_m, rot_delta_rad)

    def reset_peaks(self) -> None:
        """Clear the server's measured peaks (speed, acceleration, box excess)."""
        self._send({"op": "reset_peaks"})

    def kill_server(self) -> None:
        """Test hook: the server dies like a robot that loses power."""
        if self._proc is not None:
            self._proc.kill()
