"""Policy server and robot client over real ZeroMQ sockets on 127.0.0.1: round trips, every kind of bad
request (each answered with an error naming the field), size limits, finite outputs, the spec, auth."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import msgpack
import numpy as np
import pytest
import zmq

import policies
from embodied.errors import ConfigError, UserError
from robots.client import LocalPolicyServer, PolicyClient, PolicyServerError
from robots.server import ActionMap, PolicyServer
from robots.wire import pack, unpack


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


@pytest.mark.slow
def test_malformed_oversized_and_unauthorised_requests_do_not_kill_the_server(server):
    bad = PolicyClient(server.address, token="wrong")
    with pytest.raises(PolicyServerError, match="unauthorized"):
        bad.infer(obs(), 1, timeout_ms=2000)
    nobody = PolicyClient(server.address, token=None)
    with pytest.raises(PolicyServerError, match="unauthorized"):
        nobody.infer(obs(), 1, timeout_ms=2000)
    raw = PolicyClient(server.address, token="s3cret")
    head = {"type": "infer", "id": 1, "token": "s3cret", "obs_step": 1, "t_obs_s": 0.0}
    for junk in (b"\x00\xff garbage", msgpack.packb([1, 2, 3]), b"x" * 10_000,
                 pack({**head, "obs": {"observation.state": "nope"}}),
                 pack({**head, "obs": {"observation.state": np.zeros(3, np.float32)}}),
                 msgpack.packb({**head, "obs": {"observation.state": {
                     "__nd__": True, "dtype": "|O", "shape": [7], "data": b"1234567"}}}),
                 pack({**head, "obs": {"observation.state": np.full(7, np.nan, np.float32)}})):
        raw.send_raw(junk)
    deadline = time.monotonic() + 5
    while raw.stats["errors"] < 7 and time.monotonic() < deadline:
        raw.poll(100)
    assert raw.stats["errors"] == 7                                 # every bad message got an error reply
    assert server.stats["oversized"] == 1 and server.stats["malformed"] == 3 and server.stats["invalid"] == 3
    assert server.stats["unauthorized"] == 2
    reply = raw.infer(obs(), obs_step=3)                            # still serving
    assert reply.chunk.shape == (5, 7)
    for c in (bad, nobody, raw):
        c.close()


# -- every field of every request is checked; each bad one gets a one-line error naming it -----------
TOKEN = "s3cret"
MISSING = object()
STATE, JOINTS, EE = r'obs\["observation\.state"\]', r'obs\["joint_pos_rad"\]', r'obs\["ee_pos_m"\]'


OBS_NAMES = {"state": "observation.state", "joints": "joint_pos_rad", "ee": "ee_pos_m"}


def request(top: dict | None = None, **obs_over) -> bytes:
    """A valid infer request (id 11) with fields replaced, or removed with MISSING (state=, joints=, ee=,
    or any other obs key)."""
    msg = {"type": "infer", "id": 11, "token": TOKEN, "obs_step": 1, "t_obs_s": 0.5,
           "obs": {"observation.state": np.zeros(7, np.float32), "joint_pos_rad": np.zeros(6, np.float32),
                   "ee_pos_m": np.zeros(3, np.float32)}}
    changes = [(msg, k, v) for k, v in (top or {}).items()]
    changes += [(msg["obs"], OBS_NAMES.get(k, k), v) for k, v in obs_over.items()]
    for target, key, value in changes:
        if value is MISSING:
            target.pop(key)
        else:
            target[key] = value
    return pack(msg)


def nested(depth: int):
    value = 0.0
    for _ in range(depth):
        value = [value]
    return value


BAD_REQUESTS = [  # (name, raw, the error must match, the reply's id)
    ("type missing", request({"type": MISSING}), r"^invalid: type is missing", 11),
    ("type int", request({"type": 5}), r"^invalid: type must be 'ping' or 'infer', got int 5", 11),
    ("type unknown", request({"type": "explode"}), r"^invalid: type must be .*'explode'", 11),
    ("id missing", request({"id": MISSING}), r"^invalid: id is missing", None),
    ("id string", request({"id": "11"}), r"^invalid: id must be an int .*str '11'", None),
    ("id bool", request({"id": True}), r"^invalid: id must be an int .*bool True", None),
    ("id negative", request({"id": -1}), r"^invalid: id must be an int", None),
    ("id float", request({"id": 11.0}), r"^invalid: id must be an int", None),
    ("id uint64", request({"id": 2**64 - 1}), r"^invalid: id must be an int", None),
    ("token missing", request({"token": MISSING}), r"^unauthorized: wrong or missing token", 11),
    ("token wrong", request({"token": "s3cres"}), r"^unauthorized: ", 11),
    ("token int", request({"token": 123}), r"^unauthorized: ", 11),
    ("unknown field", request({"debug": True}), r"^invalid: unknown field str 'debug' in the infer request", 11),
    ("huge unknown field", request({"blob": {f"k{i}": i for i in range(200)}}), r"^invalid: unknown field str 'blob'", 11),
    ("obs missing", request({"obs": MISSING}), r"^invalid: obs is missing", 11),
    ("obs list", request({"obs": [1, 2]}), r"^invalid: obs must be a map", 11),
    ("obs string", request({"obs": "state"}), r"^invalid: obs must be a map", 11),
    ("obs unknown key", request(timestamp_s=1.0), r"^invalid: unknown obs key str 'timestamp_s'", 11),
    ("state missing", request(state=MISSING), STATE + r" is missing; expected 7 numbers", 11),
    ("state string", request(state="nope"), STATE + r" is str 'nope'; expected 7 numbers", 11),
    ("state None", request(state=None), STATE + r" is NoneType", 11),
    ("state map", request(state={"a": 1}), STATE + r" is dict", 11),
    ("state short", request(state=np.zeros(3, np.float32)), STATE + r" has shape \(3,\); expected 7", 11),
    ("state 2-D", request(state=np.zeros((1, 7), np.float32)), STATE + r" has shape \(1, 7\)", 11),
    ("state 0-D", request(state=np.array(1.0)), STATE + r" has shape \(\)", 11),
    ("state empty", request(state=np.zeros(0, np.float32)), STATE + r" has shape \(0,\)", 11),
    ("state bool", request(state=np.ones(7, bool)), STATE + r" has dtype bool", 11),
    ("state NaN", request(state=np.array([0, 0, np.nan, 0, 0, 0, 0], np.float32)), STATE + r"\[2\] is nan", 11),
    ("state inf", request(state=np.full(7, np.inf)), STATE + r"\[0\] is inf", 11),
    ("state 3e38", request(state=np.full(7, 3e38, np.float32)), STATE + r"\[0\] = 3e\+38 is outside \|x\| <= 1e\+06", 11),
    ("state 1e7", request(state=[0.0] * 6 + [1e7]), STATE + r"\[6\] = 1e\+07 is outside", 11),
    ("state list with str", request(state=[0.0] * 6 + ["1"]), STATE + r" holds str '1'", 11),
    ("state list with None", request(state=[None] * 7), STATE + r" holds NoneType None", 11),
    ("state list of bools", request(state=[True] * 7), STATE + r" holds bool True", 11),
    ("state nested list", request(state=[[0.0]] * 7), STATE + r" holds list", 11),
    ("state deeply nested", request(state=nested(500)), STATE + r" has 1 entries; expected 7", 11),
    ("state wide list", request(state=[0.0] * 300), STATE + r" has 300 entries; expected 7", 11),
    ("joints missing", request(joints=MISSING), JOINTS + r" is missing; expected 6 numbers", 11),
    ("joints string", request(joints="abc"), JOINTS + r" is str 'abc'; expected 6 numbers", 11),
    ("joints short", request(joints=np.zeros(5, np.float32)), JOINTS + r" has shape \(5,\); expected 6", 11),
    ("joints NaN", request(joints=np.full(6, np.nan, np.float32)), JOINTS + r"\[0\] is nan", 11),
    ("joints 3e38", request(joints=np.full(6, 3e38, np.float32)), JOINTS + r"\[0\] = 3e\+38 is outside", 11),
    ("joints int8 over", request(joints=[0, 0, 0, 0, 0, 2 * 10**6]), JOINTS + r"\[5\] = 2e\+06 is outside", 11),
    ("ee short", request(ee=np.zeros(2, np.float32)), EE + r" has shape \(2,\); expected 3", 11),
    ("ee NaN", request(ee=[0.0, float("nan"), 0.0]), EE + r"\[1\] is nan", 11),
    ("ee string", request(ee="x"), EE + r" is str", 11),
    ("obs_step missing", request({"obs_step": MISSING}), r"^invalid: obs_step is missing; expected an int >= 0", 11),
    ("obs_step string", request({"obs_step": "1"}), r"^invalid: obs_step must be an int .*str '1'", 11),
    ("obs_step bool", request({"obs_step": True}), r"^invalid: obs_step must be an int .*\(not bool\), got bool", 11),
    ("obs_step negative", request({"obs_step": -1}), r"^invalid: obs_step must be an int in \[0, 2\*\*63\)", 11),
    ("obs_step float", request({"obs_step": 1.0}), r"^invalid: obs_step must be an int .*float 1\.0", 11),
    ("obs_step uint64", request({"obs_step": 2**64 - 1}), r"^invalid: obs_step must be an int", 11),
    ("t_obs_s missing", request({"t_obs_s": MISSING}), r"^invalid: t_obs_s is missing; expected a finite number", 11),
    ("t_obs_s string", request({"t_obs_s": "0"}), r"^invalid: t_obs_s must be a finite number.*str '0'", 11),
    ("t_obs_s NaN", request({"t_obs_s": float("nan")}), r"^invalid: t_obs_s must be a finite number.*nan", 11),
    ("t_obs_s inf", request({"t_obs_s": float("inf")}), r"^invalid: t_obs_s must be a finite number", 11),
    ("t_obs_s bool", request({"t_obs_s": True}), r"^invalid: t_obs_s must be a finite number.*bool", 11),
    ("t_obs_s nested", request({"t_obs_s": nested(300)}), r"^invalid: t_obs_s must be a finite number.*list", 11),
    ("ping extra field", pack({"type": "ping", "id": 11, "token": TOKEN, "obs": {}}),
     r"^invalid: unknown field str 'obs' in the ping request", 11),
    ("ping without id", pack({"type": "ping", "token": TOKEN}), r"^invalid: id is missing", None),
    ("top-level list", msgpack.packb([1, 2, 3]), r"^malformed: a message must be a map", None),
    ("top-level int", msgpack.packb(7), r"^malformed: a message must be a map", None),
    ("top-level string", msgpack.packb("infer"), r"^malformed: a message must be a map", None),
    ("top-level nil", msgpack.packb(None), r"^malformed: a message must be a map", None),
    ("garbage", b"\x00\xff garbage", r"^malformed: not a msgpack message", None),
    ("empty", b"", r"^malformed: not a msgpack message", None),
    ("truncated", request()[:-5], r"^malformed: not a msgpack message", None),
    ("trailing bytes", request() + b"\x00", r"^malformed: not a msgpack message", None),
    ("nested 4,000 deep", b"\x91" * 4000 + b"\xc0", r"^malformed: not a msgpack message", None),
    ("map keys not strings", msgpack.packb({1: 2}), r"^malformed: not a msgpack message", None),
    ("invalid utf-8", b"\x81\xa4type\xa2\xff\xfe", r"^malformed: not a msgpack message", None),
    ("object dtype", msgpack.packb({"type": "infer", "obs": {"observation.state": {
        "__nd__": True, "dtype": "|O", "shape": [7], "data": b"1234567"}}}), r"^malformed: bad array header", None),
    ("complex dtype", msgpack.packb({"x": {"__nd__": True, "dtype": "<c16", "shape": [1], "data": b"0" * 16}}),
     r"^malformed: bad array header", None),
    ("array shorter than shape", msgpack.packb({"x": {"__nd__": True, "dtype": "<f4", "shape": [7], "data": b"1234"}}),
     r"^malformed: array data has 4 bytes, shape \[7\] needs 28", None),
    ("array shape overflow", msgpack.packb({"x": {"__nd__": True, "dtype": "<f4", "shape": [2**32, 2**32], "data": b""}}),
     r"^malformed: array data has 0 bytes", None),
    ("array bool shape", msgpack.packb({"x": {"__nd__": True, "dtype": "<f4", "shape": [True], "data": b"1234"}}),
     r"^malformed: bad array shape", None),
]


@pytest.fixture(scope="module")
def shared_server():
    """One server for the whole table: each case must leave it serving the next."""
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    policy = policies.make("gaussian", obs_dim=7, act_dim=7, hidden=[16])
    srv = PolicyServer(policy, token=TOKEN, repeat=5, max_bytes=4096, action_map=ActionMap("delta", dof=6))
    thread = threading.Thread(target=srv.serve, daemon=True)
    thread.start()
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(srv.address)
    yield srv, sock
    sock.close()
    srv.stop()
    thread.join(timeout=2)
    srv.close()


def ask(sock, raw: bytes, timeout_ms: float = 5000) -> dict:
    sock.send(raw)
    assert sock.poll(timeout_ms), "no reply"
    return unpack(sock.recv(), 1 << 24)


@pytest.mark.parametrize("name,raw,pattern,rid", BAD_REQUESTS, ids=[c[0] for c in BAD_REQUESTS])
def test_every_bad_request_gets_an_error_naming_the_field(shared_server, name, raw, pattern, rid):
    srv, sock = shared_server
    before = dict(srv.stats)
    reply = ask(sock, raw)
    assert reply["type"] == "error" and reply["id"] == rid, reply
    assert re.search(pattern, reply["error"]), reply["error"]
    assert "\n" not in reply["error"] and len(reply["error"]) < 300
    kind = reply["error"].split(":")[0]
    counter = {"policy_error": "policy_errors", "internal": "errors"}.get(kind, kind)
    changed = {k: srv.stats[k] - before[k] for k in srv.stats if srv.stats[k] != before[k]}
    assert changed == {"requests": 1, counter: 1}                   # counted once, under its kind
    good = ask(sock, request())                                     # and the server still serves
    assert good["type"] == "chunk" and good["id"] == 11 and good["chunk"].shape == (5, 7)
    assert np.isfinite(good["chunk"]).all()


def test_lists_of_numbers_and_any_numeric_dtype_are_accepted(shared_server):
    _, sock = shared_server
    for state in ([0.5] * 7, [1, 2, 3, 4, 5, 6, 7], np.arange(7, dtype=np.int16), np.zeros(7, np.float16)):
        reply = ask(sock, request(state=state, joints=[0.0] * 6))
        assert reply["type"] == "chunk", reply
    assert ask(sock, request(ee=MISSING))["type"] == "chunk"       # ee_pos_m is optional


def test_multipart_and_req_envelopes(shared_server):
    srv, _ = shared_server
    ctx = zmq.Context.instance()
    dealer = ctx.socket(zmq.DEALER)
    dealer.connect(srv.address)
    dealer.send_multipart([b"extra", request()])                    # a DEALER must send one frame
    assert dealer.poll(5000)
    assert unpack(dealer.recv_multipart()[-1], 1 << 20)["error"].startswith("malformed: 2 frames")
    req = ctx.socket(zmq.REQ)                                       # REQ adds an empty delimiter: still served
    req.connect(srv.address)
    req.send(request())
    assert req.poll(5000) and unpack(req.recv(), 1 << 20)["type"] == "chunk"
    for s in (dealer, req):
        s.close(linger=0)


def test_handle_never_raises_for_any_input():
    policy = policies.make("gaussian", obs_dim=7, act_dim=7, hidden=[16])
    srv = PolicyServer(policy, token=TOKEN, repeat=5, action_map=ActionMap("delta", dof=6))
    try:
        for raw in (None, 5, "text", object(), [b"x"], memoryview(b"\xc1"), 3.5):
            reply = srv.handle(raw)
            assert reply["type"] == "error" and re.match(r"^(internal|malformed): \S", reply["error"]), reply
        assert srv.stats["errors"] >= 5 and srv.stats["requests"] == 7
        assert srv.handle(bytearray(request()))["type"] == "chunk"   # any bytes-like buffer is fine
    finally:
        srv.close()


# -- sizes ---------------------------------------------------------------------------------------------
def test_a_100_mb_message_gets_an_oversized_reply(server):
    client = PolicyClient(server.address, token="s3cret")
    client.send_raw(b"\x00" * 100_000_000)                         # far over max_bytes, under the hard cap
    deadline = time.monotonic() + 60
    while client.stats["errors"] < 1 and time.monotonic() < deadline:
        client.poll(200)
    assert client.last_error == (f"oversized: {100_000_000 - 4096} bytes over the 4096-byte limit "
                                 "(message of 100000000 bytes); send a smaller request")
    assert server.stats["oversized"] == 1
    assert client.infer(obs(), obs_step=2).chunk.shape == (5, 7)
    client.close()


@pytest.mark.slow
def test_beyond_the_hard_cap_zmq_drops_the_message_and_the_server_keeps_serving():
    policy = policies.make("gaussian", obs_dim=7, act_dim=7, hidden=[16])
    srv = PolicyServer(policy, repeat=2, max_bytes=4096, hard_cap_bytes=1 << 20, action_map=ActionMap("delta", dof=6))
    thread = threading.Thread(target=srv.serve, daemon=True)
    thread.start()
    try:
        client = PolicyClient(srv.address)
        client.send_raw(b"\x00" * (2 << 20))                       # the transport can't answer this
        assert client.poll(1000) == [] and srv.stats["requests"] == 0
        assert client.infer(obs(), obs_step=1).chunk.shape == (2, 7)  # the DEALER reconnected by itself
        client.close()
    finally:
        srv.stop()
        thread.join(timeout=2)
        srv.close()


def test_hard_cap_below_max_bytes_is_refused():
    policy = policies.make("gaussian", obs_dim=7, act_dim=7, hidden=[16])
    with pytest.raises(ConfigError, match="hard_cap_bytes"):
        PolicyServer(policy, max_bytes=1 << 20, hard_cap_bytes=1 << 10)


# -- outputs are always finite --------------------------------------------------------------------------
def test_every_chunk_is_finite_for_observations_up_to_the_bound(server):
    client = PolicyClient(server.address, token="s3cret")
    rng = np.random.default_rng(0)
    for step in range(200):
        scale = 10.0 ** rng.uniform(-3, 6)                          # up to the 1e6 bound
        q = np.clip(rng.normal(size=6) * scale, -1e6, 1e6)
        o = {"observation.state": np.clip(rng.normal(size=7) * scale, -1e6, 1e6).astype(np.float32),
             "joint_pos_rad": q.astype(np.float32)}
        reply = client.infer(o, obs_step=step)
        assert reply.chunk.shape == (5, 7) and np.isfinite(reply.chunk).all()
        assert np.all(np.abs(reply.chunk[:, :6] - q.astype(np.float32)) <= 0.1 * (1 + 1e-6) + 1e-7 * np.abs(q) + 0.5)
    client.close()


def _serve(srv):
    thread = threading.Thread(target=srv.serve, daemon=True)
    thread.start()
    return thread


def test_non_finite_actions_are_never_sent():
    torch = pytest.importorskip("torch")
    broken = policies.make("gaussian", obs_dim=7, act_dim=7, hidden=[16])
    with torch.no_grad():
        for p in broken.parameters():
            p.fill_(float("nan"))                                   # a policy whose outputs are NaN
    loose = policies.make("gaussian", obs_dim=7, act_dim=7, hidden=[16])
    servers = [PolicyServer(broken, token=TOKEN, repeat=3, action_map=ActionMap("absolute")),
               # a bound loosened past float32: the float64 targets are finite, the float32 sent would be inf
               PolicyServer(loose, token=TOKEN, repeat=3, max_abs=1e308, action_map=ActionMap("delta", dof=6))]
    threads = [_serve(s) for s in servers]
    try:
        for srv, joints in zip(servers, ([0.0] * 6, [1e300] * 6)):
            client = PolicyClient(srv.address, token=TOKEN)
            for step in range(3):
                client.request({"observation.state": np.zeros(7, np.float32), "joint_pos_rad": joints}, step)
            deadline = time.monotonic() + 5
            while client.stats["errors"] < 3 and time.monotonic() < deadline:
                assert client.poll(100) == []                       # no chunk ever arrives
            assert client.stats["errors"] == 3 and client.stats["received"] == 0
            assert re.match(r"^nonfinite: policy produced non-finite actions \((21|18) of 21 values", client.last_error)
            assert srv.stats["nonfinite"] == 3 and srv.stats["chunks"] == 0
            client.close()
    finally:
        for srv, thread in zip(servers, threads):
            srv.stop()
            thread.join(timeout=2)
            srv.close()


def test_a_policy_that_raises_or_mismatches_the_action_map_gets_an_error():
    wide = policies.make("gaussian", obs_dim=7, act_dim=9, hidden=[16])     # 9 actions, the map needs dof+1 = 7
    srv = PolicyServer(wide, token=TOKEN, action_map=ActionMap("delta", dof=6))
    try:
        reply = srv.handle(request())
        assert reply["error"] == ("policy_error: policy outputs 9 actions per step; the action map "
                                  "(joint_position, dof=6) needs 7") and srv.stats["policy_errors"] == 1
    finally:
        srv.close()


# -- ping carries the spec --------------------------------------------------------------------------------
def test_ping_reports_the_policy_spec(server):
    client = PolicyClient(server.address, token="s3cret")
    pong = client.ping()
    assert pong["type"] == "pong" and pong["requests"] >= 1 and "chunks" in pong and pong["t_s"] > 0
    spec = client.spec()
    assert {k: spec[k] for k in ("obs_dim", "action_dim", "horizon", "action_map", "mode", "dof")} == {
        "obs_dim": 7, "action_dim": 7, "horizon": 5, "action_map": "delta", "mode": "joint_position", "dof": 6}
    assert spec["required_obs"] == ["observation.state", "joint_pos_rad"]
    assert client.stats["errors"] == 0                              # a pong is an answer, not an error
    client.close()
    wrong = PolicyClient(server.address, token="nope")
    with pytest.raises(PolicyServerError, match="unauthorized"):
        wrong.spec(timeout_ms=2000)
    wrong.close()


def test_spec_of_a_chunk_policy_reports_its_horizon():
    flow = policies.make("flow", obs_dim=5, act_dim=3, pred_horizon=4, denoiser_kwargs={"hidden": (16,)})
    srv = PolicyServer(flow, repeat=10, action_map=ActionMap("absolute", dof=2))
    try:
        assert srv.spec()["horizon"] == 4 and srv.spec()["obs_dim"] == 5 and srv.spec()["action_dim"] == 3
        reply = srv.handle(pack({"type": "infer", "id": 1, "obs": {"observation.state": np.zeros(5, np.float32)},
                                 "obs_step": 0, "t_obs_s": 0.0}))
        assert reply["chunk"].shape == (4, 3)                       # the spec's horizon is what is sent
    finally:
        srv.close()


def test_a_generative_policy_samples_fresh_noise_per_chunk_from_a_seeded_stream():
    """A flow policy acting 'deterministically' with one fixed noise draw replays the same sample for every
    chunk; the server draws fresh noise per request from a stream seeded by `noise_seed`."""
    flow = policies.make("flow", obs_dim=5, act_dim=3, pred_horizon=4, denoiser_kwargs={"hidden": (16,)})

    def chunks(seed):
        srv = PolicyServer(flow, noise_seed=seed, action_map=ActionMap("absolute", dof=2))
        try:
            return [srv.handle(pack({"type": "infer", "id": i, "obs": {"observation.state": np.zeros(5, np.float32)},
                                     "obs_step": i, "t_obs_s": 0.0}))["chunk"] for i in range(2)]
        finally:
            srv.close()

    first, second = chunks(0)
    assert not np.allclose(first, second)                            # the same observation, a fresh sample
    np.testing.assert_array_equal(np.stack(chunks(0)), np.stack([first, second]))   # the stream repeats
    assert not np.allclose(chunks(1)[0], first)


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


@pytest.mark.slow
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


@pytest.mark.slow
def test_server_without_a_token_warns_at_startup(tmp_path):
    policies.make("gaussian", obs_dim=7, act_dim=7, hidden=[16]).save(tmp_path / "pol")
    env = {k: v for k, v in os.environ.items() if k != "EMBODIED_POLICY_TOKEN"}
    proc = subprocess.Popen([sys.executable, "-m", "robots.server", "--policy", str(tmp_path / "pol")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**env, "OMP_NUM_THREADS": "1"},
                            cwd=str(Path(__file__).resolve().parents[2]))
    try:
        assert proc.stdout.readline().startswith("ADDRESS tcp://127.0.0.1:")   # still loopback only
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=20)
    warning = [line for line in err.splitlines() if line.startswith("warning:")]
    assert len(warning) == 1 and "any local process can send requests" in warning[0]
    assert "--token" in warning[0] and "$EMBODIED_POLICY_TOKEN" in warning[0]
