"""TD-MPC2 planning latency per control step at batch 1: MPPI at the official settings (the TDMPC2Config
defaults: 5M-parameter model, 512 samples, 6 iterations, horizon 3) against the CPU-sized `tdmpc2` preset
(conf/algo/tdmpc2.yaml's agent values), one thread, same process.

    python benchmarks/tdmpc2_latency.py                  # hopper sizes, ~2 minutes on a busy 2-core machine
    python benchmarks/tdmpc2_latency.py --env cube-single --calls 10 --updates 5

Each call is one `policy.act(state, deterministic=False)` (exploration acting, warm-started from the last
plan, as online). Settings run interleaved in rounds so a shared machine's load hits both alike; the
table gives medians of wall time and of the thread's CPU time (the latter is what one core costs, and
moves less with other jobs). `--updates N` also times N gradient steps (batch 256, 3-step chunks).
The result JSON records the CPU (model, AVX512-BF16), the load average and torch's version.
"""
from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))
from machine import cpu_info  # noqa: E402

from embodied import agents  # noqa: E402
from embodied.agents.tdmpc2 import TDMPC2Config  # noqa: E402

DIMS = {"hopper": (11, 3), "cube-single": (28, 5), "pointmaze-umaze": (6, 2)}
PLAN_KEYS = ("latent_dim", "mlp_dim", "enc_dim", "num_q", "num_samples", "num_elites", "num_pi_trajs", "iterations",
             "horizon")


def preset_agent(name: str = "tdmpc2", env: str = "hopper") -> dict:
    """The agent options the train job builds for an algo preset (composed by Hydra, as `embodied.train` does)."""
    from embodied.run_config import runner_config
    from embodied.train import compose_train

    return runner_config(compose_train([f"algo={name}", f"env={env}", "bf16=false"])).online_agent


def timed(fn, n: int) -> list[tuple[float, float]]:
    out = []
    for _ in range(n):
        start, cpu = time.perf_counter(), time.thread_time()
        fn()
        out.append(((time.perf_counter() - start) * 1e3, (time.thread_time() - cpu) * 1e3))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--env", default="hopper", choices=sorted(DIMS), help="observation/action sizes")
    parser.add_argument("--calls", type=int, default=12, help="timed plans per setting")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (calls are split among them)")
    parser.add_argument("--updates", type=int, default=0, help="also time this many gradient steps per setting")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results"), help="folder for the JSON result")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    obs_dim, act_dim = DIMS[args.env]
    settings = {"official": {}, "cpu": preset_agent("tdmpc2", args.env)}
    rng = np.random.default_rng(0)
    built = {}
    for name, options in settings.items():
        torch.manual_seed(0)
        agent = agents.make("tdmpc2", obs_dim, act_dim, options)
        cfg = agent.cfg
        built[name] = agent
        params = sum(p.numel() for p in agent.actor.parameters())
        print(f"{name}: {params / 1e6:.2f}M parameters, " + ", ".join(f"{k}={getattr(cfg, k)}" for k in PLAN_KEYS),
              flush=True)
        for _ in range(2):  # warm-up (allocator, first-call overhead)
            agent.act(rng.normal(size=obs_dim).astype(np.float32), deterministic=False)
    load_before = os.getloadavg()
    samples = {name: [] for name in settings}
    per_round = max(1, args.calls // args.rounds)
    for r in range(args.rounds):
        order = list(settings) if r % 2 == 0 else list(settings)[::-1]
        for name in order:
            agent = built[name]
            samples[name] += timed(lambda: agent.act(rng.normal(size=obs_dim).astype(np.float32),
                                                     deterministic=False), per_round)
    update_ms = {}
    if args.updates:
        from embodied.data.replay import ReplayBuffer

        buf = ReplayBuffer(obs_dim, act_dim, capacity=5000, seed=0)
        for t in range(5000):
            buf.add(rng.normal(size=obs_dim), rng.uniform(-1, 1, act_dim), float(rng.normal()),
                    rng.normal(size=obs_dim), False, t % 500 == 499)
        for name, agent in built.items():
            batch = buf.sample_chunks(256, agent.chunk_horizon)
            agent.update(batch)
            update_ms[name] = statistics.median(w for w, _ in timed(lambda: agent.update(batch), args.updates))
    load_after = os.getloadavg()
    wall = {n: statistics.median(w for w, _ in v) for n, v in samples.items()}
    cpu = {n: statistics.median(c for _, c in v) for n, v in samples.items()}
    print(f"\nTD-MPC2 planning at batch 1, {args.env} sizes (obs {obs_dim}, act {act_dim}), {args.threads} thread(s)")
    print("| setting | median wall ms/step | median CPU ms/step | p90 wall | calls |" +
          (" update ms (B=256) |" if update_ms else ""))
    print("|---|---|---|---|---|" + ("---|" if update_ms else ""))
    for name, v in samples.items():
        walls = sorted(w for w, _ in v)
        extra = f" {update_ms[name]:.0f} |" if update_ms else ""
        print(f"| {name} | {wall[name]:.1f} | {cpu[name]:.1f} | {walls[int(0.9 * (len(walls) - 1))]:.1f} | "
              f"{len(v)} |{extra}")
    info = cpu_info()
    print(f"CPU: {info['model']} (avx512_bf16: {info['avx512_bf16']}), load average {load_before[0]:.1f} -> "
          f"{load_after[0]:.1f}", flush=True)
    result = {"env": args.env, "obs_dim": obs_dim, "act_dim": act_dim, "threads": args.threads, "batch": 1,
              "settings": {n: {k: getattr(built[n].cfg, k) for k in PLAN_KEYS} for n in settings},
              "parameters": {n: sum(p.numel() for p in built[n].actor.parameters()) for n in settings},
              "median_wall_ms": wall, "median_cpu_ms": cpu, "samples_wall_cpu_ms": samples,
              "update_median_wall_ms_batch256": update_ms or None, "cpu": info,
              "load_avg_before": load_before, "load_avg_after": load_after, "torch": torch.__version__,
              "official_defaults": {k: getattr(TDMPC2Config(), k) for k in PLAN_KEYS}}
    out = Path(args.out) / f"tdmpc2_latency-{args.env}-{args.threads}thr-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
