"""Policy server fuzz: thousands of malformed requests against a real `python -m robots.server` process.

    python benchmarks/server_fuzz.py                 # 5,000 malformed requests + size limits
    python benchmarks/server_fuzz.py --n 20000
    python benchmarks/server_fuzz.py --quick         # 300 requests, no 100 MB message (results not written)

The server is a separate process (`robots.client.LocalPolicyServer`, random token) serving a saved
Gaussian policy (obs 7, act 7) through the delta joint_position action map. Requests are sent one at a
time on one DEALER socket; each must get exactly one reply within the timeout. About 70% are a valid
infer request with one to three fields deleted, replaced by a value the server must refuse (wrong
type, shape, dtype, NaN, 3e38, bool, negative, huge nesting, bad array headers) or an unknown field
added; for a single mutation the reply must name that field. The rest are byte-level: random bytes,
bit flips and truncations of a valid message, non-map tops, deep nesting, trailing garbage, and
messages over the size limit. Then a 100 MB message (answered `oversized`) and one past zmq's hard cap
(dropped by the transport, no reply possible), and the process must still be alive and serve a valid
request. `malformed_requests` is also what tests/robots/test_server_fuzz.py sends in-process.
"""
from __future__ import annotations

import argparse
import json
import math
import re
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import msgpack
import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

OBS_DIM, DOF, MAX_ABS = 7, 6, 1e6
KINDS = ("malformed", "invalid", "unauthorized", "oversized", "policy_error", "nonfinite", "internal")
ERROR_RE = re.compile(r"^(%s): \S[^\n]*$" % "|".join(KINDS))
VECTORS = {"observation.state": OBS_DIM, "joint_pos_rad": DOF, "ee_pos_m": 3}
REQUIRED = ("type", "id", "token", "obs", "obs_step", "t_obs_s")
# the reply to a request whose only fault is this field must match this (the error names the field)
NAMES = {"type": r"^invalid: type ", "id": r"^invalid: id ", "token": r"^unauthorized: ",
         "obs": r'^invalid: (obs |obs\["observation\.state"\] is missing|unknown obs key)',
         "obs_step": r"^invalid: obs_step ", "t_obs_s": r"^invalid: t_obs_s ",
         "+top": r"^invalid: unknown field ", "+obs": r"^invalid: unknown obs key ",
         **{k: r'^invalid: obs\["%s"\]' % re.escape(k) for k in VECTORS}}
BAD_DTYPES = ["|O", "<c16", "<U4", ">f4", "float32", 5, None]
NUMERIC_DTYPES = ["<f2", "<f4", "<f8", "|u1", "|i1", "<i2", "<i4", "<i8", "<u2", "<u4", "|b1"]


def valid_request(rng, rid: int, token: str) -> dict:
    return {"type": "infer", "id": rid, "token": token, "obs_step": int(rng.integers(0, 1 << 40)),
            "t_obs_s": float(rng.uniform(0, 1e5)),
            "obs": {"observation.state": rng.uniform(-1, 1, OBS_DIM).astype(np.float32),
                    "joint_pos_rad": rng.uniform(-3, 3, DOF).astype(np.float32),
                    "ee_pos_m": rng.uniform(-1, 1, 3).astype(np.float32)}}


def _random_str(rng, long: bool = False) -> str:
    n = int(rng.integers(1000, 3000)) if long else int(rng.integers(0, 24))
    alphabet = "abcxyz_.[]\"' 0123456789\u00e9\u4e2d\U0001f916"
    return "".join(alphabet[i] for i in rng.integers(0, len(alphabet), n))


def _random_array(rng) -> np.ndarray:
    dtype = np.dtype(NUMERIC_DTYPES[rng.integers(len(NUMERIC_DTYPES))])
    shapes = [(), (0,), (3,), (5,), (6,), (7,), (8,), (1, 7), (7, 1), (2, 3, 4), (300,)]
    shape = shapes[rng.integers(len(shapes))]
    scale = 10.0 ** rng.uniform(-3, 40)
    with np.errstate(all="ignore"):
        values = rng.normal(size=shape) * scale
        if rng.random() < 0.3 and values.size:
            values.flat[rng.integers(values.size)] = [np.nan, np.inf, -np.inf, 3e38][rng.integers(4)]
        if dtype.kind == "f":
            out = values.astype(dtype)
        elif dtype.kind == "b":
            out = values > 0
        else:
            info = np.iinfo(dtype)
            out = np.clip(np.nan_to_num(values), info.min, info.max).astype(dtype)
    return np.asarray(out)  # a 0-d result is a numpy scalar, which the wire would send as a plain number


