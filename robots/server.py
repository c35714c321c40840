"""Policy server: runs a policy where the GPU is and answers observation -> action chunk requests.

    python -m robots.server --policy CKPT [--host 127.0.0.1] [--port 5555] [--token SECRET]

ZeroMQ ROUTER socket, msgpack messages (robots.wire), never pickle. It binds 127.0.0.1 by default;
binding any other address requires a token, and every request must carry it (compared in constant
time). Malformed, oversized or unauthorised requests get an error reply and are counted; the server
keeps serving. Each reply echoes the request's `obs_step` and `t_obs_s` (the client's clock) and adds
the server's receive/send times and the inference time, so the client can drop late chunks.

Actions: a policy outputs normalised actions in [-1, 1] ([H, A]); `ActionMap` turns them into robot
units (joint targets relative to the observed joints, gripper width) unless the policy already
outputs robot units (`action_map: absolute`). A single-step policy (H=1) is repeated `repeat` times,
a zero-order hold, so an asynchronous loop always has actions to run while the next chunk is computed.
"""
from __future__ import annotations

import argparse
import hmac
import os
import threading
import time
from dataclasses import dataclass

import numpy as np

from embodied.errors import UserError, exit_on_user_error
from robots.wire import WireError, pack, unpack

LOOPBACK = {"127.0.0.1", "localhost", "::1"}
DEFAULT_MAX_BYTES = 1 << 20


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

    def __call__(self, chunk: np.ndarray, obs: dict) -> np.ndarray:
        chunk = np.asarray(chunk, np.float64)
        if self.kind == "absolute":
            return chunk
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


