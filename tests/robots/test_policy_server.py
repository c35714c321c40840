"""Policy server and robot client over real ZeroMQ sockets on 127.0.0.1: round trips, bad input, auth."""
from __future__ import annotations

import threading
import time

import msgpack
import numpy as np
import pytest

import policies
from embodied.errors import UserError
from robots.client import LocalPolicyServer, PolicyClient, PolicyServerError
from robots.server import ActionMap, PolicyServer
from robots.wire import pack


@pytest.fixture()
def server():
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    policy = policies.make("gaussian", obs_dim=7, act_dim=7, hidden=[16])
    srv = PolicyServer(policy, token="s3cret", repeat=5, max_bytes=4096,
                       action_map=ActionMap("delta", dof=6, delta_scale_rad=0.1))
    thread = threading.Thread(target=srv.serve, daemon=True)
    thread.start()
    yield srv
    srv.stop()
    thread.join(timeout=2)
    srv.close()


def obs(q=None):
    q = np.zeros(6, np.float32) if q is None else np.asarray(q, np.float32)
    return {"observation.state": np.append(q, 0.05).astype(np.float32), "joint_pos_rad": q,
            "timestamp_s": time.monotonic()}


def test_round_trip_chunk_and_action_map(server):
    client = PolicyClient(server.address, token="s3cret")
    q = np.linspace(-1, 1, 6)
    reply = client.infer(obs(q), obs_step=7)
    assert reply.chunk.shape == (5, 7) and reply.obs_step == 7
    assert np.all(np.abs(reply.chunk[:, :6] - q) <= 0.1 + 1e-6)     # q + 0.1 * tanh(.)
    assert np.all((reply.chunk[:, 6] >= 0) & (reply.chunk[:, 6] <= 0.085))
    assert np.allclose(reply.chunk[0], reply.chunk[-1])             # zero-order hold of a 1-step policy
    assert reply.round_trip_ms > 0 and reply.infer_ms >= 0
    client.close()


def test_malformed_oversized_and_unauthorised_requests_do_not_kill_the_server(server):
    bad = PolicyClient(server.address, token="wrong")
    with pytest.raises(PolicyServerError, match="unauthorized"):
        bad.infer(obs(), 1, timeout_ms=2000)
    nobody = PolicyClient(server.address, token=None)
    with pytest.raises(PolicyServerError, match="unauthorized"):
        nobody.infer(obs(), 1, timeout_ms=2000)
    raw = PolicyClient(server.address, token="s3cret")
    for junk in (b"\x00\xff garbage", msgpack.packb([1, 2, 3]), b"x" * 10_000,
                 pack({"type": "infer", "token": "s3cret", "obs": {"observation.state": "nope"}, "obs_step": 1,
                       "t_obs_s": 0.0}),
                 pack({"type": "infer", "token": "s3cret", "obs": {"observation.state": np.zeros(3, np.float32)},
                       "obs_step": 1, "t_obs_s": 0.0}),
                 msgpack.packb({"type": "infer", "token": "s3cret", "obs": {"observation.state": {
                     "__nd__": True, "dtype": "|O", "shape": [7], "data": b"1234567"}}, "obs_step": 1, "t_obs_s": 0.0}),
                 pack({"type": "infer", "token": "s3cret", "obs": {"observation.state": np.full(7, np.nan, np.float32)},
                       "obs_step": 1, "t_obs_s": 0.0})):
        raw.send_raw(junk)
    deadline = time.monotonic() + 5
    while raw.stats["errors"] < 7 and time.monotonic() < deadline:
        raw.poll(100)
    assert raw.stats["errors"] == 7                                 # every bad message got an error reply
    assert server.stats["oversized"] == 1 and server.stats["malformed"] >= 5 and server.stats["unauthorized"] == 2
    reply = raw.infer(obs(), obs_step=3)                            # still serving
    assert reply.chunk.shape == (5, 7)
    for c in (bad, nobody, raw):
        c.close()


def test_late_chunks_are_dropped_by_the_client(server):
    client = PolicyClient(server.address, token="s3cret", max_age_ms=50)
    client.request(obs(), 1, t_obs_s=time.monotonic() - 1.0)        # the observation is already 1 s old
    time.sleep(0.2)
    assert client.poll(200) == [] and client.stats["late"] == 1
    client.close()


def test_non_loopback_bind_needs_a_token():
    policy = policies.make("gaussian", obs_dim=3, act_dim=2, hidden=[4])
    with pytest.raises(UserError, match="token"):
        PolicyServer(policy, host="0.0.0.0")


def test_local_server_process_serves_a_saved_checkpoint(tmp_path):
    policies.make("gaussian", obs_dim=7, act_dim=7, hidden=[16]).save(tmp_path / "pol")
    with LocalPolicyServer(tmp_path / "pol", args=["--repeat", "4"]) as srv:
        assert srv.address.startswith("tcp://127.0.0.1:")
        client = PolicyClient(srv.address, token=srv.token)
        assert client.infer(obs(), 0, timeout_ms=20000).chunk.shape == (4, 7)
        client.close()
        wrong = PolicyClient(srv.address, token="nope")
        with pytest.raises(PolicyServerError, match="unauthorized"):
            wrong.infer(obs(), 0)
        wrong.close()
    assert srv.proc.poll() is not None