def random_value(rng, depth: int = 0):
    """A random msgpack-able value: scalars, strings, bytes, numeric arrays, number lists, ext types,
    array headers robots.wire must refuse, deep lists, and nested lists/maps of these."""
    pick = int(rng.integers(13 if depth < 4 else 9))
    if pick == 0:
        return [None, True, False][rng.integers(3)]
    if pick == 1:
        return [0, 1, -1, 2**31, 2**63 - 1, 2**63, 2**64 - 1, -(2**63), int(rng.integers(-10**9, 10**9))][rng.integers(9)]
    if pick == 2:
        return [np.nan, np.inf, -np.inf, 3e38, -3e38, 1e300, 1e7, 0.0, -0.0, 5e-324, float(rng.normal())][rng.integers(11)]
    if pick == 3:
        return _random_str(rng, long=rng.random() < 0.05)
    if pick == 4:
        return rng.bytes(int(rng.integers(0, 64)))
    if pick in (5, 6):
        return _random_array(rng)
    if pick == 7:  # a list of numbers, often the right length, with a bad entry or magnitude
        n = [0, 1, 3, 5, 6, 7, 8, 100][rng.integers(8)]
        values: list = [float(x) for x in rng.normal(size=n) * 10.0 ** rng.uniform(-3, 40)]  # Python floats, as decoded
        if n and rng.random() < 0.5:
            values[rng.integers(n)] = [np.nan, np.inf, "1.0", True, None, [1.0]][rng.integers(6)]
        return values
    if pick == 8:
        return msgpack.ExtType(int(rng.integers(0, 100)), rng.bytes(4))
    if pick == 9:  # a header robots.wire must refuse
        return {"__nd__": True, "dtype": BAD_DTYPES[rng.integers(len(BAD_DTYPES))],
                "shape": [[7], [-1], "7", [2**40], [1] * 9, [True], None][rng.integers(7)],
                "data": [b"", b"1234567", "str", None][rng.integers(4)]}
    if pick == 10:  # deep but decodable nesting
        value: object = 0.0
        for _ in range(int(rng.integers(20, 200))):
            value = [value]
        return value
    if pick == 11:
        return [random_value(rng, depth + 1) for _ in range(int(rng.integers(0, 6)))]
    return {_random_str(rng): random_value(rng, depth + 1) for _ in range(int(rng.integers(0, 6)))}


def holds_header(value) -> bool:
    """Whether a value still holds a hand-made array header (all of them are ones the wire refuses)."""
    if isinstance(value, dict):
        return "__nd__" in value or any(holds_header(v) for v in value.values())
    return isinstance(value, list) and any(holds_header(v) for v in value)


def _finite_numbers(value, n: int) -> bool:
    if isinstance(value, np.ndarray):
        if value.dtype.kind not in "iuf" or value.shape != (n,):
            return False
        arr = value.astype(np.float64)
    elif isinstance(value, list) and len(value) == n and all(type(v) in (int, float) for v in value):
        arr = np.array(value, np.float64)
    else:
        return False
    return bool(np.all(np.isfinite(arr)) and np.all(np.abs(arr) <= MAX_ABS))


def acceptable(field: str, value, token: str) -> bool:
    """The fuzzer's own statement of what the server accepts, so a replacement is surely a fault."""
    if field == "type":
        return isinstance(value, str) and value in ("infer", "ping")
    if field in ("id", "obs_step"):
        return type(value) is int and 0 <= value < 2**63
    if field == "t_obs_s":
        return type(value) in (int, float) and math.isfinite(value)
    if field == "token":
        return isinstance(value, str) and value == token
    if field == "obs":
        return isinstance(value, dict) and "observation.state" in value
    return _finite_numbers(value, VECTORS[field])


def _as_decoded(value):
    """The value as the server will see it (numpy scalars arrive as plain numbers, and so on)."""
    from robots.wire import pack, unpack

    return unpack(pack({"v": value}), 1 << 30)["v"]


def _mutate(rng, msg: dict, token: str) -> str:
    """Apply one fault in place; returns the field the error must name."""
    op = int(rng.integers(3))
    in_obs = rng.random() < 0.5 and isinstance(msg.get("obs"), dict)  # an earlier fault may have removed obs
    if op == 0:  # delete a required field
        field = ["observation.state", "joint_pos_rad"][rng.integers(2)] if in_obs else REQUIRED[rng.integers(6)]
        (msg["obs"] if in_obs else msg).pop(field, None)
        return field
    if op == 1:  # replace with a value the server must refuse
        field = list(VECTORS)[rng.integers(3)] if in_obs else REQUIRED[rng.integers(6)]
        value = random_value(rng)
        while not holds_header(value) and acceptable(field, _as_decoded(value), token):
            value = random_value(rng)
        (msg["obs"] if in_obs else msg)[field] = value
        return field
    key = _random_str(rng)
    while key in REQUIRED or key in VECTORS or key in msg or (in_obs and key in msg["obs"]):
        key = _random_str(rng) + "x"
    (msg["obs"] if in_obs else msg)[key] = random_value(rng)
    return "+obs" if in_obs else "+top"


