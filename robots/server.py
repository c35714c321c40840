"""Policy server: runs a policy where the GPU is and answers observation -> action chunk requests.

    python -m robots.server --policy CKPT [--host 127.0.0.1] [--port 5555] [--token SECRET]

ZeroMQ ROUTER socket, msgpack messages (robots.wire), never pickle. It binds 127.0.0.1 by default;
binding any other address requires a token, and every request must carry it (compared in constant
time). Without a token any local process can send requests (a warning says so at startup). Each reply
echoes the request's `obs_step` and `t_obs_s` (the client's clock) and adds the server's receive/send
times and the inference time, so the client can drop late chunks.

Requests are msgpack maps, checked field by field before the policy runs (unknown fields, at the top
level or in `obs`, are rejected so a typo cannot pass silently):

    {"type": "ping",  "id": int >= 0, "token": str (when configured)}
    {"type": "infer", "id": int >= 0, "token": str, "obs": {...}, "obs_step": int >= 0, "t_obs_s": float}

`obs`: "observation.state" (obs_dim numbers, required), "joint_pos_rad" (dof numbers; required by
the delta joint_position action map, which adds the policy's deltas to it), "ee_pos_m" (3 numbers,
optional). Numbers are a 1-D numeric array (robots.wire; bool is not numeric) or a list of int/float,
all finite and within |x| <= max_abs (1e6), so an absurd value is refused instead of reaching the policy.
A policy with cameras (the VLA) also needs "observation.images.<camera>" for each of its cameras, a
uint8 array of exactly the shape it was trained on ([H, W, 3]), and reads "task", the instruction (a
string of at most 1,000 printable characters; optional). The whole request stays within `max_bytes`.

Replies: `pong` (the counters plus `spec`, what the policy expects and sends, for a client to check
before arming), `chunk`, or {"type": "error", "id": id or None, "error": "<kind>: <one line>"} with
kind `malformed` (not a msgpack map), `invalid` (a field; the line names it and what was expected),
`unauthorized`, `oversized`, `policy_error` (the policy raised or returned the wrong shape),
`nonfinite` (NaN/Inf actions after the action map: never sent) or `internal`. Every error is counted
in `stats` under its kind (`internal` under `errors`); `handle` never raises, whatever the input.

Size: requests up to `max_bytes` (1 MiB) are served; larger ones up to `hard_cap_bytes` (256 MiB, zmq's
MAXMSGSIZE) are received and answered `oversized`. Beyond the hard cap zmq drops the connection
without delivering anything, so no reply is possible; the client's DEALER reconnects on its own.

Actions: a policy outputs normalised actions in [-1, 1] ([H, A]); `ActionMap` turns them into robot
units (joint targets relative to the observed joints, gripper width) unless the policy already
outputs robot units (`action_map: absolute`). `action_map: ogbench` reads OGBench manipulation
actions (dx, dy, dz in 5 cm, yaw in 0.3 rad, gripper +1 closed / -1 open) as ee_delta commands. A single-step policy (H=1) is repeated `repeat` times,
a zero-order hold, so an asynchronous loop always has actions to run while the next chunk is computed.
"""
from __future__ import annotations

import argparse
import hmac
import math
import os
import sys
import threading
import time
from dataclasses import dataclass

import numpy as np
import zmq

from embodied.constants import IMAGES_PREFIX, STATE_KEY, TASK_KEY, image_key
from embodied.errors import ConfigError, UserError, exit_on_user_error
from robots.wire import OversizedError, WireError, pack, unpack

LOOPBACK = {"127.0.0.1", "localhost", "::1"}
DEFAULT_MAX_BYTES = 1 << 20
DEFAULT_HARD_CAP_BYTES = 256 << 20   # zmq MAXMSGSIZE: beyond it the transport drops the message, no reply
DEFAULT_MAX_ABS = 1e6                # |value| bound on every observation number
INT64_MAX = (1 << 63) - 1
FIELDS = {"ping": ("type", "id", "token"), "infer": ("type", "id", "token", "obs", "obs_step", "t_obs_s")}
OBS_KEYS = (STATE_KEY, "joint_pos_rad", "ee_pos_m", TASK_KEY)  # + the policy's image keys
MAX_TASK_CHARS = 1000
OGBENCH_POS_SCALE_M, OGBENCH_YAW_SCALE_RAD = 0.05, 0.3  # OGBench manipspace's action range, per unit
# error kind -> the stats counter it increments
ERROR_COUNTERS = {"malformed": "malformed", "invalid": "invalid", "unauthorized": "unauthorized",
                  "oversized": "oversized", "policy_error": "policy_errors", "nonfinite": "nonfinite",
                  "internal": "errors"}
