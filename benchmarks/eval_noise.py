"""How a generative policy's evaluation noise changes its success: one fixed draw per batch row (the
runner's evaluator until stop 27) against fresh noise per chunk from a seeded stream (now), each at two
eval batch widths. The fixed draw made success depend on the width; fresh noise should not, beyond
sampling error.

    python benchmarks/eval_noise.py                       # trains bc_flow on cube-single (300 steps) first
    python benchmarks/eval_noise.py --policy RUN/policy   # any saved diffusion or flow policy

Writes benchmarks/results/eval_noise-<date>.json (with the CPU and the load).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.machine import cpu_info  # noqa: E402

import policies  # noqa: E402
from embodied.evaluation import evaluate  # noqa: E402

RESULTS = Path(__file__).parent / "results"


def train_policy(args, out: Path) -> Path:
    run = out / "run"
    cmd = [sys.executable, "-m", "embodied.train", f"algo={args.algo}", f"env={args.env}", f"dataset={args.dataset}",
           f"budget.offline_steps={args.steps}", "budget.online_steps=0", f"eval.every_offline={args.steps}",
           "eval.episodes=5", "eval.video_episodes=0", "logger=jsonl", "progress=false", "bf16=false",
           f"threads={args.threads}", f"hydra.run.dir={run}", "checkpoint.every=0"]
    print("$", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, env={**os.environ, "WANDB_MODE": "disabled"})
    return run / "policy"


def success(policy, env: str, episodes: int, seed: int, width: int, noise: str) -> float:
    stream = torch.Generator(device=policy.device).manual_seed(seed)
    if noise == "fixed":
        chunk_fn = lambda obs: policy.act(obs, deterministic=True)  # noqa: E731  seed-0 draw every call
    else:
        chunk_fn = lambda obs: policy.act(obs, deterministic=True, generator=stream)  # noqa: E731
    result = evaluate(env, None, episodes, seed=seed, chunk_policy=chunk_fn, obs_horizon=policy.obs_horizon,
                      execute_horizon=policy.execute_horizon, max_envs=width)
    return float(result.metrics()["eval/success"])


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--policy", help="a saved policy directory; default: train one")
    parser.add_argument("--algo", default="bc_flow")
    parser.add_argument("--env", default="cube-single")
    parser.add_argument("--dataset", default="task")
    parser.add_argument("--steps", type=int, default=300, help="BC gradient steps when training")
    parser.add_argument("--episodes", type=int, default=50)
    parser.add_argument("--seed", type=int, default=10_000, help="first eval start state (the runner's, seed 0)")
    parser.add_argument("--widths", type=int, nargs="+", default=[5, 25])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=RESULTS, help="where the JSON goes")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(args.policy) if args.policy else train_policy(args, Path(tmp))
        policy = policies.load(path)
        policy.eval()
        rows = []
        for noise in ("fixed", "fresh"):
            for width in args.widths:
                t0 = time.time()
                value = success(policy, args.env, args.episodes, args.seed, width, noise)
                rows.append({"noise": noise, "width": width, "success": value, "wall_s": round(time.time() - t0, 1)})
                print(f"noise={noise:5s} width={width:3d} success={value:.2f}", flush=True)
    record = {"benchmark": "eval_noise", "cpu": cpu_info(), "load_1min": os.getloadavg()[0],
              "date": time.strftime("%Y-%m-%d %H:%M:%S"), "policy": args.policy or f"{args.algo} {args.steps} steps",
              "env": args.env, "dataset": args.dataset, "episodes": args.episodes, "seed": args.seed, "rows": rows}
    args.out.mkdir(parents=True, exist_ok=True)
    out = args.out / f"eval_noise-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(json.dumps(record, indent=2))
    print(f"wrote {out}")
    fixed = [r["success"] for r in rows if r["noise"] == "fixed"]
    fresh = [r["success"] for r in rows if r["noise"] == "fresh"]
    print(f"spread across widths: fixed {max(fixed) - min(fixed):.2f}, fresh {max(fresh) - min(fresh):.2f}")


if __name__ == "__main__":
    main()
