"""In-process fuzz of the policy server through real sockets: thousands of malformed requests (structural
mutations of a valid request and byte-level garbage, from benchmarks/server_fuzz.py) must each get one
well-formed reply, the error must name the mutated field, and the server must stay up and keep serving."""
from __future__ import annotations

import importlib.util
import threading
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import zmq

import policies
from robots.server import ERROR_COUNTERS, ActionMap, PolicyServer
from robots.wire import pack

pytestmark = pytest.mark.slow  # thousands of requests against a live server

TOKEN = "fuzz-token"
MAX_BYTES = 1 << 16


def _load_fuzzer():
    path = Path(__file__).resolve().parents[2] / "benchmarks" / "server_fuzz.py"
    spec = importlib.util.spec_from_file_location("server_fuzz", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


fuzz = _load_fuzzer()


@pytest.fixture()
def served():
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    policy = policies.make("gaussian", obs_dim=fuzz.OBS_DIM, act_dim=fuzz.DOF + 1, hidden=[16])
    srv = PolicyServer(policy, token=TOKEN, repeat=5, max_bytes=MAX_BYTES, action_map=ActionMap("delta", dof=fuzz.DOF))
    thread = threading.Thread(target=srv.serve, daemon=True)
    thread.start()
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(srv.address)
    yield srv, thread, sock
    sock.close()
    srv.stop()
    thread.join(timeout=2)
    srv.close()


def run_fuzz(served, n: int, seed: int) -> None:
    srv, thread, sock = served
    rng = np.random.default_rng(seed)
    labels, kinds, failures = Counter(), Counter(), []
    for label, raw, expected, rid in fuzz.malformed_requests(rng, n, TOKEN, MAX_BYTES):
        labels[label] += 1
        reply = fuzz.ask(sock, raw, 10_000)
        if reply is None:
            failures.append(f"{label}: no reply")
            break  # the server is down or wedged; the rest would only repeat this
        kinds[reply["error"].split(":")[0] if reply.get("type") == "error" else reply.get("type")] += 1
        why = fuzz.check_reply(reply, expected, rid)
        if why:
            failures.append(f"{label}: {why}")
    assert not failures, failures[:10]
    assert sum(kinds.values()) == n                                 # every request got exactly one reply
    assert thread.is_alive()
    # the generator really mixes every kind of fault (a degenerate fuzzer would pass trivially)
    for label in ("bytes:random", "bytes:bitflip", "bytes:deep", "bytes:oversized", "mutation:multi",
                  "mutation:bad_array", "mutation:+top", "mutation:+obs", *(f"mutation:{k}" for k in fuzz.NAMES
                                                                            if not k.startswith("+"))):
        assert labels[label] > 0, label
    assert kinds["chunk"] < 0.02 * n                                # only bit flips can leave a valid request
    counters = {kind: srv.stats[counter] for kind, counter in ERROR_COUNTERS.items()}
    assert {k: v for k, v in counters.items() if v} == {k: v for k, v in kinds.items() if k != "chunk"}
    assert srv.stats["requests"] == n == srv.stats["chunks"] + srv.stats["pings"] + sum(counters.values())
    good = fuzz.ask(sock, pack(fuzz.valid_request(rng, 1, TOKEN)), 10_000)
    assert good["type"] == "chunk" and np.isfinite(good["chunk"]).all()


def test_server_answers_5000_malformed_requests_and_stays_up(served):
    run_fuzz(served, 5000, seed=0)


def test_server_answers_30000_malformed_requests_and_stays_up(served):
    run_fuzz(served, 30_000, seed=1)