MODES = ("joint_position", "joint_velocity", "ee_delta")


@dataclass
class ActionMap:
    """Normalised policy actions -> robot units. `absolute`: pass through unchanged."""

    kind: str = "delta"            # delta | absolute
    dof: int = 6
    mode: str = "joint_position"
    delta_scale_rad: float = 0.1   # joint_position: target = q_obs + scale * a
    vel_scale_rad_s: float = 0.5   # joint_velocity: qd = scale * a
    ee_scale_m: float = 0.01       # ee_delta: dx = scale * a
    ee_rot_scale_rad: float = 0.05
    gripper_max_m: float = 0.085   # width = max * (a + 1) / 2

    def __post_init__(self):
        if self.kind not in ("delta", "absolute", "ogbench"):
            raise ConfigError(f"action_map kind={self.kind!r}; use 'delta', 'absolute' or 'ogbench'")
        if self.kind == "delta" and self.mode not in MODES:
            raise ConfigError(f"action_map mode={self.mode!r}; use one of {', '.join(MODES)}")
        if self.kind == "ogbench" and self.mode != "ee_delta":
            raise ConfigError(f"action_map kind=ogbench makes end-effector deltas; the robot's control_mode is "
                              f"{self.mode!r}: use an ee_delta robot (e.g. robot=sim_ur5e_cube)")

    @property
    def needs_joints(self) -> bool:
        """Delta joint targets are relative to the observed joints, so the request must carry them."""
        return self.kind == "delta" and self.mode == "joint_position"

    @property
    def in_dim(self) -> int | None:
        """Actions per step the map needs from the policy (None: any, passed through)."""
        if self.kind == "absolute":
            return None
        if self.kind == "ogbench":
            return 5
        return 7 if self.mode == "ee_delta" else self.dof + 1

    def __call__(self, chunk: np.ndarray, obs: dict) -> np.ndarray:
        chunk = np.asarray(chunk, np.float64)
        if self.kind == "absolute":
            return chunk
        if self.kind == "ogbench":  # [dx, dy, dz, dyaw, grip] -> [dx, dy, dz, 0, 0, dyaw, width]
            out = np.zeros((len(chunk), 7))
            out[:, :3] = OGBENCH_POS_SCALE_M * chunk[:, :3]
            out[:, 5] = OGBENCH_YAW_SCALE_RAD * chunk[:, 3]
            out[:, 6] = self.gripper_max_m * (1 - np.clip(chunk[:, 4], -1, 1)) / 2  # +1 closes the gripper
            return out
        out = np.empty_like(chunk)
        n = chunk.shape[1] - 1
        if self.mode == "joint_position":
            q = np.asarray(obs["joint_pos_rad"], np.float64)[: self.dof]
            out[:, :n] = q + self.delta_scale_rad * chunk[:, :n]
        elif self.mode == "joint_velocity":
            out[:, :n] = self.vel_scale_rad_s * chunk[:, :n]
        else:
            out[:, :3] = self.ee_scale_m * chunk[:, :3]
            out[:, 3:n] = self.ee_rot_scale_rad * chunk[:, 3:n]
        out[:, -1] = self.gripper_max_m * (np.clip(chunk[:, -1], -1, 1) + 1) / 2
        return out

    def spec(self) -> dict:
        return {"action_map": self.kind, "mode": self.mode, "dof": int(self.dof)}