def malformed_requests(rng, n: int, token: str, max_bytes: int, first_id: int = 1):
    """Yield n (label, raw bytes, expected, reply id) requests. `expected` is a regex the error reply must
    match, or None where any reply will do (a bit flip can land on a float and leave a valid request);
    `reply id` is the id an error reply must echo (None where the request's id is missing or invalid)."""
    from robots.wire import pack

    for i in range(n):
        rid = first_id + i
        if rng.random() < 0.7:
            msg = valid_request(rng, rid, token)
            k = 1 if rng.random() < 0.8 else int(rng.integers(2, 4))
            faults = [_mutate(rng, msg, token) for _ in range(k)]
            raw = pack(msg)
            echo = msg.get("id") if acceptable("id", msg.get("id"), token) else None
            if len(raw) > max_bytes:
                yield "mutation:oversized", raw, r"^oversized: \d+ bytes over the %d-byte limit" % max_bytes, None
            elif holds_header(msg):  # decoding fails before any field is looked at
                yield "mutation:bad_array", raw, r"^malformed: ", None
            elif k == 1:
                yield f"mutation:{faults[0]}", raw, NAMES[faults[0]], echo
            else:
                yield "mutation:multi", raw, r"^(invalid|unauthorized): ", echo
            continue
        valid = pack(valid_request(rng, rid, token))
        pick = int(rng.integers(7))
        if pick == 0:
            yield "bytes:random", rng.bytes(int(rng.integers(0, 2000))), None, None
        elif pick == 1:
            buf = bytearray(valid)
            for j in rng.integers(0, len(buf), int(rng.integers(1, 9))):
                buf[j] ^= 1 << int(rng.integers(8))
            yield "bytes:bitflip", bytes(buf), None, None
        elif pick == 2:
            yield "bytes:truncated", valid[: int(rng.integers(0, len(valid)))], r"^malformed: ", None
        elif pick == 3:
            value = [[1, 2], 7, "infer", None, 1.5, b"x", True][rng.integers(7)]
            yield "bytes:non_map", msgpack.packb(value), r"^malformed: .*map", None
        elif pick == 4:
            yield "bytes:deep", b"\x91" * int(rng.integers(1000, 5000)) + b"\xc0", r"^malformed: ", None
        elif pick == 5:
            yield "bytes:trailing", valid + rng.bytes(int(rng.integers(1, 16))), r"^malformed: ", None
        else:
            size = int(rng.integers(max_bytes + 1, 2 * max_bytes + 2))
            yield "bytes:oversized", rng.bytes(size), r"^oversized: %d bytes over the %d-byte limit" % (
                size - max_bytes, max_bytes), None


def check_reply(reply: dict, expected: str | None, rid: int | None) -> str | None:
    """None when the reply is acceptable, else why not."""
    kind = reply.get("type")
    if kind == "chunk":
        chunk = reply.get("chunk")
        if expected is not None:
            return f"a chunk for a request that should fail ({expected})"
        if not isinstance(chunk, np.ndarray) or not np.all(np.isfinite(chunk)):
            return "a chunk with non-finite values"
        return None
    if kind != "error":
        return f"reply of type {kind!r}"
    error = reply.get("error")
    if not isinstance(error, str) or not ERROR_RE.match(error) or len(error) > 300:
        return f"error is not one '<kind>: <line>' line: {error!r:.200}"
    if expected is not None and not re.search(expected, error):
        return f"error {error!r:.200} does not match {expected!r}"
    if expected is not None and reply.get("id") != rid:
        return f"reply id {reply.get('id')!r}, expected {rid!r}"
    return None