class PolicyServer:
    def __init__(self, policy, *, host: str = "127.0.0.1", port: int = 0, token: str | None = None,
                 action_map: ActionMap | None = None, repeat: int = 1, extra_latency_ms: float = 0.0,
                 max_bytes: int = DEFAULT_MAX_BYTES, obs_dim: int | None = None):
        import zmq

        if host not in LOOPBACK and not token:
            raise UserError(f"policy server host={host!r} is not loopback; pass --token (an auth token) "
                            "or bind 127.0.0.1")
        self.policy, self.token, self.repeat = policy, token, max(1, int(repeat))
        self.action_map = action_map or ActionMap(kind="absolute")
        self.extra_latency_s = float(extra_latency_ms) / 1e3
        self.max_bytes = int(max_bytes)
        self.obs_dim = obs_dim if obs_dim is not None else getattr(policy, "obs_dim", None)
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.MAXMSGSIZE, 4 * self.max_bytes)  # zmq's own hard cap; ours is below it
        self.sock.setsockopt(zmq.ROUTER_MANDATORY, 0)
        url = f"tcp://{host}"
        self.port = self.sock.bind_to_random_port(url) if port == 0 else port
        if port:
            self.sock.bind(f"{url}:{port}")
        self.address = f"tcp://{host}:{self.port}"
        self.stats = {"requests": 0, "chunks": 0, "errors": 0, "unauthorized": 0, "malformed": 0, "oversized": 0}
        self._stop = threading.Event()
        self.exit_with_parent = False

    def _check_token(self, message: dict) -> bool:
        if not self.token:
            return True
        given = message.get("token")
        return isinstance(given, str) and hmac.compare_digest(given.encode(), self.token.encode())

    def handle(self, raw: bytes) -> dict:
        """One request -> one reply. Never raises for bad input."""
        t_recv = time.monotonic()
        self.stats["requests"] += 1
        try:
            message = unpack(raw, self.max_bytes)
        except WireError as err:
            key = "oversized" if "limit" in str(err) else "malformed"
            self.stats[key] += 1
            return {"type": "error", "error": f"{key}: {err}"}
        rid = message.get("id") if isinstance(message.get("id"), int) else None
        if not self._check_token(message):
            self.stats["unauthorized"] += 1
            return {"type": "error", "id": rid, "error": "unauthorized: wrong or missing token"}
        kind = message.get("type")
        if kind == "ping":
            return {"type": "pong", "id": rid, "t_s": time.monotonic(), **self.stats}
        if kind != "infer":
            self.stats["malformed"] += 1
            return {"type": "error", "id": rid, "error": f"malformed: unknown request type {kind!r}"}
        obs, obs_step, t_obs = message.get("obs"), message.get("obs_step"), message.get("t_obs_s")
        if not isinstance(obs, dict) or not isinstance(obs_step, int) or not isinstance(t_obs, (int, float)):
            self.stats["malformed"] += 1
            return {"type": "error", "id": rid, "error": "malformed: infer needs obs (map), obs_step (int), t_obs_s"}
        state = obs.get("observation.state")
        if not isinstance(state, np.ndarray) or state.ndim != 1 or (
                self.obs_dim is not None and state.shape[0] != self.obs_dim):
            self.stats["malformed"] += 1
            return {"type": "error", "id": rid,
                    "error": f"malformed: observation.state must be a vector of {self.obs_dim} numbers"}
        if not np.all(np.isfinite(state.astype(np.float64))):
            self.stats["malformed"] += 1
            return {"type": "error", "id": rid, "error": "malformed: observation.state has NaN or Inf"}
        t0 = time.monotonic()
        try:
            chunk = np.asarray(self.policy.act({**obs, "observation.state": state.astype(np.float32)}),
                               np.float64)
        except Exception as err:  # noqa: BLE001  a policy bug must not kill the server
            self.stats["errors"] += 1
            return {"type": "error", "id": rid, "error": f"policy failed: {type(err).__name__}: {err}"}
        if chunk.ndim == 1:
            chunk = chunk[None]
        if chunk.shape[0] == 1 and self.repeat > 1:
            chunk = np.repeat(chunk, self.repeat, axis=0)
        chunk = self.action_map(chunk, obs)
        if self.extra_latency_s > 0:  # emulate a heavier model (benchmarks)
            time.sleep(max(0.0, self.extra_latency_s - (time.monotonic() - t0)))
        infer_ms = (time.monotonic() - t0) * 1e3
        self.stats["chunks"] += 1
        return {"type": "chunk", "id": rid, "chunk": chunk.astype(np.float32), "obs_step": obs_step,
                "t_obs_s": float(t_obs), "t_recv_s": t_recv, "t_sent_s": time.monotonic(), "infer_ms": infer_ms}

    def serve(self, max_requests: int | None = None) -> None:
        import zmq

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
            identity, raw = frames[0], frames[-1]
            reply = self.handle(raw)
            try:
                self.sock.send_multipart([identity, *frames[1:-1], pack(reply)], zmq.NOBLOCK)
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
    parser.add_argument("--action-map", default="delta", choices=["delta", "absolute"])
    parser.add_argument("--mode", default="joint_position")
    parser.add_argument("--dof", type=int, default=6)
    parser.add_argument("--delta-scale-rad", type=float, default=0.1)
    parser.add_argument("--gripper-max-m", type=float, default=0.085)
    parser.add_argument("--repeat", type=int, default=10, help="zero-order hold of single-step policies")
    parser.add_argument("--extra-latency-ms", type=float, default=0.0, help="emulate a slower model")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    policy = load_policy(args.policy, args.device)
    policy.eval()
    server = PolicyServer(policy, host=args.host, port=args.port, token=args.token, repeat=args.repeat,
                          action_map=ActionMap(args.action_map, args.dof, args.mode, args.delta_scale_rad,
                                               gripper_max_m=args.gripper_max_m),
                          extra_latency_ms=args.extra_latency_ms)
    server.exit_with_parent = True
    print(f"ADDRESS {server.address}", flush=True)
    try:
        server.serve()
    except KeyboardInterrupt:
        pass
    finally:
        server.close()


if __name__ == "__main__":
    main()