class _Reject(Exception):
    """A request that gets an error reply of this kind (never leaves `handle`)."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


def _show(value, limit: int = 60) -> str:
    """A peer's value in an error line: type and a short repr, never the whole (maybe huge) thing."""
    if isinstance(value, np.ndarray):
        return f"array(dtype={value.dtype}, shape={value.shape})"
    text = repr(value)
    text = text if len(text) <= limit else text[: limit - 3] + "..."
    return f"{type(value).__name__} {text}"


def _one_line(text: str, limit: int = 200) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _is_int(value) -> bool:
    return type(value) is int  # bool is an int subclass and is refused


def _policy_rows(policy) -> int | None:
    """Rows act() returns: chunk policies say so (GenerativeChunkPolicy.future, or a horizon attribute);
    a policy with no horizon attribute at all is single-step by this project's convention."""
    for name in ("future", "horizon"):
        value = getattr(policy, name, None)
        if _is_int(value) and value > 0:
            return value
    pred, obs_h = getattr(policy, "pred_horizon", None), getattr(policy, "obs_horizon", 1)
    if _is_int(pred) and _is_int(obs_h):
        return pred - obs_h + 1
    return 1 if getattr(policy, "act_dim", None) is not None else None


def _noise_stream(policy, seed: int):
    """The noise a diffusion or flow policy samples each chunk from: fresh per request, as those policies
    are deployed (a fixed draw would replay one sample forever), and seeded, so a session repeats."""
    import torch

    device = getattr(policy, "device", torch.device("cpu"))
    return torch.Generator(device=device).manual_seed(int(seed))