def ask(sock, raw: bytes, timeout_ms: float):
    from robots.wire import unpack

    sock.send(raw)
    if not sock.poll(timeout_ms):
        return None
    return unpack(sock.recv(), 1 << 24)


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def main() -> None:
    import torch
    import zmq

    import policies
    from robots.client import LocalPolicyServer, PolicyClient

    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=5000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout-ms", type=float, default=10_000)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    n = 300 if args.quick else args.n
    max_bytes, hard_cap = 1 << 16, 128 << 20
    load_before = uptime()
    ckpt = Path(tempfile.mkdtemp(prefix="server_fuzz_")) / "policy"
    torch.manual_seed(args.seed)
    policies.make("gaussian", obs_dim=OBS_DIM, act_dim=DOF + 1, hidden=[32, 32]).save(ckpt)
    rng = np.random.default_rng(args.seed)
    server_args = ["--repeat", "5", "--dof", str(DOF), "--max-bytes", str(max_bytes),
                   "--hard-cap-bytes", str(hard_cap)]
    with LocalPolicyServer(ckpt, args=server_args) as server:
        client = PolicyClient(server.address, token=server.token, max_age_ms=60_000)
        client.ping(timeout_ms=30_000)
        ctx = zmq.Context.instance()
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(server.address)
        by_label, by_kind, failures, latencies = Counter(), Counter(), [], []
        unanswered = 0
        t0 = time.perf_counter()
        for label, raw, expected, rid in malformed_requests(rng, n, server.token, max_bytes):
            t = time.perf_counter()
            reply = ask(sock, raw, args.timeout_ms)
            latencies.append(time.perf_counter() - t)
            by_label[label] += 1
            if reply is None:
                unanswered += 1
                failures.append(f"{label}: no reply within {args.timeout_ms:.0f} ms")
                continue
            kind = reply["error"].split(":")[0] if reply.get("type") == "error" else reply.get("type")
            by_kind[kind] += 1
            why = check_reply(reply, expected, rid)
            if why:
                failures.append(f"{label}: {why}")
        fuzz_s = time.perf_counter() - t0
        size = {}
        if not args.quick:  # 100 MB: received (below the hard cap) and answered
            reply = ask(sock, b"\x00" * 100_000_000, 60_000)
            size["100MB_reply"] = None if reply is None else reply.get("error")
            ok = reply is not None and reply.get("error", "").startswith(
                f"oversized: {100_000_000 - max_bytes} bytes over the {max_bytes}-byte limit")
            size["100MB_answered_oversized"] = ok
            if not ok:
                failures.append(f"100 MB message: {size['100MB_reply']!r}")
            beyond = ctx.socket(zmq.DEALER)  # past the hard cap: zmq drops it (and the connection) unanswered
            beyond.setsockopt(zmq.LINGER, 0)
            beyond.connect(server.address)
            beyond.send(b"\x00" * (hard_cap + 1))
            size["beyond_hard_cap_replied"] = bool(beyond.poll(3000))
            beyond.close()
        stats = client.ping(timeout_ms=10_000)
        q = np.zeros(DOF, np.float32)
        good = client.infer({"observation.state": np.zeros(OBS_DIM, np.float32), "joint_pos_rad": q}, obs_step=1,
                            timeout_ms=10_000)
        alive = server.proc.poll() is None and good.chunk.shape == (5, DOF + 1) and bool(np.isfinite(good.chunk).all())
        sock.close()
        client.close()
    counters = {k: stats[k] for k in ("requests", "chunks", "pings", "malformed", "invalid", "unauthorized",
                                      "oversized", "policy_errors", "nonfinite", "errors")}
    answered = n - unanswered
    # every request the server handled is a chunk, a pong or exactly one counted error
    balanced = counters["requests"] == sum(v for k, v in counters.items() if k != "requests")
    lat = np.asarray(latencies) * 1e3
    result = {"requests": n, "answered": answered, "seed": args.seed, "max_bytes": max_bytes,
              "hard_cap_bytes": hard_cap, "replies_by_kind": dict(sorted(by_kind.items())),
              "requests_by_label": dict(sorted(by_label.items())), "failures": failures[:50],
              "n_failures": len(failures), "size_limits": size, "server_counters": counters,
              "counters_balance": balanced,
              "alive_and_serving_after": alive, "fuzz_seconds": round(fuzz_s, 2),
              "reply_ms": {"p50": round(float(np.percentile(lat, 50)), 3), "p99": round(float(np.percentile(lat, 99)), 3),
                           "max": round(float(lat.max()), 3)},
              "load_before": load_before, "load_after": uptime()}
    print(f"\nload before: {result['load_before']}\nload after:  {result['load_after']}\n")
    print(f"{n} malformed requests in {fuzz_s:.1f} s: {answered} answered, {len(failures)} failed checks")
    print("| reply kind | count |\n|---|---|")
    for kind, count in sorted(by_kind.items()):
        print(f"| {kind} | {count} |")
    print(f"\nsize limits: {size}\nserver counters: {counters} (balance: {balanced})\n"
          f"alive and serving after: {alive}")
    for line in failures[:10]:
        print("FAIL", line)
    if failures or answered != n or not alive or not balanced:
        raise SystemExit("the server missed a reply, gave a wrong one, or did not survive")
    if not args.quick:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        path = out / f"server_fuzz-{time.strftime('%Y%m%d-%H%M%S')}.json"
        path.write_text(json.dumps(result, indent=2))
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
