"""Action throughput of the VLA policy's three heads on one backbone: parallel decoding (OpenVLA-OFT),
the flow-matching expert (K Euler steps) and autoregressive 256-bin tokens with a KV cache (OpenVLA).

    python benchmarks/vla_throughput.py                    # defaults below, 1 thread
    python benchmarks/vla_throughput.py --quick --threads 2
    OMP_WAIT_POLICY=ACTIVE python benchmarks/vla_throughput.py --threads 2   # spinning workers: see below

The three policies are built with the same config except `head`, and the vision encoder, projections and
fusion transformer of the parallel one are copied into the other two, so only the decoding differs. Each
(head, batch) pair is timed in interleaved rounds (the order rotates every round, so the load of a shared
machine hits every contender alike); the table and JSON give medians. Latency is per chunk call
(`act` on a batch: text embeddings already cached, as in a rollout); actions/s = batch * chunk / latency.
Goal (OFT's figure, reported, not enforced): parallel >= 26x the actions/s of AR at the same batch.
`--train-batch B` (0 skips it) also times one training step per head (loss, backward, AdamW as in
algo=vla_bc) at batch B in interleaved rounds, reported as seconds per 1,000 gradient steps.
The JSON goes to benchmarks/results/vla_throughput-<date>.json. OpenMP's workers sleep between ops by default
here (OMP_WAIT_POLICY=PASSIVE, polite to other jobs); with --threads > 1 each of the AR head's hundreds of tiny ops
then pays a wake-up, so time multi-threaded latency with OMP_WAIT_POLICY=ACTIVE. The JSON records the policy.
"""
from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import cpu_info as cpu_flags  # noqa: E402

from embodied.constants import STATE_KEY, TASK_KEY, image_key  # noqa: E402
from policies.vla import HEADS, VLAPolicy, hash_text_encoder  # noqa: E402

GOAL = 26.0


def build(args, text_encoder) -> dict[str, VLAPolicy]:
    cfg = dict(obs_dim=args.obs_dim, act_dim=args.act_dim, cameras=args.cameras, image_size=args.image_size,
               chunk=args.chunk, dim=args.dim, depth=args.depth, flow_steps=args.flow_steps, n_bins=256)
    made = {}
    for head in HEADS:
        torch.manual_seed(0)
        made[head] = VLAPolicy(head=head, text_encoder=text_encoder, **cfg).eval().to(args.device)
    shared = {k: v for k, v in made["parallel"].state_dict().items()
              if not k.startswith(("queries", "action_out"))}
    for head in ("flow", "ar"):
        missing, unexpected = made[head].load_state_dict(shared, strict=False)
        assert not unexpected, unexpected
    return made