class PolicyServer:
    def __init__(self, policy, *, host: str = "127.0.0.1", port: int = 0, token: str | None = None,
                 action_map: ActionMap | None = None, repeat: int = 1, extra_latency_ms: float = 0.0,
                 max_bytes: int = DEFAULT_MAX_BYTES, obs_dim: int | None = None,
                 hard_cap_bytes: int = DEFAULT_HARD_CAP_BYTES, max_abs: float = DEFAULT_MAX_ABS,
                 noise_seed: int = 0):
        if host not in LOOPBACK and not token:
            raise UserError(f"policy server host={host!r} is not loopback; pass --token (an auth token) "
                            "or bind 127.0.0.1")
        if int(hard_cap_bytes) < int(max_bytes):
            raise ConfigError(f"hard_cap_bytes={hard_cap_bytes} is below max_bytes={max_bytes}; the hard cap "
                              "must be at least the size limit so oversized requests can be answered")
        self.policy, self.token, self.repeat = policy, token, max(1, int(repeat))
        self._noise = _noise_stream(policy, noise_seed)
        self.action_map = action_map or ActionMap(kind="absolute")
        self.extra_latency_s = float(extra_latency_ms) / 1e3
        self.max_bytes, self.hard_cap_bytes = int(max_bytes), int(hard_cap_bytes)
        self.max_abs = float(max_abs)
        self.obs_dim = obs_dim if obs_dim is not None else getattr(policy, "obs_dim", None)
        self.act_dim = getattr(policy, "act_dim", None)
        self.cameras = [str(c) for c in getattr(policy, "cameras", None) or []]
        size = getattr(policy, "image_size", None)
        self.image_shape = [int(size), int(size), 3] if self.cameras and size else None
        rows = _policy_rows(policy)
        self.horizon = None if rows is None else (rows * self.repeat if rows == 1 else rows)
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.MAXMSGSIZE, self.hard_cap_bytes)  # above max_bytes: oversized gets a reply
        self.sock.setsockopt(zmq.ROUTER_MANDATORY, 0)
        url = f"tcp://{host}"
        self.port = self.sock.bind_to_random_port(url) if port == 0 else port
        if port:
            self.sock.bind(f"{url}:{port}")
        self.address = f"tcp://{host}:{self.port}"
        self.stats = {"requests": 0, "chunks": 0, "pings": 0, **{c: 0 for c in ERROR_COUNTERS.values()}}
        self._stop = threading.Event()
        self.exit_with_parent = False

    def spec(self) -> dict:
        """What this server expects and sends, so a deploy loop can check it against the robot before arming."""
        return {"obs_dim": self.obs_dim, "action_dim": self.act_dim, "horizon": self.horizon,
                **self.action_map.spec(), "required_obs": self._required_obs(), "max_bytes": self.max_bytes,
                "cameras": self.cameras, "image_shape": self.image_shape}

    def _required_obs(self) -> list[str]:
        keys = [STATE_KEY, "joint_pos_rad"] if self.action_map.needs_joints else [STATE_KEY]
        return keys + [image_key(c) for c in self.cameras]

    def warm_up(self) -> float:
        """One inference on a blank observation before serving, so the first real request does not pay for
        lazy loading (a VLA's text encoder takes seconds): that chunk would miss the arm's deadline.
        Returns the seconds it took; a policy that cannot act on zeros is left to fail on real requests."""
        if self.obs_dim is None:
            return 0.0
        t0 = time.monotonic()
        obs = {STATE_KEY: np.zeros(self.obs_dim, np.float32), TASK_KEY: "warm up"}
        if self.action_map.needs_joints:
            obs["joint_pos_rad"] = np.zeros(self.action_map.dof, np.float32)
        for cam in self.cameras:
            obs[image_key(cam)] = np.zeros(self.image_shape or (64, 64, 3), np.uint8)
        try:
            self.policy.act(obs, generator=self._noise)
        except Exception:  # noqa: BLE001
            pass
        return time.monotonic() - t0

    # -- request handling --------------------------------------------------------------------------
    def handle(self, raw: bytes) -> dict:
        """One request -> one reply, for any input at all: a bad peer must not take the server down."""
        t_recv = time.monotonic()
        rid = None
        try:
            self.stats["requests"] += 1
            message = self._decode(raw)
            rid = message.get("id") if _is_int(message.get("id")) and 0 <= message["id"] <= INT64_MAX else None
            return self._answer(message, rid, t_recv)
        except _Reject as rej:
            return self._error(rej.kind, str(rej), rid)
        except Exception as err:  # noqa: BLE001  a bug here must cost one request, not the server
            return self._error("internal", f"{type(err).__name__} while handling the request: "
                                           f"{_one_line(err, 120)}", rid)

    def _error(self, kind: str, message: str, rid) -> dict:
        self.stats[ERROR_COUNTERS[kind]] += 1
        return {"type": "error", "id": rid, "error": f"{kind}: {_one_line(message)}"}

    def _decode(self, raw) -> dict:
        if len(raw) > self.max_bytes:
            raise _Reject("oversized", f"{len(raw) - self.max_bytes} bytes over the {self.max_bytes}-byte limit "
                                       f"(message of {len(raw)} bytes); send a smaller request")
        try:
            return unpack(bytes(raw), self.max_bytes)
        except OversizedError as err:
            raise _Reject("oversized", str(err)) from None
        except WireError as err:
            raise _Reject("malformed", f"{err}; send a msgpack map encoded by robots.wire") from None

    def _answer(self, message: dict, rid, t_recv: float) -> dict:
        if not self._token_ok(message):
            raise _Reject("unauthorized", "wrong or missing token; send the server's token "
                                          "(--token / $EMBODIED_POLICY_TOKEN)")
        if "type" not in message:
            raise _Reject("invalid", "type is missing; expected 'ping' or 'infer'")
        kind = message["type"]
        if not isinstance(kind, str) or kind not in FIELDS:
            raise _Reject("invalid", f"type must be 'ping' or 'infer', got {_show(kind)}")
        for key in message:
            if key not in FIELDS[kind]:
                raise _Reject("invalid", f"unknown field {_show(key)} in the {kind} request; "
                                         f"expected only {', '.join(FIELDS[kind])}")
        if "id" not in message:
            raise _Reject("invalid", "id is missing; expected an int >= 0 (echoed in the reply)")
        if rid is None:
            raise _Reject("invalid", f"id must be an int in [0, 2**63), got {_show(message['id'])}")
        if kind == "ping":
            self.stats["pings"] += 1
            return {"type": "pong", "id": rid, "t_s": time.monotonic(), **self.stats, "spec": self.spec()}
        obs = self._obs(message)
        obs_step = self._field(message, "obs_step", "an int >= 0")
        if not _is_int(obs_step) or not 0 <= obs_step <= INT64_MAX:
            raise _Reject("invalid", f"obs_step must be an int in [0, 2**63) (not bool), got {_show(obs_step)}")
        t_obs = self._field(message, "t_obs_s", "a finite number (the client's clock, s)")
        if type(t_obs) not in (int, float) or not math.isfinite(t_obs):
            raise _Reject("invalid", f"t_obs_s must be a finite number (the client's clock, s), got {_show(t_obs)}")
        return self._infer(obs, obs_step, float(t_obs), rid, t_recv)

    def _token_ok(self, message: dict) -> bool:
        given = message.get("token")
        if not self.token:
            if "token" in message and not isinstance(given, str):
                raise _Reject("invalid", f"token must be a string, got {_show(given)}")
            return True
        return isinstance(given, str) and hmac.compare_digest(given.encode(), self.token.encode())

    @staticmethod
    def _field(message: dict, key: str, expected: str):
        if key not in message:
            raise _Reject("invalid", f"{key} is missing; expected {expected}")
        return message[key]

    def _obs(self, message: dict) -> dict:
        obs = self._field(message, "obs", "a map with " + ", ".join(self._required_obs()))
        if not isinstance(obs, dict):
            raise _Reject("invalid", f"obs must be a map of observation arrays, got {_show(obs)}")
        images = [image_key(c) for c in self.cameras]
        for key in obs:
            if key not in OBS_KEYS and key not in images:
                hint = (f"; this policy reads cameras {self.cameras}" if isinstance(key, str)
                        and key.startswith(IMAGES_PREFIX) else "")
                raise _Reject("invalid", f"unknown obs key {_show(key)}; expected only "
                                         f"{', '.join(OBS_KEYS + tuple(images))}{hint}")
        out = {STATE_KEY: self._vector(obs, STATE_KEY, self.obs_dim, required=True)}
        joints_n = self.action_map.dof if self.action_map.needs_joints else None
        q = self._vector(obs, "joint_pos_rad", joints_n, required=self.action_map.needs_joints)
        ee = self._vector(obs, "ee_pos_m", 3, required=False)
        out.update({k: v for k, v in (("joint_pos_rad", q), ("ee_pos_m", ee)) if v is not None})
        for key in images:
            out[key] = self._image(obs, key)
        if TASK_KEY in obs:
            out[TASK_KEY] = self._task(obs[TASK_KEY])
        return out

    def _image(self, obs: dict, key: str) -> np.ndarray:
        """A uint8 [H, W, 3] frame of exactly the policy's training size."""
        shape = self.image_shape
        want = f"a uint8 array of shape {shape} (HWC; resize on the robot side)"
        if key not in obs:
            raise _Reject("invalid", f'obs["{key}"] is missing; this policy reads cameras {self.cameras}: send {want}')
        frame = obs[key]
        if not isinstance(frame, np.ndarray):
            raise _Reject("invalid", f'obs["{key}"] is {_show(frame)}; send {want}')
        if frame.dtype != np.uint8:
            raise _Reject("invalid", f'obs["{key}"] has dtype {frame.dtype}; send {want}')
        if shape is not None and list(frame.shape) != shape:
            raise _Reject("invalid", f'obs["{key}"] has shape {list(frame.shape)}; send {want}')
        return frame

    @staticmethod
    def _task(task) -> str:
        if not isinstance(task, str):
            raise _Reject("invalid", f'obs["{TASK_KEY}"] is {_show(task)}; send the instruction as a string')
        if len(task) > MAX_TASK_CHARS or not task.isprintable():
            raise _Reject("invalid", f'obs["{TASK_KEY}"] has {len(task)} characters or unprintable ones; send at '
                                     f"most {MAX_TASK_CHARS} printable characters")
        return task

    def _vector(self, obs: dict, key: str, n: int | None, required: bool) -> np.ndarray | None:
        """A 1-D vector of n finite numbers within max_abs, as float64; None when absent and optional."""
        where = f'obs["{key}"]'
        expected = f"{n if n is not None else 'a vector of'} numbers (a 1-D numeric array or a list)"
        if key not in obs:
            if required:
                raise _Reject("invalid", f"{where} is missing; expected {expected}")
            return None
        value = obs[key]
        if isinstance(value, np.ndarray):
            if value.dtype.kind not in "iuf":
                raise _Reject("invalid", f"{where} has dtype {value.dtype}; expected {expected}")
            if value.ndim != 1 or (n is not None and value.shape[0] != n) or value.size == 0:
                raise _Reject("invalid", f"{where} has shape {value.shape}; expected {expected}")
            arr = value.astype(np.float64)
        elif isinstance(value, list):
            if (n is not None and len(value) != n) or not value:
                raise _Reject("invalid", f"{where} has {len(value)} entries; expected {expected}")
            bad = [v for v in value if type(v) not in (int, float)][:1]  # a list: None is a possible entry
            if bad:
                raise _Reject("invalid", f"{where} holds {_show(bad[0])}; expected {expected}")
            arr = np.array([float(v) for v in value], np.float64)
        else:
            raise _Reject("invalid", f"{where} is {_show(value)}; expected {expected}")
        finite = np.isfinite(arr)
        if not finite.all():
            i = int(np.argmin(finite))
            raise _Reject("invalid", f"{where}[{i}] is {arr[i]}; expected finite numbers")
        big = np.abs(arr) > self.max_abs
        if big.any():
            i = int(np.argmax(big))
            raise _Reject("invalid", f"{where}[{i}] = {arr[i]:.3g} is outside |x| <= {self.max_abs:g}; "
                                     "send values in robot units")
        return arr

    def _infer(self, obs: dict, obs_step: int, t_obs: float, rid, t_recv: float) -> dict:
        t0 = time.monotonic()
        with np.errstate(over="ignore"):  # only past a loosened max_abs; the output check catches the result
            policy_obs = {k: v if k == TASK_KEY or k.startswith(IMAGES_PREFIX) else v.astype(np.float32)
                          for k, v in obs.items()}  # only checked inputs reach the policy
        try:
            chunk = np.asarray(self.policy.act(policy_obs, generator=self._noise), np.float64)
        except Exception as err:  # noqa: BLE001  a policy bug must not kill the server
            raise _Reject("policy_error", f"policy failed: {type(err).__name__}: {_one_line(err, 120)}") from None
        if chunk.ndim == 1:
            chunk = chunk[None]
        want = self.act_dim if self.act_dim is not None else self.action_map.in_dim
        if chunk.ndim != 2 or chunk.shape[0] == 0 or (want is not None and chunk.shape[1] != want):
            raise _Reject("policy_error", f"policy returned actions of shape {chunk.shape}; expected [H, {want}]")
        if self.action_map.in_dim is not None and chunk.shape[1] != self.action_map.in_dim:
            raise _Reject("policy_error", f"policy outputs {chunk.shape[1]} actions per step; the action map "
                                          f"({self.action_map.mode}, dof={self.action_map.dof}) needs "
                                          f"{self.action_map.in_dim}")
        if chunk.shape[0] == 1 and self.repeat > 1:
            chunk = np.repeat(chunk, self.repeat, axis=0)
        with np.errstate(over="ignore", invalid="ignore"):  # overflow is caught just below, not warned about
            out = self.action_map(chunk, obs).astype(np.float32)  # float32 is what is sent: check that
        finite = np.isfinite(out)
        if not finite.all():
            raise _Reject("nonfinite", f"policy produced non-finite actions ({int((~finite).sum())} of {out.size} "
                                       "values NaN/Inf after the action map); nothing sent, check the policy")
        if self.extra_latency_s > 0:  # emulate a heavier model (benchmarks)
            time.sleep(max(0.0, self.extra_latency_s - (time.monotonic() - t0)))
        infer_ms = (time.monotonic() - t0) * 1e3
        self.stats["chunks"] += 1
        return {"type": "chunk", "id": rid, "chunk": out, "obs_step": obs_step, "t_obs_s": t_obs,
                "t_recv_s": t_recv, "t_sent_s": time.monotonic(), "infer_ms": infer_ms}

    # -- transport ---------------------------------------------------------------------------------
    def serve(self, max_requests: int | None = None) -> None:
        poller = zmq.Poller()
        poller.register(self.sock, zmq.POLLIN)
        served = 0
        parent = os.getppid()
        while not self._stop.is_set():
            if not poller.poll(100):
                if self.exit_with_parent and os.getppid() != parent:
                    break  # started by a controller that is gone
                continue
            try:
                frames = self.sock.recv_multipart(zmq.NOBLOCK)
            except zmq.ZMQError:
                continue
            if len(frames) < 2:
                continue
            identity, envelope = frames[0], frames[1:-1]
            if len(envelope) > 1 or any(envelope):
                # a DEALER sends one frame, a REQ an empty delimiter and one frame; anything else is refused
                self.stats["requests"] += 1
                envelope, reply = [], self._error("malformed", f"{len(frames) - 1} frames; send one msgpack "
                                                               "frame per request", None)
            else:
                reply = self.handle(frames[-1])
            try:
                payload = pack(reply)
            except Exception as err:  # noqa: BLE001  never expected; answer rather than go silent
                payload = pack(self._error("internal", f"reply not encodable ({type(err).__name__})",
                                           reply.get("id") if isinstance(reply, dict) else None))
            try:
                self.sock.send_multipart([identity, *envelope, payload], zmq.NOBLOCK)
            except zmq.ZMQError:
                pass  # the client went away
            served += 1
            if max_requests is not None and served >= max_requests:
                break

    def stop(self) -> None:
        self._stop.set()

    def close(self) -> None:
        self.sock.close()
        self.ctx.term()


