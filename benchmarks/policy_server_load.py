"""Policy server under load: 1,000 chunk round trips over ZeroMQ on 127.0.0.1, plus abuse.

    python benchmarks/policy_server_load.py            # 1,000 round trips
    python benchmarks/policy_server_load.py --quick    # 50 (results not written)

The server is a separate process (`robots.client.LocalPolicyServer`: own interpreter, random token)
serving a saved 256x256 Gaussian policy with a 20-step chunk. Side by side on the same connection,
1,000 `ping` round trips (transport + msgpack only) are the peer, so the policy's share is a ratio.
Then malformed, oversized and wrong-token messages are sent and the server must still answer.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def pct(values) -> dict:
    a = np.asarray(values) * 1e3
    return {"p50_ms": round(float(np.percentile(a, 50)), 3), "p90_ms": round(float(np.percentile(a, 90)), 3),
            "p99_ms": round(float(np.percentile(a, 99)), 3), "max_ms": round(float(a.max()), 3),
            "mean_ms": round(float(a.mean()), 3)}


def main() -> None:
    import torch

    import policies
    from robots.client import LocalPolicyServer, PolicyClient, PolicyServerError
    from robots.wire import pack

    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=1000)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    n = 50 if args.quick else args.n
    load_before = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    ckpt = Path(tempfile.mkdtemp(prefix="policy_server_load_")) / "policy"
    policies.make("gaussian", obs_dim=7, act_dim=7, hidden=[256, 256]).save(ckpt)
    rng = np.random.default_rng(0)
    with LocalPolicyServer(ckpt, args=["--repeat", "20"]) as server:
        client = PolicyClient(server.address, token=server.token, max_age_ms=10_000)
        client.ping(timeout_ms=30_000)
        infer, ping = [], []
        for i in range(n):
            q = rng.uniform(-1, 1, 6).astype(np.float32)
            obs = {"observation.state": np.append(q, 0.04).astype(np.float32), "joint_pos_rad": q,
                   "timestamp_s": time.monotonic()}
            t0 = time.perf_counter()
            reply = client.infer(obs, obs_step=i)
            infer.append(time.perf_counter() - t0)
            assert reply.chunk.shape == (20, 7) and reply.obs_step == i
            t0 = time.perf_counter()
            client.ping()
            ping.append(time.perf_counter() - t0)
        # abuse: none of these may take the server down
        abuse = {"malformed": 0, "oversized": 0, "wrong_token": 0}
        for junk in (b"\xc1\xc1 not msgpack", pack({"type": "infer", "token": server.token, "obs": 5}),
                     pack({"type": "what", "token": server.token})):
            client.send_raw(junk)
            abuse["malformed"] += 1
        client.send_raw(b"\x00" * (2 << 20))   # 2 MiB: over the 1 MiB limit
        abuse["oversized"] += 1
        errors_before = client.stats["errors"]
        deadline = time.monotonic() + 5
        while client.stats["errors"] - errors_before < 4 and time.monotonic() < deadline:
            client.poll(200)
        errors = client.stats["errors"] - errors_before
        wrong = PolicyClient(server.address, token="not-the-token")
        try:
            wrong.infer({"observation.state": np.zeros(7, np.float32), "joint_pos_rad": np.zeros(6, np.float32)})
            refused = False
        except PolicyServerError as err:
            refused = "unauthorized" in str(err)
        abuse["wrong_token"] += 1
        wrong.close()
        stats = client.ping()
        alive = client.infer({"observation.state": np.zeros(7, np.float32), "joint_pos_rad": np.zeros(6, np.float32),
                              "timestamp_s": time.monotonic()}, obs_step=n + 1).chunk.shape == (20, 7)
        client.close()
    result = {"round_trips": n, "infer": pct(infer), "ping_peer": pct(ping),
              "policy_share_p50": round(float(np.median(infer) / np.median(ping)), 2),
              "abuse_sent": abuse, "error_replies": errors, "wrong_token_refused": refused,
              "server_counters": {k: stats[k] for k in ("requests", "chunks", "malformed", "oversized", "unauthorized")},
              "server_alive_after_abuse": alive, "load_before": load_before,
              "load_after": subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()}
    print(f"\nload before: {result['load_before']}\nload after:  {result['load_after']}\n")
    print("| round trip | n | p50 ms | p90 ms | p99 ms | max ms |")
    print("|---|---|---|---|---|---|")
    for name, key in (("infer (20x7 chunk, 256x256 MLP)", "infer"), ("ping (peer: transport only)", "ping_peer")):
        r = result[key]
        print(f"| {name} | {n} | {r['p50_ms']} | {r['p90_ms']} | {r['p99_ms']} | {r['max_ms']} |")
    print(f"\ninfer/ping p50 ratio {result['policy_share_p50']}x; abuse {abuse} -> {errors} error replies, "
          f"wrong token refused: {refused}, server counters {result['server_counters']}, alive after: {alive}")
    if not (refused and alive and errors == 4):
        raise SystemExit("server did not survive or did not refuse the abuse")
    if not args.quick:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        path = out / f"policy_server_load-{time.strftime('%Y%m%d-%H%M%S')}.json"
        path.write_text(json.dumps(result, indent=2))
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