def observations(args, batch: int, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    obs = {STATE_KEY: rng.normal(size=(batch, args.obs_dim)).astype(np.float32),
           TASK_KEY: "put the red cube in the drawer"}
    for camera in args.cameras:
        obs[image_key(camera)] = rng.integers(0, 256, (batch, args.image_size, args.image_size, 3), dtype=np.uint8)
    return obs


def training_cost(args, made: dict[str, VLAPolicy]) -> dict[str, float]:
    """Median seconds per 1,000 gradient steps of each head at batch `args.train_batch` (interleaved rounds)."""
    obs = observations(args, args.train_batch, seed=1)
    obs[TASK_KEY] = [["open the drawer", "put the red cube on the blue one"][i % 2] for i in range(args.train_batch)]
    actions = np.random.default_rng(2).uniform(-1, 1, (args.train_batch, args.chunk, args.act_dim)).astype(np.float32)
    optimizers = {h: torch.optim.AdamW(p.parameters(), lr=5e-4, weight_decay=0.01) for h, p in made.items()}

    def step(head: str) -> None:
        policy = made[head].train()
        loss = policy.loss(obs, actions)
        optimizers[head].zero_grad(set_to_none=True)
        loss.backward()
        optimizers[head].step()
        policy.eval()

    for head in made:      # warm-up
        step(head)
    times: dict[str, list[float]] = {h: [] for h in made}
    heads = list(made)
    for r in range(args.train_rounds):
        for head in heads[r % len(heads):] + heads[:r % len(heads)]:
            start = time.perf_counter()
            step(head)
            times[head].append(time.perf_counter() - start)
    return {h: 1e3 * statistics.median(t) for h, t in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--obs-dim", type=int, default=28)
    parser.add_argument("--act-dim", type=int, default=7)
    parser.add_argument("--chunk", type=int, default=8)
    parser.add_argument("--cameras", nargs="*", default=["front", "wrist"])
    parser.add_argument("--image-size", type=int, default=84)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--depth", type=int, default=2)
    parser.add_argument("--flow-steps", type=int, default=10)
    parser.add_argument("--text", choices=["minilm", "hash"], default="minilm",
                        help="text encoder (embeddings are cached before timing, so this only costs start-up)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--quick", action="store_true", help="5 rounds, 64 px images")
    parser.add_argument("--train-batch", type=int, default=64, help="time training steps at this batch (0: skip)")
    parser.add_argument("--train-rounds", type=int, default=10)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.image_size, args.train_rounds = min(args.rounds, 5), 64, min(args.train_rounds, 3)
    torch.set_num_threads(args.threads)

    text_encoder = None
    if args.text == "hash":
        text_encoder = hash_text_encoder()
    made = build(args, text_encoder)
    inputs = {b: observations(args, b) for b in args.batches}
    with torch.no_grad():
        for policy in made.values():  # warm up: text cache, allocator, lazy inits
            for obs in inputs.values():
                policy.act(obs)
    parallel = made["parallel"]

    def encode_prefix(obs):  # the shared floor: vision + text + fusion transformer over the prefix only
        state, images, tasks, _ = parallel._inputs(obs)
        return parallel.backbone(parallel.prefix(state, images, tasks))

    runners = {head: made[head].act for head in HEADS}
    runners["prefix"] = torch.no_grad()(encode_prefix)
    keys = [(head, b) for b in args.batches for head in (*HEADS, "prefix")]
    times: dict[tuple, list[float]] = {k: [] for k in keys}
    for r in range(args.rounds):
        order = keys[r % len(keys):] + keys[:r % len(keys)]
        for head, b in order:
            start = time.perf_counter()
            runners[head](inputs[b])
            times[(head, b)].append(time.perf_counter() - start)

    uptime = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    rows = []  # "prefix": encoding the observation alone, the cost every head pays before decoding
    for head, b in keys:
        med = statistics.median(times[(head, b)])
        rows.append(dict(head=head, batch=b, latency_ms=1e3 * med, actions_per_s=b * args.chunk / med,
                         sequential_passes={"parallel": 1, "flow": 1 + args.flow_steps,
                                            "ar": 1 + args.chunk * args.act_dim, "prefix": 1}[head]))
    by = {(r["head"], r["batch"]): r for r in rows}
    ratios = {f"parallel_over_ar_b{b}": by[("parallel", b)]["actions_per_s"] / by[("ar", b)]["actions_per_s"]
              for b in args.batches}
    ratios.update({f"flow_over_ar_b{b}": by[("flow", b)]["actions_per_s"] / by[("ar", b)]["actions_per_s"]
                   for b in args.batches})
    train_s_per_1k = training_cost(args, made) if args.train_batch > 0 else {}
    cpu = cpu_flags()
    print(f"cpu: {cpu['model']}  avx512_bf16: {'yes' if cpu['avx512_bf16'] else 'no'}  cores: {cpu['cores']}  "
          f"threads: {args.threads}  omp_wait_policy: {os.environ['OMP_WAIT_POLICY']}  precision: fp32  "
          f"device: {args.device}")
    print(f"load: {uptime}")
    print(f"backbone: dim {args.dim}, depth {args.depth}, cameras {args.cameras} at {args.image_size} px, "
          f"chunk {args.chunk} x act {args.act_dim}, {made['parallel'].num_parameters():,} params (parallel)")
    print(f"{'head':<9} {'batch':>5} {'passes':>6} {'ms/chunk':>9} {'actions/s':>10}")
    for r in rows:
        rate = f"{r['actions_per_s']:>10.0f}" if r["head"] != "prefix" else "  (shared)"
        print(f"{r['head']:<9} {r['batch']:>5} {r['sequential_passes']:>6} {r['latency_ms']:>9.2f} {rate}")
    for b in args.batches:
        ratio = ratios[f"parallel_over_ar_b{b}"]
        print(f"batch {b}: parallel/AR = {ratio:.1f}x  (goal >= {GOAL:.0f}x: {'met' if ratio >= GOAL else 'NOT met'})"
              f"; flow/AR = {ratios[f'flow_over_ar_b{b}']:.1f}x")
    for head, seconds in train_s_per_1k.items():
        print(f"training {head:<9} batch {args.train_batch}: {seconds:.0f} s per 1,000 gradient steps")
    result = dict(benchmark="vla_throughput", date=time.strftime("%Y-%m-%dT%H:%M:%S"), cpu=cpu, precision="fp32",
                  threads=args.threads, omp_wait_policy=os.environ["OMP_WAIT_POLICY"], device=args.device,
                  uptime=uptime, rounds=args.rounds,
                  config={k: v for k, v in vars(args).items() if k not in ("out",)}, rows=rows, ratios=ratios,
                  goal_parallel_over_ar=GOAL,
                  params={h: p.num_parameters() for h, p in made.items()},
                  train_batch=args.train_batch, train_s_per_1k_steps=train_s_per_1k)
    out = Path(args.out) if args.out else (Path(__file__).resolve().parent / "results" /
                                           f"vla_throughput-{time.strftime('%Y%m%d-%H%M%S')}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