def load_policy(path: str, device: str = "cpu"):
    import policies

    return policies.load(path, device=device)


@exit_on_user_error
def main(argv=None) -> None:
    import torch

    parser = argparse.ArgumentParser(description="Serve a saved policy over ZeroMQ (msgpack).")
    parser.add_argument("--policy", required=True, help="a directory written by Policy.save()")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0: a free port (printed)")
    parser.add_argument("--token", default=os.environ.get("EMBODIED_POLICY_TOKEN"),
                        help="auth token (default: $EMBODIED_POLICY_TOKEN); required off loopback")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--action-map", default="delta", choices=["delta", "absolute", "ogbench"])
    parser.add_argument("--mode", default="joint_position")
    parser.add_argument("--dof", type=int, default=6)
    parser.add_argument("--delta-scale-rad", type=float, default=0.1)
    parser.add_argument("--gripper-max-m", type=float, default=0.085)
    parser.add_argument("--repeat", type=int, default=10, help="zero-order hold of single-step policies")
    parser.add_argument("--extra-latency-ms", type=float, default=0.0, help="emulate a slower model")
    parser.add_argument("--max-bytes", type=int, default=DEFAULT_MAX_BYTES, help="largest request served")
    parser.add_argument("--hard-cap-bytes", type=int, default=DEFAULT_HARD_CAP_BYTES,
                        help="zmq MAXMSGSIZE: larger requests are dropped by the transport, unanswered")
    parser.add_argument("--max-abs", type=float, default=DEFAULT_MAX_ABS, help="bound on |observation values|")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--noise-seed", type=int, default=0,
                        help="seed of the noise diffusion/flow policies draw fresh for every chunk")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    policy = load_policy(args.policy, args.device)
    policy.eval()
    server = PolicyServer(policy, host=args.host, port=args.port, token=args.token, repeat=args.repeat,
                          action_map=ActionMap(args.action_map, args.dof, args.mode, args.delta_scale_rad,
                                               gripper_max_m=args.gripper_max_m),
                          extra_latency_ms=args.extra_latency_ms, max_bytes=args.max_bytes,
                          hard_cap_bytes=args.hard_cap_bytes, max_abs=args.max_abs, noise_seed=args.noise_seed)
    server.exit_with_parent = True
    server.warm_up()
    if not args.token:
        print(f"warning: no token set, so any local process can send requests to {server.address}; "
              "set one with --token or $EMBODIED_POLICY_TOKEN", file=sys.stderr, flush=True)
    print(f"ADDRESS {server.address}", flush=True)
    try:
        server.serve()
    except KeyboardInterrupt:
        pass
    finally:
        server.close()


if __name__ == "__main__":
    main()
