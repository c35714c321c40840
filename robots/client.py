"""Robot-side client of the policy server: asynchronous chunk requests that never block the loop.

    client = PolicyClient("tcp://127.0.0.1:5555", token=...)
    client.request(obs, obs_step)          # returns at once
    for reply in client.poll():            # chunks that arrived since the last call
        executor.push(reply.chunk, reply.obs_step)

A chunk older than `max_age_ms` (measured on the robot's clock from the observation it answers) is
dropped here; the executor drops chunks whose actions are all in the past.
"""
from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import zmq

from embodied.constants import STATE_KEY, TASK_KEY, image_key
from embodied.errors import UserError
from robots.wire import WireError, pack, unpack


@dataclass
class ChunkReply:
    chunk: np.ndarray        # [H, A] robot units
    obs_step: int
    t_obs_s: float           # robot clock, when the observation was taken
    t_arrived_s: float       # robot clock, when the reply arrived
    infer_ms: float

    @property
    def round_trip_ms(self) -> float:
        return (self.t_arrived_s - self.t_obs_s) * 1e3


class PolicyServerError(RuntimeError):
    pass


class PolicyClient:
    def __init__(self, address: str, token: str | None = None, max_age_ms: float = 1000.0,
                 max_bytes: int = 1 << 22):
        self.zmq = zmq
        self.address, self.token = address, token
        self.max_age_s = float(max_age_ms) / 1e3
        self.max_bytes = max_bytes
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(address)
        self._id = 0
        self._min_id = 1                         # replies to requests older than this are ignored
        self.in_flight: dict[int, float] = {}   # request id -> send time
        self.stats = {"sent": 0, "received": 0, "late": 0, "errors": 0}
        self.last_error: str | None = None
        self.cameras: list[str] = []  # the server policy's cameras, learnt from spec()

    def _send(self, message: dict) -> int:
        self._id += 1
        message = {**message, "id": self._id}
        if self.token:
            message["token"] = self.token
        self.sock.send(pack(message), self.zmq.NOBLOCK)
        self.in_flight[self._id] = time.monotonic()
        self.stats["sent"] += 1
        return self._id

    def request(self, obs: dict, obs_step: int, t_obs_s: float | None = None) -> int:
        """Send the observation: observation.state, joint_pos_rad, ee_pos_m, the instruction (`task`) when
        there is one, and the frames of the cameras the server's policy reads (`cameras` from `spec()`)."""
        keep = {k: np.asarray(v) for k, v in obs.items() if k in (STATE_KEY, "joint_pos_rad", "ee_pos_m")}
        keep.update({image_key(c): np.asarray(obs[image_key(c)]) for c in self.cameras if image_key(c) in obs})
        if isinstance(obs.get(TASK_KEY), str):
            keep[TASK_KEY] = obs[TASK_KEY]
        t = obs.get("timestamp_s", time.monotonic()) if t_obs_s is None else t_obs_s
        return self._send({"type": "infer", "obs": keep, "obs_step": int(obs_step), "t_obs_s": float(t)})

    def new_epoch(self) -> None:
        """Forget requests in flight (a new episode): their answers would refer to old steps."""
        self._min_id = self._id + 1
        self.in_flight.clear()

    def send_raw(self, raw: bytes) -> None:
        """Tests: put arbitrary bytes on the wire."""
        self.sock.send(raw)

    def poll(self, timeout_ms: float = 0) -> list[ChunkReply]:
        out = []
        while self.sock.poll(timeout_ms if not out else 0):
            raw = self.sock.recv()
            now = time.monotonic()
            try:
                msg = unpack(raw, self.max_bytes)
            except WireError as err:
                self.stats["errors"] += 1
                self.last_error = str(err)
                continue
            rid = msg.get("id")
            self.in_flight.pop(rid, None)
            if isinstance(rid, int) and rid < self._min_id:
                continue  # answers a request from before new_epoch()
            if msg.get("type") == "pong":
                out.append(msg)  # type: ignore[arg-type]  (a pong is an answer, not an error)
                continue
            if msg.get("type") != "chunk":
                self.stats["errors"] += 1
                self.last_error = str(msg.get("error", msg.get("type")))
                continue
            self.stats["received"] += 1
            reply = ChunkReply(np.asarray(msg["chunk"], np.float64), int(msg["obs_step"]), float(msg["t_obs_s"]),
                               now, float(msg["infer_ms"]))
            if now - reply.t_obs_s > self.max_age_s:
                self.stats["late"] += 1
                continue
            out.append(reply)
            timeout_ms = 0
        return out

    def infer(self, obs: dict, obs_step: int = 0, timeout_ms: float = 5000) -> ChunkReply:
        """Blocking round trip (benchmarks, tests)."""
        errors = self.stats["errors"]
        rid = self.request(obs, obs_step)
        deadline = time.monotonic() + timeout_ms / 1e3
        while time.monotonic() < deadline:
            for reply in self.poll(max(1.0, (deadline - time.monotonic()) * 1e3)):
                if isinstance(reply, ChunkReply) and reply.obs_step == obs_step:
                    return reply
            # its error reply (one the server could not read an id from, e.g. oversized, has id None)
            if self.stats["errors"] > errors and self.last_error and (rid not in self.in_flight or len(self.in_flight) == 1):
                raise PolicyServerError(self.last_error)
        raise TimeoutError(f"no chunk from {self.address} within {timeout_ms:.0f} ms")

    def ping(self, timeout_ms: float = 2000) -> dict:
        """The server's counters and `spec`; raises PolicyServerError when it refuses the ping."""
        rid = self._send({"type": "ping"})
        errors = self.stats["errors"]
        deadline = time.monotonic() + timeout_ms / 1e3
        while time.monotonic() < deadline:
            for msg in self.poll(50):
                if isinstance(msg, dict) and msg.get("id") == rid:
                    return msg
            if self.stats["errors"] > errors and rid not in self.in_flight:
                raise PolicyServerError(self.last_error)  # the ping itself was refused (token, ...)
        raise TimeoutError(f"policy server {self.address} did not answer a ping within {timeout_ms:.0f} ms")

    def spec(self, timeout_ms: float = 2000) -> dict:
        """What the server's policy expects and sends (obs_dim, action_dim, horizon, action_map, mode, dof),
        to check against the robot before arming."""
        spec = self.ping(timeout_ms).get("spec")
        if not isinstance(spec, dict):
            raise PolicyServerError(f"policy server {self.address} sent no spec with its pong; "
                                    "it predates spec reporting, restart it from this checkout")
        self.cameras = [str(c) for c in spec.get("cameras") or []]
        return spec

    def close(self) -> None:
        self.sock.close()
        self.ctx.term()


class LocalPolicyServer:
    """Start `python -m robots.server` as a separate process (own interpreter, own GIL), with a fresh
    random token passed through the environment (not the command line)."""

    def __init__(self, policy_dir: str | Path, *, args: list[str] | None = None, token: str | None = None,
                 start_timeout_s: float = 60.0):
        self.token = token or secrets.token_hex(16)
        env = {**os.environ, "EMBODIED_POLICY_TOKEN": self.token, "OMP_NUM_THREADS": "1"}
        cmd = [sys.executable, "-m", "robots.server", "--policy", str(policy_dir), *(args or [])]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env,
                                     cwd=str(Path(__file__).resolve().parents[1]), start_new_session=True)
        line = self.proc.stdout.readline()
        if not line.startswith("ADDRESS "):
            self.stop()
            raise UserError(f"policy server for {policy_dir} did not start (exit code {self.proc.returncode}); "
                            f"run python -m robots.server --policy {policy_dir} to see why")
        self.address = line.split()[1]

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)  # a stalled (SIGSTOPped) server must wake up to terminate
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc.stdout:
            self.proc.stdout.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()
